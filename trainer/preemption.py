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
import time

log = logging.getLogger(__name__)

EXIT_PREEMPTED = 143  # 128 + SIGTERM: PyTorchJob restartPolicy ExitCode retries 128-255


class PreemptionFlag:
    def __init__(self):
        self.signal_name: str | None = None
        self.raised_at: float | None = None  # time.monotonic() of the first signal

    def install(self) -> "PreemptionFlag":
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name
            self.raised_at = time.monotonic()
            # "try": after a peer died, torchrun signals the survivors too, and their save
            # cannot complete without it (the launcher then reports the peer's death).
            log.warning("received %s: will try to checkpoint at the next step boundary and exit %d",
                        self.signal_name, EXIT_PREEMPTED)

    def seconds_since(self) -> float:
        return time.monotonic() - self.raised_at if self.raised_at is not None else 0.0

    @property
    def raised(self) -> bool:
        return self.signal_name is not None


def preemption_budget_seconds() -> float:
    """Seconds from the signal until torchrun SIGKILLs the workers (its shutdown timeout,
    `TORCH_ELASTIC_SHUTDOWN_TIMEOUT`, which trainer.launch sets; torchrun's default is 30)."""
    try:
        return float(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30"))
    except ValueError:
        return 30.0


def report_exit(rank: int, reason: str, step: int, **details) -> None:
    """Tells the launcher (trainer.launch) why this rank ended, since torchrun's own exit
    code does not say it (it exits 1 after a forwarded SIGTERM even when workers exit 0).
    `reason` is running (written at start: a rank killed outright never replaces it),
    completed, preempted or failed. Written atomically (temporary file, then rename), so
    the launcher never reads half a report."""
    status_dir = os.environ.get("TRAINER_EXIT_STATUS_DIR")
    if not status_dir:
        return
    os.makedirs(status_dir, exist_ok=True)
    payload = {"reason": reason, "step": step, "pid": os.getpid(), "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
               "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")), **details}
    path = os.path.join(status_dir, f"rank-{rank}.json")
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, path)


def is_peer_lost(exc: BaseException) -> bool:
    """A collective failed because another rank is gone: a consequence, not a root cause."""
    import torch.distributed as dist

    if isinstance(exc, (dist.DistNetworkError, dist.DistBackendError, dist.DistStoreError)):
        return True
    text = str(exc)
    # gloo raises a plain RuntimeError for a peer that closed its connection (torch 2.13).
    return any(s in text for s in ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                                   "Connection refused", "Timed out waiting", "timed out connecting"))
