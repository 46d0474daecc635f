"""`reproducibility.deterministic: true`: two runs of one config on one device type give the
same per-step losses and weights bit for bit, and so does a run preempted and resumed.

What it switches (torchtitan's `debug.deterministic`, `torchtitan/distributed/utils.py`
`set_determinism`, does the same set):
- `torch.use_deterministic_algorithms(True)`: every op with a nondeterministic CUDA kernel
  (atomics in index_add / scatter / embedding backward...) takes its deterministic one, or
  raises rather than silently varying ("Reproducibility", PyTorch docs).
- `CUBLAS_WORKSPACE_CONFIG=:4096:8`: cuBLAS >= 10.2 picks reduction splits per stream
  workspace; without a fixed workspace the deterministic-algorithms check raises for matmuls
  (PyTorch docs, "Reproducibility", cuBLAS section). Set before the first cuBLAS handle.
  Under it, SDPA's dispatcher keeps to backends with a deterministic backward (flash and
  memory-efficient take their deterministic paths, cuDNN attention is excluded: PyTorch's
  randomness notes, "CUDA Scaled Dot Product Attention", pytorch/pytorch PR 182551).
- cuDNN: `deterministic = True`, `benchmark = False` (benchmarking picks the fastest kernel
  per run, which may differ).
- inductor (torch.compile): no autotuning that varies between runs (`max_autotune` off,
  `coordinate_descent_tuning` off), `fallback_random` so compiled dropout draws from the
  same generator as eager, and `deterministic` where the installed torch has that switch.
- every generator seeded (Python, NumPy, torch CPU and CUDA) from `seed`.

The default (off) keeps the fast kernels. The cost is measured, never assumed: see
docs/performance.md.
"""
from __future__ import annotations

import logging
import os
import random

log = logging.getLogger(__name__)

CUBLAS_WORKSPACE = ":4096:8"


def apply(deterministic: bool, seed: int) -> None:
    """Call in a process that trains before its first matmul (cuBLAS reads the workspace
    config when it creates its handle; setting the CUDA device or a process group does not)."""
    if not deterministic:
        return
    # Before torch creates a cuBLAS handle (the first matmul): an existing value is kept.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    import numpy as np
    import torch

    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    # TF32 matmuls are deterministic but differ from fp32; keep whatever the job chose.
    try:
        import torch._inductor.config as inductor

        inductor.max_autotune = False
        inductor.coordinate_descent_tuning = False
        inductor.fallback_random = True
        if hasattr(inductor, "deterministic"):  # newer torch: no tuning that varies per run
            inductor.deterministic = True
    except ImportError:  # a torch without inductor: nothing is compiled anyway
        pass
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # seeds the CUDA generators too
    log.info("deterministic mode: deterministic algorithms, CUBLAS_WORKSPACE_CONFIG=%s, no cuDNN benchmark, "
             "no varying autotune, seed %d", os.environ["CUBLAS_WORKSPACE_CONFIG"], seed)


def state() -> dict:
    """What a test or a report checks: is the process in deterministic mode?"""
    import torch

    return {"deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG")}
