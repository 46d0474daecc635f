"""Sealing a save (the manifest's SHA-256 of every rank's files, its fsyncs, the marker,
retention's renames and rmtree) never runs on the training loop's thread.

On rank 0 that thread is the one the other ranks wait for in the next step's collectives:
hashing a large state read back from FSx (about 0.6 GiB/s per core) or a slow metadata
server's renames there held every rank, against the collective timeout (100 s). The blocked
time per save, before and after, is benchmarks/checkpoint_blocking.py's."""
import os
import threading

import pytest
import torch

import trainer.checkpoint as ckpt_mod
import trainer.trust as trust_mod
from trainer.checkpoint import Checkpointer, ModelAndOptimizer
from trainer.checkpoint.layout import list_steps, step_dir
from trainer.contract.layout import MARKER
from trainer.config import ModelConfig, TrainerConfig
from trainer.distributed import Env
from trainer.model import build_model
from trainer.optim import build_optimizer
from trainer.s3 import NoMirror

CPU = Env(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), backend="gloo")


def app():
    torch.manual_seed(0)
    cfg = TrainerConfig(model=ModelConfig(size="tiny"))
    model = build_model(cfg.model, 64, 16)
    optimizer = build_optimizer(model, cfg, torch.device("cpu"))
    model(torch.randint(0, 64, (2, 16))).float().pow(2).mean().backward()
    optimizer.step()
    return ModelAndOptimizer(model, optimizer)


@pytest.mark.parametrize("async_mode", ["off", "thread"])
def test_hashing_fsyncs_marker_and_retention_run_off_the_loop_thread(tmp_path, monkeypatch, async_mode):
    where: dict[str, set[str]] = {}

    def record(what):
        where.setdefault(what, set()).add(threading.current_thread().name)

    real_sha, real_write, real_remove = trust_mod.sha256_file, ckpt_mod.write_json_atomic, ckpt_mod.rename_away
    monkeypatch.setattr(trust_mod, "sha256_file", lambda p: (record("hash"), real_sha(p))[1])
    monkeypatch.setattr(ckpt_mod, "write_json_atomic", lambda p, d: (record(os.path.basename(p)), real_write(p, d))[1])
    monkeypatch.setattr(ckpt_mod, "rename_away", lambda *a, **k: (record("retention"), real_remove(*a, **k))[1])
    # An fsync of metrics.jsonl before the marker: the loop's own flush hands it over.
    synced = []
    state = app()
    c = Checkpointer(str(tmp_path), CPU, keep_last=1, async_mode=async_mode, mirror=NoMirror())
    for step in (1, 2, 3):
        c.save(step, state, {}, "seed: 1\n", before_marker=lambda: synced.append(threading.current_thread().name))
        for _ in range(3):
            c.poll()  # the loop's step boundaries
    c.close()
    assert list_steps(str(tmp_path)) == [3] and os.path.isfile(os.path.join(step_dir(str(tmp_path), 3), MARKER))
    loop = threading.main_thread().name
    assert {"hash", MARKER, "retention"} <= set(where), where
    on_loop = {what: threads for what, threads in where.items() if loop in threads}
    assert not on_loop, f"done on the training loop's thread: {on_loop}"
    assert synced and loop not in synced


def test_the_loop_goes_on_while_a_seal_is_slow(tmp_path, monkeypatch):
    """A seal held for as long as the test wants (a slow file system): the loop's save and
    its step-boundary polls return meanwhile, and `wait()` waits for it."""
    release, sealing = threading.Event(), threading.Event()
    real_seal = trust_mod.CheckpointTrust.seal

    def slow_seal(self, path, marker, digests=None):
        sealing.set()
        assert release.wait(20), "the seal was never released: it ran where the test's thread waits"
        return real_seal(self, path, marker, digests)

    monkeypatch.setattr(trust_mod.CheckpointTrust, "seal", slow_seal)
    state = app()
    c = Checkpointer(str(tmp_path), CPU, keep_last=3, async_mode="off", mirror=NoMirror())
    done = threading.Event()

    def loop():
        c.save(5, state, {}, "{}")
        for _ in range(10):
            c.poll()
        done.set()

    threading.Thread(target=loop, daemon=True).start()
    assert done.wait(10), "the save or a poll waited for the seal"
    assert sealing.wait(10)
    assert c.last_durable_step is None and not os.path.exists(os.path.join(step_dir(str(tmp_path), 5), MARKER))
    release.set()
    c.wait()
    assert c.last_durable_step == 5 and os.path.isfile(os.path.join(step_dir(str(tmp_path), 5), MARKER))
