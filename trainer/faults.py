"""Fault injection for the recovery tests and tools/fault_injection.py: a no-op object unless
`TRAINER_FAULTS` is set."""
from __future__ import annotations

import logging
import os
import signal
import time

from trainer.distributed import Env

log = logging.getLogger(__name__)


class NoFaults:
    def at(self, point: str, step: int) -> None:
        pass

    def in_save(self, step: int) -> None:
        pass

    def nonfinite(self, step: int) -> bool:
        return False

    def gpu_error(self, step: int) -> bool:
        return False


class Faults(NoFaults):
    """Test hook: `TRAINER_FAULTS="<point>@<step>[:<rank>|*][:<SIGNAL>|:SLEEP=<seconds>]; ..."`
    sends the signal (default SIGKILL) to this process when it reaches the point at that step,
    or holds it there that long (a slow export, a frozen loop). Points: `in_save` (shards
    written, marker not yet), `in_retention` (a checkpoint renamed away, its files not yet
    removed), `after_step` (the update applied, nothing logged), `export` (rank 0, the final
    checkpoint durable, before its export), `nonfinite` (that step's loss is made NaN, no
    signal) and `gpu_error` (a CUDA ECC error raised after the step). The fault-injection tests
    and `tools/fault_injection.py` drive it; unset, `NoFaults` is used and nothing is checked."""

    def __init__(self, spec: str, rank: int):
        self.rank = rank
        # With TRAINER_FAULTS_ONCE_DIR a fault fires once across restarts (torchrun
        # --max-restarts keeps the environment): a file there records that it fired.
        self.once_dir = os.environ.get("TRAINER_FAULTS_ONCE_DIR")
        self.rules: list[tuple[str, int, signal.Signals | float]] = []
        for item in filter(None, (x.strip() for x in spec.split(";"))):
            point, _, rest = item.partition("@")
            step, *more = rest.split(":")
            who = more[0] if more else "0"
            action = more[1] if len(more) > 1 else "KILL"
            if action.upper().startswith("SLEEP="):
                what: signal.Signals | float = float(action.partition("=")[2])
            else:
                what = signal.Signals["SIG" + action.upper().removeprefix("SIG")]
            if who in ("*", str(rank)):
                self.rules.append((point, int(step), what))

    def at(self, point: str, step: int) -> None:
        for p, s, what in self.rules:
            if p == point and s == step:
                if self.once_dir:
                    flag = os.path.join(self.once_dir, f"{point}-{step}-rank{self.rank}")
                    if os.path.exists(flag):
                        continue
                    os.makedirs(self.once_dir, exist_ok=True)
                    open(flag, "w").close()
                if isinstance(what, float):
                    log.warning("fault injection: holding %s of step %d for %.0f s", point, step, what)
                    time.sleep(what)
                    continue
                log.warning("fault injection: %s at %s of step %d", what.name, point, step)
                os.kill(os.getpid(), what)

    def in_save(self, step: int) -> None:
        self.at("in_save", step)

    def nonfinite(self, step: int) -> bool:
        return any(p == "nonfinite" and s == step for p, s, _ in self.rules)

    def gpu_error(self, step: int) -> bool:
        """`gpu_error@N`: after step N the rank raises what CUDA raises for an uncorrectable ECC error."""
        return any(p == "gpu_error" and s == step for p, s, _ in self.rules)


def fault_injector(env: Env):
    spec = os.environ.get("TRAINER_FAULTS", "")
    return Faults(spec, env.rank) if spec.strip(";") else NoFaults()
