"""The dev pod's notebook server (``python -m workloads dev``; manifest: workloads/devpod.py).

    python -m trainer.devserver          # in the pod: JupyterLab on 127.0.0.1:$DEVSERVER_PORT

JupyterLab listens on the pod's loopback only: the way in is ``kubectl port-forward`` (the
kubelet's port-forward connects inside the pod's network namespace), never the VPC. It authenticates
with ``JUPYTER_TOKEN`` (jupyter_server's token variable), and it ends itself when unused for
``DEVSERVER_IDLE_SECONDS``: idle kernels are culled (``MappingKernelManager.cull_idle_timeout``,
connected or not, so an open browser tab does not hold a GPU), idle terminals too
(``TerminalManager.cull_inactive_timeout``), and then the server shuts down
(``ServerApp.shutdown_no_activity_timeout``: "after N seconds with no kernels or terminals running
and no activity"). Its exit ends the pod's Job and frees the slice.

JupyterLab is not part of the training image; the image's ``dev`` target adds it
(trainer/Dockerfile). Without it the pod exits 2 with the fix in its termination message, which
``python -m workloads dev`` prints.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import Mapping, Optional, Sequence

TERMINATION_LOG = "/dev/termination-log"
EXIT_BAD_IMAGE = 2  # permanent: the launcher's exit-code contract (trainer/launch.py)


def jupyter_argv(environ: Mapping[str, str]) -> list[str]:
    port = int(environ.get("DEVSERVER_PORT", "8888"))
    idle = int(environ.get("DEVSERVER_IDLE_SECONDS", "3600"))
    root = environ.get("DEVSERVER_ROOT") or os.getcwd()
    return [sys.executable, "-m", "jupyterlab", "--no-browser",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
            f"--ServerApp.root_dir={root}", "--ServerApp.allow_remote_access=False",
            f"--ServerApp.shutdown_no_activity_timeout={idle}",
            f"--MappingKernelManager.cull_idle_timeout={idle}", "--MappingKernelManager.cull_interval=60",
            "--MappingKernelManager.cull_connected=True",
            f"--TerminalManager.cull_inactive_timeout={idle}", "--TerminalManager.cull_interval=60"]


def _refuse(message: str, termination_log: str = TERMINATION_LOG) -> int:
    print(message, file=sys.stderr, flush=True)
    try:
        with open(termination_log, "w", encoding="utf-8") as log:
            log.write(message)
    except OSError:
        pass  # not in a pod: the message went to stderr
    return EXIT_BAD_IMAGE


def main(argv: Optional[Sequence[str]] = None, environ: Optional[Mapping[str, str]] = None) -> int:
    environ = os.environ if environ is None else environ
    if importlib.util.find_spec("jupyterlab") is None:
        return _refuse("this image has no JupyterLab. Fix: build the image's dev target "
                       "(docker build --target dev -f trainer/Dockerfile .) and give it to `dev --image`")
    if not environ.get("JUPYTER_TOKEN"):
        return _refuse("JUPYTER_TOKEN is not set: the notebook would need no login. Fix: start the pod with "
                       "`python -m workloads dev` (it creates the token's Secret)")
    argv = jupyter_argv(environ)
    os.execv(argv[0], argv)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
