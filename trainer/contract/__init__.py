"""The platform's contract for your own training code, in a few lines.

Your script runs under the platform's launcher (``python -m trainer.launch``: torchrun, the
rendezvous, the time budget). The launcher turns how your ranks ended into the exit code the
Training Operator acts on: 0 done, 143 preempted (the pods are recreated and resume), 1-127 a
permanent failure. Your code keeps its side of it::

    from trainer import contract

    job = contract.job()                       # checkpoint dir, dataset dir, rank, MLflow names
    with contract.preemption() as stop:        # SIGTERM/SIGUSR1 -> a flag, never a kill mid-step
        start = contract.latest_checkpoint()   # None, or (step, path) of the newest COMPLETE one
        for step in range(start.step + 1 if start else 1, num_steps + 1):
            train_one_step()
            if step % 100 == 0 or stop.requested():   # requested(): the same answer on every rank
                path = contract.begin_checkpoint(step)  # step-000100/ (rank 0 creates it)
                save_into(path)                         # your files: torch.save, safetensors...
                contract.commit_checkpoint(step)        # the marker, written last (rank 0)
            if stop.requested():
                break                          # leaving the block exits 143: the job resumes
    # left normally: "completed"; an exception: "failed" (permanent), re-raised

What it promises:

- ``stop.requested()`` is all-reduced across ranks (when torch.distributed is initialised): the
  signal reaches the ranks at slightly different times, or only one node's, and every rank must
  stop at the same step or the next collective hangs. Call it once per step on every rank.
- The time budget: from the signal, ``job.preemption_budget_seconds`` (torchrun's shutdown
  timeout, set from the job's timeBudget) to finish the step, save and exit; then SIGKILL.
- Checkpoints in the platform's layout (``<checkpoint dir>/step-NNNNNN/`` complete when its
  ``complete.json`` exists, written last and atomically), so a half-written save is never
  resumed, the launcher counts progress between attempts (trainer/retries.py), and
  ``workloads checkpoints`` lists them. A framework with its own layout (the Hugging Face
  ``Trainer``'s ``checkpoint-N``) commits a marker that points at its directory.
- ``contract.tracking()``: the job's MLflow run (rank 0), the same run across restarts (found by
  the job's run id), or a no-op when the job has no tracking server.

Torch is optional: a process that never initialises torch.distributed is one rank.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from trainer.contract.environment import ENV_CHECKPOINT_DIR, ENV_DATASET_DIR, ENV_RUN_ID
from trainer.contract.layout import MARKER, step_dir_name, step_of as _step_of
from trainer.durable import write_json_atomic
from trainer.preemption import EXIT_PREEMPTED, preemption_budget_seconds, report_exit

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class Job:
    """What the platform tells every rank, from the pod's environment."""

    checkpoint_dir: str
    dataset_dir: Optional[str]
    run_id: Optional[str]  # the job's stable identity: <namespace>.<name>
    experiment: Optional[str]  # the MLflow experiment, under the team's prefix
    rank: int
    local_rank: int
    world_size: int
    preemption_budget_seconds: float

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def job(environ: Optional[dict] = None) -> Job:
    env = os.environ if environ is None else environ
    return Job(
        checkpoint_dir=env.get(ENV_CHECKPOINT_DIR) or os.path.abspath("checkpoints"),
        dataset_dir=env.get(ENV_DATASET_DIR),
        run_id=env.get(ENV_RUN_ID),
        experiment=env.get("MLFLOW_EXPERIMENT_NAME"),
        rank=int(env.get("RANK", "0")),
        local_rank=int(env.get("LOCAL_RANK", "0")),
        world_size=int(env.get("WORLD_SIZE", "1")),
        preemption_budget_seconds=preemption_budget_seconds(),
    )


