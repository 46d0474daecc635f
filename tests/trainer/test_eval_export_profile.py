"""Validation loss, Hugging Face export + MLflow model registry, profiler trace: single
process, in this process (the torchrun paths share the code; see test_features_torchrun)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from trainer.checkpoint import read_marker
from trainer.checkpoint.layout import latest_complete, step_dir
from trainer_helpers import REPO, assert_same_tensors, checkpoint_tensors, losses

from test_train_single_process import train

NUM_STEPS = 16
BASE = {"schedule.num_steps": NUM_STEPS, "checkpoint.every_steps": 5, "schedule.grad_accum_steps": 2}
NO_EVAL = {"evaluation.at_end": "false", "evaluation.every_steps": 0, "export.at_end": "false"}


def metric_rows(ckpt, key):
    with open(os.path.join(ckpt, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [(r["step"], r[key]) for r in rows if key in r]


def test_evaluation_never_changes_training_and_resumes_bitwise(tmp_path, data_dir, restore_signals):
    """A run that evaluates every 3 steps, interrupted and resumed, equals bitwise a run that
    never evaluates: same per-step losses, weights and optimizer state (dropout 0.1 is on, so
    an evaluation that consumed RNG or data would show)."""
    plain, evaluated = str(tmp_path / "plain"), str(tmp_path / "evaluated")
    assert train([f"{k}={v}" for k, v in {**BASE, **NO_EVAL}.items()] + _paths(data_dir, plain)) == 0
    with_eval = [f"{k}={v}" for k, v in {**BASE, "evaluation.every_steps": 3, "export.at_end": "false"}.items()]
    assert train(with_eval + _paths(data_dir, evaluated), signal_at_step=4) == 143
    stopped_at = read_marker(latest_complete(evaluated))["step"]
    assert train(with_eval + _paths(data_dir, evaluated)) == 0

    assert losses(plain) == losses(evaluated)
    assert_same_tensors(checkpoint_tensors(latest_complete(plain), tmp_path),
                        checkpoint_tensors(latest_complete(evaluated), tmp_path))
    val = metric_rows(evaluated, "val_loss")
    # Every 3 steps and at the end, each once after the resume; a preempted step saves instead.
    assert [s for s, _ in val] == [s for s in (3, 6, 9, 12, 15, 16) if s != stopped_at]
    assert all(0 < v < 10 for _, v in val)
    assert val[-1][1] < val[0][1], "validation loss should fall while training"
    assert metric_rows(plain, "val_loss") == []


def _paths(data_dir, ckpt):
    from trainer_helpers import tiny_overrides

    return tiny_overrides(data_dir, ckpt)


def logged_model_of(client, version):
    experiment = client.get_experiment_by_name("export-test")
    found = [m for m in client.search_logged_models(experiment_ids=[experiment.experiment_id])
             if m.artifact_location == version.source]
    assert len(found) == 1, "the version's source is one logged model's artifacts"
    return found[0]


@pytest.fixture
def mlflow_store(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_experiment("export-test", artifact_location=(tmp_path / "artifacts").as_uri())
    return uri, client


def test_end_of_run_export_registers_a_loadable_gpt2_model_and_logs_the_profile(tmp_path, data_dir, mlflow_store,
                                                                               restore_signals, monkeypatch):
    import mlflow
    from transformers import GPT2LMHeadModel

    from trainer.export import checkpoint_config, load_model_from_checkpoint

    uri, client = mlflow_store
    monkeypatch.setenv("GIT_COMMIT", "0123abc")
    ckpt = str(tmp_path / "ckpt")
    overrides = [f"{k}={v}" for k, v in {
        **BASE, "tracking.uri": uri, "tracking.experiment": "export-test", "tracking.job_id": "export-job",
        "export.registered_model_name": "tiny-gpt", "profiler.start_step": 2, "profiler.num_steps": 2,
        "evaluation.every_steps": 8}.items()] + _paths(data_dir, ckpt)
    assert train(overrides) == 0

    run_id = read_marker(step_dir(ckpt, NUM_STEPS))["mlflow_run_id"]
    run = client.get_run(run_id)
    assert run.data.tags["mlflow.source.git.commit"] == "0123abc"  # MLflow's standard system tags
    assert run.data.tags["mlflow.source.name"] == "python -m trainer train"
    assert [m.step for m in client.get_metric_history(run_id, "val_loss")] == [8, 16]

    # Registered: version 1 of tiny-gpt, from a logged model of this run, with its lineage tags.
    version = client.get_model_version("tiny-gpt", "1")
    assert version.run_id == run_id
    assert version.tags["mlflow.source.git.commit"] == "0123abc"
    assert version.tags["config_hash"] == run.data.tags["config_hash"]
    assert version.tags["dataset_hash"] == run.data.tags["dataset_hash"]
    logged = logged_model_of(client, version)
    assert logged.source_run_id == run_id and logged.tags["trainer.step"] == str(NUM_STEPS)
    assert [(v["name"], str(v["version"])) for v in json.loads(logged.tags["mlflow.modelVersions"])] == [("tiny-gpt", "1")]
    outputs = client.get_run(run_id).outputs.model_outputs
    assert [(o.model_id, o.step) for o in outputs] == [(logged.model_id, NUM_STEPS)]  # listed on the run

    # Load it back from the registry and compare with the trainer's own model from the checkpoint.
    # (mlflow.artifacts resolves models:/ through the process-global registry URI; the client does not.)
    local = mlflow.artifacts.download_artifacts(artifact_uri=client.get_model_version_download_uri("tiny-gpt", "1"),
                                                dst_path=str(tmp_path / "downloaded"))
    assert {"config.json", "model.safetensors", "trainer_export.json"} <= set(os.listdir(local))
    hf = GPT2LMHeadModel.from_pretrained(local).eval()
    ours = load_model_from_checkpoint(step_dir(ckpt, NUM_STEPS), checkpoint_config(step_dir(ckpt, NUM_STEPS)))
    assert hf.lm_head.weight is hf.transformer.wte.weight  # tied, like GPT-2
    ids = torch.randint(0, ours.shape.vocab_size, (2, 32))
    with torch.no_grad():
        assert torch.allclose(ours(ids), hf(input_ids=ids).logits, atol=1e-5)
    assert os.path.isfile(os.path.join(ckpt, "export", f"step-{NUM_STEPS:06d}", "model.safetensors"))

    # The profiler trace of steps 2-3: on disk and in the run's artifacts.
    trace = os.path.join(ckpt, "profile", "step-000002-000003", "rank-0.pt.trace.json")
    with open(trace) as f:
        assert json.load(f)["traceEvents"], "empty trace"
    artifacts = [a.path for a in client.list_artifacts(run_id, "profile")]
    assert artifacts == ["profile/rank-0.pt.trace.json"]

    # On demand from an older checkpoint, through the CLI: version 2, attached to MLFLOW_RUN_ID.
    env = {**os.environ, "PYTHONPATH": REPO, "MLFLOW_TRACKING_URI": uri, "MLFLOW_RUN_ID": run_id}
    result = subprocess.run([sys.executable, "-m", "trainer", "export", "--checkpoint", step_dir(ckpt, 15),
                             "--out", str(tmp_path / "step15"), "--registered-model-name", "tiny-gpt"],
                            env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    second = client.get_model_version("tiny-gpt", "2")
    assert second.run_id == run_id and logged_model_of(client, second).tags["trainer.step"] == "15"
    assert json.load(open(tmp_path / "step15" / "trainer_export.json"))["step"] == 15


def test_export_cli_refuses_a_bad_checkpoint_clearly(tmp_path):
    result = subprocess.run([sys.executable, "-m", "trainer", "export", "--checkpoint", str(tmp_path / "nope"),
                             "--out", str(tmp_path / "x"), "--tracking-uri", "ftp://x"],
                            env={**os.environ, "PYTHONPATH": REPO}, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "no complete.json there" in result.stderr and "--tracking-uri='ftp://x'" in result.stderr


def test_hugging_face_models_export_with_save_pretrained(tmp_path, data_dir, tiny_hf_dir, restore_signals):
    from transformers import AutoModelForCausalLM

    from trainer.export import checkpoint_config, load_model_from_checkpoint

    ckpt = str(tmp_path / "ckpt")
    overrides = _paths(data_dir, ckpt) + [f"{k}={v}" for k, v in {
        "schedule.num_steps": 3, "schedule.warmup_steps": 1, "model.kind": "hf", "model.hf_path": tiny_hf_dir,
        "evaluation.at_end": "false"}.items()]
    assert train(overrides) == 0
    out = os.path.join(ckpt, "export", "step-000003")
    assert json.load(open(os.path.join(out, "trainer_export.json")))["architecture"] == "LlamaForCausalLM"
    exported = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    trained = load_model_from_checkpoint(step_dir(ckpt, 3), checkpoint_config(step_dir(ckpt, 3)))
    original = AutoModelForCausalLM.from_pretrained(tiny_hf_dir, local_files_only=True).eval()
    ids = torch.randint(0, 257, (2, 16))
    with torch.no_grad():
        assert torch.equal(exported(input_ids=ids).logits, trained(ids))
        assert not torch.equal(exported(input_ids=ids).logits, original(input_ids=ids).logits)  # it did train
