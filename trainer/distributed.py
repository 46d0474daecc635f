"""Process group, device and model wrapping (DDP or FSDP2), each strategy one object.

The loop calls the same methods whatever the strategy; the single-process strategy's
methods are no-ops, so there is no `if distributed:` in the loop.
"""
from __future__ import annotations

import contextlib
import datetime
import gc
import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from trainer.config import ParallelismConfig

log = logging.getLogger(__name__)


@dataclass
class Env:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str
    # A gloo group of its own for checkpoint I/O: DCP's async save on the default group
    # deadlocks against DDP's all-reduces (measured with torch 2.13), and on GPU it keeps
    # checkpoint traffic off NCCL.
    checkpoint_group: object = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return dist.is_initialized()


def init(cfg: ParallelismConfig) -> Env:
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    use_cuda = torch.cuda.is_available() and cfg.backend != "gloo"
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    backend = "nccl" if use_cuda else "gloo"
    env = Env(rank, local_rank, world_size, device, backend)
    if world_size > 1 or "MASTER_ADDR" in os.environ:
        # cpu:gloo alongside nccl lets CPU tensors (flags, checkpoint plans) use the same group.
        pg_backend = "cpu:gloo,cuda:nccl" if use_cuda else "gloo"
        # Start-up is bounded by the config, not by torch's 10 minutes: a peer that died before
        # the group exists (OOM kill, spot reclaim during imports) fails this rank with a
        # store or network error after this long, which the launcher classifies as a lost
        # peer (retryable), instead of hanging in the store connection.
        timeout = datetime.timedelta(seconds=cfg.init_timeout_seconds)
        store = attempt_store(rank, world_size, timeout)
        dist.init_process_group(pg_backend, timeout=timeout, device_id=device if use_cuda else None,
                                **({"store": store, "rank": rank, "world_size": world_size} if store else {}))
        # Bounded like the default group, not by torch's 30-minute gloo default (`new_group`
        # without a timeout takes `_get_default_timeout(backend)`, torch 2.13
        # distributed_c10d.py): a peer lost during a resume's load, a save's collectives or the
        # trust verdict fails this rank after this long instead of holding it half an hour.
        # It stays at the start-up bound for the whole attempt: a save's collectives wait for
        # the slowest rank's planning and writes.
        env.checkpoint_group = dist.new_group(backend="gloo", timeout=timeout)
    return env


def attempt_store(rank: int, world_size: int, timeout: datetime.timedelta):
    """The rendezvous store for this attempt's process groups, or None for env:// defaults.

    Under torchrun the workers of every attempt talk to the agent's one TCPStore
    (TORCHELASTIC_USE_AGENT_STORE=True), and torch 2.13 adds no per-attempt prefix
    (torch/distributed/rendezvous.py, `_create_c10d_store`: "We create a new TCPStore for
    every retry so no need to add prefix", but the agent's server lives on). The keys
    gloo publishes to connect a group (default and `new_group` alike) are then found
    already set by the previous attempt, and an attempt restarted by `--max-restarts`
    connects to dead peers' ports: it hangs or fails in `new_group` (reproduced without
    the trainer). Prefixing the store with TORCHELASTIC_RESTART_COUNT gives each attempt
    its own keys. torchrun counts restarts per node: a multi-node job whose nodes restarted
    a different number of times would not meet, so multi-node jobs keep --max-restarts=0
    and rely on pod restarts (docs/trainer.md)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                           is_master=False, timeout=timeout)
    return dist.PrefixStore(f"trainer/attempt-{attempt}/", client)


def set_collective_timeout(env: Env, seconds: float) -> None:
    """Lower the default group's timeout once the first step is done (torchtitan's
    `set_pg_timeouts` after step 1): start-up (compiles, loads, the first collectives) needs
    minutes, a collective in steady state does not, and a peer that dies inside one should
    cost `seconds`, not the start-up bound. On GPU NCCL's watchdog then aborts the rank
    (SIGABRT: 134, retryable); gloo raises in the waiting collective. The checkpoint group
    keeps the start-up bound (`init`): a DCP save's collectives wait for the slowest rank's
    planning and writes. `_set_pg_timeout` is private but is what torchtitan calls (torch 2.13's
    distributed_c10d.py sets each backend's default timeout: gloo and NCCL alike)."""
    if not env.distributed:
        return
    dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=seconds), None)


def teardown(clean: bool) -> None:
    """Call once the model and optimizer are unreferenced: collecting them before the group
    is destroyed avoids a SIGABRT at exit ("terminate called without an active exception")
    seen in 10-25% of gloo DDP runs. After a failure, no barrier: peers may be gone."""
    gc.collect()
    if dist.is_initialized():
        if clean:
            dist.barrier()
        dist.destroy_process_group()


