"""The readiness agent acting on a GPU fault a trainer container reported: which pods are faults of
this node, what the host's own record says (the attacker's seat: any pod can write the message),
what the node gets for each Xid action, once per fault. Pure decisions and a fake API; the real
API server: tests/cluster/test_gpu_fault_agent_live.py."""
from __future__ import annotations

import copy
import datetime as dt
import json
import urllib.error
from pathlib import Path

import pytest

from trainer.gpu_faults import EXIT_GPU_FAULT, FaultLine, node_action, parse_termination_message, termination_message, xid_actions
from workloads import node_health_agent as agent

NODE = "ip-10-0-1-2"
ACTIONS = xid_actions()
DATA = Path(__file__).parent / "data" / "node_health"
# The node booted at midnight; the container below ran 00:30-01:00.
BOOT = dt.datetime(2026, 11, 28, 0, 0, tzinfo=dt.timezone.utc).timestamp()
STARTED, FINISHED = "2026-11-28T00:30:00Z", "2026-11-28T01:00:00Z"
# What the driver writes (NVIDIA, "XID Errors"), as syslog(2) returns it: level, uptime, message.
XID_79_AT_0059 = "<4>[ 3540.123456] NVRM: Xid (PCI:0000:53:00): 79, pid=4242, name=python, GPU has fallen off the bus."
QUIET_LOG = "<6>[    0.000000] Linux version 6.1.0\n<6>[ 1800.5] eth0: link up"


def host(kernel_log: str = QUIET_LOG, smi: str = "nvidia-smi-q.healthy.txt") -> agent.HostRecord:
    """The host's record: its kernel log and nvidia-smi -q (8 GPUs), read by the agent's own parsers."""
    text = (DATA / smi).read_text()
    return agent.HostRecord(expected_gpus=8, expected_efa=0, run=lambda argv, timeout: (0, text),
                            kernel_log=lambda: kernel_log, boot_wall_s=lambda: BOOT)


def message(*faults: tuple[int, str]) -> str:
    """What the launcher writes (trainer/launch.py report_gpu_fault), rank r on local GPU r."""
    return termination_message(NODE, [{"rank": r, "local_rank": r, "gpu_fault": f} for r, f in faults])


def pod(exit_code=EXIT_GPU_FAULT, text=None, *, node=NODE, name="job-worker-0", uid="pod-uid-1", field="state",
        container_id="containerd://abc"):
    text = message((1, "GPU fault: Xid 79")) if text is None else text
    return {"metadata": {"name": name, "namespace": "team-a", "uid": uid},
            "spec": {"nodeName": node},
            "status": {"phase": "Failed", "containerStatuses": [{
                "name": "pytorch", "restartCount": 0,
                field: {"terminated": {"exitCode": exit_code, "message": text, "containerID": container_id,
                                       "startedAt": STARTED, "finishedAt": FINISHED}}}]}}


# ---------------------------------------------------------------- the message and the action (pure)

def test_the_message_the_launcher_writes_is_the_one_the_agent_parses():
    text = message((1, "GPU fault: uncorrectable ECC error encountered"), (3, "GPU fault: Xid 79"))
    assert parse_termination_message(text) == [
        FaultLine(NODE, "1", "1", "GPU fault: uncorrectable ECC error encountered"),
        FaultLine(NODE, "3", "3", "GPU fault: Xid 79")]
    assert [line.xid for line in parse_termination_message(text)] == [48, 79]


@pytest.mark.parametrize("text", [
    "", None, "Error: CUDA error: uncorrectable ECC error encountered",  # FallbackToLogsOnError output
    "gpu-fault node=n rank=1 local_rank=1 GPU fault: Xid 79",  # no colon after the GPU
    "gpu-fault node=n rank=1 local_rank=1: preempted",  # not a fault description
])
def test_anything_else_in_a_termination_message_is_not_a_fault(text):
    assert parse_termination_message(text) == []


