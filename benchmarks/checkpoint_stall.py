"""How long a checkpoint blocks training: synchronous vs. async (thread, and process) save of the
same model + AdamW state, through the trainer's Checkpointer, side by side; the first save apart
from the rest (staging buffers are allocated ahead, so it must be no slower); and how long
after a preemption signal the checkpoint is durable (marker written), to compare with the
pool's grace period. On a CUDA GPU when one is present (the state lives on the GPU, as in
training), else on CPU; the device and versions head the output.

    python3 benchmarks/checkpoint_stall.py [--size gpt2] [--repeats 3] [--device cuda|cpu] [--json PATH]

Goal (issue 28): async blocks <= 0.1 s per save of GPT-2 124M + AdamW on one H100.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
warnings.filterwarnings("ignore", message="torch.distributed is disabled")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from trainer.checkpoint import Checkpointer, ModelAndOptimizer
from trainer.config import ModelConfig, TrainerConfig  # noqa: E402
from trainer.distributed import Env  # noqa: E402
from trainer.guards import weights_finite  # noqa: E402
from trainer.model import build_model  # noqa: E402
from trainer.optim import build_optimizer  # noqa: E402
from trainer.s3 import NoMirror  # noqa: E402


def loop_thread_checks(app, metrics_path: str) -> None:
    """What `Trainer.save` runs on the loop's thread before the checkpointer: the finiteness
    check of every weight (a device sync; its all-reduce is free at world size 1). The fsync of
    metrics.jsonl is the sealer thread's, before the marker."""
    weights_finite(app.model)


def stalls(mode: str, app, root: str, repeats: int, device: torch.device) -> tuple[list[float], list[float], list[float]]:
    """Per save, the first included (index 0): seconds the loop is blocked by the save (the
    trainer's checks, the state dict, the copies), seconds to the end of the write, and seconds
    the loop spends at the next step boundary sealing it (`poll`: manifest and marker fsyncs,
    retention's rmtree, on rank 0's sealer thread: the loop only hands the write over):
    every piece of loop-thread work a save costs."""
    env = Env(rank=0, local_rank=0, world_size=1, device=device, backend="gloo")
    ckpt = Checkpointer(os.path.join(root, mode), env, keep_last=1, async_mode=mode, mirror=NoMirror())
    ckpt.prepare_staging(app)
    ckpt.poll()  # as the loop's first step boundary does: buffers are allocated off the save path
    pending = getattr(getattr(ckpt.writer, "staging", None), "_ahead", None)
    if pending is not None:
        pending.result()  # in training, steps run meanwhile; here nothing would
    blocked, total, finalize = [], [], []
    metrics = os.path.join(root, f"{mode}-metrics.jsonl")
    for step in range(1, repeats + 1):
        started = time.perf_counter()
        loop_thread_checks(app, metrics)
        ckpt.save(step, app, {"step": step}, "{}")
        blocked.append(time.perf_counter() - started)
        if ckpt.pending:
            ckpt.pending[0].result()  # the write runs while training steps would
        written = time.perf_counter()
        ckpt.poll()  # the next step boundary hands it to the sealer thread
        finalize.append(time.perf_counter() - written)
        total.append(time.perf_counter() - started)
    ckpt.close()
    return blocked, total, finalize


def signal_with_save_in_flight(app, root: str, repeats: int, device: torch.device) -> tuple[list[float], list[float]]:
    """The worst moment for a signal: an async save has just started. The trainer waits for it
    (durable at `finish`) and, if the time left allows, writes the current step too (`both`)."""
    env = Env(rank=0, local_rank=0, world_size=1, device=device, backend="gloo")
    ckpt = Checkpointer(os.path.join(root, "signal"), env, keep_last=1, async_mode="thread", mirror=NoMirror())
    finish, both = [], []
    for i in range(repeats):
        ckpt.save(2 * i + 1, app, {"step": 2 * i + 1}, "{}")
        signalled = time.perf_counter()
        ckpt.wait()
        finish.append(time.perf_counter() - signalled)
        ckpt.save(2 * i + 2, app, {"step": 2 * i + 2}, "{}")
        ckpt.wait()
        both.append(time.perf_counter() - signalled)
    ckpt.close()
    return finish, both


