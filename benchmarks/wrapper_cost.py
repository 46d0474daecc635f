"""What a world-size-1 wrapper costs: the plain model, DDP at world size 1 and FSDP2 at world
size 1, in one process and one run, alternating rounds, through the trainer's own strategy
objects and loss function. `parallelism.strategy: auto` runs the plain model on one process;
an explicit ddp/fsdp keeps its wrapper (and the trainer logs that it does).

    python3 benchmarks/wrapper_cost.py [--steps 30] [--rounds 3] [--json PATH]

On a CUDA GPU: GPT-2 124M, T=1024, micro-batch 16, bf16, torch.compile, NCCL. On CPU (this
machine): the `small` GPT, T=128, micro-batch 8, fp32, eager, gloo, one intra-op thread.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from trainer import distributed  # noqa: E402
from trainer.config import ModelConfig, ParallelismConfig, TrainerConfig  # noqa: E402
from trainer.model import build_model, loss_function  # noqa: E402
from trainer.optim import build_optimizer  # noqa: E402


def tokens_per_second(strategy_name: str, env, shape: dict, steps: int) -> float:
    cuda = env.device.type == "cuda"
    par = ParallelismConfig(strategy=strategy_name, compile=cuda, mixed_precision="bf16" if cuda else "fp32")
    cfg = TrainerConfig(model=ModelConfig(size=shape["size"], vocab_size=shape["vocab"]), parallelism=par)
    torch.manual_seed(0)
    model = build_model(cfg.model, shape["vocab"], shape["seq_len"]).to(env.device)
    strategy = distributed.strategy_for(par, env, bf16=cuda)
    assert strategy.name == strategy_name, (strategy.name, strategy_name)
    model = strategy.wrap(model, env)
    loss_fn = loss_function(model, par.compile, strategy.blocks_compiled)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda and strategy.name != "fsdp" else contextlib.nullcontext()
    optimizer = build_optimizer(model, cfg, env.device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    batch = torch.randint(0, shape["vocab"], (shape["batch"], shape["seq_len"] + 1), generator=gen).to(env.device)
    inputs, targets = batch[:, :-1], batch[:, 1:]
    warmup = 3 if not cuda else 10
    for step in range(warmup + steps):
        if step == warmup:
            if cuda:
                torch.cuda.synchronize()
            started = time.perf_counter()
        with autocast:
            loss = loss_fn(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    loss.item()
    if cuda:
        torch.cuda.synchronize()
    rate = steps * shape["batch"] * shape["seq_len"] / (time.perf_counter() - started)
    del model, optimizer, loss_fn
    if cuda:
        torch.cuda.empty_cache()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda:
        torch.set_num_threads(1)  # a shared 2-core machine: see benchmarks/throughput_overhead.py
    shape = (dict(size="gpt2", vocab=50304, seq_len=1024, batch=16) if cuda
             else dict(size="small", vocab=257, seq_len=128, batch=8))
    # A real world-size-1 process group, as `trainer.launch --nproc-per-node=1` gives.
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29533"), RANK="0",
                      LOCAL_RANK="0", WORLD_SIZE="1")
    env = distributed.init(ParallelismConfig(backend="auto"))
    names = ["none", "ddp", "fsdp"]
    rates: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(args.rounds):
        for name in names:
            rates[name].append(tokens_per_second(name, env, shape, args.steps))
    device = torch.cuda.get_device_name() if cuda else "CPU (1 thread)"
    print(f"device {device}; torch {torch.__version__}, CUDA {torch.version.cuda}; {time.strftime('%Y-%m-%d', time.gmtime())}")
    print(f"model {shape['size']}, T={shape['seq_len']}, B={shape['batch']}, {'bf16 + compile' if cuda else 'fp32 eager'}, "
          f"world size 1, median of {args.rounds} alternating rounds")
    plain = statistics.median(rates["none"])
    for name in names:
        t = statistics.median(rates[name])
        label = {"none": "plain (strategy auto/none)", "ddp": "DDP at world size 1", "fsdp": "FSDP2 at world size 1"}[name]
        print(f"{label:28s} {t:10.0f} tokens/s  ratio to plain {t / plain:.3f}  {[round(x) for x in rates[name]]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
                       "date": time.strftime("%Y-%m-%d", time.gmtime()), "shape": shape,
                       "tokens_per_second": {n: statistics.median(rates[n]) for n in names}, "rounds": rates}, f, indent=1)
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