@pytest.mark.parametrize("faults, action", [
    (["GPU fault: Xid 79"], "replace"),  # fallen off the bus: RESTART_BM
    (["GPU fault: GPU has fallen off the bus"], "replace"),  # the same, by the driver's text
    (["GPU fault: uncorrectable ECC error encountered"], "reset"),  # Xid 48: RESET_GPU workflow
    (["GPU fault: Xid 154"], "drain"),  # GPU_RECOVERY_ACTION_CHANGED: a person decides
    (["GPU fault: unspecified launch failure"], "drain"),  # no Xid of its own (also a kernel bug)
    (["GPU fault: unspecified launch failure", "GPU fault: Xid 48"], "reset"),  # the most severe
])
def test_the_node_action_is_the_xid_tables(faults, action):
    lines = parse_termination_message(message(*enumerate(faults)))
    assert node_action(lines, ACTIONS) == action


# ---------------------------------------------------------------- which pods are this node's faults

def test_a_gpu_fault_exit_with_its_message_is_a_fault_of_this_node():
    [fault] = agent.pod_gpu_faults(pod(), NODE, ACTIONS)
    assert fault.pod == "team-a/job-worker-0" and fault.container == "pytorch" and fault.action == "replace"
    assert fault.key == "pod-uid-1/pytorch/containerd://abc"
    assert "rank 1 GPU 1" in fault.describe() and "[Xid 79]" in fault.describe()


@pytest.mark.parametrize("case", ["spot exit 143", "oom 137", "135 without the message", "another node"])
def test_other_ends_are_not_faults_of_this_node(case):
    variants = {
        "spot exit 143": pod(143),
        "oom 137": pod(137),
        "135 without the message": pod(EXIT_GPU_FAULT, "launcher crashed"),
        "another node": pod(node="ip-10-0-9-9"),
    }
    assert agent.pod_gpu_faults(variants[case], NODE, ACTIONS) == []


def test_a_container_restarted_in_place_is_read_from_its_last_state():
    [fault] = agent.pod_gpu_faults(pod(field="lastState"), NODE, ACTIONS)
    assert fault.action == "replace"


# ---------------------------------------------------------------- what the node gets, once

