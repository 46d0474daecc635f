"""The run recorder's rules, without a cluster: how an attempt's end is classified from the
launcher's exit-code contract, what a run's outcome is once its job object goes, what cost so far
is, and that every record it writes is one the RunRecord CRD admits.

The same code runs against the real API server, as its own ServiceAccount, in
tests/cluster/test_run_records_live.py.
"""
from __future__ import annotations

import copy
import json

import jsonschema
import pytest

from catalog.prices import PRICES
from tests.support.validation import structural_to_json_schema
from workloads import run_recorder as rr
from workloads.run_records import crd, prices_table

T0 = 1_790_000_000.0  # 2026-09-21T...Z
PRICES_TABLE = prices_table()


def at(seconds: float) -> str:
    return rr.now_text(T0 + seconds)


def pytorchjob(name="smoke-l4", uid="0123456789abcdef", conditions=(), annotations=None, deleting=False) -> dict:
    meta = {"name": name, "namespace": "team-research", "uid": uid, "creationTimestamp": at(0),
            "labels": {"app.kubernetes.io/managed-by": "mlplatform", "mlplatform.io/team": "research",
                       "mlplatform.io/pool": "l4", "mlplatform.io/sweep": "lr"},
            "annotations": dict(annotations or {})}
    if deleting:
        meta["deletionTimestamp"] = at(500)
    container = {"name": "pytorch", "env": [{"name": "TRAINER_CHECKPOINT_DIR", "value": f"/fsx/checkpoints/team-research/{name}"}]}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": meta,
            "spec": {"nprocPerNode": "1", "pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": {"spec": {
                "containers": [container]}}}}},
            "status": {"conditions": [{"type": c, "status": "True", "lastTransitionTime": at(900)} for c in conditions]}}


