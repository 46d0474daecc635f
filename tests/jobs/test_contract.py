"""trainer.contract, the helper user code keeps the platform's contract with. SIGTERM is sent from
outside the process, as the kubelet would; the exit code and the rank's report are what the
launcher (trainer/launch.py) classifies."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainer import contract
from trainer.launch import exit_code, worker_reports

ROOT = Path(__file__).resolve().parents[2]

LOOP = """
import sys, time
from trainer import contract
with contract.tracking() as run, contract.preemption() as stop:
    start = contract.latest_checkpoint()
    step = start.step if start else 0
    print("ready", flush=True)
    while step < int(sys.argv[1]):
        step += 1
        time.sleep(0.02)
        run.log_metrics({"loss": 1.0 / step}, step)
        if stop.requested(step):
            contract.begin_checkpoint(step)
            contract.commit_checkpoint(step)
            break
"""


def _run(tmp_path, steps, *, interrupt=False):
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "TRAINER_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
           "TRAINER_EXIT_STATUS_DIR": str(tmp_path / "status")}
    proc = subprocess.Popen([sys.executable, "-c", LOOP, str(steps)], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    if interrupt:
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=60)


def test_sigterm_stops_at_a_step_boundary_checkpoints_and_exits_143(tmp_path):
    assert _run(tmp_path, 100_000, interrupt=True) == 143
    found = contract.latest_checkpoint(str(tmp_path / "ckpt"))
    assert found is not None and found.step > 0
    [report] = worker_reports(str(tmp_path / "status")).values()
    assert report["reason"] == "preempted" and report["signalled"] and report["checkpoint_step"] == found.step
    # What the launcher makes of it, with no signal of its own (the kubelet signalled another node).
    assert exit_code(1, False, [report["reason"]], [report], []) == 143
    # The next attempt resumes after the checkpoint and completes.
    assert _run(tmp_path, found.step + 3) == 0
    steps = [json.loads(line)["step"] for line in (tmp_path / "ckpt" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, found.step + 4))
    assert worker_reports(str(tmp_path / "status"))[0]["reason"] == "completed"


def test_an_exception_is_reported_failed_and_reraised(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINER_EXIT_STATUS_DIR", str(tmp_path))
    monkeypatch.setenv("TRAINER_CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    try:
        with contract.preemption():
            raise ValueError("bad batch")
    except ValueError:
        pass
    [report] = worker_reports(str(tmp_path)).values()
    assert report["reason"] == "failed" and "bad batch" in report["error"] and not report["signalled"]
    assert exit_code(1, False, ["failed"], [report], []) == 1  # permanent


def test_a_checkpoint_without_its_marker_is_never_resumed(tmp_path):
    root = str(tmp_path)
    os.makedirs(contract.step_dir(10, root))
    contract.begin_checkpoint(20, root)  # a save cut short: files, no marker
    assert contract.latest_checkpoint(root) is None
    contract.commit_checkpoint(10, root, path="hf/checkpoint-10", framework="hf")
    assert contract.latest_checkpoint(root) is None  # the marker points at nothing yet
    os.makedirs(os.path.join(root, "hf/checkpoint-10"))
    found = contract.latest_checkpoint(root)
    assert (found.step, found.path, found.meta["framework"]) == (10, os.path.join(root, "hf/checkpoint-10"), "hf")
    (tmp_path / "step-000030").mkdir()
    (tmp_path / "step-000030" / "complete.json").write_text("{torn")
    assert contract.latest_checkpoint(root).step == 10


def test_job_reads_the_pods_environment():
    job = contract.job({"TRAINER_CHECKPOINT_DIR": "/fsx/t/j", "MLP_DATASET_DIR": "/fsx/datasets/d", "RANK": "3",
                        "LOCAL_RANK": "1", "WORLD_SIZE": "8", "TRAINER_RUN_ID": "team-a.j", "MLFLOW_EXPERIMENT_NAME": "team-a/j"})
    assert (job.checkpoint_dir, job.dataset_dir, job.rank, job.local_rank, job.world_size, job.is_main) == \
        ("/fsx/t/j", "/fsx/datasets/d", 3, 1, 8, False)
    assert (job.run_id, job.experiment) == ("team-a.j", "team-a/j")


def test_the_contract_imports_without_torch(tmp_path):
    """User code that never touches torch (a JAX or NumPy script) can still use it."""
    blocker = tmp_path / "torch"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('no torch here')\n")
    code = ("from trainer import contract\nwith contract.preemption() as stop:\n    assert not stop.requested(1)\n"
            "print(contract.latest_checkpoint())")
    run = subprocess.run([sys.executable, "-c", code], env={"PATH": os.environ["PATH"], "PYTHONPATH": f"{tmp_path}:{ROOT}",
                         "TRAINER_CHECKPOINT_DIR": str(tmp_path / "ckpt")}, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "None", run.stderr