def init_local_group() -> None:
    """DCP's process mode sets up its background process through the default process group: one
    rank here, as under torchrun with one GPU."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="gpt2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", help="also write the figures here (make gpu-check)")
    args = parser.parse_args()
    device = torch.device(args.device)
    cfg = TrainerConfig(model=ModelConfig(size=args.size))
    model = build_model(cfg.model, 50304, 1024).to(device)
    optimizer = build_optimizer(model, cfg, device)
    model(torch.zeros(1, 8, dtype=torch.long, device=device)).float().sum().backward()
    optimizer.step()  # materialise AdamW's moments so they are part of the state
    optimizer.zero_grad(set_to_none=True)
    app = ModelAndOptimizer(model, optimizer)
    num_params = sum(p.numel() for p in model.parameters())
    state_gib = num_params * 4 * 3 / 2**30
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as root:
        stalls("off", app, root, 1, device)  # warm the page cache and allocator for both
        sync_blocked, sync_total, sync_finalize = stalls("off", app, root, args.repeats, device)
        async_blocked, async_total, async_finalize = stalls("thread", app, root, args.repeats, device)
        init_local_group()
        process_blocked, process_total, process_finalize = stalls("process", app, root, args.repeats, device)
        dist.destroy_process_group()
        in_flight = signal_with_save_in_flight(app, root, args.repeats, device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device {where}; torch {torch.__version__}, CUDA {torch.version.cuda}; "
          f"{time.strftime('%Y-%m-%d', time.gmtime())}")
    print(f"model {args.size}: {num_params / 1e6:.0f}M params, {state_gib:.2f} GiB of fp32 weights + AdamW moments")
    sync_s, async_s = statistics.median(sync_blocked), statistics.median(async_blocked)
    process_s = statistics.median(process_blocked)
    print(f"{'training blocked per save':28s} {'sync':>9s} {'async':>9s} {'process':>9s}")
    print(f"{'  first save':28s} {sync_blocked[0]:9.3f} {async_blocked[0]:9.3f} {process_blocked[0]:9.3f} s")
    print(f"{'  median of ' + str(args.repeats) + ' saves':28s} {sync_s:9.3f} {async_s:9.3f} {process_s:9.3f} s")
    print(f"{'  sealing at the next step':28s} {statistics.median(sync_finalize):9.3f} {statistics.median(async_finalize):9.3f} "
          f"{statistics.median(process_finalize):9.3f} s")
    print(f"{'  loop-thread work per save':28s} {sync_s + statistics.median(sync_finalize):9.3f} "
          f"{async_s + statistics.median(async_finalize):9.3f} {process_s + statistics.median(process_finalize):9.3f} s"
          "   (goal: async <= 0.1 s on an H100)")
    print(f"{'  write finished after':28s} {statistics.median(sync_total):9.3f} {statistics.median(async_total):9.3f} "
          f"{statistics.median(process_total):9.3f} s")
    print(f"stall ratio async / sync: {async_s / sync_s:.3f}; async first / median: {async_blocked[0] / async_s:.2f}")
    # From the signal (handled at the step boundary) to a durable checkpoint; add one step time.
    budget = float(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "90"))
    finish, both = statistics.median(in_flight[0]), statistics.median(in_flight[1])
    print(f"signal -> durable checkpoint, no save in flight (sync save of the step):      {statistics.median(sync_total):.3f} s")
    print(f"signal -> durable checkpoint, async save just started (finish it):            {finish:.3f} s")
    print(f"signal -> durable, async save just started, then the current step as well:   {both:.3f} s")
    print(f"budget: TORCH_ELASTIC_SHUTDOWN_TIMEOUT {budget:.0f} s (pod grace 100-110 s, spot notice 120 s); "
          f"the trainer saves the current step too only when 2 x write + 1 s fits in what is left")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": where, "torch": torch.__version__, "cuda": torch.version.cuda,
                       "date": time.strftime("%Y-%m-%d", time.gmtime()), "model": args.size,
                       "state_gib": round(state_gib, 3), "sync_blocked_s": sync_blocked,
                       "async_blocked_s": async_blocked, "sync_total_s": sync_total, "async_total_s": async_total,
                       "sync_finalize_s": sync_finalize, "async_finalize_s": async_finalize,
                       "process_blocked_s": process_blocked, "process_total_s": process_total,
                       "process_finalize_s": process_finalize,
                       "signal_finish_in_flight_s": finish, "signal_both_s": both}, f, indent=1)


if __name__ == "__main__":
    main()
