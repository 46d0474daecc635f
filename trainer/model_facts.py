"""Model and hardware facts, torch-free: the built-in GPT sizes, FLOPs per trained token and
each GPU's peak dense bf16 throughput. The trainer's MFU (trainer/metrics.py), its model
(trainer/model.py) and config checks, and the platform's preflight (jobs/preflight.py)
all read them here, so the planning figure and the measured one use the same peak.
"""
from __future__ import annotations

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
#   A10G 70: AWS's g5 variant of the A10 has no public NVIDIA datasheet (the A10 datasheet's 125
#     is the A10's); 70 is the dense bf16 figure of the A10 vs A10G spec comparison
#     (baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference: "the A10 prioritizes tensor
#     compute, while the A10G has a higher CUDA core performance").
PEAK_BF16_TFLOPS: list[tuple[str, float]] = [
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

# The device name each platform GPU type (workloads/gpu_catalog.py) reports on its instances.
DEVICE_NAME_BY_GPU_TYPE = {
    "a100": "NVIDIA A100-SXM4-40GB", "a100-80gb": "NVIDIA A100-SXM4-80GB", "h100": "NVIDIA H100 80GB HBM3",
    "h200": "NVIDIA H200", "l4": "NVIDIA L4", "a10g": "NVIDIA A10G", "l40s": "NVIDIA L40S",
}


def peak_tflops_for(device_name: str) -> float | None:
    for key, tflops in PEAK_BF16_TFLOPS:
        if key.lower() in device_name.lower():
            return tflops
    return None


def peak_tflops_for_gpu_type(gpu_type: str) -> float | None:
    """The peak of a platform GPU type (`h100`, `a10g`, ...), as the trainer's MFU uses it."""
    name = DEVICE_NAME_BY_GPU_TYPE.get(gpu_type)
    return peak_tflops_for(name) if name else None
