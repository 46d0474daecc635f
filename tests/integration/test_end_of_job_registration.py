"""The end of a 2-node training job against the real MLflow task (PostgreSQL on loopback, moto's
S3 for artifacts, `mlflow server` as ECS runs it: the fixtures of test_mlflow_server.py).

Rank 0's export is slow on purpose (held 30 s by TRAINER_FAULTS, past the 15-s start-up bound
the other rank used to wait with): both nodes end 0, the model is logged and registered. The
same job is then run again, as the operator retries a pod of a finished job (a spot notice
during the export): it resumes at the last step, exports again, and registers nothing twice:
one logged model and one version per run and step."""
from __future__ import annotations

import importlib
import os
import socket
import subprocess
import sys
import time

import pytest

from tests.integration.test_mlflow_server import (  # noqa: F401 (fixtures)
    ADMIN_PASSWORD, bootstrapped, mlflow_server, postgres, s3_endpoint, secrets)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY_CONFIG = os.path.join(REPO, "trainer", "configs", "tiny.yaml")
MODEL_NAME = "e2e-tiny-gpt"
EXPERIMENT = "end-of-job"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_cmd(node_rank: int, port: int, overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "trainer.launch", "--nnodes=2", "--nproc-per-node=1", f"--node-rank={node_rank}",
            "--master-addr=127.0.0.1", f"--master-port={port}", "--max-restarts=0",
            "-m", "trainer", "train", "--config", TINY_CONFIG, *overrides]


def _run_job(overrides: list[str], env: dict[str, str], logs_dir, attempt: int) -> tuple[list[int], list[str]]:
    port = _free_port()
    paths = [logs_dir / f"attempt{attempt}-node{n}.log" for n in (0, 1)]
    logs = [open(p, "w") for p in paths]
    procs = [subprocess.Popen(_node_cmd(n, port, overrides), env=env, cwd=REPO, stdout=logs[n],
                              stderr=subprocess.STDOUT, text=True) for n in (0, 1)]
    deadline = time.monotonic() + 480
    codes = []
    try:
        for proc in procs:
            codes.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()  # the processes this test started, by their handle
                proc.wait()
        for log in logs:
            log.close()
    return codes, [p.read_text() for p in paths]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    from trainer.prepare import prepare

    out = str(tmp_path_factory.mktemp("data"))
    prepare([importlib.import_module(m).__file__ for m in ("argparse", "textwrap", "string")], out,
            show_progress=False, val_fraction=0.05)
    return out


def test_a_finished_two_node_job_with_a_slow_export_registers_its_model_once_across_retries(
        mlflow_server, data_dir, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    url = mlflow_server[0]
    ckpt = str(tmp_path / "ckpt")
    overrides = [f"{k}={v}" for k, v in {
        "data.dir": data_dir, "checkpoint.dir": ckpt, "data.seq_len": 32, "data.micro_batch_size": 4,
        "schedule.num_steps": 6, "schedule.warmup_steps": 2, "checkpoint.every_steps": 3,
        "parallelism.init_timeout_seconds": 15, "tracking.experiment": EXPERIMENT,
        "export.registered_model_name": MODEL_NAME}.items()]
    env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "20",
           "MLFLOW_TRACKING_URI": url, "MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": ADMIN_PASSWORD,
           "TRAINER_RUN_ID": "end-of-job-e2e", "TRAINER_FAULTS": "export@6:0:SLEEP=30"}
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "MLFLOW_S3_ENDPOINT_URL"):
        env.pop(name, None)  # the trainer talks to MLflow only; artifacts go through the server

    codes, out = _run_job(overrides, env, tmp_path, 0)
    assert codes == [0, 0], f"exit codes {codes}\n--- node 0\n{out[0][-3000:]}\n--- node 1\n{out[1][-3000:]}"
    assert "holding export of step 6 for 30 s" in out[0]

    # The retry of a finished job: it resumes at step 6, exports again, registers nothing new.
    codes, out = _run_job(overrides, env, tmp_path, 1)
    assert codes == [0, 0], f"exit codes {codes}\n--- node 0\n{out[0][-3000:]}\n--- node 1\n{out[1][-3000:]}"
    assert "not registered again" in out[0], out[0][-3000:]

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", ADMIN_PASSWORD)
    client = MlflowClient(tracking_uri=url, registry_uri=url)
    versions = client.search_model_versions(f"name = '{MODEL_NAME}'")
    assert len(versions) == 1, [(v.version, v.run_id, v.tags) for v in versions]
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    models = client.search_logged_models(experiment_ids=[experiment.experiment_id])
    ready = [m for m in models if str(m.status).endswith("READY")]
    assert len(ready) == 1 and versions[0].run_id == runs[0].info.run_id, [(m.model_id, m.status) for m in models]
    assert versions[0].tags.get("trainer.step") == "6"
