"""checkpoint.async_mode=process: DCP's background checkpoint process, killed from outside.

- The OOM killer may pick it (it holds a full host copy of the state); torch then raises
  "Checkpoint background process is dead. Exit code: -9" in the trainer
  (torch/distributed/checkpoint/_async_process_executor.py, `_wait_for_response`). That is a
  signal death, retryable (128+N), not the trainer's own failure.
- It ignores SIGTERM by design, and torchrun signals a worker's process group only while the
  worker is alive ("SubprocessContext._close"), so after a SIGKILL of the trainer nothing
  ended it: it must end itself.
"""
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from trainer_helpers import REPO, descendants, launcher_env, losses_or_empty, tiny_overrides, torchrun_cmd, worker_pid


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(predicate, seconds: float) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


PARENT = textwrap.dedent("""
    import multiprocessing, sys, time
    from trainer.checkpoint.spawn import shield_spawned_processes

    def busy_save(ready):  # a save blocked in a collective whose peer is gone: never returns
        ready.set()
        time.sleep(600)

    if __name__ == "__main__":
        shield_spawned_processes()
        ctx = multiprocessing.get_context("spawn")
        ready = ctx.Event()
        child = ctx.Process(target=busy_save, args=(ready,), daemon=True)
        child.start()
        ready.wait(60)  # as DCP waits for the process's INIT_COMPLETE
        print(child.pid, flush=True)
        time.sleep(600)
""")


def test_background_process_ignores_sigterm_and_dies_with_its_trainer(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script)], cwd=REPO, env={**os.environ, "PYTHONPATH": REPO},
                              stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        os.kill(child, signal.SIGTERM)  # torchrun's forwarded SIGTERM: the save must go on
        time.sleep(1.5)
        assert alive(child), "the background process must ignore SIGTERM"
        parent.kill()  # SIGKILL of the trainer, from outside
        parent.wait()
        assert wait_until(lambda: not alive(child), 5), "the background process outlived its trainer"
    finally:
        if parent.poll() is None:
            parent.kill()
        if alive(child):
            os.kill(child, signal.SIGKILL)  # only the pid this test started


def background_pid(worker: int) -> int | None:
    for pid in descendants(worker):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"--multiprocessing-fork" in f.read().split(b"\0"):
                    return pid
        except OSError:
            pass
    return None


@pytest.mark.slow
def test_oom_kill_of_the_background_checkpoint_process_is_a_signal_death(tmp_path, data_dir):
    ckpt = str(tmp_path / "ckpt")
    cmd = torchrun_cmd(1, tiny_overrides(data_dir, ckpt, **{
        "schedule.num_steps": 400, "checkpoint.every_steps": 4, "checkpoint.async_mode": '"process"'}))
    proc = subprocess.Popen(cmd, env=launcher_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    metrics = os.path.join(ckpt, "metrics.jsonl")
    killed = None
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None and killed is None:
        if os.path.exists(metrics) and max(losses_or_empty(metrics), default=0) >= 9:
            killed = background_pid(worker_pid(proc.pid))
            if killed:
                os.kill(killed, signal.SIGKILL)  # what the OOM killer does
        time.sleep(0.02)
    out, _ = proc.communicate(timeout=180)
    assert killed, "no background checkpoint process found"
    assert proc.returncode == 137, out[-3000:]
    assert "exiting 137" in out


def background_pids(launcher: int) -> list[int]:
    found = []
    for pid in descendants(launcher):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"--multiprocessing-fork" in f.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            pass
    return found


@pytest.mark.slow
@pytest.mark.parametrize("signal_at_step", [9, 12], ids=["between-saves", "while-the-next-save-waits"])
def test_a_preemption_whose_save_lost_its_background_process_saves_the_step_synchronously(tmp_path, data_dir,
                                                                                          signal_at_step):
    """The background process dies (here: rank 1's is SIGKILLed from outside, as the OOM killer
    would) while its save is in flight and the job is being preempted. The ranks give that save
    up together and write the current step synchronously inside the grace period, instead of
    failing with "Checkpoint background process is dead" and losing the preemption checkpoint.

    Both ranks' background processes are stopped (SIGSTOP) before the step-8 save is handed to
    them, so that save is certainly in flight when the signal comes. At step 12 the next regular
    save is due and must wait for step 8's write: the signal then reaches a loop that is waiting
    (it once waited inside the checkpointer, deaf to the signal, and ended with "Checkpoint
    background process is dead" once the writer was killed)."""
    import threading

    from trainer.checkpoint.layout import list_steps

    ckpt = str(tmp_path / "ckpt")
    cmd = torchrun_cmd(2, tiny_overrides(data_dir, ckpt, **{
        "schedule.num_steps": 400, "checkpoint.every_steps": 4, "checkpoint.async_mode": '"process"',
        "tracking.log_every_steps": 1}))
    proc = subprocess.Popen(cmd, env=launcher_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    savers: list[int] = []
    try:
        assert wait_until(lambda: 4 in list_steps(ckpt) or proc.poll() is not None, 240), "no step-4 checkpoint"
        assert wait_until(lambda: len(background_pids(proc.pid)) == 2, 30), "no background processes"
        savers = background_pids(proc.pid)
        for pid in savers:
            os.kill(pid, signal.SIGSTOP)
        metrics = os.path.join(ckpt, "metrics.jsonl")
        assert wait_until(lambda: max(losses_or_empty(metrics), default=0) >= signal_at_step or proc.poll() is not None,
                          120)
        if signal_at_step % 4 == 0:
            time.sleep(2.0)  # the loop is now waiting on step 8's write before saving this step
        proc.send_signal(signal.SIGTERM)  # the spot notice
        time.sleep(1.0)
        os.kill(savers[-1], signal.SIGKILL)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in savers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)  # only the pids this test stopped
    reader.join(timeout=10)
    out = "".join(lines)
    assert proc.returncode == 143, out[-4000:]
    stopped = [line for line in out.splitlines() if "saving step" in line and "synchronously instead" in line]
    assert stopped, out[-4000:]
    final = max(list_steps(ckpt))
    assert final >= 9 and f"saving step {final} synchronously instead" in stopped[0], (final, stopped)
    assert f"final checkpoint: step {final} landed" in out, out[-2000:]
    # The save given up is the one in flight at the signal (step 8, or a later one where a loaded
    # machine let it finish before the writers were stopped).
    given_up = int(re.search(r"with the save of step (\d+) in flight", stopped[0]).group(1))
    assert given_up not in list_steps(ckpt), "the save given up must not carry a marker"
