"""GPU nodes as Karpenter runs them with the stack's settings: GPUs from the device plugin, shared
pools, and a faulty GPU node replaced (with the brake on replacing many at once).

Karpenter runs from its chart with the stack's values (``settings.featureGates``: ``nodeOverlay``
and ``nodeRepair`` on) as its own service account, with the AWS provider's repair policies
(tools/cluster/karpenter/cmd/karpenter-kwok-aws). A node registers with cpu, memory and pods only,
as a kubelet does; ``nvidia.com/*`` and ``vpc.amazonaws.com/efa`` appear once the chart's device
plugin pod is Ready on it (tools/cluster/kubelet.py), and Karpenter's initialization
("requested resources registered", karpenter v1.14.1 nodeclaim/lifecycle/initialization.go) waits
for them.
"""
from __future__ import annotations

import math
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

from tests.cluster import lifecycle as lc
from trainer.gpu_faults import gpu_fault, xid_actions
from trainer.launch import report_gpu_fault
from workloads import node_health_agent as agent
from workloads import run_recorder as rr

SHARED_EXAMPLE = {"dev": "examples/jobs/l4-shared-slice.yaml", "prod": "examples/jobs/h100-mig-slice.yaml"}
# A multi-node job on a pool of one-GPU nodes (dev) or the smallest GPU pool a team may fill (prod).
MULTI_NODE = {"dev": ("examples/jobs/l4-dev-smoke.yaml", {"nodes": 2}),
              "prod": ("examples/jobs/a100-reserved-continued-pretrain.yaml", {"nodes": 2})}
DEVICE_RESOURCES = ("nvidia.com/", "vpc.amazonaws.com/efa")
# Xid 79, "GPU has fallen off the bus": the readiness agent's action is to replace the node.
DRIVER_ERROR = "CUDA error: unspecified launch failure; NVRM: Xid (PCI:0000:53:00): 79, pid=1234, GPU has fallen off the bus."


@pytest.fixture
def cluster(stack_cluster):
    return stack_cluster


class NodeHistory:
    """Every version of every Karpenter node, from a watch started before the node exists."""

    def __init__(self, cluster):
        self.versions: dict[str, list[dict]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(cluster,), daemon=True)

    def __enter__(self):
        self._thread.start()
        time.sleep(1)
        return self

    def __exit__(self, *exc):
        self._stop.set()

    def _watch(self, cluster):
        while not self._stop.is_set():
            try:
                for event in cluster.api.watch("/api/v1/nodes", timeout_s=60, labelSelector="karpenter.sh/nodepool"):
                    node = event.get("object") or {}
                    if "metadata" in node:
                        self.versions.setdefault(node["metadata"]["name"], []).append(node)
                    if self._stop.is_set():
                        return
            except Exception:  # noqa: BLE001 - a watch ends every minute: start another
                time.sleep(0.5)


def device_resources(node: dict) -> dict[str, str]:
    allocatable = node.get("status", {}).get("allocatable") or {}
    return {k: v for k, v in allocatable.items() if k.startswith(DEVICE_RESOURCES) and v != "0"}


def daemonset_pod(cluster, node_name: str, namespace: str, daemonset: str):
    for pod in cluster.api.get(f"/api/v1/namespaces/{namespace}/pods", fieldSelector=f"spec.nodeName={node_name}")["items"]:
        if any(r.get("kind") == "DaemonSet" and r.get("name") == daemonset for r in pod["metadata"].get("ownerReferences", [])):
            return pod
    return None


def test_gpus_appear_on_a_node_only_once_the_device_plugin_runs_there(cluster, scope):
    """A job's node registers without any device-plugin resource; the GPUs (and EFA devices) the
    instance has appear only after the chart's device-plugin pod, placed by the real DaemonSet
    controller past the node's taints and startup taints, is Ready there; only then does
    Karpenter initialize the node and the job's pods start. A device plugin whose tolerations
    missed one of the pool's taints would never run there: no GPU, no job."""
    raw = lc.example(cluster, scope, "plugin")
    client = lc.client(cluster, raw["team"])
    with lc.no_spare_nodes(cluster, lc.pool_of(cluster, raw)) as spare, NodeHistory(cluster) as history:
        spare.keep(())  # the job needs a new node, watched from its first version
        submitted = client.submit(client.load(raw))
        pods = lc.running_pods(cluster, submitted.job.name, submitted.job.namespace, submitted.job.nodes)
    pool = lc.pool(cluster, submitted.job.pool)
    plugins = {(p["namespace"], p["daemonset"], p["kind"]) for p in _device_plugins(cluster)}
    assert plugins, f"{cluster.stack}: no device plugin is deployed"
    for node_name in {p["spec"]["nodeName"] for p in pods}:
        versions = history.versions.get(node_name) or [lc.node(cluster, node_name)]
        assert not device_resources(versions[0]), f"{node_name} registered with {device_resources(versions[0])}"
        final = lc.node(cluster, node_name)
        have = device_resources(final)
        facts = cluster.aws_instance_facts(final["metadata"]["labels"]["node.kubernetes.io/instance-type"])
        gpu_resources = {k: v for k, v in have.items() if k.startswith("nvidia.com/")}
        assert sum(int(v) for v in gpu_resources.values()) >= facts["gpus"], (have, facts)
        if facts["efa"] and pool["spec"]["template"]["metadata"]["labels"].get("mlplatform.io/efa") == "true":
            assert have.get("vpc.amazonaws.com/efa") == str(facts["efa"]), have
        ready_plugins = [d for (ns, d, kind) in plugins if (pod := daemonset_pod(cluster, node_name, ns, d)) and lc.ready(pod)]
        assert ready_plugins, f"{node_name} has {have} but no device-plugin pod Ready on it"


