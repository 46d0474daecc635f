"""Helpers for tests that place their own objects on the test cluster's nodes.

- ``node_for_pool``: the Node Karpenter registers for a NodeClaim of a pool (karpenter v1.14.1
  pkg/controllers/nodeclaim/lifecycle/launch.go and registration.go: template labels, the
  ``karpenter.sh/nodepool`` label, ``taints`` + ``startupTaints``), annotated so kwok keeps it
  alive and the harness's kubelet runs its pods. Its device-plugin resources come from the
  device plugins, as on a real node (tools/cluster/kubelet.py).
- The labels a test sets on a simulated pod to end it (``POD_COMPLETE_LABEL``; ``POD_FAILED_LABEL``
  with the exit code in ``POD_FAILED_EXIT_CODE``), read by the kubelet.
- ``wait_for``: the harness's one wait (tools.cluster.api.eventually) under the name tests used.
"""
from __future__ import annotations

from typing import Any, Iterable

from tools.cluster.api import eventually
from tools.cluster.kubelet import POD_COMPLETE_LABEL, POD_FAILED_EXIT_CODE, POD_FAILED_LABEL
from tools.cluster.nodes import KWOK_ANNOTATION

__all__ = ["KWOK_ANNOTATION", "POD_COMPLETE_LABEL", "POD_FAILED_EXIT_CODE", "POD_FAILED_LABEL", "node_for_pool",
           "wait_for"]


def _requirement_labels(requirements: Iterable[dict[str, Any]]) -> dict[str, str]:
    labels = {}
    for requirement in requirements:
        if requirement.get("operator") == "In" and requirement.get("values"):
            labels[requirement["key"]] = requirement["values"][0]
    return labels


def node_for_pool(pool: dict[str, Any], name: str, capacity: dict[str, str]) -> dict[str, Any]:
    """The Node Karpenter registers for a NodeClaim of ``pool`` (see the module docstring)."""
    template = pool["spec"]["template"]
    spec = template["spec"]
    labels = {**_requirement_labels(spec.get("requirements", [])), **template.get("metadata", {}).get("labels", {}),
              "karpenter.sh/nodepool": pool["metadata"]["name"], "kubernetes.io/hostname": name,
              "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "type": "kwok"}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": dict(KWOK_ANNOTATION)},
        "spec": {"taints": [*spec.get("taints", []), *spec.get("startupTaints", [])]},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def wait_for(predicate, what: str, timeout_s: float = 60.0, interval_s: float = 0.5):
    return eventually(predicate, what, timeout_s, interval_s)
