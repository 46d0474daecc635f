"""Model FLOPs utilisation of the trainer on a GPU: GPT-2 124M, bf16, the trainer's own loop.

    .venv/bin/python benchmarks/mfu.py [--steps 30] [--compile]

Without a GPU it says so and exits 0: CPU MFU against a GPU peak would be meaningless.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--micro-batch-size", type=int, default=16)
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("MFU benchmark: no CUDA GPU on this machine; nothing measured (run it on a GPU node).")
        return
    from trainer.config import load_config
    from trainer.metrics import peak_tflops_for
    from trainer.prepare import prepare
    from trainer.train import main as train_main

    work = tempfile.mkdtemp(prefix="bench-mfu-")
    import argparse as a, logging, string, textwrap

    prepare([m.__file__ for m in (a, logging, string, textwrap)], f"{work}/data", show_progress=False)
    config = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "trainer", "configs", "gpt2-124m.yaml")
    cfg = load_config(config, [f"data.dir={work}/data", f"checkpoint.dir={work}/ckpt", f"schedule.num_steps={args.steps}",
                               "schedule.warmup_steps=2", "schedule.grad_accum_steps=1", "parallelism.strategy=none",
                               f"data.micro_batch_size={args.micro_batch_size}", f"parallelism.compile={str(args.compile).lower()}",
                               "checkpoint.every_steps=100000", "tracking.log_every_steps=10", "tracking.enabled=false"],
                      environ={})
    assert train_main(cfg) == 0
    rows = [json.loads(line) for line in open(f"{work}/ckpt/metrics.jsonl") if '"mfu"' in line]
    last = rows[-1]  # the first interval includes warm-up (and compilation)
    name = torch.cuda.get_device_name()
    print(f"GPU {name} (peak {peak_tflops_for(name)} bf16 TFLOP/s), GPT-2 124M, T=1024, B={args.micro_batch_size}, "
          f"compile={args.compile}")
    print(f"tokens/s {last['tokens_per_second']:.0f}, step {last['step_seconds'] * 1000:.0f} ms, "
          f"MFU {100 * last['mfu']:.1f}%, peak memory {last['peak_gpu_memory_gib']:.1f} GiB")


if __name__ == "__main__":
    main()
