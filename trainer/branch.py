"""`<checkpoint.dir>/rollback.json`: the branch point of a rollback (torch-free: preflight reads it).

A job spec whose `checkpoint.resume` names a step directory rolls the job back to it once;
`rollback.json` records that source. Every later attempt of the same spec (preemptions,
retries) continues the branch instead, even after retention or a lost volume removed the
source directory itself, and protects the source as the branch point.
"""
from __future__ import annotations

import json
import os

from trainer.contract.layout import ROLLBACK


def read_rollback(root: str) -> dict | None:
    try:
        with open(os.path.join(root, ROLLBACK)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("source_step"), int) else None


def continues_rollback(root: str, resume: str) -> dict | None:
    """The rollback record when `resume` is the source of the rollback this directory already made."""
    record = read_rollback(root)
    if record and resume not in ("auto", "none") and record.get("source") == os.path.realpath(resume):
        return record
    return None


MAIN_BRANCH = "main"


def branch_name(source_step: int, stamp: str) -> str:
    return f"from-step-{source_step:06d}-at-{stamp}"


def current_branch(root: str) -> str:
    """The branch the checkpoints written from now on belong to: the newest rollback's, or main."""
    record = read_rollback(root)
    if record is None:
        return MAIN_BRANCH
    return record.get("branch") or (record.get("abandoned") or "").split("/")[-1] or branch_name(record["source_step"], "")
