"""Sweeps: one job per point of the grid, grouped by a label, one MLflow parent run."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from jobs.sweep import (MAX_POINTS, POINT_ANNOTATION, SWEEP_ID_ENV, SWEEP_LABEL, SWEEP_NAME_ENV, SweepError, expand,
                        parse_sweeps, point_name, render_sweep, results_table)
from workloads.jobspec import MAX_NAME_LENGTH, parse_job_spec
from tests.support.validation import validate_custom_resource

ROOT = Path(__file__).resolve().parents[2]
SPEC = yaml.safe_load((ROOT / "examples" / "jobs" / "l4-dev-smoke.yaml").read_text())


@pytest.fixture(scope="module")
def dev_facts(dev_plan):
    from jobs.facts import facts_from_plan

    return facts_from_plan(dev_plan)


@pytest.fixture(scope="module")
def spec():
    return parse_job_spec(SPEC)


def test_the_grid_is_the_cartesian_product(spec):
    axes = parse_sweeps(["optimizer.lr=1e-4,3e-4", "trainer.data.micro_batch_size=2,4,8"], spec, repo_root=str(ROOT))
    points = expand(spec, axes)
    assert len(points) == 6
    assert {tuple(sorted(p.values.items())) for p in points} == {
        (("data.micro_batch_size", b), ("optimizer.lr", lr)) for lr in ("1e-4", "3e-4") for b in ("2", "4", "8")}
    names = [p.name for p in points]
    assert len(set(names)) == 6 and all(len(n) <= MAX_NAME_LENGTH for n in names)
    # Every point: its own checkpoint directory, the sweep's experiment, its values last (they win).
    assert len({p.spec.checkpoint_path for p in points}) == 6
    assert {p.spec.experiment_name for p in points} == {f"{spec.namespace}/{spec.name}"}
    assert all(p.spec.trainer.overrides[-2:] == p.overrides for p in points)


def test_a_swept_key_replaces_the_specs_own_override(spec):
    with_lr = spec.model_copy(update={"trainer": spec.trainer.model_copy(update={"overrides": ["optimizer.lr=1e-3"]})})
    (point, _) = expand(with_lr, parse_sweeps(["optimizer.lr=1e-4,3e-4"], with_lr, repo_root=str(ROOT)))
    assert [o for o in point.spec.trainer.overrides if o.startswith("optimizer.lr=")] == ["optimizer.lr=1e-4"]


def test_long_names_are_cut_to_a_job_name():
    assert point_name("x" * 40, 7, 12) == "x" * 37 + "-07"


def test_rendered_points_are_labelled_valid_jobs_with_the_sweep_identity(spec, dev_facts, schemas):
    points = expand(spec, parse_sweeps(["optimizer.lr=1e-4,3e-4"], spec, repo_root=str(ROOT)), name="lr-probe")
    manifests = render_sweep(points, dev_facts, sweep="lr-probe")
    assert len(manifests) == 2
    for manifest, point in zip(manifests, points):
        assert validate_custom_resource(manifest, schemas) == []
        assert manifest["metadata"]["labels"][SWEEP_LABEL] == "lr-probe"
        # Queued through the team's LocalQueue like any job (Kueue admits within the quota).
        assert manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "training"
        assert json.loads(manifest["metadata"]["annotations"][POINT_ANNOTATION]) == dict(point.values)
        for replica in manifest["spec"]["pytorchReplicaSpecs"].values():
            assert replica["template"]["metadata"]["labels"][SWEEP_LABEL] == "lr-probe"
            env = {e["name"]: e.get("value") for e in replica["template"]["spec"]["containers"][0]["env"]}
            assert env[SWEEP_ID_ENV] == f"{spec.namespace}.lr-probe" and env[SWEEP_NAME_ENV] == "lr-probe"
            assert f"tracking.run_name={point.name}" in replica["template"]["spec"]["containers"][0]["args"]


@pytest.mark.parametrize("arguments, field, words", [
    (["optimizer.learning_rate=1e-4"], "--sweep optimizer.learning_rate=1e-4", "did you mean optimizer.lr?"),
    (["optimizer.lr="], "--sweep optimizer.lr=", "no values"),
    (["optimizer.lr=1e-4,,3e-4"], "--sweep optimizer.lr=1e-4,,3e-4", "empty value"),
    (["data.micro_batch_size=four"], "--sweep data.micro_batch_size=four", "must be an integer"),
    (["optimizer.lr=1e-4,1e-4"], "--sweep optimizer.lr=1e-4,1e-4", "repeats"),
    (["optimizer.lr"], "--sweep", "KEY=V1,V2"),
    (["data.dir=/fsx/x"], "--sweep data.dir=/fsx/x", "set by the platform"),
    (["optimizer.lr=1e-4", "optimizer.lr=3e-4"], "--sweep optimizer.lr=3e-4", "swept twice"),
    ([], "--sweep", "no sweep"),
])
def test_bad_sweep_input_names_field_value_and_fix(spec, arguments, field, words):
    with pytest.raises(SweepError) as caught:
        parse_sweeps(arguments, spec, repo_root=str(ROOT))
    problem = next(p for p in caught.value.problems if p.path == field)
    assert words in problem.message + " " + problem.fix and problem.fix


def test_every_sweep_mistake_at_once(spec):
    with pytest.raises(SweepError) as caught:
        parse_sweeps(["optimizer.learning_rate=1e-4", "data.micro_batch_size=x", "optimizer.lr="], spec, repo_root=str(ROOT))
    assert len(caught.value.problems) == 3


def test_too_many_points_are_refused(spec):
    values = ",".join(str(i) for i in range(1, 10))
    with pytest.raises(SweepError) as caught:
        parse_sweeps([f"data.micro_batch_size={values}", f"schedule.grad_accum_steps={values}"], spec, repo_root=str(ROOT))
    assert any(f"more than {MAX_POINTS}" in p.message for p in caught.value.problems)


def test_submit_preflights_every_point_and_refuses_one_that_does_not_fit(tmp_path, dev_facts):
    """The plan is data (no printing): the command line prints ``plan.lines()``."""
    from jobs.client import JobClient

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    plan = JobClient(stack="dev", facts=dev_facts).plan_sweep(path, ["data.micro_batch_size=4,4096"])
    out = "\n".join(plan.lines())
    assert plan.exit_code == 3 and plan.manifests == (), out
    assert "-0 (data.micro_batch_size=4): OK" in out and "-1 (data.micro_batch_size=4096): REFUSED" in out


def test_a_sweep_refuses_an_initfrom_step_that_is_not_complete(tmp_path, dev_facts):
    """Sweeps go through the client's preflight, initFrom included (before: a sweep rendered
    points whose initFrom named a step that was never completed; each pod then failed for good)."""
    import dataclasses

    from jobs.client import JobClient
    from jobs.store import LocalStore
    from trainer.contract.layout import step_dir_name

    store = tmp_path / "checkpoints"
    done = store / "team-research" / "base" / step_dir_name(100)
    done.mkdir(parents=True)
    (done / "complete.json").write_text("{}")
    client = JobClient(stack="dev", facts=dataclasses.replace(dev_facts, checkpoints_bucket="b"), store=LocalStore(str(store)))
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**SPEC, "initFrom": "base/step-200"}))
    plan = client.plan_sweep(path, ["optimizer.lr=1e-4,3e-4"])
    assert plan.exit_code == 2 and not plan.manifests
    assert "initFrom: no complete checkpoint there (complete steps of that job: [100])" in "\n".join(plan.lines())
    path.write_text(yaml.safe_dump({**SPEC, "initFrom": "base/step-100"}))
    assert client.plan_sweep(path, ["optimizer.lr=1e-4,3e-4"]).exit_code == 0


def test_results_table_over_job_objects_sorted_by_the_metric():
    def job(name, lr, phase):
        return SimpleNamespace(name=name, phase=phase, labels={SWEEP_LABEL: "lr"},
                               annotations={POINT_ANNOTATION: json.dumps({"optimizer.lr": lr})})

    jobs = [job("lr-0", "1e-4", "Succeeded"), job("lr-1", "3e-4", "Running"), job("lr-2", "1e-3", "Failed"),
            SimpleNamespace(name="other", phase="Running", labels={}, annotations={})]
    table = results_table(jobs, "lr", metrics={"lr-0": {"val_loss": 3.5}, "lr-1": {"val_loss": 3.1}})
    lines = table.splitlines()
    assert lines[0] == "sweep lr: 3 job(s), sorted by val_loss"
    assert lines[1].split() == ["job", "phase", "optimizer.lr", "val_loss"]
    assert [line.split()[0] for line in lines[2:]] == ["lr-1", "lr-0", "lr-2"]  # best first, no metric last
    assert "other" not in table


def test_results_table_reads_kubernetes_objects_too():
    manifest = {"metadata": {"name": "lr-0", "labels": {SWEEP_LABEL: "lr"}, "annotations": {POINT_ANNOTATION: '{"optimizer.lr": "1e-4"}'}},
                "status": {"conditions": [{"type": "Created", "status": "True"}, {"type": "Running", "status": "True"}]}}
    assert "lr-0  Running  1e-4" in results_table([manifest], "lr")
    assert results_table([], "lr") == "no jobs of sweep 'lr'"


def test_the_trainer_puts_every_point_under_one_parent_run(tmp_path, monkeypatch):
    """MLflow nests a run under another by the tag mlflow.parentRunId (mlflow/utils/mlflow_tags.py,
    MLFLOW_PARENT_RUN_ID = "mlflow.parentRunId"): two points of one sweep, each its own run, one parent."""
    from mlflow.tracking import MlflowClient

    from trainer.tracking import PARENT_RUN_TAG, SWEEP_TAG, MLflowTracker

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the fast store; the server uses a database
    uri = f"file://{tmp_path}/mlruns"
    runs = []
    for point in ("lr-0", "lr-1"):
        tracker = MLflowTracker(uri=uri, experiment="team-research/lr", job_id=f"team-research.{point}", run_name=point,
                                run_id=None, params={"optimizer.lr": point}, tags={}, config_yaml="{}",
                                sweep=("team-research.lr", "lr"))
        tracker.log(1, {"loss": 1.0})
        tracker.close("FINISHED")
        runs.append(tracker.run_id)
    client = MlflowClient(tracking_uri=uri)
    children = [client.get_run(r) for r in runs]
    parents = {c.data.tags[PARENT_RUN_TAG] for c in children}
    assert len(set(runs)) == 2 and len(parents) == 1
    parent = client.get_run(parents.pop())
    assert parent.info.run_name == "lr" and parent.data.tags[SWEEP_TAG] == "team-research.lr"
    assert parent.info.run_id not in runs


def test_a_dry_run_sweep_says_nothing_was_submitted(dev_facts, tmp_path, capsys):
    """Review jobs-ops-4 §1 #10: `--dry-run --sweep` ended with "queued by Kueue" though nothing was submitted."""
    import json

    from jobs.__main__ import main
    from tests.jobs.conftest import SMOKE

    facts_file = tmp_path / "facts.json"
    facts_file.write_text(json.dumps(dev_facts.to_dict()))
    assert main(["submit", str(SMOKE), "--stack", "dev", "--dry-run", "--facts", str(facts_file),
                 "--sweep", "optimizer.lr=1e-4,3e-4"]) == 0
    err = capsys.readouterr().err
    assert "queued by Kueue" not in err
    assert "sweep smoke-l4: 2 job(s) for team-research rendered below; nothing submitted (--dry-run)" in err
