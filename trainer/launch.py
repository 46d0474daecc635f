"""Container entrypoint: `python -m trainer.launch [torchrun args] -m trainer train --config ...`.

It runs torchrun as a child and turns "the trainer checkpointed because of a signal" into
exit code 143, which a PyTorchJob with `restartPolicy: ExitCode` retries. torchrun alone
cannot be trusted with that (torch 2.13, measured by benchmarks/torchrun_sigterm.py): on
SIGTERM it forwards the signal to its workers, waits up to TORCH_ELASTIC_SHUTDOWN_TIMEOUT
for them, then exits 1 — a permanent failure for the operator — even when every worker
saved its checkpoint and exited cleanly.

Exit codes: 0 finished; 143 preempted (a signal reached the launcher, or any rank reports it
saved after a signal); anything else is torchrun's own code (a real failure).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile

EXIT_PREEMPTED = 143
# Karpenter's spot notice is 120 s; the pod's grace period must exceed this, and the
# trainer's save must fit inside it. See docs/trainer.md, "Time budget".
DEFAULT_SHUTDOWN_TIMEOUT_SECONDS = "90"


def worker_reasons(status_dir: str) -> list[str]:
    reasons = []
    for name in sorted(os.listdir(status_dir)):
        with open(os.path.join(status_dir, name)) as f:
            reasons.append(json.load(f)["reason"])
    return reasons


def exit_code(torchrun_code: int, signalled: bool, reasons: list[str]) -> int:
    if signalled or "preempted" in reasons:
        return EXIT_PREEMPTED
    if torchrun_code == 0:
        return 0
    # A negative code means torchrun itself died of a signal (e.g. -9): report it shell-style.
    return 128 - torchrun_code if torchrun_code < 0 else torchrun_code


def main(argv: list[str]) -> int:
    env = dict(os.environ)
    env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", DEFAULT_SHUTDOWN_TIMEOUT_SECONDS)
    with tempfile.TemporaryDirectory(prefix="trainer-exit-") as status_dir:
        env["TRAINER_EXIT_STATUS_DIR"] = status_dir
        child = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *argv], env=env)
        signalled = []

        def forward(signum, frame):
            signalled.append(signum)
            # SIGUSR1 would kill torchrun outright; SIGTERM is the one it forwards to workers.
            child.send_signal(signal.SIGTERM)

        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
            signal.signal(sig, forward)
        code = child.wait()
        reasons = worker_reasons(status_dir)
    final = exit_code(code, bool(signalled), reasons)
    print(f"[trainer.launch] torchrun exited {code}; workers: {reasons or 'no report'}; "
          f"signal: {bool(signalled)}; exiting {final}", file=sys.stderr, flush=True)
    return final


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
