"""Bounded retries, counted in the checkpoint directory.

The Training Operator never enforces `runPolicy.backoffLimit` under `restartPolicy: ExitCode`:
it deletes and recreates a pod that exited 128-255, and its limit counts container restarts,
which recreated pods never have (kubeflow/trainer issue 2045, "PytorchJob restartPolicy:
ExitCode does not honor backoffLimit for retryable errors"; `PastBackoffLimit` in
pkg/core/job.go, v1.9.4). A deterministic OOM kill (137) or segfault (139) would loop until
`activeDeadlineSeconds`. So each node's launcher records every attempt in
`<checkpoint.dir>/attempts/node-<r>.jsonl` (one JSON line per attempt: exit code, newest
complete checkpoint step at start and at the end) and refuses to start an attempt after
`checkpoint.max_attempts_without_progress` retryable failures in a row that produced no new
checkpoint: a permanent exit (1) with a message that says why.

What counts: exits 128-255 other than 143 (a preemption is the platform working as
intended, neither a failure nor progress). Any attempt that moved the newest checkpoint
forward resets the count, as does a finished or permanently failed attempt (a resubmission).
Each node reads only its own file: no two writers per file, and each node reaches the same
verdict about its own history; the job fails as soon as one node refuses.

Torch-free: the launcher imports it before torchrun starts.
"""
from __future__ import annotations

import json
import os
import signal
import time

from trainer.contract.layout import ATTEMPTS_DIR, attempts_file_name, complete_steps

EXIT_RETRIES_EXHAUSTED = 1  # permanent for restartPolicy ExitCode (1-127)
EXIT_PREEMPTED = 143


def newest_complete_step(checkpoint_dir: str) -> int | None:
    """The newest step directory with its marker (what the next attempt resumes from)."""
    return max(complete_steps(checkpoint_dir), default=None)


def history_path(checkpoint_dir: str, node_rank: int) -> str:
    return os.path.join(checkpoint_dir, ATTEMPTS_DIR, attempts_file_name(node_rank))


def read_history(path: str) -> list[dict]:
    rows = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:  # a line cut by a kill mid-write
                    continue
                if isinstance(row, dict) and isinstance(row.get("exit_code"), int):
                    rows.append(row)
    except OSError:
        pass
    return rows


def record_attempt(path: str, exit_code: int, step_at_start: int | None, step_at_end: int | None,
                   started_at: float) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    row = {"exit_code": exit_code, "checkpoint_step_at_start": step_at_start,
           "checkpoint_step_at_end": step_at_end, "started_at": started_at, "ended_at": time.time()}
    with open(path, "a") as f:  # one short line, one write: O_APPEND keeps lines whole
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _progressed(row: dict) -> bool:
    start, end = row.get("checkpoint_step_at_start"), row.get("checkpoint_step_at_end")
    return end is not None and (start is None or end > start)


def failures_without_progress(history: list[dict]) -> list[dict]:
    """The trailing retryable failures since the last attempt that made progress."""
    counted = []
    for row in reversed(history):
        code = row["exit_code"]
        if _progressed(row) or not 128 <= code <= 255:
            break
        if code != EXIT_PREEMPTED:
            counted.append(row)
    return counted[::-1]


def _describe(code: int) -> str:
    try:
        return f"{code} ({signal.Signals(code - 128).name})"
    except ValueError:
        return str(code)


def refusal(history: list[dict], limit: int, newest_step: int | None) -> str | None:
    """Why the next attempt must not start, or None."""
    counted = failures_without_progress(history)
    if limit <= 0 or len(counted) < limit:
        return None
    last = counted[-limit:]
    codes = sorted({row["exit_code"] for row in last})
    where = f"step {newest_step}" if newest_step is not None else "no checkpoint yet"
    if len(codes) == 1:
        what = f"the last {limit} attempts all ended {_describe(codes[0])} with the newest checkpoint still at {where}"
    else:
        what = (f"the last {limit} attempts ended {', '.join(_describe(r['exit_code']) for r in last)} "
                f"without a new checkpoint (newest: {where})")
    hint = ""
    if codes == [128 + signal.SIGKILL]:
        hint = " A SIGKILL that repeats at the same point is usually the OOM killer: check the pod's memory limit."
    return (f"retries exhausted: {what}; checkpoint.max_attempts_without_progress={limit}. A retry would fail "
            f"the same way.{hint} Fix the cause and resubmit (the job resumes from its newest checkpoint); "
            f"the history is in the checkpoint directory's attempts/.")
