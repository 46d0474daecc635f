"""The readiness agent marks its node after a trainer's GPU fault, on the real API server, as
its real identity (issue 35, review trainer-4 §3).

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
JOBS = "gpu-fault-drill"
# What the driver logs and the rank's CUDA error carries when a GPU falls off the bus.
DRIVER_ERROR = "CUDA error: unspecified launch failure; NVRM: Xid (PCI:0000:53:00): 79, pid=1234, GPU has fallen off the bus."


@dataclass
class AgentIdentity:
    api: agent.KubeApi
    kubeconfig: Path


def _apply(cluster, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))


@pytest.fixture(scope="module")
def agent_on_x(stack_cluster, tmp_path_factory) -> AgentIdentity:
    """The agent's ServiceAccount token, bound to an agent pod on node X."""
    cluster = stack_cluster
    daemon_set = next(d for d in cluster.layer.of_kind("DaemonSet") if d["metadata"]["name"] == "gpu-node-health")
    namespace = daemon_set["metadata"]["namespace"]
    account = daemon_set["spec"]["template"]["spec"]["serviceAccountName"]
    for node in (NODE_X, NODE_Y):
        _apply(cluster, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}})
    _apply(cluster, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": JOBS}})
    _apply(cluster, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu-fault-agent-on-x", "namespace": namespace},
                     "spec": {"nodeName": NODE_X, "serviceAccountName": account, "tolerations": [{"operator": "Exists"}],
                              "containers": [{"name": "agent", "image": "agent:test"}]}})
    uid = cluster.kubectl("get", "pod", "gpu-fault-agent-on-x", "-n", namespace, "-o", "jsonpath={.metadata.uid}").stdout
    token = cluster.kubectl("create", "token", account, "-n", namespace, "--bound-object-kind=Pod",
                            "--bound-object-name=gpu-fault-agent-on-x", f"--bound-object-uid={uid}").stdout.strip()
    token_file = tmp_path_factory.mktemp("agent") / "token"
    token_file.write_text(token)
    context = ssl.create_default_context(cafile=str(cluster.plane.pki.ca_cert))
    api = agent.KubeApi(base_url=cluster.plane.server, token_path=str(token_file), context=context)
    yield AgentIdentity(api, cluster.plane.token_kubeconfig("gpu-fault-agent", token))
    # What the module made goes with it: the stack's cluster is shared with the other tests.
    cluster.api.delete(f"/api/v1/namespaces/{JOBS}")
    cluster.api.delete(f"/api/v1/namespaces/{namespace}/pods/gpu-fault-agent-on-x", {"gracePeriodSeconds": 0})
    for node in (NODE_X, NODE_Y):
        cluster.api.delete(f"/api/v1/nodes/{node}")


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


def fault_events(cluster, node: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "events", "-n", "default", "-o", "json",
                          f"--field-selector=reason=GpuFaultReported,involvedObject.name={node}").stdout
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
    agent.GpuFaultWatch(api, NODE_X, actions, retry_s=1).run(3)
    assert not marked(node_json(cluster, NODE_X)), "a spot exit or another node's fault marked X"
    assert not marked(node_json(cluster, NODE_Y)) and not fault_events(cluster, NODE_Y)
    assert not fault_events(cluster, NODE_X)

    # The agent watches; a trainer container on X ends with the GPU-fault exit.
    watch = agent.GpuFaultWatch(api, NODE_X, actions, retry_s=1)
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
    for named in (f"{JOBS}/trainer-on-x", "rank 1", "GPU 1", "Xid 79", "action replace"):
        assert named in event["message"], (named, event["message"])
    assert not marked(node_json(cluster, NODE_Y))

    # A restarted agent lists the same terminated pod again: nothing more happens.
    agent.GpuFaultWatch(api, NODE_X, actions, retry_s=1).run(3)
    assert len(fault_events(cluster, NODE_X)) == 1

    # The attacker's seat: the same code, handed node Y's fault, cannot mark Y with X's token.
    pod_y = json.loads(cluster.kubectl("get", "pod", "fault-on-y", "-n", JOBS, "-o", "json").stdout)
    [fault_y] = agent.pod_gpu_faults(pod_y, NODE_Y, actions)
    with pytest.raises(urllib.error.HTTPError) as refused:
        agent.mark_gpu_fault(api, NODE_Y, fault_y)
    body = refused.value.read().decode()
    assert refused.value.code == 403 and "ValidatingAdmissionPolicy" in body and "only the node its pod runs on" in body, body
    assert not marked(node_json(cluster, NODE_Y))
