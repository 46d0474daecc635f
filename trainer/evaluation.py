"""Validation loss on the held-out split, every `evaluation.every_steps` and at the end.

Evaluating must not change training: the model is switched to eval mode (no dropout) and
back, the CPU and CUDA generators are restored afterwards (`torch.random.fork_rng`), and the
validation windows come from their own fixed list, never from the training cursor. A resumed
run therefore stays bitwise identical whether or not, and how often, it evaluates.
"""
from __future__ import annotations

import logging
import math
import time

import torch

from trainer import distributed
from trainer.config import EvaluationConfig
from trainer.data import TokenShards, ValidationBatches
from trainer.model import loss_function

log = logging.getLogger(__name__)


class NoEvaluation:
    """No validation split, or evaluation not wanted: nothing is ever due."""

    def due(self, step: int, last_step: bool) -> bool:
        return False

    def maybe_evaluate(self, step: int, last_step: bool) -> dict[str, float] | None:
        return None


class Evaluator:
    def __init__(self, cfg: EvaluationConfig, model: torch.nn.Module, batches: ValidationBatches,
                 env: distributed.Env, autocast_factory, compile_model: bool = False, blocks_compiled: bool = False):
        self.cfg = cfg
        # DDP's wrapper is bypassed: a forward without gradients needs no reducer, and the
        # bucket state of the training wrapper stays untouched. FSDP2 modules are called as
        # they are (their forward gathers the shards).
        from torch.nn.parallel import DistributedDataParallel

        self.module = model.module if isinstance(model, DistributedDataParallel) else model
        # The training loss's function, compiled the same way: an eager fp32 upcast of the
        # [B*T, vocab] logits would set the run's peak memory (about 8 GB for GPT-2 at 16 x 1024),
        # which gpu-check records for preflight.
        self.loss_fn = loss_function(self.module, compile_model, blocks_compiled)
        self.batches = batches
        self.env = env
        self.autocast_factory = autocast_factory

    def due(self, step: int, last_step: bool) -> bool:
        periodic = self.cfg.every_steps > 0 and step % self.cfg.every_steps == 0
        return periodic or (last_step and self.cfg.at_end)

    def maybe_evaluate(self, step: int, last_step: bool) -> dict[str, float] | None:
        if not self.due(step, last_step):
            return None
        return self.evaluate()

    def evaluate(self) -> dict[str, float]:
        started = time.perf_counter()
        was_training = self.module.training
        devices = [self.env.device] if self.env.device.type == "cuda" else []
        total = torch.zeros((), dtype=torch.float64, device=self.env.device)
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            self.module.eval()
            try:
                for inputs, targets in self.batches:
                    with self.autocast_factory():
                        total += self.loss_fn(inputs, targets).double()
            finally:
                self.module.train(was_training)
        mean = distributed.all_reduce_mean(self.env, total / len(self.batches)).item()
        return {"val_loss": mean, "val_perplexity": math.exp(min(mean, 50.0)),
                "eval_seconds": time.perf_counter() - started}


def evaluator_for(cfg, model: torch.nn.Module, env: distributed.Env, autocast_factory, blocks_compiled: bool = False):
    """An Evaluator when the dataset has a validation split, else NoEvaluation (logged)."""
    if not (cfg.evaluation.at_end or cfg.evaluation.every_steps > 0):
        return NoEvaluation()
    val = TokenShards(cfg.data.dir, cfg.data.seq_len, split="val")
    if val.num_samples == 0:
        if env.is_main:
            log.warning("data.dir=%s has no validation split with %d-token windows: no validation loss "
                        "(prepare-data --val-fraction writes one)", cfg.data.dir, cfg.data.seq_len + 1)
        return NoEvaluation()
    batches = ValidationBatches(val, cfg.data.micro_batch_size, cfg.evaluation.num_batches, env.rank,
                                env.world_size, env.device)
    return Evaluator(cfg.evaluation, model, batches, env, autocast_factory, cfg.parallelism.compile, blocks_compiled)
