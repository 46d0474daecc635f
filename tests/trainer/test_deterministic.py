"""`reproducibility.deterministic: true` (issue 28 item 7): two runs of one config give the
same per-step losses and weights, and so does a run preempted (SIGTERM from outside the
loop, by the fault hook) and resumed. Each run is its own process, as in production: the
mode changes process-wide torch settings. The GPU twin (bf16, compile) is in tests/gpu."""
import os
import subprocess
import sys

import torch

from trainer.checkpoint.layout import latest_complete, list_steps
from trainer_helpers import REPO, TINY_CONFIG, assert_same_tensors, checkpoint_tensors, launcher_env, losses, tiny_overrides

STEPS = 10


def run_trainer(data_dir, ckpt, faults: str = "") -> subprocess.CompletedProcess:
    overrides = tiny_overrides(data_dir, ckpt, **{"schedule.num_steps": STEPS, "checkpoint.every_steps": 4,
                                                  "reproducibility.deterministic": "true", "tracking.enabled": "false",
                                                  "export.at_end": "false"})
    env = launcher_env(**({"TRAINER_FAULTS": faults} if faults else {}))
    return subprocess.run([sys.executable, "-m", "trainer", "train", "--config", TINY_CONFIG, *overrides],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_deterministic_runs_and_a_resumed_run_are_bitwise_identical(tmp_path, data_dir):
    first, second, resumed = (str(tmp_path / n) for n in ("first", "second", "resumed"))
    for path in (first, second):
        done = run_trainer(data_dir, path)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "deterministic mode: deterministic algorithms, CUBLAS_WORKSPACE_CONFIG=:4096:8" in done.stderr
    stopped = run_trainer(data_dir, resumed, faults="after_step@6:0:TERM")
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    assert 4 < max(list_steps(resumed)) < STEPS  # the SIGTERM after step 6 is handled at a step boundary
    done = run_trainer(data_dir, resumed)
    assert done.returncode == 0, done.stderr[-2000:]

    reference = losses(first)
    assert sorted(reference) == list(range(1, STEPS + 1))
    assert losses(second) == reference  # exact float equality, every step
    assert losses(resumed) == reference
    final = checkpoint_tensors(latest_complete(first), tmp_path)
    assert_same_tensors(final, checkpoint_tensors(latest_complete(second), tmp_path))
    assert_same_tensors(final, checkpoint_tensors(latest_complete(resumed), tmp_path))


def test_the_mode_sets_what_it_promises_and_the_default_stays_fast():
    code = ("import os, torch; from trainer import reproducibility as r; r.apply({flag}, 7); s = r.state(); "
            "print(s['deterministic_algorithms'], s['cudnn_benchmark'], s['cublas_workspace_config'], "
            "torch.initial_seed())")
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    env["PYTHONPATH"] = REPO
    on = subprocess.run([sys.executable, "-c", code.format(flag=True)], env=env, capture_output=True, text=True)
    off = subprocess.run([sys.executable, "-c", code.format(flag=False)], env=env, capture_output=True, text=True)
    assert on.stdout.split() == ["True", "False", ":4096:8", "7"], on.stderr
    assert off.stdout.split()[:3] == ["False", str(torch.backends.cudnn.benchmark), "None"], off.stderr
