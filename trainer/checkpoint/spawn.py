"""DCP's background checkpoint process (`async_mode: process`): shielded from the preemption
signal meant for the trainer, and its death told apart from the trainer's own failure."""
from __future__ import annotations

import contextlib
import os
import signal

# The signals torchrun (SIGTERM) and a terminal (SIGINT) send to the worker's process group.
SHIELDED_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


# The interpreter multiprocessing's spawn starts for DCP's background checkpoint process:
# Python itself, with SIGTERM/SIGINT ignored and a guard that SIGKILLs the process once its
# parent (the trainer) is gone. It then runs what spawn asked for (`-c <code> ...`).
# It starts with both signals blocked (`termination_blocked`): one sent while the interpreter
# starts stays pending, and is discarded when they are unblocked, after they are ignored.
_SPAWN_WRAPPER = """#!{python}
import os, signal, sys, threading, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGTERM, signal.SIGINT}})
_trainer = os.getppid()


def _orphan_guard():
    while os.getppid() == _trainer:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)


threading.Thread(target=_orphan_guard, name="orphan-guard", daemon=True).start()
_args = sys.argv[1:]
if "-c" not in _args:  # not spawn's command line: behave as the plain interpreter
    os.execv({python!r}, [{python!r}, *_args])
_at = _args.index("-c")
sys.argv = ["-c", *_args[_at + 2:]]
sys.path[0] = ""  # what `python -c` puts first, instead of this file's directory
exec(compile(_args[_at + 1], "<string>", "exec"), {{"__name__": "__main__", "__builtins__": __builtins__}})
"""


def shield_spawned_processes() -> str:
    """Makes processes spawned by multiprocessing from here on ignore SIGTERM and SIGINT, and
    end when the trainer that spawned them is gone.

    The orphan guard: torchrun signals a worker's process group only while the worker is alive
    (`SubprocessContext._close`, torch/distributed/elastic/multiprocessing/api.py), so after a
    SIGKILL of the trainer its background process, which ignores SIGTERM by design, would keep
    its full host copy of the state until its DCP collective failed, overlapping the next
    attempt. It polls its parent: a reparented process (the trainer died) kills itself.
    (prctl's PR_SET_PDEATHSIG does not fit: it fires when the creating *thread* exits, and DCP
    creates the process from a ThreadPoolExecutor thread that ends with its first save.)"""
    import multiprocessing
    import sys
    import tempfile

    wrapper = os.path.join(tempfile.mkdtemp(prefix="trainer-spawn-"), "python-ignoring-sigterm")
    with open(wrapper, "w") as f:
        f.write(_SPAWN_WRAPPER.format(python=sys.executable))
    os.chmod(wrapper, 0o755)
    multiprocessing.set_executable(wrapper)
    _start_resource_tracker()
    return wrapper


def _start_resource_tracker() -> None:
    """multiprocessing's spawn makes sure its resource tracker runs before each start, and when
    it starts the tracker it blocks SIGINT and SIGTERM in the calling thread, then *unblocks*
    them instead of restoring the mask (CPython 3.11 multiprocessing/resource_tracker.py,
    `ensure_running`: `pthread_sigmask(SIG_BLOCK, _IGNORED_SIGNALS)` ... `SIG_UNBLOCK`). Started
    here, on the trainer's main thread, it is found running later, and the thread that spawns
    DCP's process keeps the mask `termination_blocked` gave it. The tracker ignores both
    signals itself, so a preemption does not end it."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()


@contextlib.contextmanager
def termination_blocked():
    """SIGTERM and SIGINT blocked in this thread while DCP starts a save (`dcp.async_save`).

    DCP creates its background process from a thread it creates inside the call (torch 2.13
    `_ProcessBasedAsyncCheckpointExecutor.execute_save`: a new ThreadPoolExecutor per save), and
    a thread and a forked child inherit the creating thread's signal mask, which also survives
    exec. So the process starts with both signals blocked and only unblocks them once it
    ignores them (`_SPAWN_WRAPPER`): a SIGTERM to the worker's process group can never land in
    between and kill it. (It stays in the worker's process group on purpose: torchrun's last
    resort, SIGKILL to the group, still ends it.) A signal meant for the trainer meanwhile is
    not lost: it is delivered to another thread, or once this one unblocks it, and the
    trainer's handler runs on the main thread as always."""
    _start_resource_tracker()  # before blocking: a restarted tracker would unblock them here
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, SHIELDED_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def background_process_signal(exc: BaseException) -> int | None:
    """N when `exc` comes from DCP's background checkpoint process having died of signal N
    (the OOM killer picks it: it holds a full host copy of the state). A signal death, hence
    retryable, not the trainer's own failure."""
    if not ("Checkpoint background process is dead" in str(exc) or isinstance(exc, (BrokenPipeError, EOFError))):
        return None
    from torch.distributed.checkpoint import _async_process_executor as executor

    process = getattr(getattr(executor, "_CHECKPOINT_PROCESS", None), "_save_process", None)
    if process is None:
        return None
    process.join(timeout=5)  # its exit code is only known once it is reaped
    code = process.exitcode
    return -code if isinstance(code, int) and code < 0 else None