def all_reduce_max(env: Env, values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    if env.distributed:
        # Default group, not the checkpoint group: an async save may be using that one right now.
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def all_reduce_mean(env: Env, value: torch.Tensor) -> torch.Tensor:
    """The mean over ranks, added in rank order: the same bits for an element whatever else
    the tensor holds. (An all-reduce adds in an order that depends on the element's place in
    the tensor: gloo's ring splits it into one chunk per rank, each reduced starting at a
    different rank, and NCCL's algorithms chunk too. With 3+ ranks, the same losses logged in
    a window of 9 instead of 10, as after a resume, came out one rounding step apart.)"""
    value = value.detach().clone()
    if not env.distributed:
        return value
    gathered = [torch.empty_like(value) for _ in range(env.world_size)]
    dist.all_gather(gathered, value.contiguous())
    total = gathered[0].clone()
    for rank in range(1, env.world_size):
        total += gathered[rank]
    return total / env.world_size


def agree_on_step(env: Env, loss: torch.Tensor, norm: torch.Tensor, preempted: bool,
                  time_due: bool) -> tuple[bool, bool, bool]:
    """(preempted, time due, non-finite) as every rank sees them: a signal may reach the ranks
    at different steps, wall clocks differ, and a NaN may appear on one rank's loss only; yet
    they must skip, save and stop at the same step.

    One all-reduce of a 3-element tensor on the loss's device (NCCL with the step's own
    collectives on GPU), read back once: the one host sync of the step. Building it takes no
    sync (the flags enter as fills, the finiteness test stays on the device)."""
    device = loss.device
    flags = torch.stack([
        (~torch.isfinite(torch.stack([loss.detach().float(), norm.detach().float().to(device)]))).any().float(),
        torch.full((), float(preempted), device=device),
        torch.full((), float(time_due), device=device),
    ])
    if env.distributed:
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    bad, preempted_anywhere, due = (value > 0 for value in flags.tolist())
    return preempted_anywhere, due, bad


class SingleProcess:
    name = "none"
    blocks_compiled = False

    def wrap(self, model: nn.Module, env: Env) -> nn.Module:
        return model

    def grad_sync(self, model: nn.Module, is_last_micro_step: bool):
        return contextlib.nullcontext()

    def warm_up(self, model: nn.Module, sample: torch.Tensor, autocast) -> None:
        pass


class DDPStrategy:
    name = "ddp"
    blocks_compiled = False

    def wrap(self, model: nn.Module, env: Env) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[env.device.index] if env.device.type == "cuda" else None)

    def grad_sync(self, model: nn.Module, is_last_micro_step: bool):
        # Skipping the all-reduce on all but the last micro-step is what makes accumulation cheap.
        return contextlib.nullcontext() if is_last_micro_step else model.no_sync()

    def warm_up(self, model: nn.Module, sample: torch.Tensor, autocast) -> None:
        """One throw-away backward (zero loss, RNG untouched, gradients dropped) before the
        first step, so every attempt trains with the same gradient-bucket layout.

        DDP starts with buckets in reverse parameter order and, after the first backward,
        rebuilds them once in the order gradients became ready (Reducer::rebuild_buckets,
        torch/csrc/distributed/c10d/reducer.cpp). A resumed attempt's first step would use
        the initial layout where the uninterrupted run used the rebuilt one; with 3+ gloo
        ranks a gradient's position in the bucket changes its summation order, so the
        resume is not bitwise (2 ranks add commutatively). After this warm-up the very
        first real step of every attempt already runs on the rebuilt layout."""
        devices = [model.device_ids[0]] if getattr(model, "device_ids", None) else []
        with torch.random.fork_rng(devices=devices), autocast:
            model(sample).float().sum().mul(0.0).backward()
        model.zero_grad(set_to_none=True)


class FSDPStrategy:
    name = "fsdp"

    def __init__(self, bf16: bool, compile_blocks: bool = False):
        self.bf16 = bf16
        self.blocks_compiled = compile_blocks

    def wrap(self, model: nn.Module, env: Env) -> nn.Module:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if self.bf16 else MixedPrecisionPolicy()
        # One shard unit per decoder layer, then the root for embeddings and head.
        for layer in model.layers():
            if self.blocks_compiled:
                # Each block compiled before it is sharded, as torchtitan's apply_compile
                # runs before apply_fsdp: a compiled FSDP2 root breaks its graph at every
                # unit's hooks. Module.compile() compiles in place, so state-dict keys (the
                # checkpoint's, the export's) stay free of an `_orig_mod.` prefix.
                layer.compile()
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        return model

    def grad_sync(self, model: nn.Module, is_last_micro_step: bool):
        """Every micro-step reduce-scatters its gradients (torchtitan's choice). Switching sync
        off until the last micro-step (`set_requires_gradient_sync(False)`) keeps each
        parameter's whole unsharded gradient meanwhile, in fp32 (`unsharded_accumulated_grad`,
        torch 2.13 _fsdp_param.py): 4 bytes per parameter on every GPU, unsharded, the memory
        FSDP exists to save (a 13B model: 52 GB per GPU). The extra reduce-scatters cost
        bandwidth, not memory (pytorch/torchtitan#1710)."""
        return contextlib.nullcontext()

    def warm_up(self, model: nn.Module, sample: torch.Tensor, autocast) -> None:
        pass  # FSDP2 reduce-scatters per layer in a fixed order: bitwise across resumes (tested)


def strategy_name(requested: str, world_size: int) -> str:
    """The wrapper a job of this world size runs. `auto`: DDP across processes, the plain
    model for one process: a world-size-1 wrapper synchronises nothing and costs throughput
    (measured on one H100, GPT-2 124M, compiled bf16, micro-batch 16: plain 321k tok/s,
    DDP 270-300k, FSDP2 215-220k). An explicit ddp or fsdp is kept as asked (a job that
    tests its multi-GPU configuration on one GPU) and logged as such."""
    if requested == "auto":
        return "ddp" if world_size > 1 else "none"
    return requested


def strategy_for(cfg: ParallelismConfig, env: Env, bf16: bool):
    name = strategy_name(cfg.strategy, env.world_size)
    if name != "none" and not env.distributed:
        return SingleProcess()
    if name != "none" and env.world_size == 1 and env.is_main:
        log.warning("parallelism.strategy=%s at world size 1: running the %s wrapper with nothing to synchronise, "
                    "as asked; it costs throughput (strategy auto runs the plain model on one process)",
                    name, name.upper())
    if name == "fsdp":
        return FSDPStrategy(bf16, compile_blocks=cfg.compile)
    return {"none": SingleProcess, "ddp": DDPStrategy}[name]()
