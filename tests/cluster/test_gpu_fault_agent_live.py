"""The readiness agent marks its node after a trainer's GPU fault the host confirms, and never on a
tenant's word alone, on the real API server, as its real identity.

The agent's code (``workloads.node_health_agent.GpuFaultWatch``: list, then watch, of the pods
with ``fieldSelector=spec.nodeName=<node>``) runs here with the token of the stack's
``gpu-node-health`` ServiceAccount, bound by the real TokenRequest API to a pod on node X; the
API server puts X into the token and the authenticator exposes it as the user extra
``authentication.kubernetes.io/node-name`` (ServiceAccountTokenPodNodeInfo, GA in 1.32), which
the own-node-only admission policy reads. The trainer's pods are given the status the kubelet
writes when a container ends: ``containerStatuses[].state.terminated`` with the exit code and
the termination message, copied from the file the container wrote (k8s.io/kubernetes
pkg/kubelet/kuberuntime/kuberuntime_container.go, ``getTerminationMessage``); the message is
produced by the launcher's own ``report_gpu_fault``. The status is patched with
``system:masters``, as no kubelet runs here.

The host's own record (the kernel log the driver writes Xids into, nvidia-smi's report) is the
agent's ``HostRecord`` with those two sources given as text: a healthy node's, or one whose
driver logged Xid 79 while the container ran. The attack (team A against team B): A's GPU worker
follows B's pods onto B's node, writes the launcher's fault line itself and exits 135.
"""
from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.error
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tools.cluster.api import eventually

from trainer.gpu_faults import EXIT_GPU_FAULT, gpu_fault, xid_actions
from trainer.launch import report_gpu_fault
from workloads import node_health_agent as agent

NODE_X, NODE_Y = "gpu-fault-node-x", "gpu-fault-node-y"
CLEANUP_S = 120
JOBS = "gpu-fault-drill"
# What the driver logs and the rank's CUDA error carries when a GPU falls off the bus.
DRIVER_ERROR = "CUDA error: unspecified launch failure; NVRM: Xid (PCI:0000:53:00): 79, pid=1234, GPU has fallen off the bus."


@dataclass
class AgentIdentity:
    api: agent.KubeApi
    kubeconfig: Path


def _apply(cluster, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))


def _agent_identity(cluster, node: str, tmp_path_factory) -> AgentIdentity:
    """The agent's ServiceAccount token, bound to an agent pod on ``node``."""
    daemon_set = next(d for d in cluster.layer.of_kind("DaemonSet") if d["metadata"]["name"] == "gpu-node-health")
    namespace = daemon_set["metadata"]["namespace"]
    account = daemon_set["spec"]["template"]["spec"]["serviceAccountName"]
    _apply(cluster, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}})
    pod_name = _agent_pod_name(node)
    _apply(cluster, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod_name, "namespace": namespace},
                     "spec": {"nodeName": node, "serviceAccountName": account, "tolerations": [{"operator": "Exists"}],
                              "containers": [{"name": "agent", "image": "agent:test"}]}})
    uid = cluster.kubectl("get", "pod", pod_name, "-n", namespace, "-o", "jsonpath={.metadata.uid}").stdout
    token = cluster.kubectl("create", "token", account, "-n", namespace, "--bound-object-kind=Pod",
                            f"--bound-object-name={pod_name}", f"--bound-object-uid={uid}").stdout.strip()
    token_file = tmp_path_factory.mktemp("agent") / "token"
    token_file.write_text(token)
    context = ssl.create_default_context(cafile=str(cluster.plane.pki.ca_cert))
    api = agent.KubeApi(base_url=cluster.plane.server, token_path=str(token_file), context=context)
    return AgentIdentity(api, cluster.plane.token_kubeconfig(f"gpu-fault-agent-{node}", token))


