"""Sharded, atomic checkpoints with torch.distributed.checkpoint (DCP).

Layout of one save, `<dir>/step-000120/`:
    .metadata, __*_*.distcp   model + optimizer shards written by DCP (every rank)
    rng-rank-<r>.pt           that rank's RNG states (they differ per rank)
    config.yaml               the resolved config
    complete.json             the marker, written last and atomically by rank 0

A directory without `complete.json` is never resumed from: a kill at any point of a save
leaves at worst an incomplete directory, which the next save's retention pass removes.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import time
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from trainer.distributed import Env

MARKER = "complete.json"
STEP_DIR = re.compile(r"^step-(\d+)$")


class ModelAndOptimizer(Stateful):
    """DCP calls state_dict() at save and load; get/set_state_dict handle DDP and FSDP2 alike."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step-{step:06d}")


def list_steps(root: str, complete_only: bool = True) -> list[int]:
    if not os.path.isdir(root):
        return []
    steps = []
    for name in os.listdir(root):
        match = STEP_DIR.match(name)
        if match and (not complete_only or os.path.isfile(os.path.join(root, name, MARKER))):
            steps.append(int(match.group(1)))
    return sorted(steps)


def latest_complete(root: str) -> str | None:
    steps = list_steps(root)
    return step_dir(root, steps[-1]) if steps else None


def read_marker(path: str) -> dict:
    with open(os.path.join(path, MARKER)) as f:
        return json.load(f)


def write_json_atomic(path: str, payload: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class NoFaults:
    def in_save(self, step: int) -> None:
        pass


class KillInSave:
    """Test hook (TRAINER_FAULT_SIGKILL_IN_SAVE_AT_STEP): SIGKILL rank 0 after the shards of
    that step are written and before the marker, the worst moment for a save to die."""

    def __init__(self, step: int, env: Env):
        self.step = step
        self.env = env

    def in_save(self, step: int) -> None:
        if step == self.step and self.env.is_main:
            os.kill(os.getpid(), signal.SIGKILL)


def fault_injector(env: Env):
    step = os.environ.get("TRAINER_FAULT_SIGKILL_IN_SAVE_AT_STEP")
    return KillInSave(int(step), env) if step else NoFaults()


class SyncSave:
    """Blocks the loop until every rank has written; the stall is the whole write."""

    def __init__(self, env: Env):
        self.env = env

    def start(self, state: dict, path: str) -> Future:
        dcp.save(state, checkpoint_id=path, process_group=self.env.checkpoint_group,
                 no_dist=not self.env.distributed)
        done: Future = Future()
        done.set_result(None)
        return done

    def close(self) -> None:
        pass


class AsyncSave:
    """Stages the state to CPU memory (a copy), then writes in a thread or a process; the
    loop only stalls for the copy."""

    def __init__(self, env: Env, mode: str):
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        self.env = env
        self.kind = AsyncCheckpointerType.PROCESS if mode == "process" else AsyncCheckpointerType.THREAD

    def start(self, state: dict, path: str) -> Future:
        from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

        result = dcp.async_save(state, checkpoint_id=path, process_group=self.env.checkpoint_group,
                                async_checkpointer_type=self.kind, no_dist=not self.env.distributed)
        return result.upload_completion if isinstance(result, AsyncSaveResponse) else result

    def close(self) -> None:
        pass


class Checkpointer:
    def __init__(self, root: str, env: Env, keep_last: int, async_mode: str, mirror):
        self.root = root
        self.env = env
        self.keep_last = keep_last
        self.writer = SyncSave(env) if async_mode == "off" else AsyncSave(env, async_mode)
        self.mirror = mirror
        self.faults = fault_injector(env)
        self.pending: tuple[Future, int, dict] | None = None
        os.makedirs(root, exist_ok=True)

    def save(self, step: int, app: Stateful, meta: dict, config_yaml: str) -> float:
        """Starts a save of `step`; returns the seconds the loop was blocked."""
        started = time.perf_counter()
        self.wait()  # one save in flight at most: two would race on retention and memory
        path = step_dir(self.root, step)
        os.makedirs(path, exist_ok=True)
        torch.save(rng_state(), os.path.join(path, f"rng-rank-{self.env.rank}.pt"))
        if self.env.is_main:
            with open(os.path.join(path, "config.yaml"), "w") as f:
                f.write(config_yaml)
        future = self.writer.start({"app": app}, path)
        self.pending = (future, step, meta)
        self.poll()
        return time.perf_counter() - started

    def poll(self) -> None:
        """Finalises a finished save; called at every step boundary, costs nothing otherwise."""
        if self.pending and self.pending[0].done():
            self._finalize()

    def wait(self) -> None:
        if self.pending:
            self.pending[0].result()
            self._finalize()

    def _finalize(self) -> None:
        future, step, meta = self.pending
        self.pending = None
        future.result()  # re-raises a failed background write here, on the loop's thread
        self.faults.in_save(step)
        if self.env.is_main:
            # DCP's coordinator writes .metadata only after gathering every rank's write
            # results, so on rank 0 a finished save means all shards are on disk.
            path = step_dir(self.root, step)
            write_json_atomic(os.path.join(path, MARKER), {**meta, "step": step, "saved_at": time.time()})
            self._apply_retention()
            self.mirror.upload(path)

    def _apply_retention(self) -> None:
        complete = list_steps(self.root)
        for old in complete[: -self.keep_last]:
            shutil.rmtree(step_dir(self.root, old), ignore_errors=True)
        newest = complete[-1] if complete else -1
        # Incomplete directories older than the newest complete one are debris of a kill.
        for step in set(list_steps(self.root, complete_only=False)) - set(complete):
            if step < newest:
                shutil.rmtree(step_dir(self.root, step), ignore_errors=True)

    def load(self, path: str, app: Stateful) -> dict:
        dcp.load({"app": app}, checkpoint_id=path, process_group=self.env.checkpoint_group,
                 no_dist=not self.env.distributed)
        rng_file = os.path.join(path, f"rng-rank-{self.env.rank}.pt")
        if os.path.isfile(rng_file):
            set_rng_state(torch.load(rng_file, weights_only=False))
        return read_marker(path)

    def close(self) -> None:
        self.wait()
        self.writer.close()
        self.mirror.close()


def resolve_resume(root: str, resume: str, env: Env, mirror) -> str | None:
    """The checkpoint to start from, identical on every rank."""
    if resume == "none":
        return None
    if resume != "auto":
        if not os.path.isfile(os.path.join(resume, MARKER)):
            raise FileNotFoundError(f"checkpoint.resume={resume!r} has no {MARKER}: not a complete checkpoint")
        return resume
    if env.is_main and latest_complete(root) is None:
        # A fresh FSx volume (or a lost one) falls back to the S3 copy.
        mirror.download_latest(root)
    if env.distributed:
        dist.barrier(group=env.checkpoint_group)
    return latest_complete(root)
