"""Planning figures measured on real GPUs, per GPU type, for preflight.

`make gpu-check` (tools/gpu_check.py) measures the flagship example's model
(trainer/configs/gpt2-124m.yaml: GPT-2 124M, T=1024, micro-batch 16, plain compiled model, bf16)
on the GPU it runs on and records tokens/s, MFU and peak memory here, with the device, date,
torch and CUDA versions and the command. Preflight plans a job on that GPU type with the
measured MFU instead of the 35% default, and shows the measured peak memory next to its
estimate when the job's model and micro-batch are the measured ones. A GPU type with no
record keeps the default, and preflight says so. Nothing here is estimated: an entry exists
only where a machine measured it. Torch-free (preflight runs without torch).
"""
from __future__ import annotations

import json
import os
from typing import Any, Optional

from catalog.gpus import gpu_type_for_device

MEASUREMENTS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_measurements.json")

def gpu_type_for(device_name: str, memory_gib: float) -> Optional[str]:
    """The catalog GPU type of a device (catalog/gpus.py), or None for one no pool offers."""
    return gpu_type_for_device(device_name, memory_gib)


def load(path: str = MEASUREMENTS_FILE) -> dict[str, dict[str, Any]]:
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    return dict(data.get("gpus", {}))


def record(gpu_type: str, figures: dict[str, Any], path: str = MEASUREMENTS_FILE) -> None:
    """Adds or replaces the measurement of one GPU type (atomically: preflight may read it)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        data = {}
    data.setdefault("about", "Written by `make gpu-check` (tools/gpu_check.py); read by jobs/preflight.py. "
                             "Measured figures only, per GPU type.")
    data.setdefault("gpus", {})[gpu_type] = figures
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def matches(figures: dict[str, Any], *, num_layers: Optional[int], hidden_size: Optional[int], seq_len: int,
            micro_batch_size: int, vocab_size: int, strategy: str, activation_checkpointing: bool) -> bool:
    """Was this measurement taken with the job's model shape and micro-batch? (Memory only
    transfers between identical shapes; MFU is used for any dense GPT on that GPU.)"""
    model = figures.get("model", {})
    return (model.get("num_layers") == num_layers and model.get("hidden_size") == hidden_size
            and model.get("seq_len") == seq_len and model.get("micro_batch_size") == micro_batch_size
            and model.get("vocab_size") == vocab_size and not activation_checkpointing and strategy != "fsdp")
