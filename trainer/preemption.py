"""SIGTERM / SIGUSR1 → save at the next step boundary → exit 143.

The handler only sets a flag: saving inside a signal handler would run collectives at an
arbitrary point of the step. Ranks then agree on the flag with one all-reduce per step,
because the signal reaches ranks at slightly different times (or only some of them).
"""
from __future__ import annotations

import json
import logging
import os
import signal

log = logging.getLogger(__name__)

EXIT_PREEMPTED = 143  # 128 + SIGTERM: PyTorchJob restartPolicy ExitCode retries 128-255


class PreemptionFlag:
    def __init__(self):
        self.signal_name: str | None = None

    def install(self) -> "PreemptionFlag":
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name
            log.warning("received %s: will checkpoint at the next step boundary and exit %d",
                        self.signal_name, EXIT_PREEMPTED)

    @property
    def raised(self) -> bool:
        return self.signal_name is not None


def report_exit(rank: int, reason: str, step: int) -> None:
    """Tells the launcher (trainer.launch) why this rank ended, since torchrun's own exit
    code does not say it (it exits 1 after a forwarded SIGTERM even when workers exit 0)."""
    status_dir = os.environ.get("TRAINER_EXIT_STATUS_DIR")
    if not status_dir:
        return
    os.makedirs(status_dir, exist_ok=True)
    with open(os.path.join(status_dir, f"rank-{rank}.json"), "w") as f:
        json.dump({"reason": reason, "step": step}, f)
