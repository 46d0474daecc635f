"""Single-process training in this process: resume equivalence for the GPT and HF paths."""
import json
import os
import signal
import threading
import time

import pytest

from trainer.checkpoint import read_marker
from trainer.checkpoint.layout import latest_complete, list_steps
from trainer.config import load_config
from trainer.train import main
from trainer_helpers import TINY_CONFIG, assert_same_tensors, checkpoint_tensors, losses, losses_or_empty, tiny_overrides


def train(overrides, signal_at_step=None):
    cfg = load_config(TINY_CONFIG, overrides, environ={})
    if signal_at_step is not None:
        path = os.path.join(cfg.checkpoint.dir, "metrics.jsonl")

        def watch():
            while not (os.path.exists(path) and max(losses_or_empty(path), default=0) >= signal_at_step):
                time.sleep(0.005)
            os.kill(os.getpid(), signal.SIGTERM)  # handled on the main thread at the next step boundary

        threading.Thread(target=watch, daemon=True).start()
    return main(cfg)


@pytest.mark.parametrize("model", ["gpt", "hf"])
def test_interrupted_and_resumed_equals_uninterrupted(model, tmp_path, data_dir, tiny_hf_dir, restore_signals):
    num_steps = 16
    extra = {"schedule.num_steps": num_steps, "checkpoint.every_steps": 5, "schedule.grad_accum_steps": 2}
    if model == "hf":
        extra.update({"model.kind": "hf", "model.hf_path": tiny_hf_dir})
    full, interrupted = str(tmp_path / "full"), str(tmp_path / "interrupted")
    assert train(tiny_overrides(data_dir, full, **extra)) == 0

    assert train(tiny_overrides(data_dir, interrupted, **extra), signal_at_step=3) == 143
    stopped_at = read_marker(latest_complete(interrupted))["step"]
    assert 3 <= stopped_at < num_steps, "the signal must stop the run early, at a step boundary"
    assert stopped_at in list_steps(interrupted)  # checkpoint of the last finished step
    assert train(tiny_overrides(data_dir, interrupted, **extra)) == 0

    assert losses(full) == losses(interrupted)
    assert sorted(losses(full)) == list(range(1, num_steps + 1))
    assert_same_tensors(checkpoint_tensors(latest_complete(full), tmp_path),
                        checkpoint_tensors(latest_complete(interrupted), tmp_path))
    summary = json.load(open(os.path.join(interrupted, "summary.json")))
    assert summary["num_restarts"] == 1 and summary["final_step"] == num_steps


def test_async_thread_save_restores_exactly(tmp_path, data_dir, restore_signals):
    extra = {"schedule.num_steps": 12, "checkpoint.every_steps": 4}
    full, asynchronous = str(tmp_path / "sync"), str(tmp_path / "async")
    assert train(tiny_overrides(data_dir, full, **extra)) == 0
    # The async run keeps training while step 4 and 8 are written: the staged copy must be
    # of that step, not of weights the optimizer has changed since.
    assert train(tiny_overrides(data_dir, asynchronous, **extra, **{"checkpoint.async_mode": "thread"})) == 0
    for step in (8, 12):
        path_a = os.path.join(full, f"step-{step:06d}")
        path_b = os.path.join(asynchronous, f"step-{step:06d}")
        assert_same_tensors(checkpoint_tensors(path_a, tmp_path), checkpoint_tensors(path_b, tmp_path))
    assert list_steps(asynchronous) == [4, 8, 12]  # keep_last=3


def test_retention_keeps_newest_k(tmp_path, data_dir, restore_signals):
    ckpt = str(tmp_path / "c")
    assert train(tiny_overrides(data_dir, ckpt, **{"schedule.num_steps": 10, "checkpoint.every_steps": 2,
                                                   "checkpoint.keep_last": 2})) == 0
    assert list_steps(ckpt) == [8, 10]
