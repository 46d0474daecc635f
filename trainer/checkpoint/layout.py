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


def rename_away(root: str, step: int) -> str | None:
    """The first half of deleting a checkpoint: its directory renamed to a trash name (one
    atomic step: no kill can leave a marker without its shards). Returns the trash path, or
    None when the directory is already gone."""
    path = step_dir(root, step)
    trash = os.path.join(root, f"{TRASH_PREFIX}{os.path.basename(path)}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return None
    return trash


def remove_checkpoint(root: str, step: int) -> None:
    """Deletes a checkpoint: renamed away first, then its files removed."""
    trash = rename_away(root, step)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


def sweep_trash(root: str) -> None:
    """Removes what a kill left of earlier deletions."""
    for name in os.listdir(root):
        if name.startswith(TRASH_PREFIX):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
