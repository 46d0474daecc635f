"""JobClient against the fake API (schemas enforced, selectors as the API server applies them)."""
from __future__ import annotations

import dataclasses

import pytest

from jobs.client import (JobClient, JobNotFound, PreflightRefused, admission_from, exit_code_meaning, parse_job,
                         pod_selector)
from jobs.kube import KubeError
from jobs.store import LocalStore
from tests.jobs.conftest import (MULTINODE, add_node, kueue_workload, operator_pods, raw_spec, set_conditions)
from tests.jobs.fake_kube import selector_matches


def client(kube, facts, store=None, **kwargs):
    return JobClient(stack=facts.stack, kube=kube, facts=facts, store=store or LocalStore(), **kwargs)


# -- the fake is the API server it stands for -----------------------------------------------------
def test_the_fake_refuses_what_the_crd_refuses(kube, dev_facts):
    """An object the pinned CRD does not admit is refused, so a client bug cannot pass silently:
    PyTorchJob v1.9.4 declares nprocPerNode a string and runPolicy has no `retries` field."""
    manifest = client(kube, dev_facts).render(raw_spec())
    assert kube.apply(manifest)["metadata"]["uid"]
    for breakage in ({"nprocPerNode": 1}, {"runPolicy": {**manifest["spec"]["runPolicy"], "retries": 3}}):
        broken = {**manifest, "metadata": {**manifest["metadata"], "name": "broken"},
                  "spec": {**manifest["spec"], **breakage}}
        with pytest.raises(KubeError, match="is invalid"):
            kube.apply(broken)
    with pytest.raises(KubeError, match="is invalid"):
        kube.patch("pytorchjobs.kubeflow.org", "smoke-l4", "team-research", {"spec": {"runPolicy": {"suspend": "yes"}}})


@pytest.mark.parametrize("selector,labels,matches", [
    ("a=b", {"a": "b"}, True), ("a==b", {"a": "c"}, False), ("a!=b", {}, True), ("a!=b", {"a": "b"}, False),
    ("a in (x, y)", {"a": "y"}, True), ("a in (x,y)", {}, False), ("a notin (x)", {}, True),
    ("a notin (x)", {"a": "x"}, False), ("a", {"a": ""}, True), ("!a", {"a": "1"}, False), ("!a", {}, True),
    ("a=b,c in (d,e),!f", {"a": "b", "c": "e"}, True), ("a=b,c in (d,e),!f", {"a": "b", "c": "e", "f": "1"}, False),
])
def test_label_selectors_follow_the_apimachinery_grammar(selector, labels, matches):
    """k8s.io/apimachinery pkg/labels/selector.go: requirements are ANDed; `!=` and `notin` match
    an object without the key; `!key` matches only its absence."""
    assert selector_matches(selector, labels) is matches


# -- submit, list, get ------------------------------------------------------------------------
def test_submit_creates_the_rendered_job_and_list_shows_it_per_team(kube, dev_facts):
    jobs = client(kube, dev_facts)
    submitted = jobs.submit(raw_spec())
    assert submitted.job.name == "smoke-l4" and submitted.job.kind == "PyTorchJob"
    assert ("create", "PyTorchJob", "smoke-l4") in kube.requests
    # Kueue suspends it until admitted: the operator reports the Suspended condition.
    set_conditions(kube, submitted.manifest, "Created", "Suspended")
    assert [(j.name, j.phase, j.nodes, j.gpus_per_node) for j in jobs.list("research")] == [("smoke-l4", "Queued", 1, 1)]
    assert jobs.list("platform") == []
    assert jobs.get("smoke-l4", "research").checkpoint_dir == "/fsx/checkpoints/team-research/smoke-l4"
    set_conditions(kube, submitted.manifest, "Created", "Running", "Succeeded")
    assert jobs.list("research") == [] and [j.phase for j in jobs.list("research", include_finished=True)] == ["Succeeded"]
    with pytest.raises(JobNotFound, match="no job 'nope' in namespace team-research"):
        jobs.get("nope", "research")


def test_submit_refuses_what_preflight_refuses_and_creates_nothing(kube, dev_facts):
    jobs = client(kube, dev_facts)
    with pytest.raises(PreflightRefused):
        jobs.submit(raw_spec(gpusPerNode=8))
    assert not any(r[0] == "apply" for r in kube.requests)


