"""What the job client makes of the platform's run records (workloads/run_recorder.py): describe
of a job whose object is gone, `list --all` and `history`, the instance type of a pod whose node
the team may not read, and the why-it-ended marks `cancel` and `--replace` leave on a job.

The records here are made by the recorder's own functions from the objects the fake API holds,
as the recorder would write them; the recorder itself runs against the real API server in
tests/cluster/test_run_records_live.py.
"""
from __future__ import annotations

import json
import time

from jobs.__main__ import main
from jobs.client import JobClient
from jobs.store import LocalStore
from tests.jobs.conftest import add_node, operator_pods, raw_spec, set_conditions, use_fake_kubectl
from workloads import run_recorder as rr
from workloads.run_records import prices_table

NS = "team-research"


def record_of(kube, job: dict, *, deleted: bool = False, exit_codes=(143, 0)) -> dict:
    """The record the recorder writes for ``job`` after one pod per exit code ran on a spot g6.xlarge."""
    # The attempts end by the time the job's last condition turned (a run ends with its last attempt).
    turned = [rr.parse_time(c["lastTransitionTime"]) for c in (job.get("status") or {}).get("conditions") or []]
    now = max(turned) if turned else time.time()
    record = rr.new_record(job, "TRAINER_CHECKPOINT_DIR", now - 7200)
    node = add_node(kube, "kwok-l4-a", "g6.xlarge", "spot", 1) if kube.find("nodes", "kwok-l4-a") is None else \
        kube.find("nodes", "kwok-l4-a")
    for i, code in enumerate(exit_codes):
        start, end = rr.now_text(now - 7200 + i * 3600), rr.now_text(now - 3600 + i * 3600)
        pod = {"metadata": {"name": "smoke-l4-master-0", "namespace": NS, "uid": f"pod-{i}",
                            "labels": {"mlplatform.io/job": "smoke-l4", "training.kubeflow.org/replica-type": "master"}},
               "spec": {"nodeName": "kwok-l4-a", "containers": [{"name": "pytorch", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]},
               "status": {"containerStatuses": [{"name": "pytorch", "state": {"terminated": {
                   "exitCode": code, "startedAt": start, "finishedAt": end}}}]}}
        rr.observe_pod(record, pod, deleted=True, node=node, node_read=True, prices=prices_table(),
                       containers=("pytorch",), job=job, now=now)
    rr.observe_job(record, job, deleted=deleted, now=now)
    return kube.add(record, validate=False)


def test_a_gone_jobs_record_answers_describe_list_all_and_history(kube, dev_facts, tmp_path, monkeypatch, capsys):
    """Before: `describe` of a job removed by its TTL or kubectl exited 6 ("no job"), and `list --all`
    did not show it: only `cancel` left a trace."""
    client = JobClient(stack="dev", kube=kube, facts=dev_facts, store=LocalStore())
    client.submit(raw_spec())
    job = kube.find("pytorchjobs.kubeflow.org", "smoke-l4", NS)
    set_conditions(kube, job, "Created", "Running", "Succeeded")
    record_of(kube, kube.find("pytorchjobs.kubeflow.org", "smoke-l4", NS), deleted=True)
    kube.delete("pytorchjobs.kubeflow.org", "smoke-l4", NS, propagation="Background")  # its TTL ran out

    detail = client.describe("smoke-l4", "research")
    assert detail.job.phase == "Succeeded" and not detail.pods
    assert [(a.exit_code, a.reason, a.instance_type, a.capacity_type) for a in detail.attempts] == [
        (143, "preemption", "g6.xlarge", "spot"), (0, "done", "g6.xlarge", "spot")]
    from catalog.prices import PRICES

    assert detail.cost.node_hours == 2.0 and detail.cost.usd == round(2 * PRICES["g6.xlarge"].spot_usd_per_hour, 2)
    assert "the job object is gone from the cluster (succeeded)" in detail.notes[0]
    assert [(j.name, j.phase) for j in client.list("research", include_finished=True)] == [("smoke-l4", "Succeeded")]

    state = use_fake_kubectl(tmp_path, monkeypatch)
    kube.save(state)
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(dev_facts.to_dict()))
    assert main(["describe", "smoke-l4", "--team", "research", "--facts", str(facts)]) == 0
    out = capsys.readouterr().out
    assert "1. rank 0: exit 143 (preempted: SIGTERM" in out and "[preemption] on g6.xlarge spot (kwok-l4-a)" in out
    assert "cost so far: $" in out
    assert main(["history", "--team", "research", "--facts", str(facts)]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].split() == ["RUN", "NAME", "OUTCOME", "ATTEMPTS", "PREEMPTED", "NODE-HOURS", "COST", "CREATED", "ENDED"]
    assert rows[1].split()[1:6] == ["smoke-l4", "Succeeded", "2", "1", "2.00"]


def test_a_running_jobs_pods_get_their_node_from_the_record_when_nodes_are_not_readable(kube, dev_facts):
    """The team role cannot read Nodes: before, describe printed "(?, ?)" and no cost while it ran."""
    client = JobClient(stack="dev", kube=kube, facts=dev_facts, store=LocalStore())
    client.submit(raw_spec())
    job = kube.find("pytorchjobs.kubeflow.org", "smoke-l4", NS)
    set_conditions(kube, job, "Created", "Running")
    (pod,) = operator_pods(kube, job, node="kwok-l4-a", started_at=rr.now_text(time.time() - 600))
    record = rr.new_record(job, "TRAINER_CHECKPOINT_DIR", time.time() - 600)
    node = add_node(kube, "kwok-l4-a", "g6.xlarge", "on-demand", 1)
    rr.observe_pod(record, pod, deleted=False, node=node, node_read=True, prices=prices_table(), containers=("pytorch",),
                   job=job, now=time.time())
    kube.add(record, validate=False)
    kube.objects.pop(("nodes", "", "kwok-l4-a"))  # what a team member sees: no node
    detail = client.describe("smoke-l4", "research")
    (running,) = detail.pods
    assert (running.instance_type, running.capacity_type) == ("g6.xlarge", "on-demand")
    assert detail.cost is not None and detail.cost.usd > 0


def test_cancel_and_replace_say_why_the_run_ends_before_deleting(kube, dev_facts):
    client = JobClient(stack="dev", kube=kube, facts=dev_facts, store=LocalStore(), sleep=lambda s: None)
    client.submit(raw_spec())
    client.submit(raw_spec(), replace=True)
    patches = [json.loads(r[4]) for r in kube.requests if r[0] == "patch"]
    assert list(patches[0]["metadata"]["annotations"]) == [rr.REPLACED_AT]
    client.cancel("smoke-l4", "research")
    patches = [json.loads(r[4]) for r in kube.requests if r[0] == "patch"]
    assert list(patches[-1]["metadata"]["annotations"]) == [rr.CANCELLED_AT]
