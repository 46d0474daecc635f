"""Reruns: a new run of a spec gets its own name, checkpoint directory and MLflow run, optionally
starting from the previous run's newest checkpoint; a finished job is never "replaced" (its newest
checkpoint would be resumed and nothing trained: trainer/train.py loops ``while self.step <
num_steps``)."""
from __future__ import annotations

import json

import pytest

from jobs.__main__ import main
from jobs.client import JobClient, JobExists
from jobs.rerun import RerunError, next_name, plan_rerun
from jobs.store import LocalStore
from tests.jobs.conftest import SMOKE, raw_spec, set_conditions, use_fake_kubectl
from trainer.contract.environment import ENV_CHECKPOINT_DIR, ENV_RUN_ID
from workloads.jobspec import load_job_spec, parse_job_spec

NS = "team-research"


def env_of(manifest: dict) -> dict:
    container = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_the_next_number_counts_the_first_run_as_one():
    assert next_name("smoke-l4", []) == ("smoke-l4-r2", None)
    assert next_name("smoke-l4", ["smoke-l4"]) == ("smoke-l4-r2", "smoke-l4")
    assert next_name("smoke-l4", ["smoke-l4", "smoke-l4-r2", "smoke-l4-r7", "smoke-l4-rx", "other-r9"]) == \
        ("smoke-l4-r8", "smoke-l4-r7")


def test_a_rerun_has_its_own_checkpoints_and_mlflow_run_in_the_same_experiment(dev_facts):
    spec = load_job_spec(SMOKE)
    rerun = plan_rerun(spec, ["smoke-l4"])
    assert rerun.spec.name == "smoke-l4-r2" and rerun.previous == "smoke-l4"
    assert rerun.spec.checkpoint_path == f"/fsx/checkpoints/{NS}/smoke-l4-r2"
    assert rerun.spec.experiment_name == spec.experiment_name == f"{NS}/smoke-l4"
    from workloads.trainingjob import render

    env = env_of(render(rerun.spec, dev_facts))
    assert env[ENV_CHECKPOINT_DIR] == f"/fsx/checkpoints/{NS}/smoke-l4-r2"
    assert env[ENV_RUN_ID] == f"{NS}.smoke-l4-r2" != env_of(render(spec, dev_facts))[ENV_RUN_ID]
    assert env["MLFLOW_EXPERIMENT_NAME"] == f"{NS}/smoke-l4"
    # An explicit checkpointDir and run name take the suffix too.
    custom = parse_job_spec({**raw_spec(), "checkpointDir": f"/fsx/checkpoints/{NS}/lm/base", "runName": "base"})
    named = plan_rerun(custom, ["smoke-l4"], suffix="lr2")
    assert (named.spec.name, named.spec.checkpoint_dir, named.spec.run_name) == (
        "smoke-l4-lr2", f"/fsx/checkpoints/{NS}/lm/base-lr2", "base-lr2")


def test_from_previous_starts_from_the_newest_complete_step_of_the_newest_run():
    steps = {f"/fsx/checkpoints/{NS}/smoke-l4-r2": [100, 200], f"/fsx/checkpoints/{NS}/smoke-l4": [50]}
    rerun = plan_rerun(load_job_spec(SMOKE), ["smoke-l4", "smoke-l4-r2"], from_previous=True,
                       complete_steps=lambda d: steps.get(d, []))
    assert rerun.spec.name == "smoke-l4-r3" and rerun.spec.init_from == "smoke-l4-r2/step-200"
    from trainer.contract.layout import step_dir_name

    assert rerun.spec.init_from_path == f"/fsx/checkpoints/{NS}/smoke-l4-r2/{step_dir_name(200)}"


