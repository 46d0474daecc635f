"""Facts the job renderer reads from a stack: its offline plan's Kubernetes objects and names
(``facts_from_plan``), overlaid with the deployed stack's outputs when the Pulumi CLI can read
them (``facts_for_stack``): the renderer never hard-codes a pool label, a queue or a bucket.

Planning a stack takes 10-25 s; every CLI command needs its facts. ``plan_facts`` keeps them on
disk keyed by the stack's revision (``stack_revision``: the stack's config, the project file, the
program's sources and the package versions that decide them), so the second command reads a file.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from workloads.platform_facts import PlatformFacts

if TYPE_CHECKING:  # planning imports the program (Pulumi, infra/, components/): only on a cache miss
    from infra.config import PlatformConfig
    from infra.plan import Plan
    from infra.recording import Recording


def _kubernetes_manifests(recording: Recording) -> list[dict[str, Any]]:
    return [dict(r.inputs) for r in recording.resources
            if r.type.startswith("kubernetes:") and not r.is_provider and "kind" in r.inputs]


# EFS User Guide, "Amazon EFS performance specifications", General Purpose: per-client read/write
# 500 MiBps (1,500 MiBps only for Regional Elastic file systems with the footnoted client setup):
# the conservative figure a checkpoint save from one node can count on.
EFS_CLIENT_WRITE_MB_PER_S = 500 * 1.048576


def facts_from_plan(plan: Plan) -> PlatformFacts:
    from components.container_logs import log_group_name
    from components.datasets import DatasetBucket, write_throughput_mb_per_s
    from components.tracking import K8S_SECRET_NAME
    from workloads.platform_facts import facts_from_manifests
    from workloads.trainingjob import TORCH_DISTRIBUTED_RUNTIME

    config: PlatformConfig = plan.config
    recording = plan.recording
    bucket = next((r.outputs.get("bucket") for r in recording.resources
                   if r.type == "aws:s3/bucket:Bucket" and r.name == f"{config.name}-datasets-{DatasetBucket.CHECKPOINTS.value}-bucket"), None)
    fsx = next((r.inputs for r in recording.resources if r.type == "aws:fsx/lustreFileSystem:LustreFileSystem"), None)
    write_mb_s = (write_throughput_mb_per_s(int(fsx["storageCapacity"]), int(fsx["perUnitStorageThroughput"]))
                  if fsx else None)
    store = "FSx for Lustre" if fsx else None
    if write_mb_s is None and any(r.type == "aws:efs/fileSystem:FileSystem" for r in recording.resources):
        # Datasets storage s3-mountpoint: checkpoints go to EFS, at most its per-client rate.
        write_mb_s, store = EFS_CLIENT_WRITE_MB_PER_S, "EFS"
    trainer_v2 = any(r.type == "kubernetes:helm.sh/v3:Release" and "kubeflow-trainer" in str(r.inputs.get("chart", ""))
                     for r in recording.resources)
    facts = facts_from_manifests(
        _kubernetes_manifests(recording), stack=plan.stack, region=config.region, tracking_secret_name=K8S_SECRET_NAME,
        checkpoints_bucket=bucket, fsx_write_mb_per_s=write_mb_s,
        trainer_v2_runtime=TORCH_DISTRIBUTED_RUNTIME if trainer_v2 else None, checkpoint_store=store,
    )
    logs_on = config.monitoring is not None and config.monitoring.container_logs
    roles = {team.name: tuple(team.role_arns) for team in config.scheduling.teams}
    monitoring = config.monitoring
    return replace(
        facts, container_log_group=log_group_name(config.cluster_name) if logs_on else None,
        cluster_name=config.cluster_name,
        teams=tuple(replace(team, role_arns=roles.get(team.name, ())) for team in facts.teams),
        tracking_url=f"https://{config.tracking.domain_name}" if config.tracking is not None else None,
        argocd_url=f"https://{config.gitops.domain}" if config.gitops is not None else None,
        grafana=(None if monitoring is None else "managed" if monitoring.managed else "in-cluster" if monitoring.grafana
                 else None),
    )


def stack_outputs(stack: str) -> Optional[dict[str, Any]]:
    """The deployed stack's outputs through the Pulumi CLI, or None (no CLI, not logged in...)."""
    if shutil.which("pulumi") is None:
        return None
    try:
        done = subprocess.run(["pulumi", "stack", "output", "--json", "--stack", stack], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    try:
        return json.loads(done.stdout)
    except ValueError:
        return None


ROOT = Path(__file__).resolve().parent.parent
CACHE_ENV = "MLP_FACTS_CACHE"  # a directory; "off" turns the cache off
# What the offline plan is made of: the program (infra/), its components, the manifests it
# renders (workloads/) and the catalog they read; this module turns the plan into facts.
FACT_SOURCES = ("infra", "components", "workloads", "catalog", "jobs/facts.py")
# Installed packages whose behaviour shapes the recorded plan (resource inputs and outputs).
FACT_PACKAGES = ("ml-training-platform", "pulumi", "pulumi-aws", "pulumi-kubernetes")


def cache_dir() -> Optional[Path]:
    """Where cached facts live: $MLP_FACTS_CACHE, else $XDG_CACHE_HOME (~/.cache)/mlplatform/facts;
    None when MLP_FACTS_CACHE=off."""
    configured = os.environ.get(CACHE_ENV)
    if configured == "off":
        return None
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mlplatform" / "facts"


def _source_files(root: Path) -> list[Path]:
    files = []
    for entry in FACT_SOURCES:
        path = root / entry
        if path.is_file():
            files.append(path)
        for folder, dirs, names in os.walk(path, followlinks=True):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            files += [Path(folder) / n for n in sorted(names) if n.endswith((".py", ".yaml", ".json"))]
    return files


def stack_revision(stack: str, root: Path = ROOT) -> str:
    """A digest of everything the stack's facts are computed from: Pulumi.<stack>.yaml,
    Pulumi.yaml, the program's sources (FACT_SOURCES) and the versions of FACT_PACKAGES. Any
    edit to one of them is a new revision (and a new plan)."""
    digest = hashlib.sha256()
    for path in [root / f"Pulumi.{stack}.yaml", root / "Pulumi.yaml", *_source_files(root)]:
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes() if path.is_file() else b"<missing>")
        digest.update(b"\0")
    for package in FACT_PACKAGES:
        try:
            version = metadata.version(package)
        except metadata.PackageNotFoundError:
            version = "-"
        digest.update(f"{package}=={version}\0".encode())
    return digest.hexdigest()


