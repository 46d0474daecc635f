"""What a checkpoint holds besides files: the model and optimizer as DCP `Stateful`s, and each
rank's RNG states as tensors."""
from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful


class ModelAndOptimizer(Stateful):
    """DCP calls state_dict() at save and load; get/set_state_dict handle DDP and FSDP2 alike."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


class ModelOnly(Stateful):
    """The model's part of a checkpoint: an initial load without the optimizer (DCP loads
    only the keys asked for)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return {"model": get_model_state_dict(self.model)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.model, state["model"])


def rng_state() -> dict[str, torch.Tensor]:
    """Every RNG state as tensors only, so that it loads with `weights_only=True` (a pickle of
    Python objects would run code on load; see trainer/trust.py)."""
    version, words, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    assert name == "MT19937", name
    state = {"python_words": torch.tensor(words, dtype=torch.int64), "python_version": torch.tensor(version),
             "python_gauss": torch.tensor([gauss is not None, gauss or 0.0], dtype=torch.float64),
             "numpy_keys": torch.from_numpy(keys.astype(np.int64)), "numpy_pos": torch.tensor(pos),
             "numpy_gauss": torch.tensor([has_gauss, cached], dtype=torch.float64),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, torch.Tensor]) -> None:
    has_gauss, gauss = state["python_gauss"].tolist()
    random.setstate((int(state["python_version"]), tuple(state["python_words"].tolist()),
                     gauss if has_gauss else None))
    numpy_has_gauss, numpy_cached = state["numpy_gauss"].tolist()
    np.random.set_state(("MT19937", state["numpy_keys"].numpy().astype(np.uint32), int(state["numpy_pos"]),
                         int(numpy_has_gauss), numpy_cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def load_rng_file(path: str) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True, map_location="cpu")
