"""DCP's background checkpoint process (`async_mode: process`): shielded from the preemption
signal meant for the trainer, and its death told apart from the trainer's own failure."""
from __future__ import annotations

import os


# The interpreter multiprocessing's spawn starts for DCP's background checkpoint process:
# Python itself, with SIGTERM/SIGINT ignored and a guard that SIGKILLs the process once its
# parent (the trainer) is gone. It then runs what spawn asked for (`-c <code> ...`).
_SPAWN_WRAPPER = """#!{python}
import os, signal, sys, threading, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
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
    return wrapper


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
