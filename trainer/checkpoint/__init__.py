"""Sharded, atomic checkpoints with torch.distributed.checkpoint (DCP): `Checkpointer`, the face
the training loop sees.

Layout of one save, `<dir>/step-000120/`:
    .metadata, __*_*.distcp   model + optimizer shards written by DCP (every rank)
    rng-rank-<r>.pt           that rank's RNG states as tensors (they differ per rank)
    config.yaml               the resolved config
    manifest.json             SHA-256 of every file above, signed with the team's key (trainer/trust.py)
    complete.json             the marker, written last and atomically by rank 0

A directory without `complete.json` is never resumed from: a kill at any point of a save
leaves at worst an incomplete directory, which the next save's retention pass removes.
The converse holds too: a directory with `complete.json` is always whole. A save into an
existing step directory removes the old marker before writing anything, and a checkpoint
is deleted by renaming its directory away (one atomic step) before its files are removed.

Other names in `<dir>`: `owner.json` (the attempt allowed to finalise, prune and roll back,
see `Ownership`), `rollback.json` and `abandoned/` (see `resolve_resume`), and
`.trash-*` (checkpoints being deleted; swept by retention). The names are trainer/contract/layout.py's.

The package's face is `__all__`; everything else is imported from its module. One concern per
module:
    layout.py     step directories, markers, deletion that no kill can tear
    ownership.py  which attempt may finalise, prune and roll back
    state.py      the model/optimizer `Stateful`s and per-rank RNG state
    staging.py    host buffers allocated once and reused by every async save
    writers.py    sync, thread and process writers
    spawn.py      DCP's background process: shielded from SIGTERM, its death recognised
    threads.py    the daemon threads that write (thread mode) and seal (rank 0)
    resume.py     where a run starts: resume resolution, rollback, the abandoned branch
Fault injection for tests is trainer/faults.py.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import time
from collections import deque
from concurrent.futures import Future
from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.stateful import Stateful

from trainer import safe_load
from trainer.branch import read_rollback
from trainer.checkpoint.layout import MARKER, STEP_DIR, list_steps, read_marker, rename_away, step_dir, sweep_trash
from trainer.checkpoint.ownership import NoOwnership, Ownership
from trainer.checkpoint.resume import resolve_resume
from trainer.checkpoint.state import ModelAndOptimizer, ModelOnly, load_rng_file, rng_state, set_rng_state
from trainer.checkpoint.threads import BackgroundThread
from trainer.checkpoint.writers import AsyncSave, StagedProcessSave, StagedThreadSave, SyncSave
from trainer.distributed import Env
from trainer.durable import write_durably, write_json_atomic
from trainer.faults import NoFaults
from trainer.trust import UntrustedCheckpoint, trust_from_env

__all__ = ["Checkpointer", "ModelAndOptimizer", "ModelOnly", "read_marker", "resolve_resume"]

log = logging.getLogger(__name__)


class Checkpointer:
    """Saves (`save`, then `poll` at every step boundary), resumes (`load`, `adopt`), and seals.

    Sealing a finished save is rank 0's: the manifest (SHA-256 of every rank's files), the
    marker, retention and the S3 queue. It runs on a background thread of its own (`sealer`),
    never on the loop's thread: the other ranks go on into the next step's collectives, and
    on a large state the hashing alone (every shard read back, about 0.6 GiB/s per core) or a
    slow metadata server's fsyncs and renames would hold them there against the collective
    timeout. A checkpoint is durable, and `last_durable_step` names it, once its marker is."""

    def __init__(self, root: str, env: Env, keep_last: int, async_mode: str, mirror, ownership=None, trust=None,
                 faults=None):
        self.root = root
        self.trust = trust or trust_from_env()  # signs on save, verifies before load (trainer/trust.py)
        self.env = env
        self.keep_last = keep_last
        # thread: our pinned, reused staging + a writer thread; process: the same staging in
        # shared memory + DCP's background process. Without torch's staging helpers, DCP's own.
        staged = StagedThreadSave.supported()
        self.writer = (SyncSave(env) if async_mode == "off"
                       else StagedThreadSave(env) if async_mode == "thread" and staged
                       else StagedProcessSave(env) if async_mode == "process" and staged
                       else AsyncSave(env, async_mode))
        # The preemption path's save: no staging, no background process to depend on.
        self.sync_writer = SyncSave(env)
        # Set by prepare_staging: staging buffers are allocated once the optimizer holds state.
        self._staging_source: Stateful | None = None
        self.mirror = mirror
        self.faults = faults or NoFaults()  # the tests' fault injection (trainer/faults.py), from the trainer
        self.ownership = ownership or (Ownership(root) if env.is_main else NoOwnership())
        # The write in flight: (future, step, meta, started, config_yaml, before_marker).
        self.pending: tuple | None = None
        # Rank 0: seals, annotations and retention, in order, off the loop's thread.
        self.sealer = BackgroundThread("ckpt-sealer") if env.is_main else None
        self._sealing: deque[Future] = deque()
        # Never pruned by this attempt: the checkpoint it resumed from (see resolve_resume).
        self.protected: set[int] = set()
        # Wall seconds of the last whole write (start to durable), for the preemption budget.
        self.last_write_seconds: float | None = None
        self.last_durable_step: int | None = None
        # Facts learnt after a save started (the MLflow run id): filled into its marker.
        self.known: dict = {}
        os.makedirs(root, exist_ok=True)
        self.ownership.claim()

    def protect(self, path: str | None) -> None:
        if path and os.path.realpath(os.path.dirname(path)) == os.path.realpath(self.root):
            match = STEP_DIR.match(os.path.basename(path))
            if match:
                self.protected.add(int(match.group(1)))

    def adopt(self, resume_from: str) -> None:
        """After a resume: protect its source and the rollback branch point (in every attempt,
        not only the one that rolled back), then run retention once, so a kill between a
        marker and its retention pass leaves no extra checkpoint behind."""
        self.protect(resume_from)
        record = read_rollback(self.root)
        if record and os.path.realpath(os.path.dirname(record.get("source", ""))) == os.path.realpath(self.root):
            self.protected.add(record["source_step"])
        self.last_durable_step = read_marker(resume_from)["step"]
        if self.env.is_main and self.ownership.holds():
            self._on_sealer(self._apply_retention)

    def save(self, step: int, app: Stateful, meta: dict, config_yaml: str,
             before_marker: Callable[[], None] | None = None, synchronous: bool = False) -> float:
        """Starts a save of `step`; returns the seconds the loop was blocked. `before_marker`:
        made durable first on rank 0 (metrics.jsonl up to this step). `synchronous`: written
        before this returns, whatever the async mode (the preemption path)."""
        started = time.perf_counter()
        self.wait_written()  # one write in flight at most: staging buffers are reused
        path = step_dir(self.root, step)
        os.makedirs(path, exist_ok=True)
        # A re-save into an existing directory (a rollback, a retry after a kill) must not
        # leave the old marker standing over new, half-written shards. Every rank removes it
        # before writing, and rank 0 writes the new one only after every rank has written.
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(path, MARKER))
        # The RNG state is taken now (it is this step's); the file is written and fsynced
        # before the shards, on the writer's thread when it has one (an fsync on a busy file
        # system can take a second: not on the loop's critical path), and always before the marker.
        rng = io.BytesIO()
        torch.save(rng_state(), rng)
        side_files = [(os.path.join(path, f"rng-rank-{self.env.rank}.pt"), rng.getvalue())]
        writer = self.sync_writer if synchronous else self.writer
        if isinstance(writer, StagedThreadSave):
            future = writer.start({"app": app}, path, side_files)
        else:
            write_durably(side_files)
            future = writer.start({"app": app}, path)
        self.pending = (future, step, meta, started, config_yaml, before_marker)
        self.poll()
        return time.perf_counter() - started

    def prepare_staging(self, app: "ModelAndOptimizer") -> None:
        """Lets a staging writer allocate its host buffers ahead of the first save (at the
        first step boundary where the optimizer holds state), off the save's critical path."""
        if hasattr(self.writer, "prepare"):
            self._staging_source = app

    def poll(self) -> None:
        """At every step boundary: hands a finished write to the sealer, and raises what a
        seal raised; costs nothing otherwise."""
        if self._staging_source is not None and self._staging_source.optimizer.state:
            self.writer.prepare({"app": self._staging_source.state_dict()})
            self._staging_source = None
        if self.pending and self.pending[0].done():
            self._finalize()
        while self._sealing and self._sealing[0].done():
            self._sealing.popleft().result()

    def wait(self) -> None:
        """Until the write in flight is durable (sealed, on rank 0)."""
        self.wait_written()
        self.wait_sealed()

    def wait_written(self) -> None:
        if self.pending:
            self.pending[0].result()
            self._finalize()

    def wait_sealed(self) -> None:
        while self._sealing:
            self._sealing.popleft().result()

    @property
    def pending_step(self) -> int | None:
        return self.pending[1] if self.pending else None

    # -- the preemption path's view of the write in flight -----------------------------------------
    def write_failed(self) -> bool:
        """The write in flight raised, or the process writing it is gone."""
        if not self.pending:
            return False
        future = self.pending[0]
        if future.done():
            return future.exception() is not None
        return not self.writer.alive()

    def write_cause(self) -> str:
        """What became of the write in flight on this rank, for the log."""
        if not self.pending:
            return "written"
        future = self.pending[0]
        if future.done():
            exc = future.exception()
            return f"failed: {str(exc).splitlines()[0][:200]}" if exc else "written"
        return "its background process is gone" if not self.writer.alive() else "still running"

    def write_done(self) -> bool:
        return not self.pending or self.pending[0].done()

    @property
    def write_abandonable(self) -> bool:
        return bool(self.pending) and (self.pending[0].done() or self.writer.abandonable)

    def abandon_write(self) -> int | None:
        """Gives up the write in flight (its step keeps no marker; retention removes it later)
        and ends the background process writing it. Returns its step."""
        if not self.pending:
            return None
        step = self.pending[1]
        self.pending = None
        if self.writer.abandonable:
            self.writer.close(graceful=False)
        return step

    def _finalize(self) -> None:
        future, step, meta, started, config_yaml, before_marker = self.pending
        self.pending = None
        future.result()  # re-raises a failed background write here, on the loop's thread
        self.last_write_seconds = time.perf_counter() - started
        self.faults.in_save(step)
        if self.env.is_main:
            # DCP's coordinator writes .metadata only after gathering every rank's write
            # results, so on rank 0 a finished write means all shards are on disk.
            self._on_sealer(self._seal, step, meta, started, config_yaml, before_marker)
        else:
            self.last_durable_step = step

    def _on_sealer(self, fn: Callable, *args) -> None:
        self._sealing.append(self.sealer.submit(fn, *args))

    def _seal(self, step: int, meta: dict, started: float, config_yaml: str,
              before_marker: Callable[[], None] | None) -> None:
        """The sealer's thread: config, manifest, marker, retention, the S3 queue."""
        if not self.ownership.holds():
            log.error("checkpoint step %d written but not marked: another attempt (%s) owns %s now",
                      step, self.ownership.current() if hasattr(self.ownership, "current") else "?", self.root)
            return
        path = step_dir(self.root, step)
        write_durably([(os.path.join(path, "config.yaml"), config_yaml.encode())])
        if before_marker is not None:
            before_marker()
        late = {k: v for k, v in self.known.items() if meta.get(k) is None}
        marker = {**meta, **late, "step": step, "saved_at": time.time()}
        self.trust.seal(path, marker)  # hashes every rank's files: here, not on the loop's thread
        write_json_atomic(os.path.join(path, MARKER), marker)
        self.last_durable_step = step
        self.last_write_seconds = time.perf_counter() - started
        self._apply_retention()
        self.mirror.upload(path)

    def _apply_retention(self) -> None:
        complete = list_steps(self.root)
        keep = set(complete[-self.keep_last:]) | self.protected
        removed = []
        for old in complete:
            if old not in keep and self.ownership.holds():
                self._remove(old)
                removed.append(old)
        newest = complete[-1] if complete else -1
        # Incomplete directories older than the newest complete one are debris of a kill.
        for step in set(list_steps(self.root, complete_only=False)) - set(complete):
            if step < newest:
                self._remove(step)
        sweep_trash(self.root)
        self.mirror.prune(removed)

    def _remove(self, step: int) -> None:
        """Renamed away, then removed (see `layout.rename_away`); the fault point lies between."""
        trash = rename_away(self.root, step)
        if trash is not None:
            self.faults.at("in_retention", step)
            shutil.rmtree(trash, ignore_errors=True)

    def load_initial(self, path: str, app: Stateful) -> dict:
        """Weights (and the optimizer when `app` holds it) from another job's checkpoint; no
        RNG state, no step: everything else of this job starts fresh. Trust-checked as a resume
        is: the path is another job's directory, which any pod of the team may have written."""
        self._check_trusted(path)
        safe_load.load({"app": app}, path, process_group=self.env.checkpoint_group, no_dist=not self.env.distributed)
        return read_marker(path)

    def annotate_newest(self, extra: dict) -> None:
        """Adds what became known after the newest marker was written (the MLflow run id, once
        the tracker connected) to that marker; rank 0, owner only, on the sealer's thread (after
        the seals before it: `wait_sealed` waits for it)."""
        if not self.env.is_main:
            return
        self.known.update(extra)  # a seal still to come fills it in
        self._on_sealer(self._annotate, dict(extra))

    def _annotate(self, extra: dict) -> None:
        if not (self.last_durable_step is not None and self.ownership.holds()):
            return
        path = os.path.join(step_dir(self.root, self.last_durable_step), MARKER)
        try:
            marker = read_marker(os.path.dirname(path))
        except (OSError, ValueError):
            return
        if any(marker.get(k) is None for k in extra):
            annotated = {**marker, **{k: v for k, v in extra.items() if marker.get(k) is None}}
            # The manifest signs the marker's content: re-sign it first, then the marker, so a
            # kill in between leaves a marker the manifest still matches or one it reports.
            if self.trust.reseal_marker(os.path.dirname(path), annotated):
                write_json_atomic(path, annotated)

    def load(self, path: str, app: Stateful) -> dict:
        self._check_trusted(path)
        safe_load.load({"app": app}, path, process_group=self.env.checkpoint_group, no_dist=not self.env.distributed)
        rng_file = os.path.join(path, f"rng-rank-{self.env.rank}.pt")
        if os.path.isfile(rng_file):
            set_rng_state(load_rng_file(rng_file))
        return read_marker(path)

    def _check_trusted(self, path: str) -> None:
        """Every rank checks the signature and the pickled files, hashes its share of the shards,
        and all ranks agree on the verdict before any of them unpickles anything."""
        problems = self.trust.problems(path, share=(self.env.rank, self.env.world_size))
        if self.env.distributed:
            gathered: list = [None] * self.env.world_size
            dist.all_gather_object(gathered, problems, group=self.env.checkpoint_group)
            problems = list(dict.fromkeys(p for rank_problems in gathered for p in rank_problems))
        if problems:
            raise UntrustedCheckpoint(path, problems)

    def close(self) -> None:
        """The end of training: the last save durable, the writer ended. The S3 mirror is
        closed separately (`close_mirror`), after the ranks parted."""
        self.wait()
        self._staging_source = None  # no reference to the model outlives the loop
        self.writer.close()

    def close_mirror(self, budget_seconds: float | None = None) -> None:
        self.wait_sealed()
        self.mirror.close(budget_seconds)

    def abort(self) -> None:
        """The failure path: no waiting on peers that may be gone, nor on a seal."""
        self.writer.close(graceful=False)
        if self.sealer is not None:
            self.sealer.shutdown(wait=False)
        self.mirror.close(budget_seconds=0.0)