def _plan(stack: str, root: Path) -> PlatformFacts:
    from infra.plan import build_plan

    return facts_from_plan(build_plan(stack, root))


def plan_facts(stack: str, *, root: Path = ROOT, cache: Optional[Path] = None,
               planner: Callable[[str, Path], PlatformFacts] = _plan) -> PlatformFacts:
    """The facts of the stack's offline plan, from the cache when the stack's revision is
    unchanged (``planner`` runs only on a miss). ``cache``: the directory (default ``cache_dir()``).

    Measured on the dev stack (2 shared cores, loaded): `python -m workloads facts --stack dev
    --offline` 11.4 s with an empty cache, 1.5 s on the second run (most of it importing
    the renderer); see tests/jobs/test_facts_cache.py."""
    folder = cache if cache is not None else cache_dir()
    if folder is None or not (root / f"Pulumi.{stack}.yaml").is_file():
        return planner(stack, root)  # no cache, or no such stack: the planner says so
    # Per checkout too: two checkouts of different revisions keep one file each instead of
    # evicting each other's.
    checkout = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:8]
    path = folder / f"{stack}-{checkout}-{stack_revision(stack, root)[:32]}.json"
    try:
        return PlatformFacts.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        pass  # absent, or written by another version of PlatformFacts: plan again
    facts = planner(stack, root)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob(f"{stack}-{checkout}-*.json"):
            stale.unlink(missing_ok=True)  # older revisions of this stack are never read again
        # Written whole, then renamed: a concurrent command never reads half a file.
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as out:
            json.dump(facts.to_dict(), out, sort_keys=True)
        os.replace(out.name, path)
    except OSError:
        pass  # a read-only home: the facts are still right, only not kept
    return facts


def facts_for_stack(stack: str, *, use_outputs: bool = True) -> PlatformFacts:
    """Facts of a stack: its offline plan (cached per stack revision), with deployed names from
    the stack outputs if readable."""
    facts = plan_facts(stack)
    outputs = stack_outputs(stack) if use_outputs else None
    if outputs:
        facts = replace(facts, checkpoints_bucket=outputs.get("checkpointsBucket") or facts.checkpoints_bucket,
                        container_log_group=outputs.get("containerLogGroup") or facts.container_log_group,
                        names_deployed="checkpointsBucket" in outputs,
                        notes=facts.notes + (f"names from `pulumi stack output --stack {stack}`",))
    else:
        facts = replace(facts, notes=facts.notes + ("from the offline plan (stack outputs not readable): bucket names are placeholders",))
    return facts
