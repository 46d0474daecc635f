"""What the job tests share: submitting the stack's examples as a team, reading back what the
controllers did, and ending a simulated run.

Jobs are submitted with ``JobClient`` as the identity the plan's access entries give the team
(tests/cluster/identities.py), named with the test's scope prefix (tests/cluster/isolation.py).
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import yaml

from jobs.store import LocalStore
from tests.cluster.identities import job_client, member
from tools.cluster.api import eventually
from tools.cluster.kubelet import POD_COMPLETE_LABEL, POD_FAILED_EXIT_CODE, POD_FAILED_LABEL

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = {"dev": "examples/jobs/l4-dev-smoke.yaml", "prod": "examples/jobs/gpt2-pretrain.yaml"}
# Bounded waits: a real controller on a loaded 2-core machine, not a sleep standing for a result.
ADMIT_S, LAUNCH_S, RUN_S, END_S = 240, 300, 300, 240


def client(cluster, team: str, *, as_member: bool = False):
    """The team's job client: as who submits the team's jobs, or (``as_member``) as a team member
    with only the team's own RBAC, also where the stack's teams submit with an admin's identity."""
    # Checkpoints: an empty local store stands for the bucket (nothing here trains, so there is
    # nothing to read; no AWS call).
    return job_client(cluster, team, store=LocalStore(str(cluster.plane.workdir / "checkpoints")),
                      identity=member(cluster, f"team-{team}") if as_member else None)


def example(cluster, scope, suffix: str, path: Optional[str] = None, **changes) -> dict[str, Any]:
    raw = yaml.safe_load((ROOT / (path or EXAMPLE[cluster.stack])).read_text())
    raw.update(changes)
    raw["name"] = scope.name(suffix)
    return raw


def as_json(cluster, *args) -> dict[str, Any]:
    return json.loads(cluster.kubectl(*args, "-o", "json").stdout)


def job_pods(cluster, name: str, namespace: str) -> list[dict[str, Any]]:
    return cluster.api.get(f"/api/v1/namespaces/{namespace}/pods",
                           labelSelector=f"training.kubeflow.org/job-name={name}")["items"]


def true_conditions(obj) -> dict[str, dict]:
    return {c["type"]: c for c in obj.get("status", {}).get("conditions", []) if c.get("status") == "True"}


def diagnose(cluster, namespace: str) -> str:
    return "\n".join([
        cluster.kubectl("get", "workloads,pytorchjobs,pods", "-n", namespace, "-o", "wide", check=False).stdout,
        cluster.kubectl("get", "nodeclaims,nodes", "-o", "wide", check=False).stdout,
        cluster.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False).stdout[-3000:],
        cluster.logs(8)])


def wait(cluster, namespace: str, predicate, what: str, timeout_s: float):
    return eventually(predicate, f"{cluster.stack}: {what}", timeout_s, interval_s=1,
                      diagnose=lambda: diagnose(cluster, namespace))


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def running_pods(cluster, name: str, namespace: str, count: int) -> list[dict[str, Any]]:
    """The job's ``count`` pods Running and Ready on a node (the trainer stand-in is Ready once its
    preemption handler is installed)."""
    def check():
        pods = [p for p in job_pods(cluster, name, namespace) if p["status"].get("phase") == "Running"
                and p["spec"].get("nodeName") and ready(p) and not p["metadata"].get("deletionTimestamp")]
        return pods if len(pods) == count else None
    return wait(cluster, namespace, check, f"{count} pod(s) of {name} Running and Ready on a node", RUN_S + LAUNCH_S)


def end_pods(cluster, pods, *, exit_code: Optional[int] = None) -> None:
    """Tell each pod's training process how to end: complete (exit 0) or exit ``exit_code``."""
    for pod in pods:
        meta = pod["metadata"]
        if exit_code is None:
            cluster.kubectl("label", "pod", meta["name"], "-n", meta["namespace"], f"{POD_COMPLETE_LABEL}=true")
        else:
            cluster.kubectl("annotate", "pod", meta["name"], "-n", meta["namespace"], f"{POD_FAILED_EXIT_CODE}={exit_code}")
            cluster.kubectl("label", "pod", meta["name"], "-n", meta["namespace"], f"{POD_FAILED_LABEL}=true")


def phase(job_client_, name: str, team: str, phases, cluster, namespace: str, timeout_s: float = END_S):
    return wait(cluster, namespace, lambda: job_client_.get(name, team).phase in phases and job_client_.get(name, team),
                f"{name} reaches {phases}", timeout_s)


def pool(cluster, spec_pool: str) -> dict[str, Any]:
    for candidate in cluster.layer.of_kind("NodePool"):
        if candidate["spec"]["template"]["metadata"]["labels"].get("mlplatform.io/pool") == spec_pool:
            return candidate
    raise AssertionError(f"no NodePool for pool {spec_pool}")


def pool_of(cluster, raw: dict[str, Any]) -> str:
    """The pool a job spec runs on: its ``pool``, or the pool of its GPU type (a shared one when
    it asks for a share or a slice) as the renderer picks it."""
    if raw.get("pool"):
        return raw["pool"]
    gpu = raw.get("gpu") or {}
    gpu_type = raw.get("gpuType") or gpu.get("type")
    shared = bool(raw.get("shared") or gpu.get("slice"))
    for candidate in cluster.layer.of_kind("NodePool"):
        labels = candidate["spec"]["template"]["metadata"]["labels"]
        if labels.get("mlplatform.io/gpu-type") == gpu_type and ("mlplatform.io/gpu-sharing" in labels) == shared:
            return labels["mlplatform.io/pool"]
    raise AssertionError(f"no pool offers {gpu_type} (shared: {shared})")