@pytest.fixture(scope="module")
def agent_on_x(stack_cluster, tmp_path_factory) -> AgentIdentity:
    """The agent's ServiceAccount token, bound to an agent pod on node X."""
    cluster = stack_cluster
    _apply(cluster, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE_Y, "labels": {"kubernetes.io/hostname": NODE_Y}}})
    _apply(cluster, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": JOBS}})
    try:
        yield _agent_identity(cluster, NODE_X, tmp_path_factory)
    finally:
        # What the module made goes with it: the stack's cluster is shared with the other tests.
        cluster.api.delete(f"/api/v1/namespaces/{JOBS}")
        remove(cluster, pods=[_agent_pod(cluster, NODE_X)], nodes=[NODE_X, NODE_Y])
        eventually(lambda: not cluster.api.get_or_none(f"/api/v1/namespaces/{JOBS}"), f"namespace {JOBS} gone",
                   CLEANUP_S, interval_s=1)


def _agent_pod(cluster, node: str) -> str:
    """The path of the agent pod ``_agent_identity`` makes on ``node``."""
    daemon_set = next(d for d in cluster.layer.of_kind("DaemonSet") if d["metadata"]["name"] == "gpu-node-health")
    return f"/api/v1/namespaces/{daemon_set['metadata']['namespace']}/pods/{_agent_pod_name(node)}"


def _agent_pod_name(node: str) -> str:
    return f"gpu-fault-agent-on-{node}"[:63]


def remove(cluster, *, pods: list[str], nodes: list[str]) -> None:
    """Delete the pods (API paths) and the nodes a test made, with the node events the agent
    wrote about them, and wait until they are gone: the next test (or a rerun on a cluster that
    keeps running) starts without them."""
    for path in pods:
        cluster.api.delete(path, {"gracePeriodSeconds": 0})
    for node in nodes:
        cluster.api.delete(f"/api/v1/nodes/{node}")
        for event in cluster.api.get("/api/v1/namespaces/default/events",
                                     fieldSelector=f"involvedObject.name={node}")["items"]:
            cluster.api.delete(f"/api/v1/namespaces/default/events/{event['metadata']['name']}")

    def gone():
        return not any(cluster.api.get_or_none(path) for path in [*pods, *(f"/api/v1/nodes/{n}" for n in nodes)])
    eventually(gone, f"pods {pods} and nodes {nodes} gone", CLEANUP_S, interval_s=1)


# The node booted 10,000 s before the test; the driver's line is stamped with the kernel's uptime.
BOOT_WALL_S = time.time() - 10_000
DATA = Path(__file__).resolve().parents[1] / "workloads" / "data" / "node_health"


def host_record(*, xid_at_wall_s: float | None = None, gpus: int = 8) -> agent.HostRecord:
    """The host as the agent reads it: a kernel log (with the driver's Xid 79 line at
    ``xid_at_wall_s``, or none) and nvidia-smi -q of 8 healthy GPUs."""
    lines = ["<6>[    0.000000] Linux version 6.1.0 (AL2023)", "<6>[   42.000000] nvidia: module loaded"]
    if xid_at_wall_s is not None:
        lines.append(f"<4>[{xid_at_wall_s - BOOT_WALL_S:12.6f}] NVRM: Xid (PCI:0000:53:00): 79, pid=4242, name=python, "
                     "GPU has fallen off the bus.")
    smi = (DATA / "nvidia-smi-q.healthy.txt").read_text()
    return agent.HostRecord(expected_gpus=gpus, expected_efa=0, run=lambda argv, timeout: (0, smi),
                            kernel_log=lambda: "\n".join(lines), boot_wall_s=lambda: BOOT_WALL_S)


def trainer_pod(cluster, name: str, node: str, exit_code: int, message: str) -> str:
    """A trainer pod on ``node`` whose container ended with ``exit_code`` and ``message``, as the
    kubelet reports it. Returns the pod's uid."""
    _apply(cluster, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": JOBS},
                     "spec": {"nodeName": node, "restartPolicy": "Never", "tolerations": [{"operator": "Exists"}],
                              "containers": [{"name": "pytorch", "image": "trainer:test"}]}})
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    container_id = f"containerd://{name}-0123456789abcdef"
    status = {"status": {"phase": "Failed", "containerStatuses": [{
        "name": "pytorch", "ready": False, "restartCount": 0, "started": False, "image": "trainer:test", "imageID": "",
        "containerID": container_id,
        "state": {"terminated": {"exitCode": exit_code, "reason": "Error", "message": message, "startedAt": stamp,
                                 "finishedAt": stamp, "containerID": container_id}}}]}}
    cluster.kubectl("patch", "pod", name, "-n", JOBS, "--subresource=status", "--type=merge", "-p", json.dumps(status))
    return cluster.kubectl("get", "pod", name, "-n", JOBS, "-o", "jsonpath={.metadata.uid}").stdout


