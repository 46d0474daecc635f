"""Submitting a name the team already uses (review jobs-ops-4 §2 "resubmit", §7 gap 4).

Before: `submit` server-side applied onto the existing object, so a finished job printed
"submitted ...: Succeeded" and exit 0 (nothing ran) and a running job had its pod template
patched in place. Now a submit is a create (POST): the API server answers 409 AlreadyExists for a
taken name (apiserver: "pytorchjobs.kubeflow.org \"x\" already exists"), the client checks every
name first, and `--replace` deletes the old job in the foreground (pods get SIGTERM and their
grace period; the object goes after them) before creating the new one.
"""
from __future__ import annotations

import json

import pytest

import jobs.client as client_module
from jobs.client import JobClient
from jobs.store import LocalStore
from tests.jobs.conftest import SMOKE, operator_pods, raw_spec, set_conditions, use_fake_kubectl

NS = "team-research"
PYTORCHJOBS = "pytorchjobs.kubeflow.org"


def _client(kube, dev_facts, **kwargs) -> JobClient:
    return JobClient(stack="dev", kube=kube, facts=dev_facts, store=LocalStore(), **kwargs)


def test_a_second_submit_of_a_finished_job_is_refused_and_changes_nothing(kube, dev_facts):
    jobs = _client(kube, dev_facts)
    jobs.submit(raw_spec())
    set_conditions(kube, kube.find(PYTORCHJOBS, "smoke-l4", NS), "Created", "Running", "Succeeded")
    before = json.dumps(kube.find(PYTORCHJOBS, "smoke-l4", NS), sort_keys=True)
    writes = len([r for r in kube.requests if r[0] in ("apply", "create", "patch", "delete")])

    with pytest.raises(client_module.JobExists) as refused:
        jobs.submit(raw_spec())
    message = str(refused.value)
    # A finished job's name: running it again would resume its newest checkpoint and train nothing.
    assert "job smoke-l4 in team-research has finished (Succeeded" in message
    assert "Fix: submit with --rerun" in message and "--replace is refused" in message
    assert json.dumps(kube.find(PYTORCHJOBS, "smoke-l4", NS), sort_keys=True) == before
    assert len([r for r in kube.requests if r[0] in ("apply", "create", "patch", "delete")]) == writes


def test_a_second_submit_never_patches_a_running_jobs_pods(kube, dev_facts):
    jobs = _client(kube, dev_facts)
    jobs.submit(raw_spec())
    set_conditions(kube, kube.find(PYTORCHJOBS, "smoke-l4", NS), "Created", "Running")
    template = json.dumps(kube.find(PYTORCHJOBS, "smoke-l4", NS)["spec"], sort_keys=True)
    changed = raw_spec(trainer={"config": "trainer/configs/gpt2-124m.yaml",
                                "overrides": ["data.micro_batch_size=2", "schedule.num_steps=300",
                                              "schedule.warmup_steps=20",
                                              "export.registered_model_name=team-research.smoke-l4"]})
    with pytest.raises(client_module.JobExists, match=r"\(Running, .*an apply would patch the pods of the running one"):
        jobs.submit(changed)
    assert json.dumps(kube.find(PYTORCHJOBS, "smoke-l4", NS)["spec"], sort_keys=True) == template


def test_replace_deletes_in_the_foreground_then_creates(kube, dev_facts):
    """The kubelet's seat in ``sleep``: the old pods exit 143 after SIGTERM; the garbage collector
    then removes the job (foregroundDeletion), and only then is the name created again."""
    def kubelet(_seconds):
        for (resource, ns, name), obj in list(kube.objects.items()):
            if resource == "pods" and obj["metadata"].get("deletionTimestamp"):
                kube.terminate(name, ns, 143)

    jobs = _client(kube, dev_facts, sleep=kubelet)
    first = jobs.submit(raw_spec()).job
    operator_pods(kube, kube.find(PYTORCHJOBS, "smoke-l4", NS))
    set_conditions(kube, kube.find(PYTORCHJOBS, "smoke-l4", NS), "Created", "Running")

    again = jobs.submit(raw_spec(), replace=True, poll_seconds=0)
    assert again.replaced is not None and again.replaced.uid == first.uid and again.replaced.phase == "Running"
    assert again.job.uid != first.uid
    writes = [r for r in kube.requests if r[0] in ("apply", "create", "delete", "patch")]
    assert writes[-2:] == [("delete", PYTORCHJOBS, NS, "smoke-l4", "Foreground"), ("create", "PyTorchJob", "smoke-l4")]
    assert kube.graceful_deletions  # the old pods got their grace period


