"""The per-step agreement (preempted, time due, non-finite): one collective and one host read.

On a GPU each host read of a device value is a sync that idles the GPU until the CPU has
launched the optimizer step, and a CPU gloo all-reduce is a ring of 2(N-1) TCP hops
(pytorch/gloo gloo/allreduce.cc: `ring(opts, ...)`): the step used to do both, one after the
other. Now the flags and the finiteness test travel in one tensor on the loss's device (NCCL on
GPU, with the step's own collectives) and are read back once. The GPU half (the collective's
tensor is a CUDA tensor, one sync) is tests/gpu.
"""
import os
import sys
import time

import pytest
import torch

from trainer.config import load_config
from trainer_helpers import REPO, TINY_CONFIG, tiny_overrides

TRAINER_DIR = os.path.join(REPO, "trainer") + os.sep


def test_a_step_reads_one_value_back_and_runs_one_collective_on_the_loss_device(tmp_path, data_dir, restore_signals,
                                                                                 monkeypatch):
    import torch.distributed as dist

    from trainer import distributed
    from trainer.preemption import PreemptionFlag
    from trainer.train import Trainer

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(29400 + os.getpid() % 500))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    cfg = load_config(TINY_CONFIG, tiny_overrides(data_dir, str(tmp_path / "ckpt"), **{"schedule.num_steps": 5}),
                      environ={})
    env = distributed.init(cfg.parallelism)
    try:
        trainer = Trainer(cfg, env, time.time(), PreemptionFlag())
        trainer.train_step()  # the first step: allocations, the optimizer's state

        reads, collectives = [], []
        real_item, real_tolist, real_all_reduce = torch.Tensor.item, torch.Tensor.tolist, dist.all_reduce

        def from_trainer() -> bool:
            return sys._getframe(2).f_code.co_filename.startswith(TRAINER_DIR)

        def item(self):
            if from_trainer():
                reads.append(("item", self.device))
            return real_item(self)

        def tolist(self):
            if from_trainer():
                reads.append(("tolist", self.device))
            return real_tolist(self)

        def all_reduce(tensor, *args, **kwargs):
            collectives.append((tensor.device, tensor.dtype, tuple(tensor.shape)))
            return real_all_reduce(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "item", item)
        monkeypatch.setattr(torch.Tensor, "tolist", tolist)
        monkeypatch.setattr(dist, "all_reduce", all_reduce)
        result = trainer.train_step()
        monkeypatch.undo()
    finally:
        trainer.batches.close()
        distributed.teardown(clean=False)

    assert not (result.bad or result.preempted)
    assert len(reads) == 1, f"host reads of device values in one step: {reads}"
    assert collectives == [(env.device, torch.float32, (3,))], collectives