class FakeApi:
    def __init__(self, pods=(), watch_events=()):
        self.node_obj = {"metadata": {"name": NODE, "uid": "node-uid", "resourceVersion": "7", "labels": {}},
                         "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}}
        self.requests, self.pods, self.watch_events, self.lists = [], list(pods), list(watch_events), 0

    def node(self, name):
        assert name == NODE
        return copy.deepcopy(self.node_obj)

    def patch_node(self, name, patch, *, json_patch=False):
        assert name == NODE and not json_patch
        self.requests.append(("patch_node", patch))
        meta = self.node_obj["metadata"]
        if "resourceVersion" in patch.get("metadata", {}) and patch["metadata"]["resourceVersion"] != meta["resourceVersion"]:
            raise urllib.error.HTTPError("", 409, "Conflict", None, None)
        for field in ("labels", "annotations"):
            for key, value in patch.get("metadata", {}).get(field, {}).items():
                target = meta.setdefault(field, {})
                target.pop(key, None) if value is None else target.__setitem__(key, value)
        self.node_obj["spec"].update(patch.get("spec", {}))
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    def patch_node_status(self, name, patch):
        self.requests.append(("patch_node_status", patch))

    def create_event(self, event):
        self.requests.append(("create_event", event))

    def list_pods(self, node_name):
        self.lists += 1
        return list(self.pods), "100"

    def watch_pods(self, node_name, resource_version, timeout_s):
        while self.watch_events:
            event = self.watch_events.pop(0)
            if isinstance(event, Exception):
                raise event
            yield event

    def kinds(self):
        return [kind for kind, _ in self.requests]


def test_a_replace_fault_cordons_labels_records_and_asks_karpenter_to_replace_the_node(capsys):
    api = FakeApi()
    [fault] = agent.pod_gpu_faults(pod(), NODE, ACTIONS)
    assert agent.mark_gpu_fault(api, NODE, fault) is True
    node = api.node_obj
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["labels"][agent.FAILURE_LABEL] == "gpu-fault"
    assert json.loads(node["metadata"]["annotations"][agent.GPU_FAULTS_ANNOTATION]) == [fault.key]
    condition = next(p for kind, p in api.requests if kind == "patch_node_status")["status"]["conditions"][0]
    assert (condition["type"], condition["status"], condition["reason"]) == ("AcceleratedHardwareReady", "False", "GpuFaultReported")
    event = next(p for kind, p in api.requests if kind == "create_event")
    assert event["reason"] == "GpuFaultReported" and event["involvedObject"]["name"] == NODE
    for named in ("team-a/job-worker-0", "rank 1", "GPU 1", "Xid 79", "action replace"):
        assert named in event["message"], named
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["pod"] == "team-a/job-worker-0" and line["faults"][0] == {"rank": "1", "gpu": "1", "xid": 79, "fault": "GPU fault: Xid 79"}


def test_a_drain_fault_cordons_but_leaves_the_decision_to_a_person():
    api = FakeApi()
    [fault] = agent.pod_gpu_faults(pod(text=message((0, "GPU fault: unspecified launch failure"))), NODE, ACTIONS)
    agent.mark_gpu_fault(api, NODE, fault)
    assert api.node_obj["spec"]["unschedulable"] is True
    assert "patch_node_status" not in api.kinds()
    assert "a person decides" in next(p for kind, p in api.requests if kind == "create_event")["message"]


def test_once_per_fault_even_across_an_agent_restart():
    api = FakeApi()
    [fault] = agent.pod_gpu_faults(pod(), NODE, ACTIONS)
    agent.mark_gpu_fault(api, NODE, fault)
    before = list(api.requests)
    assert agent.mark_gpu_fault(api, NODE, fault) is False  # the node's annotation remembers it
    assert api.requests == before
    # A second fault (the retried pod's container, elsewhere or here) is a new one.
    [other] = agent.pod_gpu_faults(pod(uid="pod-uid-2", container_id="containerd://def"), NODE, ACTIONS)
    assert agent.mark_gpu_fault(api, NODE, other) is True
    assert json.loads(api.node_obj["metadata"]["annotations"][agent.GPU_FAULTS_ANNOTATION]) == [fault.key, other.key]
    assert api.kinds().count("create_event") == 2


def test_a_concurrent_node_change_is_decided_again_not_overwritten():
    api = FakeApi()
    [fault] = agent.pod_gpu_faults(pod(), NODE, ACTIONS)
    original = api.node

    def stale(name):  # the first read is overtaken by another writer
        node = original(name)
        if not api.requests:
            api.node_obj["metadata"]["resourceVersion"] = "8"
            api.node_obj["metadata"]["labels"]["other"] = "x"
        return node

    api.node = stale
    assert agent.mark_gpu_fault(api, NODE, fault) is True
    # The repair condition first (a recorded fault is never acted on again), then the record:
    # 409, then decided on the fresh node.
    assert api.kinds() == ["patch_node_status", "patch_node", "patch_node", "create_event"]
    assert api.node_obj["metadata"]["labels"] == {"other": "x", agent.FAILURE_LABEL: "gpu-fault"}


def test_the_failure_label_keeps_earlier_classes_and_a_passing_check_keeps_the_fault():
    node = {"metadata": {"labels": {agent.FAILURE_LABEL: "tool-error"}}, "spec": {}}
    [fault] = agent.pod_gpu_faults(pod(), NODE, ACTIONS)
    patch = agent.gpu_fault_node_patch(node, fault)
    assert patch["metadata"]["labels"][agent.FAILURE_LABEL] == "gpu-fault.tool-error"
    # A later dcgmi pass drops the tool error but not the job's fault, and does not report healthy.
    assert agent.healthy_node_patch({"metadata": {"labels": {agent.FAILURE_LABEL: "gpu-fault.tool-error"}}}) == \
        {"metadata": {"labels": {agent.FAILURE_LABEL: "gpu-fault"}}}
    api = FakeApi()
    agent.mark_gpu_fault(api, NODE, fault)
    api.requests.clear()
    agent.report(api, NODE, [], 2)
    assert "patch_node_status" not in api.kinds()
    assert api.node_obj["metadata"]["labels"][agent.FAILURE_LABEL] == "gpu-fault"


def test_the_annotation_stays_bounded():
    node = {"metadata": {"annotations": {agent.GPU_FAULTS_ANNOTATION: json.dumps([f"k{i}" for i in range(40)])}}, "spec": {}}
    [fault] = agent.pod_gpu_faults(pod(), NODE, ACTIONS)
    keys = json.loads(agent.gpu_fault_node_patch(node, fault)["metadata"]["annotations"][agent.GPU_FAULTS_ANNOTATION])
    assert len(keys) == agent.GPU_FAULTS_KEPT and keys[-1] == fault.key


# ---------------------------------------------------------------- the watch

def test_the_watch_marks_from_the_list_and_from_events_and_relists_after_410():
    spot = pod(143, message((0, "GPU fault: Xid 79")), name="spot", uid="u-spot")
    api = FakeApi(pods=[spot], watch_events=[
        {"type": "MODIFIED", "object": {**pod(), "metadata": {**pod()["metadata"], "resourceVersion": "101"}}},
        {"type": "ERROR", "object": {"kind": "Status", "code": 410}},
    ])
    watch = agent.GpuFaultWatch(api, NODE, ACTIONS, host(XID_79_AT_0059), retry_s=0.01)
    watch.run(1.2)
    assert api.lists >= 2  # the 410 made it list again
    assert api.kinds().count("create_event") == 1  # the fault once; the spot pod never
    assert json.loads(api.node_obj["metadata"]["annotations"][agent.GPU_FAULTS_ANNOTATION]) == ["pod-uid-1/pytorch/containerd://abc"]


def test_a_failing_api_is_retried_at_a_bounded_rate_not_in_a_loop():
    api = FakeApi(watch_events=[urllib.error.URLError("connection refused")] * 1000)
    watch = agent.GpuFaultWatch(api, NODE, ACTIONS, host(), retry_s=0.25)
    watch.run(1.2)
    assert len(api.watch_events) >= 995  # about one try per retry_s, not a busy loop


def test_the_fault_event_and_condition_are_valid_core_objects():
    import datetime as dt

    from tests.support.validation import validate_core

    [fault] = agent.pod_gpu_faults(pod(), NODE, ACTIONS)
    event = agent.gpu_fault_event(NODE, "node-uid", fault, dt.datetime(2026, 11, 28, 1, 0))
    event = {**event, "metadata": {**event["metadata"], "name": f"{NODE}.gpu-fault-x"}}  # the server fills generateName
    assert validate_core(event) == []
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {agent.FAILURE_LABEL: "gpu-fault"},
                                                             "annotations": {agent.GPU_FAULTS_ANNOTATION: "[]"}},
            "spec": {"unschedulable": True},
            **agent.condition_patch(False, event["message"], dt.datetime(2026, 11, 28, 1, 0), reason="GpuFaultReported")}
    assert validate_core(node) == []


