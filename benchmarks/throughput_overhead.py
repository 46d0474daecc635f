"""Trainer tokens/s (MLflow tracking + periodic checkpoints) vs. a bare PyTorch loop, same
model, data, optimizer and step count, one process, measured back to back in one run, with
the overhead broken down: the trainer's loop alone, + MLflow, + sync or async checkpoints.

    .venv/bin/python benchmarks/throughput_overhead.py [--steps 150] [--size small]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from trainer.config import load_config  # noqa: E402
from trainer.data import DistributedBatches, TokenShards  # noqa: E402
from trainer.model import build_model  # noqa: E402
from trainer.optim import build_optimizer  # noqa: E402
from trainer.prepare import prepare  # noqa: E402
from trainer.train import main as train_main  # noqa: E402

CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "trainer", "configs", "tiny.yaml")


def bare_loop(cfg, num_steps: int) -> float:
    """The loop everyone writes first: no tracking, no checkpoints, no signals."""
    torch.manual_seed(cfg.seed)
    shards = TokenShards(cfg.data.dir, cfg.data.seq_len)
    batches = DistributedBatches(shards, cfg.data.micro_batch_size, 0, 1, cfg.seed, torch.device("cpu"))
    model = build_model(cfg.model, shards.vocab_size, cfg.data.seq_len)
    optimizer = build_optimizer(model, cfg, torch.device("cpu"))
    started = time.perf_counter()
    for _ in range(num_steps):
        x, y = batches.next_batch()
        loss = F.cross_entropy(model(x).view(-1, shards.vocab_size), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    loss.item()
    return num_steps * cfg.data.seq_len * cfg.data.micro_batch_size / (time.perf_counter() - started)


class Scraper:
    """Turns the trainer's health endpoint on (port 0: any free port) and scrapes it every
    second, 30x Prometheus' rate, for the run's duration."""

    def __init__(self) -> None:
        import threading
        import trainer.health as health

        self._health, self._stop = health, threading.Event()
        self._original = health.HttpHealth.__init__
        self.servers: list = []
        scraper = self

        def record(obj, *args, **kwargs):  # keeps the server so the scraper finds its port
            scraper._original(obj, *args, **kwargs)
            scraper.servers.append(obj)

        health.HttpHealth.__init__ = record
        os.environ[health.PORT_ENV] = "0"
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import urllib.request
        while not self._stop.wait(1.0):
            for server in self.servers:
                urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5).read()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        os.environ.pop(self._health.PORT_ENV, None)
        self._health.HttpHealth.__init__ = self._original
        for server in self.servers:
            server.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--size", default="small")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    # One intra-op thread for both loops: with OpenMP threads on a shared 2-core machine, a
    # busy neighbour makes every parallel region wait on a descheduled thread (20x swings).
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="bench-throughput-")
    import argparse as a, textwrap, string, logging

    prepare([m.__file__ for m in (a, textwrap, string, logging)], f"{work}/data", show_progress=False)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{work}/mlflow.db"
    variants = {
        # name: (extra overrides, what it adds)
        "loop": (["tracking.enabled=false", f"checkpoint.every_steps={args.steps}"], "the trainer's loop, final save only"),
        "loop-health": (["tracking.enabled=false", f"checkpoint.every_steps={args.steps}"],
                        "same + health endpoint (rank 0, scraped)"),
        "mlflow": ([f"checkpoint.every_steps={args.steps}"], "+ MLflow (sqlite, background thread)"),
        "full": (["checkpoint.every_steps=25"], "+ a sync checkpoint every 25 steps"),
        "full-async": (["checkpoint.every_steps=25", "checkpoint.async_mode=thread"], "same, async (thread) saves"),
    }
    bare = []
    rates: dict[str, list[float]] = {name: [] for name in variants}
    stalls: dict[str, list[float]] = {name: [] for name in variants}
    # Alternating rounds, medians: a shared machine's load drifts between back-to-back runs.
    for round_ in range(args.rounds):
        base = [f"data.dir={work}/data", f"model.size={args.size}", f"schedule.num_steps={args.steps}",
                "data.seq_len=128", "data.micro_batch_size=8", "tracking.log_every_steps=10", "model.dropout=0.0"]
        cfg = load_config(CONFIG, base + [f"checkpoint.dir={work}/unused"], environ={})
        bare.append(bare_loop(cfg, args.steps))
        for name, (extra, _) in variants.items():
            ckpt = f"{work}/ckpt-{name}-{round_}"
            scraper = Scraper() if name == "loop-health" else None
            try:
                assert train_main(load_config(CONFIG, base + extra + [f"checkpoint.dir={ckpt}"], environ={})) == 0
            finally:
                if scraper is not None:
                    scraper.stop()
            summary = json.load(open(f"{ckpt}/summary.json"))
            rates[name].append(summary["tokens_seen"] / (summary["wall_seconds"] - summary["startup_seconds"]))
            stalls[name].append(summary["checkpoint_stall_seconds"])
    b = statistics.median(bare)
    print(f"model {args.size}, {args.steps} steps x {cfg.data.seq_len * cfg.data.micro_batch_size} tokens, "
          f"CPU, 1 process, 1 thread, median of {args.rounds} alternating rounds")
    print(f"{'bare PyTorch loop':45s} {b:8.0f} tokens/s  {[round(x) for x in bare]}")
    for name, (_, what) in variants.items():
        t = statistics.median(rates[name])
        print(f"{'trainer ' + name + ': ' + what:45s} {t:8.0f} tokens/s  ratio {t / b:.3f}  "
              f"(checkpoint stall {statistics.median(stalls[name]):.2f} s)  {[round(x) for x in rates[name]]}")
    print(f"ratio trainer with health endpoint / without: "
          f"{statistics.median(rates['loop-health']) / statistics.median(rates['loop']):.3f}")
    print(f"ratio trainer (MLflow + checkpoint every 25 steps) / bare: {statistics.median(rates['full']) / b:.3f}")
    # On this CPU benchmark (one intra-op thread) the async writer competes with training for
    # the same core; on a GPU host it runs on otherwise idle cores while the GPU computes.
    print(f"  with async (thread) checkpoints instead:               {statistics.median(rates['full-async']) / b:.3f}")


if __name__ == "__main__":
    main()
