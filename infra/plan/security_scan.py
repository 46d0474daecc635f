"""checkov over what the platform ships: the Dockerfiles and every Kubernetes object a plan renders.

    python -m infra.plan.security_scan --checkov .venv-checkov/bin/checkov [--stack dev --stack prod]

checkov runs from its own virtual environment (it pins old packaging/boto3/networkx that
break pulumi and pytest) and offline (``--skip-download``: no policy download, no platform
calls). For each stack, the recorded plan's Kubernetes objects (``kubernetes:*`` resources,
Helm releases aside: their charts are not rendered offline) are written as manifests; every
pod template inside an object (a custom resource's or a workload's ``template``) is also
written as a Pod, so that checkov's pod checks reach it. A check is skipped only by an
annotation on the object (``checkov.io/skip1: CKV_K8S_xx=reason``) or a comment in the
Dockerfile (``# checkov:skip=CKV_DOCKER_x: reason``); a skip without a reason fails the scan.

Exit status: 0 clean, 1 failed checks (or a skip without a reason), 2 bad usage.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = ("trainer/Dockerfile", "docker/mlflow/Dockerfile", "docker/node-health/Dockerfile")
DEFAULT_STACKS = ("dev", "prod")
# Not renderable offline: a Helm release is values for a chart, a kustomize Directory a remote
# overlay (the training operator), both rendered by the engine at deploy.
# A DeploymentPatch is a partial object merged into the upstream Deployment at apply time.
NOT_RENDERED = ("kubernetes:helm.sh/v3:Release", "kubernetes:helm.sh/v4:Chart", "kubernetes:kustomize/v2:Directory",
                "kubernetes:apps/v1:DeploymentPatch")
SKIP_ANNOTATION = re.compile(r"^checkov\.io/skip\d+$")


@dataclass(frozen=True)
class Manifest:
    stack: str
    name: str
    document: dict[str, Any]


def kubernetes_objects(recording: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """(resource name, object) of every Kubernetes object the recorded program declares."""
    for resource in recording.resources:
        if not resource.type.startswith("kubernetes:") or resource.is_provider or resource.type in NOT_RENDERED:
            continue
        if not resource.custom or "kind" not in resource.inputs:
            continue
        document = json.loads(json.dumps(resource.inputs))  # a deep copy of plain data
        metadata = document.setdefault("metadata", {})
        metadata.setdefault("name", resource.name)  # Pulumi auto-names objects without one
        yield resource.name, document


def pod_templates(document: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, template) of every pod template inside an object: ``{metadata?, spec: {containers}}``
    under a key named ``template`` (Deployments, Jobs, PyTorchJob replica specs, NodePool-free CRs)."""
    for key, value in document.items():
        here = f"{path}.{key}" if path else key
        if isinstance(value, dict):
            spec = value.get("spec")
            if key == "template" and isinstance(spec, dict) and isinstance(spec.get("containers"), list):
                yield here, value
            yield from pod_templates(value, here)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, dict):
                    yield from pod_templates(item, f"{here}[{index}]")


def as_pod(owner: dict[str, Any], path: str, template: dict[str, Any]) -> dict[str, Any]:
    """A pod template as the Pod it becomes, with the template's labels and annotations (skips)."""
    owner_meta = owner.get("metadata", {})
    meta = dict(template.get("metadata") or {})
    slug = re.sub(r"[^a-z0-9-]+", "-", path.lower()).strip("-")
    meta["name"] = f"{owner_meta.get('name', 'object')}-{slug}"[:253]
    if owner_meta.get("namespace"):
        meta["namespace"] = owner_meta["namespace"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}


def with_operator_init_containers(document: dict[str, Any], path: str, template: dict[str, Any]) -> dict[str, Any]:
    """A PyTorchJob worker's pod template with the init container the Training Operator adds to
    it when the job has a Master (pkg/controller.v1/pytorch/initcontainer.go setInitContainer),
    so the scan sees the pod that runs, not only the one declared."""
    specs = (document.get("spec") or {}).get("pytorchReplicaSpecs") or {}
    if document.get("kind") != "PyTorchJob" or "Master" not in specs or "Worker" not in path:
        return template
    from components.training import operator_init_containers

    master = f"{document.get('metadata', {}).get('name', 'job')}-master-0"
    spec = dict(template["spec"])
    spec["initContainers"] = [*(spec.get("initContainers") or []), *operator_init_containers(master)]
    return {**template, "spec": spec}


def gitops_objects(stack: str, project_dir: Path = ROOT) -> list[tuple[str, dict[str, Any]]]:
    """Every object of the stack's committed GitOps tree (``workloads/rendered/<stack>``)."""
    tree = project_dir / "workloads" / "rendered" / stack
    out = []
    for path in sorted(tree.rglob("*.yaml")) if tree.is_dir() else []:
        for index, document in enumerate(yaml.safe_load_all(path.read_text())):
            if isinstance(document, dict) and document.get("kind"):
                out.append((f"gitops--{path.relative_to(tree).with_suffix('')}--{index}", document))
    return out


