"""Every GPU pool's node becomes schedulable: each startup taint is lifted by something the stack
deploys, and a GPU pod then lands on the node (the real scheduler decides).

Karpenter's rule for startup taints (karpenter v1.14.1 pkg/apis/v1/nodepool.go): "startupTaints
are taints that are applied to nodes upon startup which are expected to be removed automatically
within a short period of time, typically by a DaemonSet that tolerates the taint. [...] pods are
not required to tolerate a StartupTaint in order to have nodes provisioned for them." So a
startup taint nobody removes leaves a node that Karpenter launched for a pod the pod can never
use (audit aws-readiness-4, R1: dev's FSx taint with no FSx driver).

The node is what Karpenter registers for the pool (tools/cluster/standins.py ``node_for_pool``),
kept alive by kwok; the platform's DaemonSets are placed on it by the real DaemonSet controller
and scheduler; the owners of startup taints are stand-ins that lift a taint only when the stack
deploys its owner (and, for a DaemonSet of ours, when its pod is Ready on that node).
"""
from __future__ import annotations

import json

import pytest

from tools.cluster.controlplane import missing_tools
from tools.cluster.standins import (STARTUP_TAINT_OWNERS, TaintLifter, node_for_pool, start_kwok,
                                    wait_for)


@pytest.fixture(scope="module")
def kwok(stack_cluster):
    if missing_tools(("kwok",)):
        pytest.skip("kwok not built (make cluster-tools)")
    start_kwok(stack_cluster.plane)
    return stack_cluster


def _exclusive_gpu_pools(layer):
    """Pools whose nodes offer whole GPUs (shared pools advertise slices under other names)."""
    pools = []
    for pool in layer.of_kind("NodePool"):
        taints = {t["key"] for t in pool["spec"]["template"]["spec"].get("taints", [])}
        if "nvidia.com/gpu" in taints and "mlplatform.io/gpu-sharing" not in taints:
            pools.append(pool)
    return pools


def _pods_on(cluster, node):
    return json.loads(cluster.kubectl("get", "pods", "-A", "--field-selector", f"spec.nodeName={node}",
                                      "-o", "json").stdout)["items"]


def test_every_startup_taint_has_an_owner_the_stack_deploys(stack_cluster):
    """The table of owners covers every startup taint any pool declares (a new taint needs an
    owner here, and a deployed owner in the stack)."""
    unknown = sorted({t["key"] for p in stack_cluster.layer.of_kind("NodePool")
                      for t in p["spec"]["template"]["spec"].get("startupTaints", [])} - set(STARTUP_TAINT_OWNERS))
    assert not unknown, f"startup taints with no known owner: {unknown}"


def test_a_gpu_pod_schedules_on_every_exclusive_gpu_pool(kwok):
    cluster = kwok
    daemonsets = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in cluster.layer.of_kind("DaemonSet")}
    pools = _exclusive_gpu_pools(cluster.layer)
    assert pools, f"{cluster.stack} has no exclusive GPU pool"
    failures = []
    with TaintLifter(cluster.plane, cluster.layer.addons, daemonsets) as lifter:
        for pool in pools:
            pool_name = pool["metadata"]["name"]
            node_name = f"{pool_name}-node"
            node = node_for_pool(pool, node_name, {"cpu": "46", "memory": "180Gi", "pods": "110",
                                                  "nvidia.com/gpu": "4", "ephemeral-storage": "500Gi"})
            status = node.pop("status")
            cluster.kubectl("create", "-f", "-", input=json.dumps(node))
            cluster.kubectl("patch", "node", node_name, "--subresource=status", "--type=merge",
                            "-p", json.dumps({"status": status}))
            pod = {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"train-{pool_name}", "namespace": "default"},
                "spec": {
                    # The toleration for nvidia.com/gpu is added by the ExtendedResourceToleration
                    # admission plugin EKS enables (the pod requests nvidia.com/gpu).
                    "nodeSelector": {"karpenter.sh/nodepool": pool_name},
                    "containers": [{"name": "trainer", "image": "trainer:test",
                                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                },
            }
            cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
            try:
                wait_for(lambda: json.loads(cluster.kubectl("get", "pod", f"train-{pool_name}", "-n", "default",
                                                            "-o", "json").stdout)["spec"].get("nodeName"),
                         f"pod on {pool_name}", timeout_s=90)
            except TimeoutError:
                taints = json.loads(cluster.kubectl("get", "node", node_name, "-o", "json").stdout)["spec"].get("taints", [])
                events = cluster.kubectl("get", "events", "-n", "default", "--field-selector",
                                         f"involvedObject.name=train-{pool_name}", "-o",
                                         "jsonpath={.items[*].message}").stdout
                left = [t["key"] for t in taints if t["key"] in STARTUP_TAINT_OWNERS]
                owners = {k: (STARTUP_TAINT_OWNERS[k].addon or "/".join(STARTUP_TAINT_OWNERS[k].daemonset or ()))
                          for k in left}
                placed = [p["metadata"]["name"] for p in _pods_on(cluster, node_name)]
                failures.append(f"{cluster.stack} pool {pool_name}: the GPU pod never scheduled; startup taints "
                                f"never lifted: {owners} (owners the stack deploys: add-ons {sorted(cluster.layer.addons)}, "
                                f"DaemonSets {sorted(daemonsets)}; pods on the node: {placed}); scheduler: {events}")
    assert not failures, "\n".join(failures)
    # Every node above was registered with its pool's startup taints (node_for_pool), so a scheduled
    # pod means they were lifted: by this lifter, or by the same stand-in the session's controllers
    # run (tests/cluster/test_job_lifecycle_live.py), whichever saw the owner's pod Ready first.
    declared = {t["key"] for p in pools for t in p["spec"]["template"]["spec"].get("startupTaints", [])}
    assert declared, f"{cluster.stack}: no exclusive GPU pool declares a startup taint: nothing was tested"
