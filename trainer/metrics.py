"""FLOP accounting (MFU), device memory and the goodput ledger."""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass

import torch

# Re-exported: benchmarks and tests import them from here too.
from trainer.model_facts import PEAK_BF16_TFLOPS, flops_per_token, peak_tflops_for  # noqa: F401


class MFU:
    def __init__(self, flops_per_token: float, peak_tflops: float):
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_tflops * 1e12

    def __call__(self, tokens_per_second_per_device: float) -> float | None:
        return tokens_per_second_per_device * self.flops_per_token / self.peak_flops


class NoMFU:
    """CPU, or a GPU missing from the table without tracking.peak_tflops: nothing to report."""

    def __call__(self, tokens_per_second_per_device: float) -> float | None:
        return None


def mfu_meter(device: torch.device, flops: float, override_tflops: float | None):
    peak = override_tflops
    if peak is None and device.type == "cuda":
        peak = peak_tflops_for(torch.cuda.get_device_name(device))
    return MFU(flops, peak) if peak else NoMFU()


# Logged metrics that measure this run on this machine (wall time, memory), not results of the
# computation: they differ between any two runs. Every other metric logged per step is a
# function of the data, the seed and the config, and a resumed run logs it bitwise equal to
# an uninterrupted one (tools/fault_injection.py and the recovery tests compare them all).
MEASURED_METRICS = frozenset({"tokens_per_second", "mfu", "step_seconds", "data_wait_seconds", "checkpoint_seconds",
                              "peak_gpu_memory_gib", "eval_seconds"})


class CudaMemory:
    def peak_gib(self) -> float | None:
        return torch.cuda.max_memory_allocated() / 2**30


class NoDeviceMemory:
    def peak_gib(self) -> float | None:
        return None


def memory_meter(device: torch.device):
    return CudaMemory() if device.type == "cuda" else NoDeviceMemory()


@dataclass
class Goodput:
    """Where the job's wall time went, summed over every attempt (restarts included).
    Snapshotted into each checkpoint, so time spent after the last checkpoint of an attempt
    that died is counted as lost, not productive."""

    wall_seconds: float = 0.0
    productive_seconds: float = 0.0
    checkpoint_stall_seconds: float = 0.0
    startup_seconds: float = 0.0
    lost_seconds: float = 0.0
    num_restarts: int = 0
    num_lost_steps: int = 0

    def summary(self) -> dict[str, float]:
        d = asdict(self)
        d["goodput"] = self.productive_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0
        return d


class Heartbeat:
    """Last step reached, written by rank 0 next to the checkpoints, so a restarted attempt
    knows how much work its predecessor lost after its last checkpoint."""

    def __init__(self, root: str):
        self.path = os.path.join(root, "heartbeat.json")

    def beat(self, step: int) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"step": step, "time": time.time()}, f)
        os.replace(tmp, self.path)

    def read(self) -> dict | None:
        try:
            with open(self.path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None