def launcher_message(tmp_path: Path, monkeypatch, node: str) -> str:
    """The termination message the launcher writes for rank 1 (local GPU 1) hitting DRIVER_ERROR."""
    log = tmp_path / f"termination-log-{node}"
    log.write_text("")
    monkeypatch.setenv("NODE_NAME", node)
    report_gpu_fault([{"rank": 1, "local_rank": 1, "gpu_fault": gpu_fault(RuntimeError(DRIVER_ERROR))}], path=str(log))
    return log.read_text()


def node_json(cluster, name: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", "node", name, "-o", "json").stdout)


def fault_events(cluster, node: str, reason: str = "GpuFaultReported") -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "events", "-n", "default", "-o", "json",
                          f"--field-selector=reason={reason},involvedObject.name={node}").stdout
    return json.loads(out)["items"]


def marked(node: dict[str, Any]) -> bool:
    meta = node["metadata"]
    return bool(node["spec"].get("unschedulable") or agent.FAILURE_LABEL in (meta.get("labels") or {})
                or agent.GPU_FAULTS_ANNOTATION in (meta.get("annotations") or {}))


def test_the_agent_may_list_and_watch_pods_and_nothing_more(stack_cluster, agent_on_x):
    """The attacker holds the agent's token: it reads pod lists (RBAC cannot narrow that to
    spec.nodeName, KEP-4601 passes selectors to webhook authorizers only), but cannot read a
    pod by name, its logs or Secrets, exec, or create or delete pods."""
    def can(*args):
        return stack_cluster.kubectl("auth", "can-i", *args, kubeconfig=agent_on_x.kubeconfig, check=False).stdout.strip()

    assert can("list", "pods", "-A") == "yes" and can("watch", "pods", "-A") == "yes"
    for args in (("get", "pods/log", "-n", JOBS), ("create", "pods/exec", "-n", JOBS), ("create", "pods", "-n", JOBS),
                 ("delete", "pods", "-n", JOBS), ("get", "secrets", "-n", JOBS), ("get", "pods", "-n", JOBS),
                 ("patch", "pods/status", "-n", JOBS), ("create", "pods/eviction", "-n", JOBS)):
        assert can(*args) == "no", args