def test_a_fault_first_seen_in_the_pods_deletion_still_marks_the_node():
    """The Training Operator deletes a pod that ended with a retryable code at once; a watch
    that reconnects in between sees only the DELETED event, whose object keeps the status."""
    api = FakeApi(watch_events=[{"type": "DELETED", "object": pod()}])
    agent.GpuFaultWatch(api, NODE, ACTIONS, host(XID_79_AT_0059), retry_s=0.01).run(1.1)
    assert api.kinds().count("create_event") == 1 and api.node_obj["spec"]["unschedulable"] is True


# ---------------------------------------------------------------- the host's word, not the pod's

def _events(api, reason):
    return [p for kind, p in api.requests if kind == "create_event" and p["reason"] == reason]


def test_a_forged_fault_from_a_pod_on_the_node_cordons_nothing():
    """The attack: a tenant's container writes the launcher's line for Xid 79 to its termination
    log and exits 135, on a node it shares with another team. The host logged no Xid and its GPUs
    are healthy: an Event says so, and the node is neither cordoned, labelled nor marked for repair."""
    api = FakeApi(pods=[pod()])
    agent.GpuFaultWatch(api, NODE, ACTIONS, host(), retry_s=0.01).run(1.1)
    assert "patch_node" not in api.kinds() and "patch_node_status" not in api.kinds()
    assert "unschedulable" not in api.node_obj["spec"] and agent.FAILURE_LABEL not in api.node_obj["metadata"]["labels"]
    [event] = _events(api, "GpuFaultNotConfirmed")
    assert "team-a/job-worker-0" in event["message"] and "the node stays in service" in event["message"]
    assert not _events(api, "GpuFaultReported")


