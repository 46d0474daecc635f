"""Where a run starts: the newest complete checkpoint, or an explicit one (a rollback, which
moves the newer history aside)."""
from __future__ import annotations

import json
import logging
import os
import time

import torch.distributed as dist

from trainer.branch import ROLLBACK, branch_name, continues_rollback
from trainer.checkpoint.layout import ABANDONED, MARKER, latest_complete, list_steps, read_marker, step_dir
from trainer.distributed import Env
from trainer.durable import write_json_atomic

log = logging.getLogger(__name__)


def _rollback(root: str, source: str, mirror) -> None:
    """Moves every checkpoint newer than `source` into `abandoned/<branch>/`: they belong
    to a history the job no longer follows, and `resume: auto` must never pick them. Their
    S3 copies are deleted (marker first), or a lost volume would restore the abandoned branch
    (`download_latest` takes the highest step in S3); the FSx copies stay for inspection."""
    source_step = read_marker(source)["step"]
    newer = [s for s in list_steps(root, complete_only=False) if s > source_step]
    name = branch_name(source_step, time.strftime('%Y%m%dT%H%M%S'))
    branch = os.path.join(root, ABANDONED, name)
    abandoned_rows = _archive_metrics(root, source_step, branch)
    if newer:
        os.makedirs(branch, exist_ok=True)
        for s in newer:
            os.rename(step_dir(root, s), os.path.join(branch, os.path.basename(step_dir(root, s))))
        log.warning("rollback to %s: %d newer checkpoint(s) (steps %s) moved to %s", source, len(newer),
                    ", ".join(map(str, newer)), branch)
        mirror.prune(newer)
    write_json_atomic(os.path.join(root, ROLLBACK), {
        "source": os.path.realpath(source), "source_step": source_step, "time": time.time(), "branch": name,
        "abandoned": os.path.relpath(branch, root) if newer or abandoned_rows else None, "abandoned_steps": newer,
        # The run the abandoned branch logged to: the new branch's MLflow run points back to it.
        "abandoned_mlflow_run_id": _newest_run_id(newer and os.path.join(branch, os.path.basename(step_dir(root, newer[-1]))))
        or read_marker(source).get("mlflow_run_id")})


def _newest_run_id(path) -> str | None:
    try:
        return read_marker(path).get("mlflow_run_id") if path else None
    except (OSError, ValueError):
        return None


def _archive_metrics(root: str, source_step: int, branch: str) -> int:
    """Copies the rows of `metrics.jsonl` past the branch point to `<branch>/metrics.jsonl`
    before the tracker truncates the file to the new branch: both histories stay comparable."""
    path = os.path.join(root, "metrics.jsonl")
    try:
        with open(path) as f:
            rows = [line for line in f if _row_step(line) is not None and _row_step(line) > source_step]
    except OSError:
        return 0
    if rows:
        os.makedirs(branch, exist_ok=True)
        tmp = os.path.join(branch, f"metrics.jsonl.tmp-{os.getpid()}")
        with open(tmp, "w") as f:
            f.writelines(rows)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(branch, "metrics.jsonl"))
    return len(rows)


def _row_step(line: str) -> int | None:
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row.get("step") if isinstance(row, dict) and isinstance(row.get("step"), int) else None


def _resolve_on_main(root: str, resume: str, mirror) -> str | None:
    if resume == "none":
        return None
    if resume != "auto":
        # Read first: a later attempt of the branch started by this rollback (the job spec
        # still names the old checkpoint) continues the branch, even when the source itself
        # is gone by now (without it the third attempt failed as bad input).
        record = continues_rollback(root, resume)
        if record:
            newest = latest_complete(root)
            if newest and read_marker(newest)["step"] >= record["source_step"]:
                return newest
            if os.path.isfile(os.path.join(resume, MARKER)):
                return resume
            raise FileNotFoundError(f"checkpoint.resume={resume!r}: the rollback source is gone and {root} holds no "
                                    f"checkpoint of its branch (step >= {record['source_step']}); use auto or another step")
        if not os.path.isfile(os.path.join(resume, MARKER)):
            raise FileNotFoundError(f"checkpoint.resume={resume!r} has no {MARKER}: not a complete checkpoint")
        _rollback(root, resume, mirror)
        return resume
    if latest_complete(root) is None:
        # A fresh FSx volume (or a lost one) falls back to the S3 copy.
        mirror.download_latest(root)
    return latest_complete(root)


def resolve_resume(root: str, resume: str, env: Env, mirror) -> str | None:
    """The checkpoint to start from, decided by rank 0 and the same on every rank.

    `auto`: the newest complete `step-N` in the directory (or in S3 when it has none).
    An explicit path is a rollback: checkpoints newer than it are moved to `abandoned/`
    (kept, never resumed automatically) and `rollback.json` records the branch point, so
    that a restarted attempt whose spec still names that path continues the new branch
    instead of rolling back again."""
    if not env.distributed:
        return _resolve_on_main(root, resume, mirror)
    box: list = [None]
    if env.is_main:
        try:
            box[0] = ("ok", _resolve_on_main(root, resume, mirror))
        except Exception as exc:  # every rank must leave the broadcast, then fail alike
            box[0] = ("error", f"{type(exc).__name__}: {exc}")
    dist.broadcast_object_list(box, src=0, group=env.checkpoint_group)
    status, value = box[0]
    if status == "error":
        raise RuntimeError(value)
    return value