def test_a_gpu_fault_on_its_node_marks_it_once_and_nothing_else_does(stack_cluster, agent_on_x, tmp_path, monkeypatch):
    cluster, api = stack_cluster, agent_on_x.api
    actions = xid_actions()
    # Before the agent looks: a spot-preempted pod on X (143, even with a fault message: the exit
    # code decides) and a GPU fault on node Y, which is not the agent's.
    trainer_pod(cluster, "spot-on-x", NODE_X, 143, launcher_message(tmp_path, monkeypatch, NODE_X))
    trainer_pod(cluster, "fault-on-y", NODE_Y, EXIT_GPU_FAULT, launcher_message(tmp_path, monkeypatch, NODE_Y))
    # X's driver logs Xid 79 now: the fault the trainer pod below reports really happened.
    host = host_record(xid_at_wall_s=time.time())
    agent.GpuFaultWatch(api, NODE_X, actions, host, retry_s=1).run(3)
    assert not marked(node_json(cluster, NODE_X)), "a spot exit or another node's fault marked X"
    assert not marked(node_json(cluster, NODE_Y)) and not fault_events(cluster, NODE_Y)
    assert not fault_events(cluster, NODE_X)

    # The agent watches; a trainer container on X ends with the GPU-fault exit.
    watch = agent.GpuFaultWatch(api, NODE_X, actions, host, retry_s=1)
    watcher = threading.Thread(target=watch.run, args=(45,), daemon=True)
    watcher.start()
    # The list is done before the pod exists: the fault can only arrive as a watch event.
    eventually(lambda: watch.resource_version is not None, "the agent lists its node's pods", 20, interval_s=0.1)
    uid = trainer_pod(cluster, "trainer-on-x", NODE_X, EXIT_GPU_FAULT, launcher_message(tmp_path, monkeypatch, NODE_X))
    try:
        eventually(lambda: node_json(cluster, NODE_X)["spec"].get("unschedulable"), "the agent cordons X", 40)
    except TimeoutError:
        pass  # asserted below, with what the node shows
    watcher.join(timeout=60)
    assert not watcher.is_alive(), "the agent's watch outlived its window"
    node = node_json(cluster, NODE_X)
    assert node["spec"].get("unschedulable") is True, "the agent did not cordon its node after the GPU fault"
    assert node["metadata"]["labels"][agent.FAILURE_LABEL] == "gpu-fault"
    [key] = json.loads(node["metadata"]["annotations"][agent.GPU_FAULTS_ANNOTATION])
    assert key.startswith(f"{uid}/pytorch/")
    condition = next(c for c in node.get("status", {}).get("conditions", []) if c["type"] == agent.HEALTH_CONDITION)
    assert (condition["status"], condition["reason"]) == ("False", "GpuFaultReported")  # Xid 79: replace
    [event] = fault_events(cluster, NODE_X)
    for named in (f"{JOBS}/trainer-on-x", "rank 1", "GPU 1", "Xid 79", "action replace", "host: kernel log Xid 79"):
        assert named in event["message"], (named, event["message"])
    assert not marked(node_json(cluster, NODE_Y))

    # A restarted agent lists the same terminated pod again: nothing more happens.
    agent.GpuFaultWatch(api, NODE_X, actions, host, retry_s=1).run(3)
    assert len(fault_events(cluster, NODE_X)) == 1

    # The attacker's seat: the same code, handed node Y's fault, cannot mark Y with X's token.
    pod_y = json.loads(cluster.kubectl("get", "pod", "fault-on-y", "-n", JOBS, "-o", "json").stdout)
    [fault_y] = agent.pod_gpu_faults(pod_y, NODE_Y, actions)
    with pytest.raises(urllib.error.HTTPError) as refused:
        agent.mark_gpu_fault(api, NODE_Y, fault_y)
    body = refused.value.read().decode()
    assert refused.value.code == 403 and "ValidatingAdmissionPolicy" in body and "only the node its pod runs on" in body, body
    assert not marked(node_json(cluster, NODE_Y))


# ---------------------------------------------------------------- team A against team B's node

NODE_B = "gpu-fault-node-of-team-b"


def _as(user: dict[str, Any]) -> list[str]:
    return [f"--as={user['username']}", *(f"--as-group={g}" for g in user["groups"] if g != "system:authenticated")]


TEST_PLACED = "placed-by-the-test"


def _bind(cluster, pod: dict[str, Any], node: str) -> None:
    """Bound as the scheduler binds: the pods/binding subresource, once Kueue has admitted the
    pod. Kueue's plain-pod integration gates every pod of a team namespace at creation (its pod
    webhook: `gate(&pod.pod)`), and the API server refuses to bind a gated pod ("pod ... has
    non-empty .spec.schedulingGates"); Kueue lifts the gate when the team's quota admits it."""
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    eventually(lambda: not json.loads(cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout)
               ["spec"].get("schedulingGates"), f"Kueue admits {namespace}/{name}", 120)
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod["metadata"]["name"]},
               "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    cluster.kubectl("create", "--raw", f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}/binding",
                    "-f", "-", input=json.dumps(binding))


