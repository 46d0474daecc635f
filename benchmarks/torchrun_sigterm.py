"""What torchrun (torch 2.13) does with SIGTERM, measured: how fast workers see it, what it
exits with, and when it escalates to SIGKILL. The facts behind trainer/launch.py.

    .venv/bin/python benchmarks/torchrun_sigterm.py
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

WORKER = textwrap.dedent("""
    import json, os, signal, sys, time
    out = sys.argv[1]; mode = sys.argv[2]
    def on_term(signum, frame):
        with open(f"{out}/rank-{os.environ['RANK']}.json", "w") as f:
            json.dump({"signal_at": time.time()}, f)
        if mode == "clean":
            time.sleep(1.0)  # a 1 s "checkpoint"
            sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    open(f"{out}/ready-{os.environ['RANK']}", "w").close()
    while True:
        time.sleep(0.05)
""")


def trial(mode: str, shutdown_timeout: int) -> None:
    with tempfile.TemporaryDirectory() as out:
        script = os.path.join(out, "worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                                 f"--shutdown-timeout={shutdown_timeout}", script, out, mode],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not all(os.path.exists(f"{out}/ready-{r}") for r in (0, 1)):
            time.sleep(0.05)
        sent = time.time()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait()
        ended = time.time()
        seen = [json.load(open(f"{out}/rank-{r}.json"))["signal_at"] - sent for r in (0, 1)
                if os.path.exists(f"{out}/rank-{r}.json")]
    what = "workers save 1 s then exit 0" if mode == "clean" else "workers ignore SIGTERM"
    print(f"{what:32s} shutdown-timeout {shutdown_timeout:2d}s: workers got SIGTERM after "
          f"{', '.join(f'{s * 1000:.0f} ms' for s in seen)}; torchrun exited {code} after {ended - sent:.1f} s")


def main() -> None:
    import torch

    print(f"torch {torch.__version__}")
    trial("clean", 30)
    trial("stubborn", 3)
    print("=> torchrun forwards SIGTERM at once, waits up to --shutdown-timeout (env TORCH_ELASTIC_SHUTDOWN_TIMEOUT),"
          " SIGKILLs the rest, and exits non-zero (not 143) either way: trainer/launch.py maps it.")


if __name__ == "__main__":
    main()
