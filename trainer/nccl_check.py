"""All-reduce bus bandwidth between the ranks of a job, measured like nccl-tests' all_reduce_perf.

    torchrun --nnodes=2 --nproc-per-node=8 ... -m trainer.nccl_check --min-busbw-gb-per-s 240

nccl-tests (doc/PERFORMANCE.md) reports algbw = bytes / time and, for all-reduce,
busbw = algbw x 2(n-1)/n: the bandwidth each link must sustain, comparable across world sizes.
This uses torch.distributed (NCCL on GPUs, gloo on CPU) so it runs from the trainer image with
the same torchrun rendezvous as training. Exit 0 when the median busbw reaches the floor, 1 if not.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def bus_bandwidth(num_bytes: int, seconds: float, world_size: int) -> float:
    """nccl-tests' all-reduce bus bandwidth in bytes/s."""
    return num_bytes / seconds * 2 * (world_size - 1) / world_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.nccl_check")
    parser.add_argument("--size-mib", type=float, default=1024.0, help="message size (nccl-tests' -e)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--min-busbw-gb-per-s", type=float, required=True)
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    numel = int(args.size_mib * 1024 * 1024 // 4)
    tensor = torch.ones(numel, dtype=torch.float32, device=device)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        dist.all_reduce(tensor)
    sync()
    times = []
    for _ in range(args.iters):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        sync()
        times.append(time.perf_counter() - start)
    # Every rank must agree on the time: take the slowest rank's median.
    median = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
    dist.all_reduce(median, op=dist.ReduceOp.MAX)
    num_bytes = numel * 4
    busbw = bus_bandwidth(num_bytes, float(median.item()), world) / 1e9
    ok = busbw >= args.min_busbw_gb_per_s
    if rank == 0:
        print(json.dumps({"world_size": world, "size_bytes": num_bytes, "median_seconds": float(median.item()),
                          "algbw_gb_per_s": num_bytes / float(median.item()) / 1e9, "busbw_gb_per_s": busbw,
                          "floor_gb_per_s": args.min_busbw_gb_per_s, "ok": ok}), flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
