"""What the job tests share: submitting the stack's examples as a team, reading back what the
controllers did, and ending a simulated run.

Jobs are submitted with ``JobClient`` as the identity the plan's access entries give the team
(tests/cluster/identities.py), named with the test's scope prefix (tests/cluster/isolation.py).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import yaml

from jobs.store import LocalStore
from tests.cluster.identities import job_client
from tools.cluster.api import eventually
from tools.cluster.kubelet import POD_COMPLETE_LABEL, POD_FAILED_EXIT_CODE, POD_FAILED_LABEL

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = {"dev": "examples/jobs/l4-dev-smoke.yaml", "prod": "examples/jobs/gpt2-pretrain.yaml"}
# Bounded waits: a real controller on a loaded 2-core machine, not a sleep standing for a result.
ADMIT_S, LAUNCH_S, RUN_S, END_S = 240, 300, 300, 240


def client(cluster, team: str):
    # Checkpoints: an empty local store stands for the bucket (nothing here trains, so there is
    # nothing to read; no AWS call).
    return job_client(cluster, team, store=LocalStore(str(cluster.plane.workdir / "checkpoints")))


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


def node(cluster, name: str) -> dict[str, Any]:
    return cluster.api.get(f"/api/v1/nodes/{name}")


def node_claim(cluster, node_name: str) -> Optional[dict[str, Any]]:
    return next((c for c in cluster.api.get("/apis/karpenter.sh/v1/nodeclaims")["items"]
                 if c.get("status", {}).get("nodeName") == node_name), None)


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
