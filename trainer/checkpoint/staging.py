"""Host buffers a save copies the device state into, allocated once and reused by every save."""
from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from torch.distributed.checkpoint.stateful import Stateful

log = logging.getLogger(__name__)


class StagingBuffers:
    """Host copies of the training state, allocated once and reused by every save.

    Thread mode writes them from a thread; process mode allocates them in shared memory and
    DCP's background process writes them from there (`StagedProcessSave`).

    A save copies the device state into these buffers (non-blocking copies, then one device
    synchronisation) and hands them to the writer; training goes on as soon as the copy has
    landed. On CUDA the buffers are pinned: a copy into pageable memory is staged through a
    driver bounce buffer and runs at a fraction of the bandwidth (copying GPT-2 124M + AdamW,
    593 tensors and 1.65 GB, into reused pinned buffers took 0.031 s on one H100; DCP's
    thread mode, which allocated fresh pageable memory per save, blocked 0.97-1.16 s).

    The buffers are allocated ahead (`allocate_ahead`, in a background thread, as soon as the
    optimizer holds state), so the first save is no slower than the others. They hold one
    full copy of this rank's state in host memory for the life of the job.

    Built on torch's own staging helpers (`_create_cpu_state_dict`, `_copy_state_dict`, which
    DCP's `BlockingAsyncStager(cache_staged_state_dict=True)` uses and which handle DTensor
    shards), not on DCP's `DefaultStager`: with torch 2.11 that raised `KeyError: <class 'type'>`
    on the state of `get_state_dict(model, optimizer)`."""

    def __init__(self, pin_memory: bool, share_memory: bool = False):
        self.pin_memory = pin_memory
        # Shared memory (process mode): DCP hands the staged state to its background process
        # through a pipe, and a tensor whose storage is already shared travels as a handle to
        # the same pages, not as a copy (torch.multiprocessing.reductions.reduce_storage).
        self.share_memory = share_memory
        self.buffers: dict | None = None
        self.allocations = 0
        self._ahead: Future | None = None

    def _allocate(self, state: dict) -> dict:
        from torch.distributed._state_dict_utils import _create_cpu_state_dict

        buffers = _create_cpu_state_dict(state, pin_memory=self.pin_memory, share_memory=self.share_memory)
        if not self.pin_memory:
            # Touch every page now: the first copy into fresh pageable memory would otherwise
            # pay the page faults, and the first save would block longer than the rest.
            # (Pinned memory is resident from allocation.)
            _for_each_tensor(buffers, lambda t: t.zero_())
        self.allocations += 1
        return buffers

    def allocate_ahead(self, state: dict) -> None:
        if self.buffers is not None or self._ahead is not None:
            return
        executor = ThreadPoolExecutor(1, thread_name_prefix="ckpt-staging-alloc")
        self._ahead = executor.submit(self._allocate, state)
        executor.shutdown(wait=False)

    @property
    def ready(self) -> bool:
        return self.buffers is not None or (self._ahead is not None and self._ahead.done())

    def stage(self, state: dict, device: torch.device) -> dict:
        """Copies `state` into the buffers; returns a state dict that references them (and
        the current values of everything that is not a tensor: learning rates, step counts)."""
        from torch.distributed._state_dict_utils import _copy_state_dict
        try:
            from torch.distributed._state_dict_utils import CompanionMismatch
        except ImportError:  # older torch raised a plain exception on a structure mismatch
            CompanionMismatch = ValueError  # noqa: N806

        if self._ahead is not None:
            self.buffers, self._ahead = self._ahead.result(), None
        if self.buffers is None:
            self.buffers = self._allocate(state)
        try:
            staged = _copy_state_dict(state, self.buffers, non_blocking=True)
        except (CompanionMismatch, RuntimeError) as exc:
            # The state's structure changed (a first save before the optimizer held state,
            # a resized tensor): allocate new buffers once for the new structure.
            log.info("checkpoint staging buffers reallocated: the state changed shape (%s)", type(exc).__name__)
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # no copy may still target the old buffers
            self.buffers = self._allocate(state)
            staged = _copy_state_dict(state, self.buffers, non_blocking=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # one sync: every non-blocking copy has landed
        return staged


def _for_each_tensor(node, fn) -> None:
    if isinstance(node, torch.Tensor):
        fn(getattr(node, "_local_tensor", node))  # a DTensor's buffer is its local shard
    elif isinstance(node, dict):
        for value in node.values():
            _for_each_tensor(value, fn)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _for_each_tensor(value, fn)


def _plain_state(state: dict) -> dict:
    """{"app": Stateful} -> {"app": its state dict}: DCP flattens both to the same keys
    (`app.model.*`, `app.optim.*`), so a load through the Stateful reads what this wrote."""
    return {key: value.state_dict() if isinstance(value, Stateful) else value for key, value in state.items()}
