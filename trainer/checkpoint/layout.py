"""The checkpoint directory on disk: step directories, their markers, and deletion that no kill
can tear (rename away, then remove). The names are the platform's contract (trainer/contract/layout.py)."""
from __future__ import annotations

import json
import os
import shutil
import uuid

from trainer.contract.layout import ABANDONED, MARKER, OWNER, STEP_DIR, TRASH_PREFIX, step_dir_name  # noqa: F401 (re-exported)


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, step_dir_name(step))


def list_steps(root: str, complete_only: bool = True) -> list[int]:
    if not os.path.isdir(root):
        return []
    steps = []
    for name in os.listdir(root):
        match = STEP_DIR.match(name)
        if match and (not complete_only or os.path.isfile(os.path.join(root, name, MARKER))):
            steps.append(int(match.group(1)))
    return sorted(steps)


def latest_complete(root: str) -> str | None:
    steps = list_steps(root)
    return step_dir(root, steps[-1]) if steps else None


def read_marker(path: str) -> dict:
    with open(os.path.join(path, MARKER)) as f:
        return json.load(f)


def remove_checkpoint(root: str, step: int, faults=None) -> None:
    """Deletes a checkpoint so that no kill can leave a marker without its shards: the
    directory is renamed away first (atomic), then its files are removed."""
    path = step_dir(root, step)
    trash = os.path.join(root, f"{TRASH_PREFIX}{os.path.basename(path)}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return
    if faults is not None:
        faults.at("in_retention", step)
    shutil.rmtree(trash, ignore_errors=True)


def sweep_trash(root: str) -> None:
    """Removes what a kill left of earlier deletions."""
    for name in os.listdir(root):
        if name.startswith(TRASH_PREFIX):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