def test_list_skips_a_missing_trainjob_crd_but_not_other_errors(dev_facts):
    class NoTrainJobs:
        def list(self, resource, namespace=None, selector=None):
            if resource.startswith("trainjobs"):
                raise KubeError('the server doesn\'t have a resource type "trainjobs"')
            return []

    assert client(NoTrainJobs(), dev_facts).list() == []

    class Broken(NoTrainJobs):
        def list(self, resource, namespace=None, selector=None):
            raise KubeError("etcdserver: request timed out")

    with pytest.raises(KubeError):
        client(Broken(), dev_facts).list()


# -- describe ------------------------------------------------------------------------------------
def test_describe_says_why_kueue_holds_the_job(kube, dev_facts):
    jobs = client(kube, dev_facts)
    job = jobs.submit(raw_spec()).manifest
    stored = kube.find("pytorchjobs.kubeflow.org", "smoke-l4", "team-research")
    message = "couldn't assign flavors to pod set master: insufficient unused quota for nvidia.com/gpu in flavor l4, 1 more needed"
    kueue_workload(kube, stored, [{"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": message,
                                   "lastTransitionTime": "2026-11-25T10:00:00Z"}])
    detail = jobs.describe("smoke-l4", "research")
    assert detail.admission.admitted is False
    assert detail.admission.reason == f"waiting (Pending): {message}"
    assert detail.pods == () and detail.attempts == ()
    del job


def test_admission_reads_admitted_and_evicted_workloads():
    admitted = {"metadata": {"name": "w"}, "status": {
        "conditions": [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}],
        "admission": {"podSetAssignments": [{"name": "master", "flavors": {"nvidia.com/gpu": "l4"}}]}}}
    assert admission_from(admitted).reason == "admitted on l4"
    evicted = {"metadata": {"name": "w"}, "status": {"conditions": [
        {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "Preempted to accommodate a workload"}]}}
    assert admission_from(evicted).reason.startswith("evicted (Preempted)")


def test_describe_lists_attempts_with_their_meaning_checkpoints_and_cost(kube, dev_facts, tmp_path, monkeypatch):
    """Attempts come from what each node's launcher recorded (trainer/retries.py writes them, here
    for real) plus the pods running now; the cost from node hours x price x the pod's GPU share."""
    from trainer import retries

    store = LocalStore(str(tmp_path))
    jobs = client(kube, dev_facts, store=store, clock=lambda: 1_800_000_000.0 + 1800)
    job = jobs.submit(raw_spec(MULTINODE)).manifest
    job = kube.find("pytorchjobs.kubeflow.org", job["metadata"]["name"], "team-research")
    set_conditions(kube, job, "Created", "Running")
    ckpt = tmp_path / "team-research" / "gpt2-ddp-a10g"
    for step in (100, 200):
        (ckpt / f"step-{step:06d}").mkdir(parents=True)
        (ckpt / f"step-{step:06d}" / "complete.json").write_text("{}")
    (ckpt / "step-000300").mkdir()  # no marker: not complete
    t0 = 1_800_000_000.0 - 3600  # 1_800_000_000 = 2027-01-15T08:00:00Z
    with monkeypatch.context() as m:
        m.setattr(retries.time, "time", lambda: t0 + 3600)  # each attempt ran one hour
        for rank, code in ((0, 143), (1, 137)):
            retries.record_attempt(retries.history_path(str(ckpt), rank), code, None, 100, t0)
    add_node(kube, "ip-10-0-1-1", "g5.12xlarge", "spot", 4)
    operator_pods(kube, job, started_at="2027-01-15T08:00:00Z")  # the current attempt: half an hour so far
    detail = jobs.describe("gpt2-ddp-a10g", "research")
    assert detail.checkpoint_steps == (100, 200)
    assert [(a.node_rank, a.exit_code, a.source) for a in detail.attempts] == [
        (0, 143, "history"), (1, 137, "history"), (0, None, "gpt2-ddp-a10g-master-0"), (1, None, "gpt2-ddp-a10g-worker-0")]
    assert detail.attempts[0].meaning.startswith("preempted") and detail.attempts[1].meaning.startswith("killed")
    assert [(p.node_rank, p.instance_type, p.capacity_type) for p in detail.pods] == [(0, "g5.12xlarge", "spot"), (1, "g5.12xlarge", "spot")]
    # 2 nodes x (1 h recorded + 0.5 h running) x whole node (4 of 4 GPUs) at the g5.12xlarge spot assumption.
    from workloads.prices import PRICES

    assert detail.cost.node_hours == pytest.approx(3.0)
    assert detail.cost.usd == pytest.approx(round(3.0 * PRICES["g5.12xlarge"].spot_usd_per_hour, 2))