@pytest.mark.parametrize("stack_cluster", ["prod"], indirect=True)
def test_team_a_cannot_get_team_bs_node_cordoned(stack_cluster, tmp_path_factory, tmp_path, monkeypatch):
    """The attack, step by step, each step as the identity that takes it on a real cluster:

    1. Team B's training worker runs on a GPU node.
    2. Team A submits a GPU worker whose template follows B's workers there (required podAffinity,
       namespaceSelector on B, topologyKey hostname): the Training Operator creates that pod. The
       API server refuses it (mlplatform-team-pod-placement), and the PyTorchJob carrying that
       template is refused when the team member submits it (mlplatform-team-queue-label-pytorchjobs).
    3. Co-located anyway (shared MIG and time-sliced pools put teams together by design), A's worker
       writes the launcher's own fault line for Xid 79 and exits 135. The node's agent reads it,
       finds nothing in the host's record (no Xid in the kernel log, nvidia-smi healthy), records
       GpuFaultNotConfirmed, and the node stays schedulable with B's pod on it."""
    from tests.security import admission_cases as cases
    from tests.infra import test_tenant_attacks as attacks

    cluster = stack_cluster
    team_a, team_b = cases.A, cases.B
    try:
        _attack_on_team_bs_node(cluster, cases, attacks, tmp_path_factory)
    finally:
        remove(cluster, pods=[_agent_pod(cluster, NODE_B), f"/api/v1/namespaces/{team_b}/pods/b-worker-0",
                              f"/api/v1/namespaces/{team_a}/pods/a-worker-0",
                              f"/api/v1/namespaces/{team_a}/pods/a-follows-b-0"], nodes=[NODE_B])


