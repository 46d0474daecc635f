"""How long each rank waits because of a checkpoint save, 2 CPU ranks, a 1 GB state: the code as
it is, and the code of an older commit (`--before REV`), in one run, with the ratios.

    python benchmarks/checkpoint_blocking.py [--before e9410a2] [--state-gb 1.0] [--saves 3]
        [--modes off,process,thread] [--json PATH]

What is measured: each rank runs a loop of fake steps (`--step-seconds` of sleep standing in for
compute, then a small all-reduce, as the trainer's per-step agreement does) and saves every so
often through the trainer's `Checkpointer` (model + AdamW, the state replicated as under DDP, so
DCP splits the writing between the ranks). A save's *blocked time* on a rank is the wall time of
the steps from the save until the save is durable on every rank, less their sleeps: what the
save itself held the loop (sync mode: the whole write), what the step boundaries' polls held it,
and what the rank waited in the all-reduces for the other rank. Before the sealer thread, rank
0 hashed every rank's files for the manifest (and fsynced, renamed, removed) on its loop thread,
and rank 1 waited for it in the next all-reduce; a large state outlasted the collective timeout.

The older commit's `trainer/` is taken with `git archive` into a scratch directory; both
variants run the same worker (below), which uses only the Checkpointer's common face.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    from trainer import distributed
    from trainer.checkpoint import Checkpointer, ModelAndOptimizer
    from trainer.config import ParallelismConfig
    from trainer.s3 import NoMirror

    env = distributed.init(ParallelismConfig(init_timeout_seconds=900))
    torch.manual_seed(0)
    width = 2048
    layers = max(1, round(args.state_gb * 2**30 / (12 * width * width)))  # fp32 weights + AdamW's two moments
    model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    app = ModelAndOptimizer(model, optimizer)
    root = os.path.join(args.scratch, f"{args.variant}-{args.mode}")
    ckpt = Checkpointer(root, env, keep_last=1, async_mode=args.mode, mirror=NoMirror())
    ckpt.prepare_staging(app)
    ckpt.poll()
    staging = getattr(getattr(ckpt.writer, "staging", None), "_ahead", None)
    if staging is not None:
        staging.result()
    flag = torch.zeros(1)

    def step(done: bool) -> bool:
        """One fake step: compute, the step boundary's poll, the per-step all-reduce; True
        once every rank's save is durable."""
        time.sleep(args.step_seconds)
        ckpt.poll()
        flag[0] = 0.0 if done else 1.0
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return flag.item() == 0.0

    def durable(save_step: int) -> bool:
        return ckpt.last_durable_step == save_step and not ckpt.pending

    blocked, written = [], []
    for save in range(args.saves + 1):  # save 0 warms up (process mode starts its process there)
        dist.barrier()
        started = time.perf_counter()
        ckpt.save(save + 1, app, {"tokens_seen": 0}, "{}")
        steps = 0
        while True:
            steps += 1
            if step(durable(save + 1)) or steps > 2000:
                break
        wall = time.perf_counter() - started
        if save:
            blocked.append(wall - steps * args.step_seconds)
            written.append(wall)
    ckpt.close()
    with open(os.path.join(args.scratch, f"{args.variant}-{args.mode}-rank{env.rank}.json"), "w") as f:
        json.dump({"blocked": blocked, "wall": written, "layers": layers}, f)
    dist.barrier()
    dist.destroy_process_group()


def run_variant(variant: str, tree: str, mode: str, args, scratch: str) -> dict[int, dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           os.path.abspath(__file__), "--worker", "--variant", variant, "--mode", mode, "--scratch", scratch,
           "--state-gb", str(args.state_gb), "--saves", str(args.saves), "--step-seconds", str(args.step_seconds)]
    env = {**os.environ, "PYTHONPATH": tree, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{variant} {mode}: exit {proc.returncode}\n{(proc.stdout + proc.stderr)[-3000:]}")
    out = {}
    for rank in (0, 1):
        with open(os.path.join(scratch, f"{variant}-{mode}-rank{rank}.json")) as f:
            out[rank] = json.load(f)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="after", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="off", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    parser.add_argument("--before", default=None, help="a commit whose trainer/ is the 'before' (git archive)")
    parser.add_argument("--state-gb", type=float, default=1.0, help="GiB of fp32 weights + AdamW moments")
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--step-seconds", type=float, default=0.2, help="each fake step's compute (a sleep)")
    parser.add_argument("--modes", default="off,process,thread")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    modes = [m for m in args.modes.split(",") if m]
    with tempfile.TemporaryDirectory(prefix="bench-blocking-", dir=os.environ.get("TMPDIR")) as scratch:
        trees = [("after", REPO)]
        if args.before:
            before = os.path.join(scratch, "before-tree")
            os.makedirs(before)
            archive = subprocess.run(["git", "-C", REPO, "archive", args.before, "trainer"], capture_output=True,
                                     check=True).stdout
            subprocess.run(["tar", "-x", "-C", before], input=archive, check=True)
            trees.insert(0, ("before", before))
        results = {(variant, mode): run_variant(variant, tree, mode, args, scratch)
                   for mode in modes for variant, tree in trees}
    import torch

    layers = next(iter(results.values()))[0]["layers"]
    state = layers * 2048 * 2048 * 12 / 2**30
    print(f"2 CPU ranks (gloo), {state:.2f} GiB of fp32 weights + AdamW moments, {args.saves} saves per mode, "
          f"{args.step_seconds} s of compute per step; torch {torch.__version__}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {os.getloadavg()[0]:.1f}")
    print(f"{'blocked per save (median), s':34s} {'rank 0':>8s} {'rank 1':>8s}")
    figures = {}
    for mode in modes:
        for variant, _ in trees:
            per_rank = results[(variant, mode)]
            med = [statistics.median(per_rank[r]["blocked"]) for r in (0, 1)]
            figures[f"{variant}/{mode}"] = {"rank0": med[0], "rank1": med[1],
                                            "blocked": {r: per_rank[r]["blocked"] for r in (0, 1)}}
            print(f"  {mode:8s} {variant:8s} {'':16s} {med[0]:8.3f} {med[1]:8.3f}")
        if args.before:
            b, a = figures[f"before/{mode}"], figures[f"after/{mode}"]
            ratios = [b[k] / a[k] if a[k] > 0 else float("inf") for k in ("rank0", "rank1")]
            figures[f"ratio/{mode}"] = {"rank0": ratios[0], "rank1": ratios[1]}
            print(f"  {mode:8s} before/after {'':12s} {ratios[0]:7.1f}x {ratios[1]:7.1f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"state_gib": state, "saves": args.saves, "figures": figures}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