def _device_plugins(cluster):
    return cluster.aws.device_plugins()


def test_a_shared_gpu_pool_launches_its_node_and_packs_slices_onto_it(cluster, scope):
    """A job asking for one slice (dev: a time-sliced L4 share, ``nvidia.com/gpu.shared``; prod: a
    MIG 1g.10gb slice of an H100, ``nvidia.com/mig-1g.10gb``) is admitted by Kueue to the shared
    pool's flavor; Karpenter launches that pool's node only because the pool's NodeOverlay tells it
    the instance type offers slices (the ``NodeOverlay`` gate the stack turns on); the node's
    device plugin advertises as many slices as the overlay declared (time-slicing: the plugin's
    own config, ``replicas`` renamed ``.shared``; MIG: the MIG manager's layout once it reports
    success, which lifts the MIG gate's startup taint); a second slice job then lands on the same
    node."""
    path = SHARED_EXAMPLE[cluster.stack]
    first_raw = lc.example(cluster, scope, "slice-1", path=path)
    client = lc.client(cluster, first_raw["team"])
    first = client.submit(client.load(first_raw)).job
    (pod,) = lc.running_pods(cluster, first.name, first.namespace, 1)
    node_name = pod["spec"]["nodeName"]
    node = lc.node(cluster, node_name)
    overlay = lc.node_overlay(cluster, node["metadata"]["labels"]["karpenter.sh/nodepool"])
    assert overlay, f"no NodeOverlay for {node['metadata']['labels']['karpenter.sh/nodepool']}"
    declared = {k: v for k, v in (overlay["spec"].get("capacity") or {}).items() if k.startswith("nvidia.com/")}
    assert declared, overlay
    assert {k: v for k, v in device_resources(node).items() if k in declared} == declared, (device_resources(node), declared)
    requested = {k for c in pod["spec"]["containers"] for k in (c.get("resources", {}).get("requests") or {})
                 if k.startswith("nvidia.com/")}
    assert requested and requested <= set(declared), (requested, declared)

    # The first slice may have landed on an empty node an earlier test left, just as Karpenter
    # consolidates it (it taints the node karpenter.sh/disrupted:NoSchedule, then deletes it:
    # karpenter v1.14.1 pkg/controllers/disruption/queue.go ``markDisrupted``); the second would
    # then need another node. Such a node is not the pool's packing: it must settle first.
    lc.wait(cluster, first.namespace, lambda: not rr.node_disrupted(cluster.api.get_or_none(f"/api/v1/nodes/{node_name}")),
            f"{node_name} not being disrupted", 60)
    # The pool's other nodes (empty ones earlier tests left) are cordoned meanwhile: the scheduler's
    # default scoring (NodeResourcesFit LeastAllocated) would rather spread the second slice there.
    with lc.no_spare_nodes(cluster, lc.pool_of(cluster, first_raw)) as spare:
        spare.keep([node_name])
        second_raw = lc.example(cluster, scope, "slice-2", path=path)
        second = client.submit(client.load(second_raw)).job
        (other,) = lc.running_pods(cluster, second.name, second.namespace, 1)
    assert other["spec"]["nodeName"] == node_name, f"the second slice went to {other['spec']['nodeName']}, not {node_name}"


