"""`python -m workloads pipeline --local`: text files -> tokens -> tiny GPT -> validation loss -> a model
version in a local MLflow registry, with the commands the WorkflowTemplate runs (a few minutes on CPU)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.plan import ROOT

DECLARATION = "workloads/declared/dev/pipelines/shakespeare-gpt.yaml"
CORPUS_MODULES = ("argparse", "textwrap", "string", "functools", "dataclasses")


def _texts(directory: Path) -> Path:
    import importlib

    directory.mkdir()
    for name in CORPUS_MODULES:
        source = Path(importlib.import_module(name).__file__).read_text()
        (directory / f"{name}.txt").write_text(source)
    return directory


def _cli(*args, cwd=ROOT):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "workloads", "pipeline", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.skipif(not (ROOT / "trainer" / "export.py").exists(),
                    reason="the register step runs `python -m trainer export` (trainer export capability not in this checkout)")
def test_local_pipeline_registers_a_model_with_the_runs_lineage(tmp_path):
    done = _cli(DECLARATION, "--stack", "dev", "--local", "--dataset", str(_texts(tmp_path / "texts")),
                "--work-dir", str(tmp_path / "runs"))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    run_dir = tmp_path / "runs" / "shakespeare-gpt-local"
    # The cluster's paths (/fsx/checkpoints/<team>/pipelines/<run>/...) on the local FSx stand-in.
    work = run_dir / "fsx" / "checkpoints" / "team-research" / "pipelines" / "shakespeare-gpt-local"
    evaluation = json.loads((work / "evaluation.json").read_text())
    assert evaluation["step"] == 40 and 0 < evaluation["val_loss"] < 6  # bytes: ln(256) = 5.5 untrained
    assert (work / "final-checkpoint").read_text() == evaluation["checkpoint"]

    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{run_dir}/mlflow.db"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    versions = client.search_model_versions("name = 'shakespeare-gpt'")
    assert len(versions) == 1
    version = versions[0]
    run = client.get_run(version.run_id)
    # Lineage: the version points at the training run, which carries the training curve, the
    # validation loss of exactly the exported checkpoint, and the pipeline's tags.
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")][-1] == 40
    # The train step ran the rendered pod: its environment named the run after the job spec.
    assert run.data.tags.get("trainer.job_id") == "shakespeare-gpt-local"
    assert run.data.metrics["final_val_loss"] == pytest.approx(evaluation["val_loss"])
    assert run.data.tags["mlplatform.pipeline"] == "shakespeare-gpt"
    assert run.data.tags["mlplatform.job_spec"] == "workloads/declared/dev/pipelines/jobs/shakespeare-gpt.yaml"
    assert run.data.tags["dataset_hash"] == evaluation["dataset_hash"]
    export = work / "model"
    assert (export / "model.safetensors").is_file() and (export / "config.json").is_file()


def test_bad_input_is_one_clear_line(tmp_path):
    done = _cli("no/such/pipeline.yaml", "--stack", "dev", "--local", "--dataset", str(tmp_path))
    assert done.returncode == 2
    assert "no/such/pipeline.yaml" in done.stderr and "Traceback" not in done.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\njobSpec: y.yaml\ndataset: /tmp/raw\n")
    done = _cli(str(bad), "--stack", "dev", "--local", "--dataset", str(tmp_path))
    assert done.returncode == 2
    assert "modelName: required" in done.stderr and "dataset: must be on the FSx mount" in done.stderr


@pytest.mark.parametrize("make", ["missing", "empty"])
def test_a_dataset_that_holds_nothing_is_one_line_naming_the_fix(tmp_path, make):
    """Review jobs-ops-4 §1 #13: the README's `--dataset ./texts` without a ./texts ended in a
    Python traceback (FileNotFoundError from the prepare step) and said nothing of what it
    should hold. Run from the outside, as the README does."""
    texts = tmp_path / "texts"
    if make == "empty":
        texts.mkdir()
    done = _cli("workloads/declared/dev/pipelines/shakespeare-gpt.yaml", "--stack", "dev", "--local",
                "--dataset", str(texts), "--work-dir", str(tmp_path / "runs"))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"pipeline: --dataset {texts}")
    assert "Fix: give a directory of text files" in done.stderr
    assert not (tmp_path / "runs").exists()  # nothing ran