@pytest.mark.parametrize("code,meaning", [(0, "done"), (143, "preempted"), (137, "killed"), (141, "peer lost"),
                                          (139, "died of SIGSEGV"), (1, "failed (permanent"), (2, "bad input")])
def test_exit_codes_mean_what_the_launcher_says(code, meaning):
    """trainer/launch.py: 0 finished, 143 preempted, 128+N a signal (137 SIGKILL), 141 peer lost,
    1-127 permanent."""
    from trainer import launch

    assert launch.EXIT_PREEMPTED == 143 and launch.EXIT_PEER_LOST == 141
    assert exit_code_meaning(code).startswith(meaning)


# -- TrainJob -------------------------------------------------------------------------------------
def test_trainjob_pods_are_found_by_the_jobset_labels_they_carry(kube, v2_facts):
    """Trainer v2.3.0 names the JobSet after the TrainJob (plugins/jobset/jobset.go:413) and JobSet
    v0.12.0 labels each pod `jobset.sigs.k8s.io/jobset-name` (jobset_controller.go:950, 1020): the
    v1 label `training.kubeflow.org/job-name` is not on them."""
    jobs = client(kube, v2_facts)
    job = jobs.submit(raw_spec(MULTINODE, runtime="trainjob")).manifest
    job = kube.find("trainjobs.trainer.kubeflow.org", job["metadata"]["name"], "team-research")
    pods = operator_pods(kube, job, logs=lambda name: [f"hello from {name}"])
    assert all("training.kubeflow.org/job-name" not in p["metadata"]["labels"] for p in pods)
    parsed = parse_job(job)
    assert parsed.kind == "TrainJob" and parsed.nodes == 2
    assert kube.list("pods", "team-research", "training.kubeflow.org/job-name=gpt2-ddp-a10g") == []
    assert len(kube.list("pods", "team-research", pod_selector(parsed))) == 2
    lines = list(jobs.logs("gpt2-ddp-a10g", "research", rank=1))
    assert [(l.node_rank, l.text) for l in lines] == [(1, "hello from gpt2-ddp-a10g-node-0-1-xabcd")]
    assert all(r[3] == "node" for r in kube.requests if r[0] == "logs")  # the runtime's container


# -- wait ----------------------------------------------------------------------------------------
def test_wait_polls_until_the_job_finishes(kube, dev_facts):
    clock = [0.0]
    polls = []

    def sleep(seconds):
        polls.append(seconds)
        clock[0] += seconds
        if len(polls) == 3:
            set_conditions(kube, job, "Created", "Running", "Failed", message="PyTorchJob smoke-l4 is failed")

    jobs = client(kube, dev_facts, clock=lambda: clock[0], sleep=sleep)
    job = jobs.submit(raw_spec()).manifest
    set_conditions(kube, job, "Created", "Running")
    assert jobs.wait("smoke-l4", "research", poll_seconds=10).phase == "Failed"
    assert polls == [10, 10, 10]
    set_conditions(kube, job, "Created", "Running")
    with pytest.raises(TimeoutError, match="still Running after 25 s"):
        jobs.wait("smoke-l4", "research", timeout_seconds=25, poll_seconds=10)


def test_client_objects_are_frozen(kube, dev_facts):
    jobs = client(kube, dev_facts)
    job = jobs.submit(raw_spec()).job
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.phase = "Running"


def test_preflight_refuses_a_model_name_the_config_file_gives_outside_the_teams_prefix(kube, dev_facts):
    """Review jobs-ops-4 §3: only an override was checked; trainer/configs/gpt2-124m.yaml's
    `gpt2-124m` passed, MLflow's team authorizer answered 403 at the end and the job Succeeded."""
    spec = raw_spec()
    spec["trainer"] = {**spec["trainer"], "overrides": [o for o in spec["trainer"]["overrides"]
                                                        if not o.startswith("export.registered_model_name=")]}
    jobs = JobClient(stack="dev", kube=kube, facts=dev_facts, store=LocalStore())
    refused = jobs.preflight(spec)
    assert not refused.ok
    assert ("trainer[export.registered_model_name]: comes from trainer/configs/gpt2-124m.yaml and is not under team "
            "research's model prefix team-research.") in refused.text
    assert "add export.registered_model_name=team-research.gpt2-124m to trainer.overrides" in refused.text
    spec["trainer"]["overrides"].append("export.registered_model_name=null")
    assert jobs.preflight(spec).ok
