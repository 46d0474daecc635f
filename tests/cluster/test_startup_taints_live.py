"""Every GPU pool's node becomes usable: each startup taint is lifted by its owner's pod once it runs
on the node, the device plugin advertises the pool's GPUs or slices, and a GPU pod then lands there
(the real scheduler decides).

Karpenter's rule for startup taints (karpenter v1.14.1 pkg/apis/v1/nodepool.go): "startupTaints
are taints that are applied to nodes upon startup which are expected to be removed automatically
within a short period of time, typically by a DaemonSet that tolerates the taint. [...] pods are
not required to tolerate a StartupTaint in order to have nodes provisioned for them." So a
startup taint nobody removes leaves a node that Karpenter launched for a pod the pod can never
use (dev's FSx taint with no FSx driver did exactly that once).

The node is what Karpenter registers for the pool (``standins.node_for_pool``: template labels,
taints + startup taints; an instance type of the pool; cpu, memory and pods only). The real
DaemonSet controller and scheduler place the stack's DaemonSets on it (the storage drivers' node
plugins, the readiness agent, the MIG gate, the device plugins, each with the tolerations the stack
or the add-on gives it); each owner lifts its taint once its pod is Ready there
(``workloads.karpenter.STARTUP_TAINT_OWNERS``, with the upstream code each runs). A DaemonSet whose
tolerations miss one of the pool's taints never runs there, and its taint, or the GPUs, never go.
"""
from __future__ import annotations

from tests.cluster.lifecycle import node_overlay
from tools.cluster.api import eventually
from tools.cluster.aws import _offers, catalog_instance_types
from tools.cluster.standins import node_for_pool
from workloads.karpenter import STARTUP_TAINT_OWNERS


def _gpu_pools(layer):
    return [p for p in layer.of_kind("NodePool")
            if any(t["key"] == "nvidia.com/gpu" for t in p["spec"]["template"]["spec"].get("taints", []))]


def _instance_type(pool) -> dict:
    requirements = pool["spec"]["template"]["spec"].get("requirements", [])
    return next(it for it in catalog_instance_types() if _offers(it, requirements))


def _slice_resource(cluster, pool) -> str:
    """The resource a pod of this pool asks for: the NodeOverlay's slices on a shared pool, else GPUs."""
    overlay = node_overlay(cluster, pool["metadata"]["name"])
    if overlay is None:
        return "nvidia.com/gpu"
    return next(k for k in overlay["spec"].get("capacity", {}) if k.startswith("nvidia.com/"))


def test_every_gpu_pools_node_loses_its_startup_taints_and_takes_a_gpu_pod(stack_cluster, scope):
    cluster = stack_cluster
    pools = _gpu_pools(cluster.layer)
    assert pools, f"{cluster.stack} has no GPU pool"
    declared = {t["key"] for p in pools for t in p["spec"]["template"]["spec"].get("startupTaints", [])}
    assert declared <= set(STARTUP_TAINT_OWNERS), f"startup taints with no owner: {declared - set(STARTUP_TAINT_OWNERS)}"
    failures = []
    for pool in pools:
        pool_name = pool["metadata"]["name"]
        node_name = scope.name(pool_name)[:63]
        instance = _instance_type(pool)
        capacity = {"cpu": instance["resources"]["cpu"], "memory": instance["resources"]["memory"], "pods": "110",
                    "ephemeral-storage": "500Gi"}
        node = node_for_pool(pool, node_name, capacity)
        node["metadata"]["labels"].update({"node.kubernetes.io/instance-type": instance["name"],
                                           "karpenter.sh/capacity-type": "on-demand"})
        status = node.pop("status")
        cluster.api.create("/api/v1/nodes", node)
        cluster.api.merge_patch(f"/api/v1/nodes/{node_name}/status", {"status": status})
        resource = _slice_resource(cluster, pool)
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": scope.name(f"gpu-{pool_name}")[:63], "namespace": "default"},
               "spec": {
                   # nvidia.com/gpu's toleration is added by the ExtendedResourceToleration admission
                   # plugin EKS enables; a shared pool's taint is tolerated as Kueue's flavor does.
                   "nodeSelector": {"kubernetes.io/hostname": node_name},
                   "tolerations": [{"key": t["key"], "operator": "Exists"} for t in pool["spec"]["template"]["spec"].get("taints", [])],
                   "containers": [{"name": "trainer", "image": "trainer:test", "resources": {"limits": {resource: "1"}}}]}}
        cluster.api.create("/api/v1/namespaces/default/pods", pod)
        recreated = []

        def bound():
            current = cluster.api.get_or_none(f"/api/v1/namespaces/default/pods/{pod['metadata']['name']}")
            if current is None and len(recreated) < 2:
                # Kubernetes' taint-eviction controller can delete a pod bound just after a NoExecute
                # startup taint was lifted, its node cache still holding the taint (an open upstream
                # race, kubernetes/kubernetes#139992, seen on EKS with agent-not-ready taints). A job's
                # pod is recreated by its controller; this bare pod is recreated here, at most twice.
                recreated.append(pool_name)
                cluster.api.create("/api/v1/namespaces/default/pods", pod)
                return None
            return current and current["spec"].get("nodeName")
        try:
            eventually(bound, f"pod on {pool_name}", 180)
        except TimeoutError:
            current = cluster.api.get(f"/api/v1/nodes/{node_name}")
            left = [t["key"] for t in current["spec"].get("taints", []) if t["key"] in STARTUP_TAINT_OWNERS]
            owners = {k: "/".join(STARTUP_TAINT_OWNERS[k].daemonset) for k in left}
            placed = [p["metadata"]["name"] for p in cluster.api.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node_name}")["items"]]
            events = cluster.kubectl("get", "events", "-n", "default", "--field-selector",
                                     f"involvedObject.name={pod['metadata']['name']}", "-o",
                                     "jsonpath={.items[*].message}").stdout
            failures.append(f"{cluster.stack} pool {pool_name}: the {resource} pod never scheduled; startup taints never "
                            f"lifted: {owners}; allocatable {current['status'].get('allocatable')}; pods on the node: "
                            f"{placed}; scheduler: {events}; deleted and recreated {len(recreated)} time(s)")
        finally:
            cluster.api.delete(f"/api/v1/namespaces/default/pods/{pod['metadata']['name']}", {"gracePeriodSeconds": 0})
            cluster.api.delete(f"/api/v1/nodes/{node_name}")
    assert not failures, "\n".join(failures)