def test_replace_gives_up_without_creating_when_the_old_job_does_not_go(kube, dev_facts):
    clock = iter(range(0, 10_000, 100))
    jobs = _client(kube, dev_facts, clock=lambda: float(next(clock)), sleep=lambda s: None)
    jobs.submit(raw_spec())
    operator_pods(kube, kube.find(PYTORCHJOBS, "smoke-l4", NS))  # the pods never exit
    with pytest.raises(TimeoutError, match="still terminating .* nothing new was created"):
        jobs.submit(raw_spec(), replace=True, replace_timeout_seconds=300)
    assert [r for r in kube.requests if r[0] == "create"] == [("create", "PyTorchJob", "smoke-l4")]


def test_a_sweep_with_one_taken_name_creates_none(kube, dev_facts):
    jobs = _client(kube, dev_facts)
    first = jobs.render(raw_spec())
    second = json.loads(json.dumps(first))
    second["metadata"]["name"] = "smoke-l4-b"
    jobs.create_jobs([second])
    with pytest.raises(client_module.JobExists, match="job smoke-l4-b already exists"):
        jobs.create_jobs([first, second])
    assert kube.find(PYTORCHJOBS, "smoke-l4", NS) is None


def test_cli_resubmit_is_one_line_exit_7_and_replace_works(kube, dev_facts, tmp_path, monkeypatch, capsys):
    """Through the fake kubectl (the production transport's argv): the second `submit` of a
    finished job exits 7 with the job, its phase and the fix (--rerun); `--replace` of a finished
    job is refused the same way (it would resume the newest checkpoint and train nothing), and
    `--rerun` creates the new run."""
    from jobs.__main__ import main
    from tests.jobs.fake_kube import FakeKubeApi

    state = use_fake_kubectl(tmp_path, monkeypatch)
    kube.save(state)
    facts_file = tmp_path / "facts.json"
    facts_file.write_text(json.dumps(dev_facts.to_dict()))
    argv = ["submit", str(SMOKE), "--stack", "dev", "--facts", str(facts_file)]
    assert main(argv) == 0
    assert "submitted PyTorchJob team-research/smoke-l4" in capsys.readouterr().out
    cluster = FakeKubeApi.load(state)
    set_conditions(cluster, cluster.find(PYTORCHJOBS, "smoke-l4", NS), "Created", "Running", "Succeeded")
    cluster.save(state)
    uid = cluster.find(PYTORCHJOBS, "smoke-l4", NS)["metadata"]["uid"]

    assert main(argv) == 7
    out, err = capsys.readouterr()
    assert "submitted" not in out
    assert err.count("\n") == 1 and err.startswith("error: job smoke-l4 in team-research has finished (Succeeded")
    assert "--rerun" in err
    assert FakeKubeApi.load(state).find(PYTORCHJOBS, "smoke-l4", NS)["metadata"]["uid"] == uid

    assert main([*argv, "--replace"]) == 7
    assert "--replace is refused" in capsys.readouterr().err
    cluster = FakeKubeApi.load(state)
    assert cluster.find(PYTORCHJOBS, "smoke-l4", NS)["metadata"]["uid"] == uid
    assert not [r for r in cluster.requests if r[0] == "delete"]

    assert main([*argv, "--rerun"]) == 0
    assert "submitted PyTorchJob team-research/smoke-l4-r2" in capsys.readouterr().out

    assert main([*argv, "--replace", "--dry-run"]) == 2
    assert "--replace replaces a job on the cluster" in capsys.readouterr().err


def test_the_client_takes_a_kubeconfig_and_context(kube, dev_facts, tmp_path, monkeypatch):
    """JobClient(kubeconfig=..., context=...) passes kubectl's --kubeconfig/--context: a client
    can be pointed at any cluster (e.g. a local control plane) without touching $KUBECONFIG."""
    from jobs.kube import NoClusterAccess

    state = use_fake_kubectl(tmp_path, monkeypatch)
    kube.save(state)
    monkeypatch.delenv("KUBECONFIG")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config either
    monkeypatch.setenv("FAKE_KUBE_CONTEXTS", "kind-mlp")
    with pytest.raises(NoClusterAccess, match="no kubeconfig"):
        JobClient(stack="dev", facts=dev_facts).list("research")
    other = tmp_path / "other-kubeconfig"
    other.write_text("apiVersion: v1\nkind: Config\n")
    jobs = JobClient(stack="dev", facts=dev_facts, store=LocalStore(), kubeconfig=other, context="kind-mlp")
    assert jobs.submit(raw_spec()).job.name == "smoke-l4"
    assert [j.name for j in jobs.list("research")] == ["smoke-l4"]
    with pytest.raises(Exception, match='context "nope" does not exist'):
        JobClient(stack="dev", facts=dev_facts, kubeconfig=other, context="nope").list("research")
