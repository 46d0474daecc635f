"""Two `trainer.launch` "pods" on loopback (nnodes=2, one rank each), as a 2-node PyTorchJob
runs them, with a worker SIGKILLed from outside the trainer (the OOM killer, a lost node).

The exit-code contract must hold on every node: `restartPolicy: ExitCode` treats 1-127 as
permanent, so a node whose rank only saw a lost peer must exit 128-255 too, or one OOM kill
fails the whole job (review trainer-3, B1: the survivor exited torchrun's 1).
"""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from trainer.checkpoint import read_marker
from trainer.checkpoint.layout import latest_complete
from trainer_helpers import REPO, TINY_CONFIG, launcher_env, losses, losses_or_empty, tiny_overrides, worker_pid

pytestmark = pytest.mark.slow

NUM_STEPS = 300
EXTRA = {"schedule.num_steps": NUM_STEPS, "checkpoint.every_steps": 4}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_cmd(node_rank: int, port: int, overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "trainer.launch", "--nnodes=2", "--nproc-per-node=1", f"--node-rank={node_rank}",
            "--master-addr=127.0.0.1", f"--master-port={port}", "--max-restarts=0",
            "-m", "trainer", "train", "--config", TINY_CONFIG, *overrides]


def start_nodes(overrides: list[str], logs) -> list[subprocess.Popen]:
    port = free_port()
    env = launcher_env()
    return [subprocess.Popen(node_cmd(n, port, overrides), env=env, cwd=REPO, stdout=logs[n], stderr=subprocess.STDOUT,
                             text=True) for n in (0, 1)]


def wait_all(procs, timeout=240) -> list[int]:
    deadline = time.time() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1, deadline - time.time())))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    q.kill()  # processes this test started, by their handle
            raise
    return codes


@pytest.mark.parametrize("victim_node", [0, 1])
def test_killed_worker_on_either_node_makes_both_nodes_retryable_then_the_job_finishes(victim_node, tmp_path, data_dir):
    ckpt = str(tmp_path / "ckpt")
    overrides = tiny_overrides(data_dir, ckpt, **EXTRA)
    metrics = os.path.join(ckpt, "metrics.jsonl")
    logs = [open(tmp_path / f"node{n}-attempt1.log", "w+") for n in (0, 1)]
    nodes = start_nodes(overrides, logs)
    deadline = time.time() + 180
    while time.time() < deadline and all(p.poll() is None for p in nodes):
        if os.path.exists(metrics) and max(losses_or_empty(metrics), default=0) >= 9:
            break
        time.sleep(0.02)
    assert all(p.poll() is None for p in nodes), "a node ended before the fault"
    victim = worker_pid(nodes[victim_node].pid)
    os.kill(victim, signal.SIGKILL)  # from outside, as the OOM killer does
    codes = wait_all(nodes)
    text = []
    for log in logs:
        log.seek(0)
        text.append(log.read())
    assert all(128 <= c <= 255 for c in codes), f"exits {codes}: 1-127 fails the PyTorchJob for good\n" + \
        "\n".join(t[-2500:] for t in text)
    assert codes[victim_node] == 128 + signal.SIGKILL
    newest = read_marker(latest_complete(ckpt))["step"]
    assert 8 <= newest < NUM_STEPS

    # Both pods recreated, as the operator does: the job finishes from the newest checkpoint.
    logs = [open(tmp_path / f"node{n}-attempt2.log", "w+") for n in (0, 1)]
    codes = wait_all(start_nodes(overrides, logs))
    for log in logs:
        log.seek(0)
    assert codes == [0, 0], "\n".join(log.read()[-2500:] for log in logs)
    assert read_marker(latest_complete(ckpt))["step"] == NUM_STEPS
    assert sorted(losses(ckpt)) == list(range(1, NUM_STEPS + 1))  # each step once
    logs[0].seek(0)
    assert f"step-{newest:06d} at step {newest}" in logs[0].read()  # "resumed from <dir> at step N"