def _dist():
    """torch.distributed when it is importable and initialised, else None (one rank)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


# -- preemption ---------------------------------------------------------------------------------
class Stop:
    """The preemption flag: set by SIGTERM/SIGUSR1, agreed on by every rank in ``requested()``."""

    def __init__(self) -> None:
        self.signal_name: Optional[str] = None
        self.raised_at: Optional[float] = None
        self._agreed = False
        self.step = 0

    def _handle(self, signum, frame) -> None:
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name
            self.raised_at = time.monotonic()
            log.warning("received %s: stopping at the next step boundary, then exiting %d", self.signal_name, EXIT_PREEMPTED)

    @property
    def local(self) -> bool:
        """This rank got the signal (no collective: safe anywhere)."""
        return self.signal_name is not None

    def requested(self, step: Optional[int] = None) -> bool:
        """Whether any rank got the signal: one all-reduce, so call it on every rank once a step."""
        if step is not None:
            self.step = step
        if self._agreed:
            return True
        flag = self.local
        dist = _dist()
        if dist is not None:
            import torch

            device = "cuda" if dist.get_backend() == "nccl" else "cpu"
            if device == "cuda":
                device = f"cuda:{torch.cuda.current_device()}"
            tensor = torch.tensor([1 if flag else 0], device=device)
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
            flag = bool(tensor.item())
        self._agreed = flag
        return flag

    def seconds_left(self) -> float:
        """Of the time budget since the signal (the full budget before one)."""
        used = time.monotonic() - self.raised_at if self.raised_at is not None else 0.0
        return preemption_budget_seconds() - used


def _is_peer_lost(exc: BaseException) -> bool:
    try:
        from trainer.preemption import is_peer_lost

        return is_peer_lost(exc)
    except ImportError:  # no torch: no peers
        return False


@contextmanager
def preemption(step_of=None) -> Iterator[Stop]:
    """Install the SIGTERM/SIGUSR1 flag; on leaving, tell the launcher how this rank ended and,
    when preempted, exit 143. An exception is re-raised after the report (the launcher makes it a
    permanent failure unless a signal or a lost peer explains it)."""
    stop = Stop()
    previous = {sig: signal.signal(sig, stop._handle) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    me = job()
    report_exit(me.rank, "running", 0)
    try:
        yield stop
    except BaseException as exc:
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            report_exit(me.rank, "completed", stop.step, checkpoint_step=_newest(me.checkpoint_dir))
            raise
        report_exit(me.rank, "failed", stop.step, signalled=stop.local, peer_lost=_is_peer_lost(exc),
                    error=f"{type(exc).__name__}: {exc}"[:500])
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stop.local or stop._agreed:
        report_exit(me.rank, "preempted", stop.step, signalled=stop.local, checkpoint_step=_newest(me.checkpoint_dir))
        sys.stdout.flush()
        sys.stderr.flush()
        raise SystemExit(EXIT_PREEMPTED)
    report_exit(me.rank, "completed", stop.step, checkpoint_step=_newest(me.checkpoint_dir))


# -- checkpoints ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: str  # where the files are: the step directory, or the framework's own directory
    meta: dict


def step_dir(step: int, root: Optional[str] = None) -> str:
    return os.path.join(root or job().checkpoint_dir, step_dir_name(step))


def _newest(root: str) -> Optional[int]:
    found = latest_checkpoint(root)
    return found.step if found else None


def latest_checkpoint(root: Optional[str] = None) -> Optional[Checkpoint]:
    """The newest complete checkpoint (its marker exists), or None: what a restarted pod resumes."""
    root = root or job().checkpoint_dir
    try:
        names = os.listdir(root)
    except OSError:
        return None
    for step in sorted((s for n in names if (s := _step_of(n)) is not None), reverse=True):
        directory = step_dir(step, root)
        try:
            with open(os.path.join(directory, MARKER)) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            continue  # no marker (a save cut short) or a torn one: not a checkpoint
        path = os.path.join(root, meta["path"]) if isinstance(meta.get("path"), str) else directory
        if not os.path.isdir(path):
            continue  # the framework rotated its directory away (e.g. the HF Trainer's save_total_limit)
        return Checkpoint(step, path, meta)
    return None


def _barrier() -> None:
    dist = _dist()
    if dist is not None:
        dist.barrier()


def begin_checkpoint(step: int, root: Optional[str] = None) -> str:
    """The step's directory, created by rank 0 before any rank writes into it (a barrier)."""
    path = step_dir(step, root)
    if job().is_main:
        os.makedirs(path, exist_ok=True)
    _barrier()
    return path


def commit_checkpoint(step: int, root: Optional[str] = None, *, path: Optional[str] = None, **meta: Any) -> None:
    """Mark the step complete, after every rank finished writing (a barrier). ``path``: where the
    files are when not in the step directory (relative to the checkpoint root)."""
    _barrier()
    if job().is_main:
        directory = step_dir(step, root)
        os.makedirs(directory, exist_ok=True)
        payload = {"step": step, "saved_at": time.time(), **meta}
        if path is not None:
            payload["path"] = path
        write_json_atomic(os.path.join(directory, MARKER), payload)
    _barrier()


# -- tracking -----------------------------------------------------------------------------------
class _Tracking:
    """Metrics to ``<checkpoint dir>/metrics.jsonl`` (what the built-in trainer writes too), and to
    the MLflow run when there is one."""

    def __init__(self, metrics_path: Optional[str], client=None, run_id: Optional[str] = None):
        self.metrics_path, self.client, self.run_id = metrics_path, client, run_id

    def log_metrics(self, metrics: dict, step: int) -> None:
        if self.metrics_path:
            os.makedirs(os.path.dirname(self.metrics_path), exist_ok=True)
            with open(self.metrics_path, "a") as f:
                f.write(json.dumps({"step": step, **{k: float(v) for k, v in metrics.items()}}) + "\n")
        if self.client is not None:
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

    def log_params(self, params: dict) -> None:
        if self.client is None:
            return
        from mlflow.entities import Param

        existing = self.client.get_run(self.run_id).data.params
        fresh = [Param(k, str(v)) for k, v in params.items() if k not in existing]
        if fresh:  # a resumed run already has them; MLflow refuses to change a param
            self.client.log_batch(self.run_id, params=fresh)


@contextmanager
def tracking() -> Iterator[Any]:
    """The job's MLflow run on rank 0 (``log_metrics``, ``log_params``), the same run after a
    restart (tag ``trainer.job_id`` = the job's run id); a no-op elsewhere or without a server."""
    me = job()
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if not me.is_main:
        yield _Tracking(None)
        return
    metrics_path = os.path.join(me.checkpoint_dir, "metrics.jsonl")
    if not uri:
        yield _Tracking(metrics_path)
        return
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    name = me.experiment or "default"
    experiment = client.get_experiment_by_name(name)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
    runs = client.search_runs([experiment_id], filter_string=f"tags.`trainer.job_id` = '{me.run_id}'",
                              max_results=1) if me.run_id else []
    run_id = runs[0].info.run_id if runs else client.create_run(
        experiment_id, tags={"trainer.job_id": me.run_id or "", "mlflow.source.type": "JOB"}).info.run_id
    try:
        yield _Tracking(metrics_path, client, run_id)
    except SystemExit as exc:
        # Preempted: the run stays RUNNING, the recreated pod continues it.
        if exc.code not in (0, None):
            raise
        client.set_terminated(run_id, "FINISHED")
        raise
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    else:
        client.set_terminated(run_id, "FINISHED")
