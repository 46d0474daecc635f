"""Helpers for the GPU suite. Only torch, numpy, PyYAML and transformers are assumed (the
trainer image's packages): no pytest fixtures, so tools/gpu_check.py can run these tests
without pytest too. Skips raise unittest.SkipTest, which pytest reports as a skip.

TRAINER_GPU_TESTS_ON_CPU=1 runs the flows on CPU (fp32, eager) to check the tests' own logic
on a machine without a GPU; it proves nothing about CUDA and `make gpu-check` never sets it."""
from __future__ import annotations

import functools
import os
import sys
import tempfile
import unittest

import torch

from tests.trainer.trainer_helpers import REPO, launcher_env, run

ON_CPU = os.environ.get("TRAINER_GPU_TESTS_ON_CPU") == "1"
TINY_CONFIG = os.path.join(REPO, "trainer", "configs", "tiny.yaml")


def require_gpu(cuda_only: bool = False) -> None:
    if torch.cuda.is_available() or (ON_CPU and not cuda_only):
        return
    reason = (f"no CUDA GPU on this machine (torch {torch.__version__}, torch.cuda.is_available() is "
                            "False): the GPU suite runs on a GPU node, `make gpu-check`")
    try:
        import pytest
    except ImportError:
        raise unittest.SkipTest(reason) from None
    pytest.skip(reason)


@functools.lru_cache(maxsize=None)
def prepared_data() -> str:
    """Byte-level shards of a few stdlib modules with a held-out split, once per session."""
    import argparse
    import logging
    import string
    import textwrap

    from trainer.prepare import prepare

    out = os.path.join(tempfile.mkdtemp(prefix="gpu-tests-data-"), "data")
    prepare([m.__file__ for m in (argparse, logging, string, textwrap)], out, show_progress=False, val_fraction=0.05)
    return out


def overrides(ckpt: str, **extra) -> list[str]:
    """A small GPT (4 layers, 128 wide) in bf16 with torch.compile on the GPU."""
    base = {
        "data.dir": prepared_data(), "checkpoint.dir": ckpt, "model.size": "small", "model.dropout": 0.1,
        "data.seq_len": 128, "data.micro_batch_size": 8, "schedule.num_steps": 12, "schedule.warmup_steps": 2,
        "checkpoint.every_steps": 4, "tracking.enabled": "false", "tracking.log_every_steps": 1,
        "export.at_end": "false", "evaluation.every_steps": 4, "evaluation.num_batches": 2,
        "parallelism.mixed_precision": "fp32" if ON_CPU else "bf16",
        "parallelism.compile": "false" if ON_CPU else "true",
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def launch_cmd(args: list[str], nproc: int = 1) -> list[str]:
    return [sys.executable, "-m", "trainer.launch", f"--nproc-per-node={nproc}", "--standalone",
            "-m", "trainer", "train", "--config", TINY_CONFIG, *args]


def launch(args: list[str], nproc: int = 1, timeout: float = 900, **env: str):
    return run(launch_cmd(args, nproc), launcher_env(**env), timeout=timeout)


def scratch(name: str) -> str:
    return tempfile.mkdtemp(prefix=f"gpu-test-{name}-")


def device_word() -> str:
    return "cpu" if ON_CPU and not torch.cuda.is_available() else "cuda"
