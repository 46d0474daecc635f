"""Guards that stop a run from recording one thing and doing another.

- Non-finite steps: a step whose loss or gradient norm is NaN/inf does not update the
  weights (the optimizer step is skipped, like a loss-scaler skip); K such steps in a row
  stop the run with a clear message and a non-zero exit, since no later step can recover.
- Non-finite weights are never checkpointed: a save of them would become the checkpoint
  every retry resumes from.
- Resume compatibility is checked from the marker, before anything is loaded.
- Optimizer hyperparameters changed on resume are applied after the optimizer state is
  loaded (that state carries the old values) and logged, so the logs, MLflow and the
  maths agree.
"""
from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


class TrainingStopped(RuntimeError):
    """A deliberate stop with a message for the user: printed without a traceback; the
    exit code is non-zero and permanent (1-127) for the launcher and the operator."""


class NonFiniteSteps:
    def __init__(self, max_consecutive: int):
        self.max_consecutive = max_consecutive
        self.consecutive = 0
        self.first_bad_step: int | None = None
        self.num_skipped = 0

    def record(self, step: int, finite: bool, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        if finite:
            self.consecutive, self.first_bad_step = 0, None
            return
        loss, grad_norm = loss.item(), grad_norm.item()  # only read back when something is wrong
        self.consecutive += 1
        self.num_skipped += 1
        self.first_bad_step = self.first_bad_step or step
        log.warning("step %d: non-finite loss %s or gradient norm %s: update skipped (%d in a row, limit %d)",
                    step, loss, grad_norm, self.consecutive, self.max_consecutive)
        if self.consecutive >= self.max_consecutive:
            raise TrainingStopped(
                f"loss or gradient norm non-finite for {self.consecutive} consecutive steps "
                f"({self.first_bad_step}-{step}; optimizer.max_nonfinite_steps={self.max_consecutive}): the run "
                f"stopped without saving. The newest checkpoint holds finite weights; resume from it with a lower "
                f"optimizer.lr, more schedule.warmup_steps or optimizer.grad_clip_norm, or check the data.")


def local_tensors(module: torch.nn.Module):
    for p in module.parameters():
        yield p.to_local() if hasattr(p, "to_local") else p  # FSDP2: this rank's shard


def weights_finite(module: torch.nn.Module) -> bool:
    flags = [torch.isfinite(t).all() for t in local_tensors(module) if t.numel()]
    return bool(torch.stack(flags).all().item()) if flags else True


def check_resume_compatible(saved_config: dict, saved_world_size: int, cfg, world_size: int, path: str) -> None:
    """The data cursor counts samples of `seq_len` tokens in one global order that does not
    depend on the world size, so a resume is exact when each optimizer step still consumes
    the same number of samples (micro-batch x accumulation x world size) of the same length."""
    d, s = saved_config["data"], saved_config["schedule"]
    saved_batch = d["micro_batch_size"] * s["grad_accum_steps"] * saved_world_size
    batch = cfg.data.micro_batch_size * cfg.schedule.grad_accum_steps * world_size
    problems = []
    if saved_batch != batch:
        problems.append(
            f"global batch {batch} samples (data.micro_batch_size={cfg.data.micro_batch_size} x "
            f"schedule.grad_accum_steps={cfg.schedule.grad_accum_steps} x world size {world_size}) differs from the "
            f"checkpoint's {saved_batch} ({d['micro_batch_size']} x {s['grad_accum_steps']} x {saved_world_size}): "
            f"choose values whose product is {saved_batch}")
    if d["seq_len"] != cfg.data.seq_len:
        problems.append(f"data.seq_len={cfg.data.seq_len} differs from the checkpoint's {d['seq_len']}: "
                        f"the data cursor counts samples of that length")
    if problems:
        raise TrainingStopped(f"cannot resume from {path}: " + "; ".join(problems))


OPTIMIZER_KEYS = ("lr", "weight_decay", "beta1", "beta2", "eps")


def apply_optimizer_config(optimizer: torch.optim.Optimizer, scheduler, cfg, saved_config: dict) -> list[str]:
    """Puts the config's optimizer hyperparameters into the loaded optimizer and scheduler;
    returns what changed. Nothing is touched when nothing changed (bitwise resume)."""
    o, saved = cfg.optimizer, saved_config.get("optimizer", {})
    changed = [f"optimizer.{k}: {saved[k]} -> {getattr(o, k)}" for k in OPTIMIZER_KEYS
               if k in saved and saved[k] != getattr(o, k)]
    if not changed:
        return []
    scheduler.base_lrs = [o.lr for _ in optimizer.param_groups]
    for i, group in enumerate(optimizer.param_groups):
        group["initial_lr"] = o.lr
        group["lr"] = o.lr * scheduler.lr_lambdas[i](scheduler.last_epoch)
        group["betas"] = (o.beta1, o.beta2)
        group["eps"] = o.eps
        if i == 0:  # build_optimizer's first group holds the decayed matrices; biases/norms stay at 0
            group["weight_decay"] = o.weight_decay
    scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
    return changed

