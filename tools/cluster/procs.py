"""Every process the cluster harness starts: in a session of its own, stopped by process group,
and never outliving the process that started it.

The orphan guard is the kernel's: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` in the child before it
executes its program (``guarded``), so when the starting process dies (a killed pytest worker, a CI
timeout, an OOM kill) the kernel kills the child (man 2 prctl). Two rules come with it:

- the signal fires when the *thread* that forked the child exits, so processes are started only
  from threads that live as long as they do (the main thread, or a supervisor's main loop);
- a child that finds its parent already gone when it starts exits at once (the race the man page
  names: the parent may die between the fork and the prctl).

The same guard holds one level down: the plane's machine process and its kubelet start their own
children with it, so killing the test process ends the whole tree.
"""
from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence

def guarded(argv: Sequence[str]) -> list[str]:
    """``argv`` behind the orphan guard: util-linux ``setpriv --pdeathsig KILL`` sets the signal and
    executes a shell that exits at once if its parent is no longer the process that started it
    (the parent died before the prctl), else executes ``argv`` in place (same process). No Python
    runs between fork and exec (``preexec_fn`` can deadlock in a process with threads: the Pulumi
    engine's gRPC threads live in the test process)."""
    return ["setpriv", "--pdeathsig", "KILL", "--", "/bin/sh", "-c", '[ "$PPID" = "$0" ] || exit 126; exec "$@"',
            str(os.getpid()), *argv]


@dataclass
class Process:
    name: str
    popen: subprocess.Popen
    log: Path
    stopped: bool = field(default=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to its process group, then SIGKILL after ``grace_s``."""
        self.stopped = True
        if not self.alive():
            return
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.popen.wait(timeout=grace_s)


def spawn(name: str, argv: Sequence[str], log: Path, *, env: Optional[Mapping[str, str]] = None,
          cwd: Optional[Path] = None, pass_fds: Sequence[int] = (), inherit_env: bool = True,
          stdin=subprocess.DEVNULL) -> Process:
    """Start ``argv`` in a session of its own, output appended to ``log``, with the orphan guard."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as handle:
        popen = subprocess.Popen(guarded(argv), stdout=handle, stderr=subprocess.STDOUT, stdin=stdin,
                                 cwd=cwd, start_new_session=True, pass_fds=tuple(pass_fds),
                                 env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                      **(os.environ if inherit_env else {}), **(env or {})})
    return Process(name, popen, log)


def run(argv: Sequence[str], *, input: Optional[str] = None, timeout_s: float = 60,
        env: Optional[Mapping[str, str]] = None, check: bool = True) -> subprocess.CompletedProcess:
    """A short command with the same guard (``ip``, ``mount``...): output captured."""
    result = subprocess.run(guarded(argv), input=input, capture_output=True, text=True, timeout=timeout_s,
                            env={**os.environ, **(env or {})})
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): "
                           f"{(result.stderr or result.stdout).strip()}")
    return result
