"""Async (thread) checkpoints stage into host buffers allocated once and reused (issue 28
item 3). The timing target (<= 0.1 s blocked per GPT-2 124M save on an H100) lives in
benchmarks/checkpoint_stall.py; these tests pin the behaviour that makes it possible."""
import os

import torch
import torch.distributed.checkpoint as dcp

from trainer.checkpoint import Checkpointer, ModelAndOptimizer, StagedThreadSave, step_dir
from trainer.config import ModelConfig, TrainerConfig
from trainer.distributed import Env
from trainer.model import build_model
from trainer.s3 import NoMirror
from trainer.optim import build_optimizer

CPU = Env(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), backend="gloo")


def model_and_optimizer():
    torch.manual_seed(0)
    cfg = TrainerConfig(model=ModelConfig(size="tiny"))
    model = build_model(cfg.model, 64, 16)
    return model, build_optimizer(model, cfg, torch.device("cpu"))


def train_one_step(model, optimizer):
    model(torch.randint(0, 64, (2, 16))).float().pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def buffer_pointers(writer: StagedThreadSave) -> set[int]:
    out = set()

    def walk(node):
        if isinstance(node, torch.Tensor):
            out.add(node.data_ptr())
        elif isinstance(node, dict):
            for v in node.values():
                walk(v)
        elif isinstance(node, (list, tuple)):
            for v in node:
                walk(v)

    walk(writer.staging.buffers)
    return out


def test_buffers_are_allocated_ahead_once_and_reused_by_every_save(tmp_path):
    model, optimizer = model_and_optimizer()
    ckpt = Checkpointer(str(tmp_path), CPU, keep_last=5, async_mode="thread", mirror=NoMirror())
    assert isinstance(ckpt.writer, StagedThreadSave)
    app = ModelAndOptimizer(model, optimizer)
    ckpt.prepare_staging(app)
    ckpt.poll()  # no optimizer state yet: nothing to size the buffers by (and no AdamW step faked)
    assert ckpt.writer.staging.allocations == 0 and not optimizer.state
    train_one_step(model, optimizer)
    ckpt.poll()  # the first step boundary with optimizer state: allocation starts, off the save path
    ckpt.writer.staging._ahead.result(timeout=30)
    assert ckpt.writer.staging.allocations == 1
    pointers = None
    for step in (1, 2, 3):
        ckpt.save(step, app, {"step": step}, "{}")
        ckpt.wait()
        pointers = pointers or buffer_pointers(ckpt.writer)
        assert buffer_pointers(ckpt.writer) == pointers
        train_one_step(model, optimizer)
    assert ckpt.writer.staging.allocations == 1, "the first save must not allocate: it would be slower than the rest"
    ckpt.close()


def test_training_after_the_save_returns_does_not_leak_into_the_checkpoint(tmp_path):
    """The save returns after the copy; the write runs while training changes the weights.
    The checkpoint must hold the weights and learning rate of the step it names."""
    model, optimizer = model_and_optimizer()
    train_one_step(model, optimizer)
    app = ModelAndOptimizer(model, optimizer)
    ckpt = Checkpointer(str(tmp_path), CPU, keep_last=5, async_mode="thread", mirror=NoMirror())
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    for group in optimizer.param_groups:
        group["lr"] = 1.25e-3
    ckpt.save(1, app, {"step": 1}, "{}")
    with torch.no_grad():  # training goes on before the background write has finished
        for p in model.parameters():
            p.add_(1.0)
    for group in optimizer.param_groups:
        group["lr"] = 9.0
    ckpt.wait()
    ckpt.save(2, app, {"step": 2}, "{}")  # the second save reuses the buffers: it must carry lr 9.0
    ckpt.wait()
    ckpt.close()

    fresh, fresh_opt = model_and_optimizer()
    restored = ModelAndOptimizer(fresh, fresh_opt)
    dcp.load({"app": restored}, checkpoint_id=os.path.join(tmp_path, "step-000001"), no_dist=True)
    for key, value in fresh.state_dict().items():
        assert torch.equal(value, expected[key]), key
    assert fresh_opt.param_groups[0]["lr"] == 1.25e-3
    dcp.load({"app": restored}, checkpoint_id=os.path.join(tmp_path, "step-000002"), no_dist=True)
    assert fresh_opt.param_groups[0]["lr"] == 9.0
    assert torch.equal(fresh.wte.weight, expected["wte.weight"] + 1.0)


def test_the_manifest_is_hashed_on_the_writer_thread_not_the_loop(tmp_path, monkeypatch):
    """Hashing every file of a step for its signed manifest (trainer/trust.py) costs about a
    second per 1.5 GB: done at finalize on the loop's thread it would undo the staging. The
    writer's thread hashes right after the save; the loop only signs and writes the manifest."""
    import threading

    from trainer import trust

    hashed_on: list[str] = []  # the thread that asked for each batch of non-empty digests
    real = trust.CheckpointTrust._digests

    def digests(self, path, names):
        if names:
            hashed_on.append(threading.current_thread().name)
        return real(self, path, names)

    monkeypatch.setattr(trust.CheckpointTrust, "_digests", digests)
    model, optimizer = model_and_optimizer()
    ckpt = Checkpointer(str(tmp_path), CPU, keep_last=5, async_mode="thread", mirror=NoMirror())
    app = ModelAndOptimizer(model, optimizer)
    train_one_step(model, optimizer)
    ckpt.save(1, app, {"tokens_seen": 0}, "{}")
    ckpt.wait()
    assert hashed_on, "nothing was hashed: the manifest lists no file"
    assert all(name.startswith("ckpt-writer") for name in hashed_on), hashed_on
    with open(os.path.join(step_dir(str(tmp_path), 1), trust.MANIFEST)) as f:
        import json
        files = json.load(f)["body"]["files"]
    assert ".metadata" in files and any(n.endswith(".distcp") for n in files)
