"""The checkpoint directory layout: one on-disk contract with several readers, so its names live
here once. Torch-free (the job CLI and the launcher read it without torch).

Writers: the built-in trainer (trainer/checkpoint/) and your own code (trainer/contract/). Readers:
the launcher's retry bound (trainer/retries.py), the job CLI's store (jobs/store.py) and local
runs (jobs/local.py), the restore drill (trainer/verify.py), export and evaluation.

    <checkpoint dir>/
        step-000120/           one save; complete when MARKER exists in it
            complete.json      MARKER: written last and atomically (rank 0)
            manifest.json      MANIFEST: the SHA-256 of every file, signed (trainer/trust.py)
            rng-rank-<r>.pt    RNG_FILE_PREFIX: rank r's RNG states (built-in trainer)
        owner.json             OWNER: the attempt allowed to finalise, prune and roll back
        rollback.json          ROLLBACK: the branch point of the last rollback (trainer/branch.py)
        abandoned/<branch>/    ABANDONED: checkpoints of a history the job no longer follows
        attempts/node-<n>.jsonl  ATTEMPTS_DIR: each node's attempts (trainer/retries.py)
        .trash-*               TRASH_PREFIX: checkpoints being deleted
"""
from __future__ import annotations

import os
import re

STEP_DIR = re.compile(r"^step-(\d+)$")
# A step directory is complete when this file exists: written last, after every shard.
MARKER = "complete.json"
MANIFEST = "manifest.json"
RNG_FILE_PREFIX = "rng-rank-"
OWNER = "owner.json"
ROLLBACK = "rollback.json"
ABANDONED = "abandoned"
ATTEMPTS_DIR = "attempts"
TRASH_PREFIX = ".trash-"
# attempts/node-<n>.jsonl: one JSON line per attempt of node n.
ATTEMPTS_FILE = re.compile(r"^node-(\d+)\.jsonl$")


def step_dir_name(step: int) -> str:
    """`step-000120`: six digits at least, so a listing sorts by step up to a million."""
    return f"step-{step:06d}"


def step_of(name: str) -> int | None:
    """The step of a step directory's name, or None for any other name."""
    match = STEP_DIR.match(name)
    return int(match.group(1)) if match else None


def attempts_file_name(node_rank: int) -> str:
    return f"node-{node_rank}.jsonl"


def complete_steps(root: str) -> list[int]:
    """The steps under `root` whose directory holds the marker, ascending; [] when `root` is unreadable."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    return sorted(step for name in names
                  if (step := step_of(name)) is not None and os.path.isfile(os.path.join(root, name, MARKER)))