def node(cluster, name: str) -> dict[str, Any]:
    return cluster.api.get(f"/api/v1/nodes/{name}")


def node_claim(cluster, node_name: str) -> Optional[dict[str, Any]]:
    return next((c for c in cluster.api.get("/apis/karpenter.sh/v1/nodeclaims")["items"]
                 if c.get("status", {}).get("nodeName") == node_name), None)


def release_empty_nodes(cluster, spec_pool: str) -> None:
    """Delete the NodeClaims of the pool's nodes that run no pod but DaemonSet ones, and wait until
    they are gone: what Karpenter's consolidation does once the pool's ``consolidateAfter`` has
    passed (minutes: prod's a100-reserved 30m), which a test cannot wait for. A test that needs
    the whole pool otherwise finds earlier tests' empty nodes holding places under the pool's
    limits, in whichever zone they were launched, while its job's pods must share one zone."""
    pool_name = pool(cluster, spec_pool)["metadata"]["name"]
    busy = {p["spec"].get("nodeName") for p in cluster.api.get("/api/v1/pods")["items"]
            if p["status"].get("phase") not in ("Succeeded", "Failed")
            and not any(o.get("kind") == "DaemonSet" for o in p["metadata"].get("ownerReferences", []))}
    claims = [c["metadata"]["name"] for c in cluster.api.get("/apis/karpenter.sh/v1/nodeclaims")["items"]
              if c["metadata"].get("labels", {}).get("karpenter.sh/nodepool") == pool_name
              and c.get("status", {}).get("nodeName") and c["status"]["nodeName"] not in busy]
    for claim in claims:
        cluster.kubectl("delete", "nodeclaim", claim, "--wait=false", "--ignore-not-found", check=False)
    eventually(lambda: not any(cluster.api.get_or_none(f"/apis/karpenter.sh/v1/nodeclaims/{c}") for c in claims),
               f"{cluster.stack}: the empty nodes of {pool_name} released ({', '.join(claims) or 'none'})", LAUNCH_S,
               interval_s=1)


def workload_of(cluster, job_uid: str, namespace: str) -> Optional[dict[str, Any]]:
    for candidate in cluster.api.get(f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{namespace}/workloads")["items"]:
        if any(ref.get("uid") == job_uid for ref in candidate["metadata"].get("ownerReferences", [])):
            return candidate
    return None


def container_log(cluster, pod: dict[str, Any], container: str = "pytorch") -> str:
    meta = pod["metadata"]
    found = list((cluster.plane.workdir / "kubelet" / "logs").glob(
        f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}_{container}.log"))
    return found[0].read_text(errors="replace") if found else ""


class _Spare:
    def __init__(self, cluster, pool_name: str):
        self.cluster, self.pool_name, self.cordoned = cluster, pool_name, set()

    def keep(self, nodes) -> None:
        """Cordon every node of the pool but ``nodes`` (the test's own)."""
        for node in self.cluster.api.get("/api/v1/nodes", labelSelector=f"karpenter.sh/nodepool={self.pool_name}")["items"]:
            name = node["metadata"]["name"]
            if name not in nodes and not node["spec"].get("unschedulable"):
                self.cluster.api.merge_patch(f"/api/v1/nodes/{name}", {"spec": {"unschedulable": True}})
                self.cordoned.add(name)


@contextmanager
def no_spare_nodes(cluster, spec_pool: str):
    """While inside, the pool's nodes other than the ones ``keep`` names are cordoned (nodes other
    tests left, empty until the pool consolidates them); uncordoned after."""
    spare = _Spare(cluster, pool(cluster, spec_pool)["metadata"]["name"])
    try:
        yield spare
    finally:
        for name in spare.cordoned:
            if cluster.api.get_or_none(f"/api/v1/nodes/{name}"):
                cluster.api.merge_patch(f"/api/v1/nodes/{name}", {"spec": {"unschedulable": False}})


def node_overlay(cluster, pool_name: str) -> Optional[dict[str, Any]]:
    """The NodeOverlay that applies to a NodePool (its ``karpenter.sh/nodepool In`` requirement)."""
    for overlay in cluster.layer.of_kind("NodeOverlay"):
        for requirement in overlay["spec"].get("requirements", []):
            if requirement["key"] == "karpenter.sh/nodepool" and requirement["operator"] == "In" \
                    and pool_name in requirement.get("values", []):
                return overlay
    return None


def gitops_runs_completed(cluster) -> None:
    """Every training job the stack's GitOps render installs (prod: the team's ``gpt2-pretrain``,
    2 x 8 H100) run to completion: Argo CD would start it, and while it ran it would hold its
    team's quota and its pool's nodes, so a test's job of that team would wait behind it. Its
    training processes are told to complete once they run; the job stays stored (Succeeded), as
    the layer declares it."""
    for obj in cluster.layer.gitops_objects:
        if obj.get("kind") != "PyTorchJob":
            continue
        name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
        path = f"/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs/{name}"
        if {"Succeeded", "Failed"} & set(true_conditions(cluster.api.get(path))):
            continue
        replicas = sum(int(r.get("replicas", 1)) for r in obj["spec"]["pytorchReplicaSpecs"].values())
        end_pods(cluster, running_pods(cluster, name, namespace, replicas))
        wait(cluster, namespace, lambda: "Succeeded" in true_conditions(cluster.api.get(path)),
             f"the GitOps-installed {namespace}/{name} Succeeded", END_S)
