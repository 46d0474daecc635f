"""FLOP accounting (MFU), device memory and the goodput ledger."""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass

import torch

# bf16 dense tensor-core peak, TFLOP/s per device (vendor datasheets, no sparsity; the
# datasheets print the sparse figure, twice these, with an asterisk). Matched in order
# against torch.cuda.get_device_name(), most specific first ("A10G" before "A10", "L40S"
# before "L40" before "L4"). Every GPU type of workloads/gpu_catalog.py is covered
# (tests/trainer/test_model_flops.py checks it):
#   H100 SXM 989 / PCIe 756 / NVL 835: nvidia.com/en-us/data-center/h100 (datasheet table)
#   H200 989: nvidia.com/en-us/data-center/h200
#   A100 312: nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
#   L40S 362: nvidia.com/en-us/data-center/l40s ; L40 181: L40 datasheet
#   L4 121: nvidia.com/en-us/data-center/l4
#   A10 125: nvidia.com/en-us/data-center/products/a10-gpu
#   A10G 70: AWS's g5 variant of the A10 has no NVIDIA datasheet; 70 is the dense bf16
#     figure in the A10 vs A10G spec comparison (baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference)
PEAK_BF16_TFLOPS = [
    ("GB200", 2500.0),
    ("B200", 2250.0),
    ("GH200", 989.0),
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("H800", 989.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("A10G", 70.0),
    ("A10", 125.0),
    ("V100", 125.0),  # fp16; V100 has no bf16
]


def peak_tflops_for(device_name: str) -> float | None:
    for key, tflops in PEAK_BF16_TFLOPS:
        if key.lower() in device_name.lower():
            return tflops
    return None


def flops_per_token(num_params: int, num_layers: int, hidden_size: int, seq_len: int) -> float:
    """Forward + backward FLOPs per trained token: 6N for the matmuls with the weights, plus
    12·L·H·T for attention scores and values (PaLM appendix B, as in nanoGPT)."""
    return 6.0 * num_params + 12.0 * num_layers * hidden_size * seq_len


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
