"""Bounded retries: the Training Operator does not enforce `backoffLimit` under
`restartPolicy: ExitCode`. kubeflow/trainer issue 2045: "When the pod errors out, the
controller deletes the pod and recreates it. This is done indefinitely until the pod completes
successfully (if it ever does!). It ignores the backoffLimit." So a deterministic OOM kill would
loop until `maxRuntime`; the launcher counts attempts in the checkpoint directory instead."""
import os
import signal
import subprocess
import time

import pytest

from trainer import retries
from trainer_helpers import REPO, launcher_env, losses_or_empty, tiny_overrides, torchrun_cmd, worker_pid


def row(code, start, end):
    return {"exit_code": code, "checkpoint_step_at_start": start, "checkpoint_step_at_end": end}


def test_failures_without_progress_count_and_what_resets_them():
    oom = [row(137, 20, 20)] * 3
    assert "all ended 137 (SIGKILL)" in retries.refusal(oom, 3, 20)
    assert "OOM killer" in retries.refusal(oom, 3, 20)
    assert retries.refusal(oom[:2], 3, 20) is None
    # A preemption in between is neither a failure nor progress.
    assert retries.refusal([row(137, 20, 20), row(143, 20, 20), row(139, 20, 20), row(141, 20, 20)], 3, 20)
    # An attempt that wrote a newer checkpoint resets the count.
    assert retries.refusal([row(137, 20, 20), row(137, 20, 40), row(137, 40, 40), row(137, 40, 40)], 3, 40) is None
    # A permanent exit (the refusal itself, recorded) ends the count: a resubmission starts afresh.
    assert retries.refusal(oom + [row(1, 20, 20)], 3, 20) is None
    assert retries.refusal(oom, 0, 20) is None  # 0: unbounded


def kill_worker_after_step(cmd, env, ckpt, at_step) -> subprocess.CompletedProcess:
    """Starts one pod (launcher), SIGKILLs its rank from outside once it logged `at_step`,
    as the OOM killer would. Returns the launcher's result."""
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = os.path.join(ckpt, "metrics.jsonl")
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(metrics) and max(losses_or_empty(metrics), default=0) >= at_step:
            os.kill(worker_pid(proc.pid), signal.SIGKILL)
            break
        time.sleep(0.02)
    out, _ = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


@pytest.mark.slow
def test_repeated_oom_kills_without_progress_end_in_a_permanent_exit(tmp_path, data_dir):
    ckpt = str(tmp_path / "ckpt")
    # Saves every 100 steps; the "OOM" strikes once step 105 is logged, so from the second attempt
    # on no attempt gets past the step-100 checkpoint. The kill comes from a watcher polling the
    # metrics file: 95 steps (about a second here) before the next save leave room for a watcher
    # the scheduler delays on a loaded machine (4 steps once did not: the kill landed after a save).
    every, at_step = 100, 105
    cmd = torchrun_cmd(1, tiny_overrides(data_dir, ckpt, **{
        "schedule.num_steps": 400, "checkpoint.every_steps": every, "checkpoint.max_attempts_without_progress": 2}))
    env = launcher_env()
    first = kill_worker_after_step(cmd, env, ckpt, at_step=at_step)
    assert first.returncode == 137, first.stdout[-2000:]
    for attempt in range(2):  # no progress: step 100 stays the newest checkpoint
        os.remove(os.path.join(ckpt, "metrics.jsonl"))  # so the watcher sees this attempt's steps
        again = kill_worker_after_step(cmd, env, ckpt, at_step=at_step)
        assert again.returncode == 137, again.stdout[-2000:]
        ends = [r["checkpoint_step_at_end"] for r in retries.read_history(retries.history_path(ckpt, 0))]
        assert ends == [every] * (attempt + 2), f"the kill landed after a newer save: {ends}"
    refused = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1, refused.stderr[-2000:]
    assert "retries exhausted: the last 2 attempts all ended 137 (SIGKILL)" in refused.stderr
    assert "not starting torchrun" in refused.stderr
    # A resubmission after the fix (here: the same spec) runs again: the refusal ended the count.
    rows = retries.read_history(retries.history_path(ckpt, 0))
    assert [r["exit_code"] for r in rows] == [137, 137, 137, 1]
    assert [r["checkpoint_step_at_end"] for r in rows] == [every] * 4
    assert retries.refusal(rows, 2, every) is None