@pytest.mark.parametrize("kernel_log, why", [
    ("<4>[ 1000.0] NVRM: Xid (PCI:0000:53:00): 79, pid=1, GPU has fallen off the bus.", "logged before the container started"),
    ("<4>[ 3540.0] NVRM: Xid (PCI:0000:53:00): 13, pid=4242, Graphics Exception", "an application's Xid (action none)"),
    ("<3>[ 3540.0] NVRM: Xid (PCI:[4242]: segfault at 0 ip 00007f sp 00007ff error 4 in libc.so.6", "a process named 'NVRM: Xid (PCI:'"),
    ("NVRM: Xid (PCI:0000:53:00): 79, pid=1, GPU has fallen off the bus.", "no kernel timestamp: cannot be placed in time"),
])
def test_what_does_not_confirm_a_fault(kernel_log, why):
    fault, evidence = agent.confirmed(agent.pod_gpu_faults(pod(), NODE, ACTIONS)[0], host(kernel_log), ACTIONS)
    assert fault is None and evidence.xids == (), why


def test_the_host_decides_the_action_not_the_claim():
    # The rank saw only "unspecified launch failure" (a drain), the driver logged Xid 79: replace.
    claimed = agent.pod_gpu_faults(pod(text=message((0, "GPU fault: unspecified launch failure"))), NODE, ACTIONS)[0]
    assert claimed.action == "drain"
    fault, _ = agent.confirmed(claimed, host(XID_79_AT_0059), ACTIONS)
    assert fault.action == "replace" and "kernel log Xid 79 on PCI:0000:53:00" in fault.host
    # The claim says Xid 79 (replace), the driver logged Xid 154 (a drain): a person decides.
    drain_log = "<4>[ 3540.0] NVRM: Xid (PCI:0000:53:00): 154, pid=1, GPU recovery action changed"
    fault, _ = agent.confirmed(agent.pod_gpu_faults(pod(), NODE, ACTIONS)[0], host(drain_log), ACTIONS)
    assert fault.action == "drain"


def test_a_gpu_nvml_reports_lost_confirms_a_replacement_without_a_logged_xid():
    fault, evidence = agent.confirmed(agent.pod_gpu_faults(pod(), NODE, ACTIONS)[0],
                                      host(smi="nvidia-smi-q.gpu-count.txt"), ACTIONS)
    assert fault.action == "replace" and "gpu-count" in fault.host and evidence.xids == ()


def test_a_confirmed_fault_marks_the_node_and_names_the_hosts_record():
    api = FakeApi(pods=[pod()])
    agent.GpuFaultWatch(api, NODE, ACTIONS, host(XID_79_AT_0059), retry_s=0.01).run(1.1)
    assert api.node_obj["spec"]["unschedulable"] is True
    [event] = _events(api, "GpuFaultReported")
    assert "host: kernel log Xid 79 on PCI:0000:53:00" in event["message"] and "action replace" in event["message"]


def test_the_driver_lines_the_kernel_writes_are_parsed():
    text = "\n".join([
        "<4>[  812.304717] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        "[ 9001.5] NVRM: Xid (PCI:0000:0a:00.0): 48, pid=77, An uncorrectable double bit error (DBE) has been detected",
        "<6>[ 9002.0] nvidia-modeset: Allocated GPU:0",
    ])
    assert agent.parse_kernel_xids(text) == [agent.KernelXid(812.304717, "PCI:0000:3b:00", 79),
                                             agent.KernelXid(9001.5, "PCI:0000:0a:00.0", 48)]


def test_the_unconfirmed_event_is_a_valid_core_object():
    from tests.support.validation import validate_core

    claimed = agent.pod_gpu_faults(pod(), NODE, ACTIONS)[0]
    _, evidence = agent.confirmed(claimed, host(), ACTIONS)
    event = agent.unconfirmed_event(NODE, "node-uid", claimed, evidence, dt.datetime(2026, 11, 28, 1, 0))
    assert validate_core({**event, "metadata": {**event["metadata"], "name": f"{NODE}.gpu-fault-unconfirmed-x"}}) == []
