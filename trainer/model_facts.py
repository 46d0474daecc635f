"""Model and hardware facts, torch-free: the built-in GPT sizes, FLOPs per trained token and
each GPU's peak dense bf16 throughput (read from catalog/gpus.py). The trainer's MFU (trainer/metrics.py), its model
(trainer/model.py) and config checks, and the platform's preflight (jobs/preflight.py)
all read them here, so the planning figure and the measured one use the same peak.
"""
from __future__ import annotations

from catalog.gpus import GPU_TYPES, device_peaks, peak_tflops_for  # noqa: F401  (re-exported)

# Built-in GPT sizes. "gpt2" is GPT-2 124M (12 layers, 12 heads, 768 wide; the GPT-2 paper's
# smallest model and Hugging Face's `gpt2` config), the others its medium/large/xl siblings.
GPT_SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(num_layers=2, num_heads=2, embed_dim=64),
    "small": dict(num_layers=4, num_heads=4, embed_dim=128),
    "gpt2": dict(num_layers=12, num_heads=12, embed_dim=768),  # 124M
    "gpt2-medium": dict(num_layers=24, num_heads=16, embed_dim=1024),  # 350M
    "gpt2-large": dict(num_layers=36, num_heads=20, embed_dim=1280),  # 774M
    "gpt2-xl": dict(num_layers=48, num_heads=25, embed_dim=1600),  # 1558M
}


def flops_per_token(num_params: float, num_layers: int, hidden_size: int, seq_len: int) -> float:
    """Forward + backward FLOPs per trained token: 6N for the matmuls with the weights, plus
    12·L·H·T for attention scores and values (PaLM appendix B, as in nanoGPT)."""
    return 6.0 * num_params + 12.0 * num_layers * hidden_size * seq_len


# Peak dense bf16 TFLOP/s per device, and the device name of each platform GPU type: from
# catalog/gpus.py (the one table; its docstring cites every figure).
PEAK_BF16_TFLOPS: list[tuple[str, float]] = sorted(device_peaks().items(), key=lambda item: -len(item[0]))
DEVICE_NAME_BY_GPU_TYPE = {name: gpu.cuda_device_name for name, gpu in GPU_TYPES.items()}


def peak_tflops_for_gpu_type(gpu_type: str) -> float | None:
    """The peak of a platform GPU type (`h100`, `a10g`, ...), as the trainer's MFU uses it."""
    gpu = GPU_TYPES.get(gpu_type)
    return gpu.peak_bf16_tflops if gpu else None
