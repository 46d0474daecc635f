"""One background thread that runs what it is given in order and answers with futures.

Not `concurrent.futures.ThreadPoolExecutor`: its threads are joined when the interpreter exits
(`threading._register_atexit(_python_exit)`, CPython 3.9+ concurrent/futures/thread.py), so a
checkpoint writer stuck in a collective whose peer is gone held the process at exit for the
checkpoint group's whole timeout. This thread is a daemon: the failure path leaves it behind,
and the process ends when its main thread does."""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable


class BackgroundThread:
    def __init__(self, name: str):
        self.name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._queue.put((future, fn, args))
        return future

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
                future.set_exception(exc)

    def shutdown(self, wait: bool = True) -> None:
        """Stops after what was submitted; `wait=False` returns at once (the failure path)."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is None:
                return
            self._queue.put(None)
        if wait:
            thread.join()
