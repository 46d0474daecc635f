"""The optimizer and its learning-rate schedule: what the training loop, the restore drill
(trainer/verify.py) and the benchmarks build alike, so none of them imports the loop for it."""
from __future__ import annotations

import math

import torch

from trainer.config import TrainerConfig


def cosine_with_warmup(warmup_steps: int, num_steps: int, min_lr_ratio: float):
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, num_steps - warmup_steps)
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return factor


def build_optimizer(model: torch.nn.Module, cfg: TrainerConfig, device: torch.device) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    # Weight decay on matrices only; biases and norms are not decayed (GPT-2 / nanoGPT).
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.optimizer.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    o = cfg.optimizer
    return torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, fused=device.type == "cuda")
