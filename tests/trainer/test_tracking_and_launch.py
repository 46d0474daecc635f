import os
import time

import pytest

from trainer.launch import EXIT_PEER_LOST, EXIT_PREEMPTED, exit_code
from trainer.metrics import flops_per_token, mfu_meter, peak_tflops_for
from trainer.tracking import MLflowTracker


class FlakyClient:
    """Stands in for MlflowClient: raises while `down`, records what reaches it otherwise."""

    def __init__(self):
        self.down = True
        self.metrics = []
        self.created = 0

    def __getattr__(self, name):
        raise AssertionError(f"unexpected MLflow call {name}")

    def _check(self):
        if self.down:
            raise ConnectionError("connection refused")

    def get_experiment_by_name(self, name):
        self._check()
        return None

    def create_experiment(self, name):
        return "1"

    def search_runs(self, *a, **k):
        return []

    def create_run(self, experiment_id, run_name=None, tags=None):
        self.created += 1

        class Run:
            class info:
                run_id = "run-1"

            class data:
                params = {}

        return Run

    def log_text(self, *a):
        pass

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        self._check()
        self.metrics += [(m.key, m.step) for m in metrics]

    def set_terminated(self, run_id, status):
        self.status = status


def wait_for(predicate, seconds=10.0):
    deadline = time.time() + seconds
    while time.time() < deadline and not predicate():
        time.sleep(0.02)
    return predicate()


def test_unreachable_tracking_server_buffers_then_flushes():
    client = FlakyClient()
    tracker = MLflowTracker(uri="http://127.0.0.1:9", experiment="e", job_id="j", run_name=None, run_id=None,
                            params={"a": 1}, tags={}, config_yaml="", retry_seconds=0.05, client=client)
    started = time.perf_counter()
    for step in range(1, 6):
        tracker.log(step, {"loss": 1.0 / step})
    assert time.perf_counter() - started < 1.0  # logging never waits for the network
    time.sleep(0.3)
    assert client.metrics == [] and tracker.run_id is None  # still down: nothing lost, nothing sent
    client.down = False
    assert wait_for(lambda: len(client.metrics) == 5)
    tracker.log(6, {"loss": 0.1})
    tracker.close(status="FINISHED", timeout_seconds=5)
    assert [s for k, s in client.metrics if k == "loss"] == [1, 2, 3, 4, 5, 6]
    assert client.created == 1 and client.status == "FINISHED"


@pytest.mark.parametrize("torchrun_code, signalled, reasons, expected", [
    (1, True, ["preempted", "preempted"], EXIT_PREEMPTED),  # what torch 2.13's torchrun does on SIGTERM
    (1, False, ["preempted", "preempted"], EXIT_PREEMPTED),  # signal sent to the workers directly
    (0, False, ["completed", "completed"], 0),
    (1, False, ["failed", "completed"], 1),  # a crash stays a permanent failure
    (-9, False, [], 137),
])
def test_launcher_exit_codes(torchrun_code, signalled, reasons, expected):
    assert exit_code(torchrun_code, signalled, reasons) == expected


def test_a_node_whose_ranks_only_lost_a_peer_exits_retryable():
    """Multi-node: this node's rank saw "Connection reset by peer" (the worker that died is on
    the other node), torchrun recorded exit 1: retryable, not torchrun's permanent 1."""
    reports = [{"rank": 0, "reason": "failed", "peer_lost": True, "signalled": False}]
    failures = [{"rank": 0, "exitcode": 1, "timestamp": 1}]
    assert exit_code(1, False, ["failed"], reports, failures) == EXIT_PEER_LOST == 141
    # The same exit with a rank that failed on its own stays permanent.
    crashed = reports + [{"rank": 1, "reason": "failed", "peer_lost": False, "signalled": False}]
    assert exit_code(1, False, ["failed", "failed"], crashed, failures) == 1


def test_mfu_table_and_flops():
    assert peak_tflops_for("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_tflops_for("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops_for("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_tflops_for("NVIDIA L40S") == 362.0 and peak_tflops_for("NVIDIA L4") == 121.0
    assert peak_tflops_for("some CPU") is None
    # GPT-2 124M at T=1024: 6N + 12·L·H·T (nanoGPT's estimate)
    n = 85_000_000
    assert flops_per_token(n, 12, 768, 1024) == 6 * n + 12 * 12 * 768 * 1024
    import torch

    assert mfu_meter(torch.device("cpu"), 1e9, None)(1000.0) is None
    assert mfu_meter(torch.device("cpu"), 1e9, 1.0)(1000.0) == pytest.approx(1e12 / 1e12)
