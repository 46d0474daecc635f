"""Model FLOPs utilisation of the trainer on one GPU: GPT-2 124M (tied, 124.4M parameters),
bf16, torch.compile, the trainer's own loop, next to the best plain loop of the same model:
nanoGPT's (the cross-entropy inside the compiled forward, fused AdamW, clipping), so the
trainer's overhead is measured against that, not against a loop with the trainer's own tail.

    python3 benchmarks/mfu.py [--steps 50] [--micro-batch-size 16] [--no-compile] [--json PATH]

Prints tokens/s, MFU (6N + 12·L·H·T FLOPs per token, N = 123.65M as nanoGPT counts it, over
the dense bf16 peak of the GPU from trainer.metrics), peak memory, and the ratio trainer /
nanoGPT loop. Goal (docs/trainer-reference.md, "Performance goals"): >= 45% MFU on one H100 or H200.
Without a GPU it says "not measured" and exits 0: CPU MFU against a GPU peak is meaningless.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def nanogpt_loop(cfg, num_steps: int, compile_model: bool) -> tuple[float, float]:
    """Tokens/s and peak GiB of nanoGPT's training step on the same model, data and optimizer:
    the loss computed inside the compiled function (nanoGPT's `GPT.forward(idx, targets)`
    under `torch.compile`), bf16 autocast, fused AdamW, clipping, no wrapper, nothing else."""
    import torch.nn.functional as F

    from trainer.data import DistributedBatches, TokenShards
    from trainer.model import build_model
    from trainer.optim import build_optimizer

    device = torch.device("cuda")
    shards = TokenShards(cfg.data.dir, cfg.data.seq_len)
    batches = DistributedBatches(shards, cfg.data.micro_batch_size, 0, 1, cfg.seed, device, prefetch=2)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, shards.vocab_size, cfg.data.seq_len).to(device)

    def forward_with_loss(idx, targets):
        logits = model(idx)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)

    step_loss = torch.compile(forward_with_loss) if compile_model else forward_with_loss
    optimizer = build_optimizer(model, cfg, device)
    tokens = cfg.data.micro_batch_size * cfg.data.seq_len
    warmup = min(10, num_steps // 2)
    torch.cuda.reset_peak_memory_stats(device)
    for step in range(num_steps):
        if step == warmup:
            torch.cuda.synchronize()
            started = time.perf_counter()
        inputs, targets = batches.next_batch()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_loss(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    batches.close()
    rate = (num_steps - warmup) * tokens / (time.perf_counter() - started)
    peak = torch.cuda.max_memory_allocated(device) / 2**30
    del model, optimizer
    torch.cuda.empty_cache()
    return rate, peak


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--micro-batch-size", type=int, default=16)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--json", help="also write the figures here (make gpu-check)")
    parser.add_argument("--deterministic", action="store_true",
                        help="the trainer in reproducibility.deterministic mode (its throughput cost)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("MFU benchmark: no CUDA GPU on this machine: not measured (run it on a GPU node).")
        return
    from trainer.config import load_config
    from trainer.metrics import flops_per_token, peak_tflops_for
    from trainer.model import build_model, count_params
    from trainer.prepare import prepare
    from trainer.train import main as train_main

    compile_model = not args.no_compile
    work = tempfile.mkdtemp(prefix="bench-mfu-")
    import argparse as a, logging, string, textwrap

    # Byte-level tokens: vocab 257 here, but model.vocab_size=50304 keeps GPT-2's head size.
    prepare([m.__file__ for m in (a, logging, string, textwrap)], f"{work}/data", show_progress=False)
    config = os.path.join(REPO, "trainer", "configs", "gpt2-124m.yaml")
    cfg = load_config(config, [f"data.dir={work}/data", f"checkpoint.dir={work}/ckpt", f"schedule.num_steps={args.steps}",
                               "schedule.warmup_steps=2", "schedule.grad_accum_steps=1", "parallelism.strategy=none",
                               f"data.micro_batch_size={args.micro_batch_size}", f"parallelism.compile={str(compile_model).lower()}",
                               "checkpoint.every_steps=100000", "tracking.log_every_steps=10", "tracking.enabled=false",
                               "evaluation.at_end=false", "export.at_end=false",
                               f"reproducibility.deterministic={str(args.deterministic).lower()}"],
                      environ={})
    assert train_main(cfg) == 0
    rows = [json.loads(line) for line in open(f"{work}/ckpt/metrics.jsonl") if '"mfu"' in line]
    last = rows[-1]  # the first interval includes warm-up (and compilation)
    # With --deterministic the process stays in deterministic mode for this loop too: compare
    # the trainer's figure with the default run's, not with this loop.
    bare, bare_peak = nanogpt_loop(cfg, args.steps, compile_model)

    name = torch.cuda.get_device_name()
    peak = peak_tflops_for(name)
    with torch.device("meta"):
        model = build_model(cfg.model, 257, cfg.data.seq_len)
    flops = flops_per_token(count_params(model), 12, 768, cfg.data.seq_len)
    bare_mfu = bare * flops / (peak * 1e12) if peak else None
    print(f"GPU {name} (dense bf16 peak {peak} TFLOP/s); torch {torch.__version__}, CUDA {torch.version.cuda}; "
          f"{time.strftime('%Y-%m-%d', time.gmtime())}")
    print(f"GPT-2 124M ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, N={count_params(model) / 1e6:.2f}M), "
          f"T={cfg.data.seq_len}, B={args.micro_batch_size}, compile={compile_model}, bf16"
          f"{', trainer in deterministic mode' if args.deterministic else ''}")
    print(f"trainer:      {last['tokens_per_second']:8.0f} tokens/s, step {last['step_seconds'] * 1000:.0f} ms, "
          f"MFU {100 * last['mfu']:.1f}%, peak memory {last['peak_gpu_memory_gib']:.1f} GiB")
    print(f"nanoGPT loop: {bare:8.0f} tokens/s, MFU {f'{100 * bare_mfu:.1f}%' if bare_mfu else 'n/a'}, "
          f"peak memory {bare_peak:.1f} GiB")
    print(f"ratio trainer / nanoGPT loop: {last['tokens_per_second'] / bare:.3f}   (goal: trainer MFU >= 45% on an H100/H200)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "torch": torch.__version__, "cuda": torch.version.cuda,
                       "date": time.strftime("%Y-%m-%d", time.gmtime()),
                       "memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1),
                       "peak_tflops": peak, "command": f"python3 benchmarks/mfu.py --steps {args.steps} "
                       f"--micro-batch-size {args.micro_batch_size}{' --no-compile' if not compile_model else ''}",
                       "model": {"config": "trainer/configs/gpt2-124m.yaml", "num_layers": 12, "hidden_size": 768,
                                 "seq_len": cfg.data.seq_len, "micro_batch_size": args.micro_batch_size,
                                 "vocab_size": cfg.model.vocab_size, "strategy": "none", "compile": compile_model},
                       "tokens_per_second": last["tokens_per_second"], "mfu": last["mfu"],
                       "step_seconds": last["step_seconds"], "peak_memory_gib": last["peak_gpu_memory_gib"],
                       "nanogpt_tokens_per_second": bare, "nanogpt_mfu": bare_mfu, "nanogpt_peak_memory_gib": bare_peak,
                       "ratio_trainer_to_nanogpt": last["tokens_per_second"] / bare,
                       "deterministic": args.deterministic}, f, indent=1)


if __name__ == "__main__":
    main()