def _attack_on_team_bs_node(cluster, cases, attacks, tmp_path_factory) -> None:
    team_a, team_b = cases.A, cases.B
    identity = _agent_identity(cluster, NODE_B, tmp_path_factory)

    # 1. B's worker on its node (created by B's job controller, bound by the scheduler).
    victim = attacks.pod(team_b, gpus=1)
    victim["metadata"] = {"name": "b-worker-0", "namespace": team_b, "labels": {"training.kubeflow.org/replica-type": "worker"}}
    victim["spec"]["tolerations"] = [dict(cases.GPU_TOLERATION)]
    # Placed by the test, not by the default scheduler (which would put the admitted pod on a node
    # of the pool before the test binds it to B's node): a scheduler name nothing answers to.
    victim["spec"]["schedulerName"] = TEST_PLACED
    cluster.kubectl("create", "-f", "-", *_as(cases.TRAINING_OPERATOR), input=json.dumps(victim))
    _bind(cluster, victim, NODE_B)
    # Running and Ready as B's node's kubelet reports it: Kueue's waitForPodsReady (blockAdmission)
    # admits nothing else until an admitted workload's pods are ready.
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ready = {"status": {"phase": "Running", "startTime": now, "conditions": [
        {"type": t, "status": "True", "lastTransitionTime": now}
        for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")], "containerStatuses": [{
            "name": "main", "ready": True, "restartCount": 0, "started": True, "image": "trainer:1", "imageID": "",
            "containerID": "containerd://b-worker-0", "state": {"running": {"startedAt": now}}}]}}
    cluster.kubectl("patch", "pod", "b-worker-0", "-n", team_b, "--subresource=status", "--type=merge", "-p", json.dumps(ready))

    # 2. A's worker following B's: refused as the operator creates it, and as A submits the job.
    follow = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {"training.kubeflow.org/replica-type": "worker"}},
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": team_b}},
        "topologyKey": "kubernetes.io/hostname"}]}}
    follower = cases.gpu_job_pod(affinity=follow)
    follower["metadata"]["name"] = "a-follows-b-0"
    refused = cluster.kubectl("create", "-f", "-", *_as(cases.TRAINING_OPERATOR), input=json.dumps(follower), check=False)
    assert refused.returncode != 0, "a worker following another team's pods was admitted"
    assert "ValidatingAdmissionPolicy 'mlplatform-team-pod-placement'" in refused.stderr, refused.stderr
    job = cases.job(affinity=follow)
    refused = cluster.kubectl("create", "-f", "-", "--dry-run=server", *_as(cases.TEAM_USER), input=json.dumps(job), check=False)
    assert refused.returncode != 0 and "mlplatform-team-queue-label-pytorchjobs" in refused.stderr, refused.stderr

    # 3. A's worker on B's node anyway, ending with the forged message and exit 135.
    # One GPU of a whole-GPU pool A has quota on (prod: A has none on B's H100 pool, and no
    # borrowing there), placed as Kueue places it (the flavor's nodeLabels and tolerations);
    # where it runs is the test's binding, as on a shared node.
    quota = next(t.gpu_quota for t in cases.CONFIG.scheduling.teams if t.namespace == team_a)
    flavor = next(f for f in cases.queues(cases.CONFIG).flavors if quota.get(f.name.removeprefix("gpu-"), 0) > 0
                  and not f.slices_per_gpu)
    placement = cases.kueue.resource_flavor(flavor)["spec"]
    attacker = attacks.pod(team_a, gpus=1, nodeSelector=dict(placement["nodeLabels"]),
                           tolerations=[dict(t) for t in placement["tolerations"]])
    attacker["metadata"] = {"name": "a-worker-0", "namespace": team_a, "labels": {"training.kubeflow.org/replica-type": "worker"}}
    attacker["spec"]["schedulerName"] = TEST_PLACED
    cluster.kubectl("create", "-f", "-", *_as(cases.TRAINING_OPERATOR), input=json.dumps(attacker))
    _bind(cluster, attacker, NODE_B)
    forged = "gpu-fault node=x rank=0 local_rank=0: GPU fault: Xid 79"
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {"status": {"phase": "Failed", "containerStatuses": [{
        "name": "main", "ready": False, "restartCount": 0, "started": False, "image": "trainer:1", "imageID": "",
        "containerID": "containerd://forged", "state": {"terminated": {
            "exitCode": EXIT_GPU_FAULT, "reason": "Error", "message": forged, "startedAt": now, "finishedAt": now,
            "containerID": "containerd://forged"}}}]}}
    cluster.kubectl("patch", "pod", "a-worker-0", "-n", team_a, "--subresource=status", "--type=merge", "-p", json.dumps(status))
    pod_a = json.loads(cluster.kubectl("get", "pod", "a-worker-0", "-n", team_a, "-o", "json").stdout)
    assert agent.pod_gpu_faults(pod_a, NODE_B, xid_actions()), "the forged message must read as a fault claim"

    agent.GpuFaultWatch(identity.api, NODE_B, xid_actions(), host_record(), retry_s=1).run(3)
    node = node_json(cluster, NODE_B)
    assert not marked(node), f"team A's forged fault marked team B's node: {node['spec']} {node['metadata']}"
    assert not any(c["type"] == agent.HEALTH_CONDITION for c in node.get("status", {}).get("conditions", []))
    assert not fault_events(cluster, NODE_B)
    [event] = fault_events(cluster, NODE_B, "GpuFaultNotConfirmed")
    assert f"{team_a}/a-worker-0" in event["message"] and "the node stays in service" in event["message"]
    assert cluster.kubectl("get", "pod", "b-worker-0", "-n", team_b, "-o", "jsonpath={.spec.nodeName}").stdout == NODE_B
