"""What the trackers record across a rollback and across jobs (review trainer-3 B4, B5, B10, B12),
with a real MLflow store (sqlite) and real single-process training."""
import json
import os

import pytest

from trainer.checkpoint import read_marker
from trainer.checkpoint.layout import ABANDONED, step_dir
from trainer.config import load_config
from trainer.train import main
from trainer_helpers import TINY_CONFIG, losses, tiny_overrides


def train(overrides):
    return main(load_config(TINY_CONFIG, overrides, environ={}))


def rows(ckpt):
    with open(os.path.join(ckpt, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture
def mlflow_uri(tmp_path):
    return f"sqlite:///{tmp_path}/mlflow.db"


def history(client, run_id, key):
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def test_after_a_rollback_mlflow_shows_the_branch_that_produced_the_model(tmp_path, data_dir, mlflow_uri,
                                                                         restore_signals):
    """E7: branch A, 12 steps at lr 3e-3; branch B rolls back to step 4 with lr 3e-4. MLflow
    used to keep A's loss and lr for steps 5-12 and drop B's as replays."""
    from mlflow.tracking import MlflowClient

    ckpt = str(tmp_path / "c")
    base = {"schedule.num_steps": 12, "checkpoint.every_steps": 4, "tracking.uri": mlflow_uri,
            "tracking.experiment": "lineage", "tracking.job_id": "job-rb"}
    assert train(tiny_overrides(data_dir, ckpt, **base)) == 0
    branch_a = losses(ckpt)
    a_run = read_marker(step_dir(ckpt, 12))["mlflow_run_id"]
    assert a_run, "the marker carries the run id once it is known"
    assert train(tiny_overrides(data_dir, ckpt, **base, **{"checkpoint.resume": step_dir(ckpt, 4),
                                                          "optimizer.lr": 3e-4})) == 0
    branch_b = losses(ckpt)
    assert branch_b[12] != branch_a[12]
    b_run = read_marker(step_dir(ckpt, 12))["mlflow_run_id"]
    assert b_run and b_run != a_run
    client = MlflowClient(tracking_uri=mlflow_uri)
    b = client.get_run(b_run)
    assert b.data.tags["trainer.rollback_of"] == a_run and b.data.tags["trainer.branch_point"] == "4"
    assert b.data.tags["trainer.job_id"] == "job-rb"
    assert history(client, b_run, "loss") == pytest.approx(branch_b, abs=0, rel=1e-6)  # shared 1-4, then B's
    assert history(client, a_run, "loss") == pytest.approx(branch_a, abs=0, rel=1e-6)  # A kept apart
    # metrics.jsonl follows B; A's rows past the branch point are kept under abandoned/<branch>/.
    [branch_dir] = os.listdir(os.path.join(ckpt, ABANDONED))
    assert losses(os.path.join(ckpt, ABANDONED, branch_dir)) == {s: v for s, v in branch_a.items() if s > 4}
    # A later attempt of B (spec unchanged) reattaches to B's run, not A's.
    assert train(tiny_overrides(data_dir, ckpt, **{**base, "schedule.num_steps": 14}, **{
        "checkpoint.resume": step_dir(ckpt, 4), "optimizer.lr": 3e-4})) == 0
    assert read_marker(step_dir(ckpt, 14))["mlflow_run_id"] == b_run
    assert max(history(client, b_run, "loss")) == 14 and max(history(client, a_run, "loss")) == 12


def test_initial_load_starts_a_new_job_from_another_jobs_weights(tmp_path, data_dir, mlflow_uri, restore_signals):
    """B5: starting from another job's checkpoint attached to that job's MLflow run and inherited
    its goodput. The explicit initial load (torchtitan's initial_load_path) takes the weights only."""
    from mlflow.tracking import MlflowClient

    x = str(tmp_path / "x")
    common = {"tracking.uri": mlflow_uri, "checkpoint.every_steps": 10, "model.dropout": 0.0}
    assert train(tiny_overrides(data_dir, x, **common, **{"schedule.num_steps": 40, "tracking.experiment": "pretrain",
                                                          "tracking.job_id": "job-x"})) == 0
    x_marker = read_marker(step_dir(x, 40))
    y = str(tmp_path / "y")
    fresh = str(tmp_path / "fresh")
    y_spec = {**common, "schedule.num_steps": 6, "tracking.experiment": "finetune", "tracking.job_id": "job-y"}
    assert train(tiny_overrides(data_dir, y, **y_spec, **{"checkpoint.initial_load_path": step_dir(x, 40)})) == 0
    assert train(tiny_overrides(data_dir, fresh, **{**y_spec, "tracking.job_id": "job-fresh"})) == 0
    # Step, schedule and data start at 0; the weights are X's: the first loss is far below a fresh start.
    assert sorted(losses(y)) == list(range(1, 7))
    assert losses(y)[1] < losses(fresh)[1] - 1.0
    lr = {run: {r["step"]: r["learning_rate"] for r in rows(run) if "learning_rate" in r} for run in (y, fresh)}
    assert lr[y] == lr[fresh]  # the schedule is Y's own, from its step 0
    with open(os.path.join(y, "summary.json")) as f:
        assert json.load(f)["num_restarts"] == 0  # not X's goodput
    client = MlflowClient(tracking_uri=mlflow_uri)
    x_run = client.get_run(x_marker["mlflow_run_id"])
    assert x_run.data.tags["trainer.job_id"] == "job-x" and max(history(client, x_run.info.run_id, "loss")) == 40
    y_run = read_marker(step_dir(y, 6))["mlflow_run_id"]
    assert y_run != x_run.info.run_id
    assert client.get_run(y_run).data.tags["trainer.job_id"] == "job-y"


def test_checkpoint_resume_from_another_jobs_directory_never_attaches_to_its_run(tmp_path, data_dir, mlflow_uri,
                                                                                restore_signals):
    from mlflow.tracking import MlflowClient

    x, y = str(tmp_path / "x"), str(tmp_path / "y")
    common = {"tracking.uri": mlflow_uri, "checkpoint.every_steps": 5}
    assert train(tiny_overrides(data_dir, x, **common, **{"schedule.num_steps": 10, "tracking.job_id": "job-x"})) == 0
    x_run = read_marker(step_dir(x, 10))["mlflow_run_id"]
    assert train(tiny_overrides(data_dir, y, **common, **{"schedule.num_steps": 13, "tracking.job_id": "job-y",
                                                          "checkpoint.resume": step_dir(x, 10)})) == 0
    client = MlflowClient(tracking_uri=mlflow_uri)
    assert client.get_run(x_run).data.tags["trainer.job_id"] == "job-x"
    assert max(history(client, x_run, "loss")) == 10
    assert read_marker(step_dir(y, 13))["mlflow_run_id"] != x_run


def test_the_learning_rate_logged_for_a_step_is_the_one_it_used(tmp_path, data_dir, restore_signals):
    """B10: the logged rate was read after scheduler.step(), i.e. the next step's. Warm-up is
    linear from step 1: step s of a 5-step warm-up uses lr * s / 5 (trainer/train.py's schedule)."""
    ckpt = str(tmp_path / "c")
    assert train(tiny_overrides(data_dir, ckpt, **{"schedule.num_steps": 8, "checkpoint.every_steps": 8})) == 0
    lr = {r["step"]: r["learning_rate"] for r in rows(ckpt) if "learning_rate" in r}
    peak = load_config(TINY_CONFIG, tiny_overrides(data_dir, ckpt), environ={}).optimizer.lr
    assert lr[1] == pytest.approx(peak * 1 / 5)  # schedule.warmup_steps=5 (tiny_overrides)
    assert lr[3] == pytest.approx(peak * 3 / 5)