def _agent_api(cluster, node_name: str) -> agent.KubeApi:
    """The readiness agent's own identity on ``node_name``: its ServiceAccount's token bound by the
    TokenRequest API to its DaemonSet's pod there (the API server writes the node into the token;
    the own-node policy reads it)."""
    import ssl
    daemonset = next(d for d in cluster.layer.of_kind("DaemonSet") if d["metadata"]["name"] == "gpu-node-health")
    namespace = daemonset["metadata"]["namespace"]
    pod = lc.wait(cluster, namespace, lambda: daemonset_pod(cluster, node_name, namespace, "gpu-node-health"),
                  f"the readiness agent's pod on {node_name}", 60)
    account = daemonset["spec"]["template"]["spec"]["serviceAccountName"]
    token = cluster.kubectl("create", "token", account, "-n", namespace, "--bound-object-kind=Pod",
                            f"--bound-object-name={pod['metadata']['name']}",
                            f"--bound-object-uid={pod['metadata']['uid']}").stdout.strip()
    token_file = cluster.plane.workdir / f"agent-token-{node_name}"
    token_file.write_text(token)
    return agent.KubeApi(base_url=cluster.plane.server, token_path=str(token_file),
                         context=ssl.create_default_context(cafile=str(cluster.plane.pki.ca_cert)))


def _mark_faulty(cluster, node_name: str, tmp_path, monkeypatch) -> None:
    """The readiness agent's code, as its identity, marks the node after a trainer's GPU fault: the
    termination message is the one ``trainer.launch.report_gpu_fault`` writes for rank 0."""
    log = tmp_path / f"termination-{node_name}"
    log.write_text("")
    monkeypatch.setenv("NODE_NAME", node_name)
    report_gpu_fault([{"rank": 0, "local_rank": 0, "gpu_fault": gpu_fault(RuntimeError(DRIVER_ERROR))}], path=str(log))
    pod = {"metadata": {"name": "trainer", "namespace": "jobs", "uid": f"uid-{node_name}"},
           "spec": {"nodeName": node_name},
           "status": {"containerStatuses": [{"name": "pytorch", "containerID": f"containerd://{node_name}",
                                             "state": {"terminated": {"exitCode": 135, "message": log.read_text()}}}]}}
    [fault] = agent.pod_gpu_faults(pod, node_name, xid_actions())
    assert agent.mark_gpu_fault(_agent_api(cluster, node_name), node_name, fault)


