"""torch.profiler trace of chosen steps (`profiler.start_step`, `profiler.num_steps`).

Each rank writes `<checkpoint.dir>/profile/step-<first>-<last>/rank-<r>.pt.trace.json`
(Chrome trace format: open in Perfetto, chrome://tracing or TensorBoard's profiler plugin);
rank 0 logs the directory to MLflow as the `profile` artifact at the end of the attempt.
Profiling starts at the top of the first chosen step and stops after the last one, so only
those steps are recorded; the first profiled step includes the profiler's own start-up.
"""
from __future__ import annotations

import logging
import os

import torch

from trainer.config import ProfilerConfig

log = logging.getLogger(__name__)


class NoProfiler:
    trace_dir: str | None = None

    def before_step(self, step: int) -> None:
        pass

    def after_step(self, step: int) -> None:
        pass

    def close(self) -> None:
        pass


class StepProfiler:
    def __init__(self, cfg: ProfilerConfig, root: str, rank: int, device: torch.device):
        self.first = cfg.start_step
        self.last = cfg.start_step + cfg.num_steps - 1
        self.cfg = cfg
        self.rank = rank
        self.trace_dir = os.path.join(root, "profile", f"step-{self.first:06d}-{self.last:06d}")
        self.activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            self.activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profile = None
        self.done = False

    def before_step(self, step: int) -> None:
        """`step` is the number the step about to run will have once finished (1-based)."""
        if step == self.first and self.profile is None and not self.done:
            self.profile = torch.profiler.profile(activities=self.activities, record_shapes=self.cfg.record_shapes,
                                                  profile_memory=self.cfg.profile_memory, with_stack=self.cfg.with_stack)
            self.profile.__enter__()

    def after_step(self, step: int) -> None:
        if self.profile is not None:
            self.profile.step()
            if step >= self.last:
                self._stop()

    def _stop(self) -> None:
        self.profile.__exit__(None, None, None)
        os.makedirs(self.trace_dir, exist_ok=True)
        path = os.path.join(self.trace_dir, f"rank-{self.rank}.pt.trace.json")
        self.profile.export_chrome_trace(path)
        self.profile = None
        self.done = True
        log.info("profiler trace of steps %d-%d written to %s", self.first, self.last, path)

    def close(self) -> None:
        if self.profile is not None:  # the run ended (or was preempted) inside the window
            self._stop()


def profiler_for(cfg: ProfilerConfig, root: str, rank: int, device: torch.device):
    return StepProfiler(cfg, root, rank, device) if cfg.start_step > 0 else NoProfiler()