def pod(uid, *, node=None, started=None, exit_code=None, finished=None, job_uid="0123456789abcdef") -> dict:
    state = {}
    if exit_code is not None:
        state = {"terminated": {"exitCode": exit_code, "startedAt": started, "finishedAt": finished}}
    elif started:
        state = {"running": {"startedAt": started}}
    return {"metadata": {"name": "smoke-l4-master-0", "namespace": "team-research", "uid": uid, "creationTimestamp": at(0),
                         "labels": {"mlplatform.io/job": "smoke-l4", "training.kubeflow.org/replica-type": "master",
                                    "training.kubeflow.org/replica-index": "0"},
                         "ownerReferences": [{"kind": "PyTorchJob", "uid": job_uid, "name": "smoke-l4"}]},
            "spec": {"nodeName": node, "containers": [{"name": "pytorch", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]},
            "status": {"containerStatuses": [{"name": "pytorch", "state": state}]}}


def node(name="kwok-l4-a", instance="g6.xlarge", capacity="spot", disrupted=False) -> dict:
    return {"metadata": {"name": name, "labels": {"node.kubernetes.io/instance-type": instance,
                                                  "karpenter.sh/capacity-type": capacity}},
            "spec": {"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}] if disrupted else []},
            "status": {"capacity": {"nvidia.com/gpu": "1"}}}


def validate(record: dict) -> None:
    schema = structural_to_json_schema(crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    jsonschema.Draft202012Validator(schema).validate(record)


@pytest.mark.parametrize("code, kwargs, reason", [
    (0, {}, rr.DONE),
    (2, {}, rr.FAILURE), (3, {}, rr.FAILURE), (1, {"job_suspended": True}, rr.FAILURE),
    (143, {}, rr.PREEMPTION), (143, {"job_suspended": True}, rr.PREEMPTION), (143, {"node_going": True}, rr.PREEMPTION),
    (137, {}, rr.KILLED), (None, {}, rr.LOST),
    (143, {"job_deleting": True}, rr.CANCEL), (None, {"job_deleting": True}, rr.CANCEL),
    (137, {"node_going": True}, rr.PREEMPTION),
])
def test_an_attempts_end_is_classified_by_the_launchers_exit_code_contract(code, kwargs, reason):
    flags = {"job_deleting": False, "job_suspended": False, "node_going": False, **kwargs}
    assert rr.classify(code, **flags)[0] == reason


def test_a_preempted_attempt_then_a_successful_one_with_node_facts_and_cost():
    record = rr.new_record(pytorchjob(), "TRAINER_CHECKPOINT_DIR", T0)
    job = pytorchjob(conditions=("Running",))
    spot = node()
    assert rr.observe_pod(record, pod("p1"), deleted=False, node=None, node_read=False, prices=PRICES_TABLE,
                          containers=("pytorch",), job=job, now=T0 + 10)
    rr.observe_pod(record, pod("p1", node=spot["metadata"]["name"], started=at(60)), deleted=False, node=spot,
                   node_read=True, prices=PRICES_TABLE, containers=("pytorch",), job=job, now=T0 + 60)
    # The spot notice: Karpenter taints the node, the trainer checkpoints and exits 143, the
    # operator deletes the pod (its DELETED event still carries the exit code).
    ended = pod("p1", node=spot["metadata"]["name"], started=at(60), exit_code=143, finished=at(1860))
    rr.observe_pod(record, ended, deleted=True, node=node(disrupted=True), node_read=True, prices=PRICES_TABLE,
                   containers=("pytorch",), job=job, now=T0 + 1861)
    on_demand = node("kwok-l4-b", capacity="on-demand")
    rr.observe_pod(record, pod("p2", node="kwok-l4-b", started=at(1900), exit_code=0, finished=at(3700)), deleted=False,
                   node=on_demand, node_read=True, prices=PRICES_TABLE, containers=("pytorch",), job=job, now=T0 + 3700)
    first, second = record["spec"]["attempts"]
    assert (first["exitCode"], first["reason"], first["instanceType"], first["capacityType"]) == (143, "preemption", "g6.xlarge", "spot")
    assert "node was taken away" in first["message"]
    assert (second["exitCode"], second["reason"], second["capacityType"]) == (0, "done", "on-demand")
    usd, hours, unpriced = rr.run_cost(record, T0 + 9999)
    price = PRICES["g6.xlarge"]
    assert hours == pytest.approx(1.0) and not unpriced
    assert usd == pytest.approx(0.5 * price.spot_usd_per_hour + 0.5 * price.on_demand_usd_per_hour, rel=1e-4)
    validate(record)


@pytest.mark.parametrize("phase, reason", [("Succeeded", rr.DONE), ("Failed", rr.FAILURE)])
@pytest.mark.parametrize("job_seen_first", [True, False], ids=["job-event-first", "pod-event-first"])
def test_a_worker_stopped_once_the_job_finished_is_not_a_preemption(phase, reason, job_seen_first):
    """Rank 0 completes, the job turns Succeeded (or Failed) at 900 s, and the Training Operator's
    cleanPodPolicy: Running stops a worker still shutting down: it exits 143 at 903 s. Its attempt
    belongs to the finished run, whichever watch event the recorder reads first; a worker preempted
    before the end stays a preemption."""
    record = rr.new_record(pytorchjob(), "TRAINER_CHECKPOINT_DIR", T0)
    running, finished = pytorchjob(conditions=("Running",)), pytorchjob(conditions=(phase,))
    earlier = pod("w0", node="n", started=at(10), exit_code=143, finished=at(400))
    rr.observe_pod(record, earlier, deleted=True, node=node("n", disrupted=True), node_read=True, prices=PRICES_TABLE,
                   containers=("pytorch",), job=running, now=T0 + 401)
    straggler = pod("w1", node="n2", started=at(420), exit_code=143, finished=at(903))
    if job_seen_first:
        rr.observe_job(record, finished, deleted=False, now=T0 + 901)
        rr.observe_pod(record, straggler, deleted=False, node=node("n2"), node_read=True, prices=PRICES_TABLE,
                       containers=("pytorch",), job=finished, now=T0 + 904)
    else:
        rr.observe_pod(record, straggler, deleted=False, node=node("n2"), node_read=True, prices=PRICES_TABLE,
                       containers=("pytorch",), job=running, now=T0 + 904)
        assert record["spec"]["attempts"][1]["reason"] == rr.PREEMPTION  # what it looks like until the job event
        rr.observe_job(record, finished, deleted=False, now=T0 + 905)
    before, after = record["spec"]["attempts"]
    assert (before["exitCode"], before["reason"]) == (143, rr.PREEMPTION)
    assert (after["exitCode"], after["reason"]) == (143, reason)
    assert "cleanPodPolicy" in after["message"]
    validate(record)


def test_a_running_attempt_costs_up_to_now_and_a_shared_gpu_its_share():
    record = rr.new_record(pytorchjob(), "TRAINER_CHECKPOINT_DIR", T0)
    shared = node(instance="g6.xlarge", capacity="on-demand")
    shared["status"]["capacity"] = {"nvidia.com/gpu.shared": "4"}
    running = pod("p1", node="kwok-l4-a", started=at(0))
    running["spec"]["containers"][0]["resources"]["requests"] = {"nvidia.com/gpu.shared": "1"}
    rr.observe_pod(record, running, deleted=False, node=shared, node_read=True, prices=PRICES_TABLE,
                   containers=("pytorch",), job=pytorchjob(conditions=("Running",)), now=T0)
    usd, hours, _ = rr.run_cost(record, T0 + 3600)
    assert hours == pytest.approx(0.25)
    assert usd == pytest.approx(PRICES["g6.xlarge"].on_demand_usd_per_hour / 4, rel=1e-4)


@pytest.mark.parametrize("annotations, conditions, outcome", [
    ({rr.CANCELLED_AT: "2026-09-21T10:00:00Z"}, ("Running",), "Cancelled"),
    ({rr.REPLACED_AT: "2026-09-21T10:00:00Z"}, ("Running",), "Replaced"),
    ({}, ("Running",), "Deleted"),
    ({}, ("Succeeded",), "Succeeded"),  # removed by ttlSecondsAfterFinished
    ({}, ("Failed",), "Failed"),
])
def test_the_outcome_once_the_job_object_is_gone(annotations, conditions, outcome):
    record = rr.new_record(pytorchjob(), "TRAINER_CHECKPOINT_DIR", T0)
    job = pytorchjob(conditions=conditions, annotations=annotations)
    rr.observe_pod(record, pod("p1", node="n", started=at(10)), deleted=False, node=node("n"), node_read=True,
                   prices=PRICES_TABLE, containers=("pytorch",), job=job, now=T0 + 10)
    rr.observe_job(record, job, deleted=False, now=T0 + 100)
    assert rr.observe_job(record, job, deleted=True, now=T0 + 200)
    spec = record["spec"]
    assert spec["outcome"] == outcome and spec["removedAt"] == at(200)
    (attempt,) = spec["attempts"]
    if outcome in ("Cancelled", "Replaced", "Deleted"):
        assert attempt["reason"] == "cancel" and attempt["endedAt"] == at(200)
    validate(record)


def test_records_expire_after_the_retention_and_not_before():
    record = rr.new_record(pytorchjob(), "TRAINER_CHECKPOINT_DIR", T0)
    assert not rr.expired(record, T0 + 10**9, 86400)  # a run that has not ended never expires
    rr.end_run(record, T0 + 100)
    assert not rr.expired(record, T0 + 100 + 86399, 86400)
    assert rr.expired(record, T0 + 100 + 86401, 86400)


class MemoryApi:
    """The API calls the recorder makes, in memory (the live test uses the real API server)."""

    def __init__(self, jobs=(), pods=(), nodes=()):
        self.jobs = {j["metadata"]["name"]: j for j in jobs}
        self.pods = list(pods)
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.records: dict[str, dict] = {}
        self.version = 0

    def call(self, method, path, body=None, content_type=None):
        self.version += 1
        if path.startswith("/api/v1/nodes/"):
            name = path.rsplit("/", 1)[1]
            if name not in self.nodes:
                raise rr.ApiError(404, "not found")
            return self.nodes[name]
        if path.startswith("/apis/kubeflow.org/v1/pytorchjobs"):
            return {"items": list(self.jobs.values()), "metadata": {"resourceVersion": "1"}}
        if path.startswith("/apis/trainer.kubeflow.org"):
            raise rr.ApiError(404, "the server could not find the requested resource")
        if path.startswith("/api/v1/pods"):
            return {"items": self.pods, "metadata": {"resourceVersion": "1"}}
        if rr.PLURAL in path:
            if method == "GET":
                return {"items": [copy.deepcopy(r) for r in self.records.values()], "metadata": {"resourceVersion": "1"}}
            name = path.rsplit("/", 1)[1] if method in ("PUT", "DELETE") else body["metadata"]["name"]
            if method == "DELETE":
                self.records.pop(name)
                return {}
            if method == "POST" and name in self.records:
                raise rr.ApiError(409, "exists")
            stored = copy.deepcopy(body)
            stored["metadata"]["resourceVersion"] = str(self.version)
            self.records[name] = stored
            return stored
        raise AssertionError(f"unexpected call {method} {path}")


def test_a_recorder_keeps_a_run_whose_job_went_while_it_was_down_and_removes_it_after_the_retention():
    clock = [T0]
    job = pytorchjob(conditions=("Running",))
    api = MemoryApi(jobs=[job], pods=[pod("p1", node="n1", started=at(0))], nodes=[node("n1")])
    recorder = rr.Recorder(api, prices=PRICES_TABLE, containers=("pytorch",), checkpoint_env="TRAINER_CHECKPOINT_DIR",
                           retention_seconds=86400, clock=lambda: clock[0])
    recorder.resync()
    assert recorder.flush() == 1
    (stored,) = api.records.values()
    validate({k: v for k, v in stored.items()})
    assert stored["spec"]["attempts"][0]["instanceType"] == "g6.xlarge"
    assert stored["metadata"]["labels"]["mlplatform.io/sweep"] == "lr"  # list --sweep finds gone points
    # The job and its pod go while no recorder runs (kubectl delete); a new recorder relists.
    api.jobs.clear()
    api.pods.clear()
    clock[0] = T0 + 600
    fresh = rr.Recorder(api, prices=PRICES_TABLE, containers=("pytorch",), checkpoint_env="TRAINER_CHECKPOINT_DIR",
                        retention_seconds=86400, clock=lambda: clock[0])
    fresh.resync()
    fresh.flush()
    (stored,) = api.records.values()
    assert stored["spec"]["outcome"] == "Deleted" and stored["spec"]["attempts"][0]["reason"] == "cancel"
    clock[0] = T0 + 600 + 86400 + 1
    fresh.resync()
    assert api.records == {}, "the record outlived the retention"


def test_the_record_the_recorder_writes_carries_no_owner_and_the_crd_prints_columns():
    record = rr.new_record(pytorchjob(), "TRAINER_CHECKPOINT_DIR", T0)
    # No ownerReference: the garbage collector never takes a record with its job.
    assert "ownerReferences" not in record["metadata"]
    columns = [c["name"] for c in crd()["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns == ["Job", "Phase", "Outcome", "Age"]
    assert json.loads(json.dumps(record)) == record