def _time_passes(cluster, node_name: str, minutes: int = 31) -> None:
    """The repair policies wait minutes after the condition turns (AWS provider v1.14.1:
    ``AcceleratedHardwareReady`` False tolerated 10 minutes, the others 30): instead of waiting,
    the condition's ``lastTransitionTime``, the one input Karpenter's health controller reads
    (``terminationTime := unhealthyNodeCondition.LastTransitionTime.Add(policyTerminationDuration)``),
    is moved back; the node update also makes Karpenter reconcile it at once."""
    node = lc.node(cluster, node_name)
    conditions = node["status"]["conditions"]
    index = next(i for i, c in enumerate(conditions) if c["type"] == agent.HEALTH_CONDITION)
    past = (datetime.now(timezone.utc) - timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")
    cluster.api.json_patch(f"/api/v1/nodes/{node_name}/status", [
        {"op": "test", "path": f"/status/conditions/{index}/type", "value": agent.HEALTH_CONDITION},
        {"op": "replace", "path": f"/status/conditions/{index}/lastTransitionTime", "value": past}])


def test_a_faulty_gpu_node_is_replaced_and_its_job_resumes(cluster, scope, tmp_path, monkeypatch):
    """Node repair: the readiness agent sets ``AcceleratedHardwareReady=False`` on the node of a
    running job (its own code and identity); past the AWS provider's toleration Karpenter deletes
    the NodeClaim ("deleting unhealthy node"), the node is drained (the trainer exits 143 on the
    kubelet's SIGTERM), the job's pods are recreated and run on a new node."""
    raw = lc.example(cluster, scope, "repair")
    client = lc.client(cluster, raw["team"])
    submitted = client.submit(client.load(raw)).job
    name, namespace = submitted.name, submitted.namespace
    first = lc.running_pods(cluster, name, namespace, submitted.nodes)
    node_name = first[0]["spec"]["nodeName"]
    claim = lc.node_claim(cluster, node_name)["metadata"]["name"]
    _mark_faulty(cluster, node_name, tmp_path, monkeypatch)
    _time_passes(cluster, node_name)
    lc.wait(cluster, namespace, lambda: cluster.api.get_or_none(f"/apis/karpenter.sh/v1/nodeclaims/{claim}") is None,
            f"Karpenter replaces faulty node {node_name} (NodeClaim {claim} gone)", lc.LAUNCH_S)
    on_faulty_node = {p["metadata"]["uid"] for p in first if p["spec"]["nodeName"] == node_name}

    def moved():
        # The drained node's pods are recreated elsewhere; a rank on a healthy node may keep its
        # pod (the operator recreates failed replicas only).
        pods = [p for p in lc.job_pods(cluster, name, namespace) if lc.ready(p) and p["spec"].get("nodeName")]
        if len(pods) != submitted.nodes or any(p["spec"]["nodeName"] == node_name for p in pods):
            return None
        return pods if not on_faulty_node & {p["metadata"]["uid"] for p in pods} else None
    lc.wait(cluster, namespace, moved, f"{name} runs again on another node", lc.RUN_S + lc.LAUNCH_S)
    job = lc.as_json(cluster, "get", "pytorchjob", name, "-n", namespace)
    assert "Failed" not in lc.true_conditions(job), job["status"]


def test_karpenter_does_not_repair_many_faulty_nodes_of_a_pool_at_once(cluster, scope, tmp_path, monkeypatch):
    """Karpenter's brake: no node of a NodePool is repaired while more than 20% of its nodes
    (rounded up) are unhealthy (karpenter v1.14.1 pkg/controllers/node/health/controller.go
    ``allowedUnhealthyPercent = intstr.FromString("20%")``, ``isNodePoolHealthy``); it reports
    NodeRepairBlocked instead. With both nodes of a two-node job faulty the pool is past the
    threshold and both stay; once one recovers, the other is repaired."""
    path, changes = MULTI_NODE[cluster.stack]
    raw = lc.example(cluster, scope, "brake", path=path, **changes)
    client = lc.client(cluster, raw["team"])
    submitted = client.submit(client.load(raw)).job
    pods = lc.running_pods(cluster, submitted.name, submitted.namespace, submitted.nodes)
    nodes = sorted({p["spec"]["nodeName"] for p in pods})
    assert len(nodes) == 2, nodes
    pool_name = lc.node(cluster, nodes[0])["metadata"]["labels"]["karpenter.sh/nodepool"]
    in_pool = cluster.api.get("/api/v1/nodes", labelSelector=f"karpenter.sh/nodepool={pool_name}")["items"]
    threshold = math.ceil(0.2 * len(in_pool))
    assert len(nodes) > threshold, f"{len(in_pool)} nodes in {pool_name}: two faulty ones are within its 20%"
    claims = {n: lc.node_claim(cluster, n)["metadata"]["name"] for n in nodes}
    try:
        _brake_holds_until_one_recovers(cluster, submitted, nodes, claims, tmp_path, monkeypatch)
    finally:
        # The recovered node keeps the agent's cordon (a person clears it after checking the GPU):
        # left behind, it would hold a place in the pool's node limit for the tests after this one.
        # The job goes first, or its pods would be recreated on new nodes.
        cluster.kubectl("delete", "pytorchjob", submitted.name, "-n", submitted.namespace, "--wait=true",
                        timeout_s=lc.END_S, check=False)
        for claim in claims.values():
            cluster.kubectl("delete", "nodeclaim", claim, "--wait=false", "--ignore-not-found", check=False)


def _brake_holds_until_one_recovers(cluster, submitted, nodes, claims, tmp_path, monkeypatch) -> None:
    for node_name in nodes:
        _mark_faulty(cluster, node_name, tmp_path, monkeypatch)
    for node_name in nodes:
        _time_passes(cluster, node_name)

    def blocked():
        events = cluster.api.get("/api/v1/events", fieldSelector="reason=NodeRepairBlocked")["items"]
        return [e for e in events if e["involvedObject"]["name"] in set(nodes) | set(claims.values())]
    events = lc.wait(cluster, submitted.namespace, blocked, f"Karpenter blocks repairing {nodes}", 120)
    assert any("unhealthy" in e["message"] for e in events), [e["message"] for e in events]
    time.sleep(10)
    assert all(cluster.api.get_or_none(f"/apis/karpenter.sh/v1/nodeclaims/{c}") for c in claims.values()), \
        "a node was repaired while the pool was past its unhealthy threshold"

    recovered, faulty = nodes
    node = lc.node(cluster, recovered)
    index = next(i for i, c in enumerate(node["status"]["conditions"]) if c["type"] == agent.HEALTH_CONDITION)
    cluster.api.json_patch(f"/api/v1/nodes/{recovered}/status", [
        {"op": "replace", "path": f"/status/conditions/{index}/status", "value": "True"}])
    _time_passes(cluster, faulty, minutes=32)
    lc.wait(cluster, submitted.namespace,
            lambda: cluster.api.get_or_none(f"/apis/karpenter.sh/v1/nodeclaims/{claims[faulty]}") is None,
            f"{faulty} repaired once it is the only faulty node", lc.LAUNCH_S)
    assert cluster.api.get_or_none(f"/apis/karpenter.sh/v1/nodeclaims/{claims[recovered]}"), "the recovered node went too"
