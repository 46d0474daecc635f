"""The three ways a save is written: synchronously, by a thread, or by DCP's background process.
Each takes the state and the step directory and returns a future that is done when every rank's
shards are written."""
from __future__ import annotations

import contextlib
from concurrent.futures import Future

import torch.distributed.checkpoint as dcp

from trainer.checkpoint.spawn import shield_spawned_processes, termination_blocked
from trainer.checkpoint.staging import StagingBuffers, _plain_state
from trainer.checkpoint.threads import BackgroundThread
from trainer.distributed import Env
from trainer.durable import write_durably


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

    def close(self, graceful: bool = True) -> None:
        pass

    def alive(self) -> bool:
        return True

    abandonable = False


class AsyncSave:
    """Stages the state to CPU memory (a copy), then writes in a thread or a process; the
    loop only stalls for the copy.

    Process mode: torchrun delivers SIGTERM to each worker's whole process group, which
    includes DCP's background checkpoint process, so a preemption used to kill the very
    save it should wait for ("Checkpoint background process is dead. Exit code: -15").
    That process is started by multiprocessing's spawn, so its interpreter is whatever
    `multiprocessing.set_executable` names: here a small Python wrapper that sets SIGTERM
    and SIGINT to ignored and guards against outliving the trainer (see
    `shield_spawned_processes`). Only the trainer reacts to the signal and the save finishes.
    The process starts with SIGTERM and SIGINT blocked and unblocks them only once it ignores
    them (`termination_blocked`), so no signal can land while it starts. (A hook in
    `trainer.__main__` would not run there: spawn does not re-import a `__main__` module.)
    SIGKILL, torchrun's last resort, still ends it; since it ignores SIGTERM, `close()` ends
    it explicitly (DCP's terminate message, then SIGKILL)."""

    def __init__(self, env: Env, mode: str):
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        self.env = env
        self.kind = AsyncCheckpointerType.PROCESS if mode == "process" else AsyncCheckpointerType.THREAD
        self.process_mode = mode == "process"
        if self.process_mode:
            shield_spawned_processes()

    def start(self, state: dict, path: str, stager=None) -> Future:
        """`stager`: DCP's `AsyncStager`; None is DCP's default, a fresh pageable copy per save."""
        from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

        with termination_blocked() if self.process_mode else contextlib.nullcontext():
            result = dcp.async_save(state, checkpoint_id=path, process_group=self.env.checkpoint_group,
                                    async_checkpointer_type=self.kind, async_stager=stager,
                                    no_dist=not self.env.distributed)
        return result.upload_completion if isinstance(result, AsyncSaveResponse) else result

    @property
    def abandonable(self) -> bool:
        """A write in flight can be given up: its process is ended (a thread cannot be)."""
        return self.process_mode

    @staticmethod
    def _background_process():
        # torch keeps its one background process in a module global (torch 2.13).
        from torch.distributed.checkpoint import _async_process_executor as executor

        return getattr(getattr(executor, "_CHECKPOINT_PROCESS", None), "_save_process", None)

    def alive(self) -> bool:
        """False once the background process has died (None yet: it is still starting)."""
        if not self.process_mode:
            return True
        process = self._background_process()
        return process is None or process.is_alive()

    def close(self, graceful: bool = True) -> None:
        if not self.process_mode:
            return
        from torch.distributed.checkpoint import _async_process_executor as executor

        background = getattr(executor, "_CHECKPOINT_PROCESS", None)
        process = self._background_process()
        if process is None:
            return
        if graceful and process.is_alive():
            with contextlib.suppress(Exception):
                background._send(executor._CheckpointSaveProcessControlOpts.TERMINATE)
                process.join(timeout=10)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)
        executor._CHECKPOINT_PROCESS = None


class StagedThreadSave:
    """`async_mode: thread`: the loop stalls only for the copy into the reused staging
    buffers; a background thread writes them with DCP (on the checkpoint group, as DCP's
    own thread mode does)."""

    @staticmethod
    def supported() -> bool:
        """torch's staging helpers are private API: present from torch 2.4 through 2.13 (checked
        on 2.13 here; 2.11 is the GPU image's). Without them, DCP's own thread mode is used."""
        try:
            from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict  # noqa: F401
        except ImportError:
            return False
        return True

    abandonable = False

    def __init__(self, env: Env):
        self.env = env
        self.staging = StagingBuffers(pin_memory=env.device.type == "cuda")
        # A daemon thread: the failure path does not wait for a write stuck in a collective.
        self.thread = BackgroundThread("ckpt-writer")

    def prepare(self, state: dict) -> None:
        self.staging.allocate_ahead(state)

    def start(self, state: dict, path: str, side_files: list[tuple[str, bytes]] = ()) -> Future:
        staged = self.staging.stage(_plain_state(state), self.env.device)

        def write() -> None:
            write_durably(side_files)
            dcp.save(staged, checkpoint_id=path, process_group=self.env.checkpoint_group,
                     no_dist=not self.env.distributed)

        return self.thread.submit(write)

    def alive(self) -> bool:
        return True

    def close(self, graceful: bool = True) -> None:
        self.thread.shutdown(wait=graceful)


class AlreadyStaged:
    """DCP's `AsyncStager` protocol for a state that is already a host copy: handed on as it is
    (without a stager, `dcp.async_save` would copy it once more, into fresh pageable memory:
    `DefaultStager(StagingOptions(False, False, False, False))`, torch 2.13 state_dict_saver.py)."""

    should_synchronize_after_execute = False

    def stage(self, state_dict: dict) -> dict:
        return state_dict

    def synchronize_staging(self) -> None:
        pass

    def close(self) -> None:
        pass


class StagedProcessSave(AsyncSave):
    """`async_mode: process`: the loop stalls only for the copy into staging buffers allocated
    once, in shared memory (and pinned on CUDA), and reused by every save; DCP's background
    process maps and writes those same pages. Before, each save staged through DCP's default
    stager: fresh pageable memory per save (about 1 s per GPT-2 124M save on an H100), which the
    pipe to the background process then copied into shared memory a second time.

    The buffers are safe to overwrite at the next save: `Checkpointer.save` waits for the
    previous write first (one save in flight at most)."""

    def __init__(self, env: Env):
        super().__init__(env, "process")
        self.staging = StagingBuffers(pin_memory=env.device.type == "cuda", share_memory=True)
        self.stager = AlreadyStaged()

    def prepare(self, state: dict) -> None:
        self.staging.allocate_ahead(state)

    def start(self, state: dict, path: str, stager=None) -> Future:
        staged = self.staging.stage(_plain_state(state), self.env.device)
        return super().start(staged, path, stager=self.stager)