def render_manifests(stacks: tuple[str, ...], project_dir: Path = ROOT) -> list[Manifest]:
    from infra.plan import build_plan

    manifests = []
    for stack in stacks:
        plan = build_plan(stack, project_dir)
        # What Pulumi applies, then what Argo CD applies from Git (the declared jobs and
        # pipelines, with the init container the operator adds to their workers).
        for name, document in [*kubernetes_objects(plan.recording), *gitops_objects(stack, project_dir)]:
            manifests.append(Manifest(stack, name, document))
            for path, template in pod_templates(document):
                template = with_operator_init_containers(document, path, template)
                manifests.append(Manifest(stack, f"{name}--{path}", as_pod(document, path, template)))
    return manifests


def write_manifests(manifests: list[Manifest], out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    for manifest in manifests:
        target = out / manifest.stack / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', manifest.name)}.yaml"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(yaml.safe_dump(manifest.document, sort_keys=False))


def skips_without_reason(manifests: list[Manifest], dockerfiles: list[Path]) -> list[str]:
    """Every skip must say why: ``CKV_K8S_xx=reason`` / ``# checkov:skip=CKV_DOCKER_x: reason``."""
    bad = []
    for manifest in manifests:
        for key, value in (manifest.document.get("metadata", {}).get("annotations") or {}).items():
            if SKIP_ANNOTATION.match(key) and not re.match(r"^CKV2?_[A-Z0-9_]+=\s*\S", str(value)):
                bad.append(f"{manifest.stack}/{manifest.name}: annotation {key}: {value!r} has no reason")
            elif SKIP_ANNOTATION.match(key) and str(value).count("=") != 1:
                # checkov's kubernetes_utils.get_skipped_checks: `id, comment = value.split("=")`.
                bad.append(f"{manifest.stack}/{manifest.name}: annotation {key}: {value!r} has a '=' in its reason "
                           "(checkov splits on it and crashes)")
    for dockerfile in dockerfiles:
        for number, line in enumerate(dockerfile.read_text().splitlines(), 1):
            if "checkov:skip=" in line and not re.search(r"checkov:skip=CKV2?_[A-Z0-9_]+:\s*\S", line):
                bad.append(f"{dockerfile}:{number}: {line.strip()!r} has no reason")
    return bad


def run_checkov(checkov: str, manifests_dir: Path, dockerfiles: list[Path]) -> list[dict[str, Any]]:
    """Two runs: checkov scans either a directory or files, not both in one run."""
    base = [checkov, "--skip-download", "--compact", "--output", "json"]
    runs = [["--framework", "kubernetes", "--directory", str(manifests_dir)],
            ["--framework", "dockerfile", *[arg for d in dockerfiles for arg in ("--file", str(d))]]]
    env = {"PATH": f"{Path(checkov).parent}:/usr/bin:/bin", "HOME": str(Path.home()), "LOG_LEVEL": "WARNING"}
    reports: list[dict[str, Any]] = []
    for extra in runs:
        result = subprocess.run(base + extra, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
        try:
            report = json.loads(result.stdout)
        except ValueError:
            raise SystemExit(f"checkov produced no JSON report (exit {result.returncode}):\n{result.stderr[-4000:]}") from None
        found = report if isinstance(report, list) else [report]
        if not any(r.get("summary", {}).get("resource_count") for r in found if isinstance(r, dict)):
            raise SystemExit(f"checkov scanned nothing with {extra}: {result.stdout[-2000:]}")
        reports += [r for r in found if isinstance(r, dict)]
    return reports


def summarize(reports: list[dict[str, Any]]) -> tuple[list[str], list[str], int]:
    failed, skipped, passed = [], [], 0
    for report in reports:
        results = report.get("results", {})
        passed += len(results.get("passed_checks", []))
        for check in results.get("failed_checks", []):
            failed.append(f"{check['check_id']} {check['check_name']} in {check.get('file_path')} "
                          f"({check.get('resource')})")
        for check in results.get("skipped_checks", []):
            reason = (check.get("check_result") or {}).get("suppress_comment", "")
            skipped.append(f"{check['check_id']} in {check.get('file_path')} ({check.get('resource')}): {reason}")
    return failed, skipped, passed


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.plan.security_scan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkov", required=True, help="checkov executable (its own virtual environment)")
    parser.add_argument("--stack", action="append", help="stack to render (default: dev and prod)")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "checkov", help="where the manifests are written")
    args = parser.parse_args(argv)
    if not Path(args.checkov).exists() and shutil.which(args.checkov) is None:
        print(f"error: checkov not found at {args.checkov}; run `make security` (it creates .venv-checkov)", file=sys.stderr)
        return 2
    stacks = tuple(args.stack or DEFAULT_STACKS)
    manifests = render_manifests(stacks)
    write_manifests(manifests, args.out)
    dockerfiles = [ROOT / d for d in DOCKERFILES]
    print(f"checkov: {len(manifests)} Kubernetes manifests of stacks {', '.join(stacks)} "
          f"({sum(m.document['kind'] == 'Pod' for m in manifests)} pod templates as Pods) and {len(dockerfiles)} Dockerfiles")
    unexplained = skips_without_reason(manifests, dockerfiles)
    failed, skipped, passed = summarize(run_checkov(args.checkov, args.out, dockerfiles))
    print(f"checkov: {passed} passed, {len(failed)} failed, {len(skipped)} skipped")
    for line in skipped:
        print(f"  skipped {line}")
    for line in failed:
        print(f"  FAILED {line}")
    for line in unexplained:
        print(f"  SKIP WITHOUT REASON {line}")
    return 1 if failed or unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