@pytest.mark.parametrize("kwargs, taken, message", [
    ({"suffix": "Lr_2"}, [], r"^--rerun: is not a name suffix .*\(got 'Lr_2'\)\. Fix: e\.g\. --rerun lr2"),
    ({"suffix": "x" * 40}, [], r"^--rerun: the rerun's name smoke-l4-x+ is longer than 40 characters .*Fix: shorten"),
    ({"suffix": "r2"}, ["smoke-l4", "smoke-l4-r2"], r"job smoke-l4-r2 already exists"),
    ({"from_previous": True}, [], r"^--from-previous: no earlier run of smoke-l4 is known"),
    ({"from_previous": True}, ["smoke-l4"], r"^--from-previous: the previous run smoke-l4 has no complete checkpoint"),
])
def test_a_malformed_rerun_setting_is_one_line_naming_the_flag_and_the_fix(kwargs, taken, message):
    with pytest.raises(RerunError, match=message) as refused:
        plan_rerun(load_job_spec(SMOKE), taken, complete_steps=lambda d: [], **kwargs)
    assert "\n" not in str(refused.value) and "Fix: " in str(refused.value)


def finished_cluster(kube, dev_facts, phase="Succeeded"):
    client = JobClient(stack="dev", kube=kube, facts=dev_facts, store=LocalStore(), sleep=lambda s: None)
    client.submit(raw_spec())
    set_conditions(kube, kube.find("pytorchjobs.kubeflow.org", "smoke-l4", NS), "Created", "Running", phase)
    return client


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_replace_of_a_finished_job_is_refused_with_the_rerun_fix(kube, dev_facts, phase):
    """Before: --replace deleted the finished job and created it again; the new pods resumed its
    newest checkpoint, at schedule.num_steps, and trained nothing."""
    client = finished_cluster(kube, dev_facts, phase)
    with pytest.raises(JobExists, match=rf"has finished \({phase}, .*--replace is refused\. Fix: submit with --rerun"):
        client.submit(raw_spec(), replace=True)
    assert not [r for r in kube.requests if r[0] == "delete"], "the finished job was deleted"


def test_submit_rerun_through_the_command_line(kube, dev_facts, tmp_path, monkeypatch, capsys):
    finished_cluster(kube, dev_facts)
    state = use_fake_kubectl(tmp_path, monkeypatch)
    kube.save(state)
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(dev_facts.to_dict()))
    # The finished name, resubmitted: exit 7 and the fix is --rerun (not --replace).
    assert main(["submit", str(SMOKE), "--stack", "dev", "--facts", str(facts)]) == 7
    err = capsys.readouterr().err
    assert "has finished (Succeeded" in err and "Fix: submit with --rerun" in err
    assert main(["submit", str(SMOKE), "--stack", "dev", "--facts", str(facts), "--rerun"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"rerun of smoke-l4 as smoke-l4-r2: checkpoints in /fsx/checkpoints/{NS}/smoke-l4-r2, a new "
                          f"MLflow run in experiment {NS}/smoke-l4, starting from scratch")
    assert "submitted PyTorchJob team-research/smoke-l4-r2" in out
    from tests.jobs.fake_kube import FakeKubeApi

    created = FakeKubeApi.load(state).find("pytorchjobs.kubeflow.org", "smoke-l4-r2", NS)
    assert env_of(created)[ENV_RUN_ID] == f"{NS}.smoke-l4-r2"


@pytest.mark.parametrize("flags, message", [
    (["--from-previous"], "error: --from-previous starts a rerun from the previous run's checkpoint. Fix: add --rerun"),
    (["--rerun", "--replace"], "error: --rerun and --replace do not go together"),
    (["--rerun", "--local"], "error: --rerun and --local do not go together"),
    (["--rerun=Bad_X", "--dry-run"], "error: --rerun: is not a name suffix"),
])
def test_bad_rerun_flags_are_one_line_and_create_nothing(kube, dev_facts, tmp_path, monkeypatch, capsys, flags, message):
    state = use_fake_kubectl(tmp_path, monkeypatch)
    kube.save(state)
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(dev_facts.to_dict()))
    assert main(["submit", str(SMOKE), "--stack", "dev", "--facts", str(facts), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err
    from tests.jobs.fake_kube import FakeKubeApi

    assert not FakeKubeApi.load(state).list("pytorchjobs.kubeflow.org", NS)
