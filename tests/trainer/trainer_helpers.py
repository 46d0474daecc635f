"""Shared helpers for the trainer tests: run the trainer, read what it wrote."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY_CONFIG = os.path.join(REPO, "trainer", "configs", "tiny.yaml")


def tiny_overrides(data_dir: str, ckpt_dir: str, **extra) -> list[str]:
    base = {
        "data.dir": data_dir,
        "checkpoint.dir": ckpt_dir,
        "data.seq_len": 32,
        "data.micro_batch_size": 4,
        "schedule.warmup_steps": 5,
        "tracking.log_every_steps": 1,
        "model.dropout": 0.1,  # exercises the RNG state restore: without it, resumes would diverge
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def losses(ckpt_dir: str) -> dict[int, float]:
    with open(os.path.join(ckpt_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    steps = [r["step"] for r in rows if "loss" in r]
    assert len(steps) == len(set(steps)), "a step was logged twice"
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def checkpoint_tensors(step_dir: str, tmp_path) -> dict[str, torch.Tensor]:
    from tools.fault_injection import flat_tensors

    return flat_tensors(step_dir, str(tmp_path))


def assert_same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    assert any(k.startswith("app.model") for k in a), "no model parameters in the checkpoint"
    assert any(k.startswith("app.optim") for k in a), "no optimizer state in the checkpoint"
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"tensors differ: {different[:5]}"


def launcher_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    env.update({"PYTHONPATH": REPO, "OMP_NUM_THREADS": "1", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "20"})
    env.update(extra)
    return env


def torchrun_cmd(nproc: int, overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "trainer.launch", f"--nproc-per-node={nproc}", "--standalone",
            "-m", "trainer", "train", "--config", TINY_CONFIG, *overrides]


def run(cmd: list[str], env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def run_and_signal(cmd: list[str], env: dict[str, str], ckpt_dir: str, at_step: int,
                   sig: int = signal.SIGTERM, timeout: float = 240) -> subprocess.CompletedProcess:
    """Starts the launcher, sends `sig` to it once the trainer has logged `at_step`."""
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    path = os.path.join(ckpt_dir, "metrics.jsonl")
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(path) and os.path.getsize(path) and max(losses_or_empty(path), default=0) >= at_step:
            proc.send_signal(sig)
            break
        time.sleep(0.02)
    out, _ = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def losses_or_empty(path: str) -> list[int]:
    steps = []
    with open(path) as f:
        for line in f:
            try:
                steps.append(json.loads(line)["step"])
            except ValueError:  # a line being written
                pass
    return steps


def descendants(pid: int) -> list[int]:
    """Every process under `pid`, from /proc (what `ps --ppid` walks): only processes we started."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in os.listdir(f"/proc/{parent}/task") if os.path.isdir(f"/proc/{parent}/task") else []:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


def worker_pid(launcher_pid: int) -> int:
    """The training rank under a launcher: launcher -> torchrun (trainer.elastic_run) -> worker."""
    for pid in descendants(launcher_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        # A child the launcher or torchrun forked (ldconfig, uname) carries their command line
        # until it execs: only the worker itself is `... -m trainer train ...`.
        if b"trainer" in argv and b"train" in argv and not {b"trainer.elastic_run", b"trainer.launch"} & set(argv):
            return pid
    raise AssertionError(f"no worker process under launcher {launcher_pid}")
