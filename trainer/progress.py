"""A rank that stops making progress ends itself.

Its peers give up after `parallelism.collective_timeout_seconds` (their collective fails), but
a rank frozen outside a collective (a deadlock in host code, a read that never returns) has
nothing to time out: its pod stays Running, and with it the rendezvous store when it is node
0, so the recreated pods cannot form the job until `maxRuntime`. torchrun restarts only what
exits. After the first step, this thread expects a beat (a step, an evaluation, a save) at
least every `progress_timeout_seconds`; past that it logs every thread's stack and SIGKILLs
the process: a signal death, which the launcher exits 137 for (retryable), and the pod ends.
(A process in uninterruptible sleep ends only once that sleep does: no signal is taken then.)
"""
from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
import time

log = logging.getLogger(__name__)


class NoWatchdog:
    def beat(self) -> None:
        pass

    def stop(self) -> None:
        pass


class ProgressWatchdog(NoWatchdog):
    def __init__(self, timeout_seconds: float, rank: int):
        self.timeout_seconds = timeout_seconds
        self.rank = rank
        self._last = time.monotonic()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="progress-watchdog", daemon=True)
        self._thread.start()

    def beat(self) -> None:
        self._last = time.monotonic()

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        while not self._stopped.wait(min(5.0, self.timeout_seconds / 10)):
            idle = time.monotonic() - self._last
            if idle > self.timeout_seconds:
                self._expire(idle)
                return

    def _expire(self, idle: float) -> None:
        log.error("rank %d made no progress for %.0f s (parallelism.progress_timeout_seconds=%g): ending this "
                  "process (SIGKILL, retryable); where every thread was:", self.rank, idle, self.timeout_seconds)
        for handler in logging.getLogger().handlers:
            handler.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
