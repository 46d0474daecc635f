"""Facts the job renderer reads from a stack: its offline plan's Kubernetes objects and names
(``facts_from_plan``), overlaid with the deployed stack's outputs when the Pulumi CLI can read
them (``facts_for_stack``): the renderer never hard-codes a pool label, a queue or a bucket.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from typing import Any, Optional

from components.datasets import DatasetBucket, write_throughput_mb_per_s
from components.tracking import K8S_SECRET_NAME
from infra.config import PlatformConfig
from infra.recording import Recording
from infra.plan import Plan, build_plan
from workloads.platform_facts import PlatformFacts, facts_from_manifests
from workloads.trainingjob import TORCH_DISTRIBUTED_RUNTIME


def _kubernetes_manifests(recording: Recording) -> list[dict[str, Any]]:
    return [dict(r.inputs) for r in recording.resources
            if r.type.startswith("kubernetes:") and not r.is_provider and "kind" in r.inputs]


# EFS User Guide, "Amazon EFS performance specifications", General Purpose: per-client read/write
# 500 MiBps (1,500 MiBps only for Regional Elastic file systems with the footnoted client setup):
# the conservative figure a checkpoint save from one node can count on.
EFS_CLIENT_WRITE_MB_PER_S = 500 * 1.048576


def facts_from_plan(plan: Plan) -> PlatformFacts:
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
    return facts_from_manifests(
        _kubernetes_manifests(recording), stack=plan.stack, region=config.region, tracking_secret_name=K8S_SECRET_NAME,
        checkpoints_bucket=bucket, fsx_write_mb_per_s=write_mb_s,
        trainer_v2_runtime=TORCH_DISTRIBUTED_RUNTIME if trainer_v2 else None, checkpoint_store=store,
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


def facts_for_stack(stack: str, *, use_outputs: bool = True) -> PlatformFacts:
    """Facts of a stack: its offline plan, with deployed names from the stack outputs if readable."""
    facts = facts_from_plan(build_plan(stack))
    outputs = stack_outputs(stack) if use_outputs else None
    if outputs:
        facts = replace(facts, checkpoints_bucket=outputs.get("checkpointsBucket") or facts.checkpoints_bucket,
                        notes=facts.notes + (f"names from `pulumi stack output --stack {stack}`",))
    else:
        facts = replace(facts, notes=facts.notes + ("from the offline plan (stack outputs not readable): bucket names are placeholders",))
    return facts
