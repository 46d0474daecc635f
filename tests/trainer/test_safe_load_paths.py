"""A checkpoint's ``.metadata`` naming shard files outside its own step directory, from the
attacker's seat: the author of a checkpoint cannot read another directory, the reader (an export,
an evaluation, the operator's verification) can, and DCP's reader opens
``concat_path(step_dir, relative_path)`` (torch 2.13 filesystem.py ``read_data``). The attack
rewrites the metadata's ``_StorageInfo.relative_path`` to ``../<other step>/__0_0.distcp``; the
restricted unpickler admits ``_StorageInfo`` (it is data), so the path check refuses it."""
from __future__ import annotations

import dataclasses
import os
import pickle
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed.checkpoint as dcp  # noqa: E402

from trainer import safe_load  # noqa: E402


def _save(step: Path, value: float) -> None:
    dcp.save({"app": {"model": {"w": torch.full((4,), value)}}}, checkpoint_id=str(step), no_dist=True)


@pytest.fixture
def two_checkpoints(tmp_path):
    other, own = tmp_path / "other-team" / "job" / "step-000100", tmp_path / "team-a" / "job" / "step-000100"
    _save(other, 7.0)
    _save(own, 1.0)
    return other, own


def _point_shards_at(own: Path, target: str) -> None:
    metadata = safe_load.read_metadata(str(own))
    metadata.storage_data = {index: dataclasses.replace(info, relative_path=target)
                             for index, info in metadata.storage_data.items()}
    metadata.storage_meta = None
    with open(own / safe_load.METADATA_FILE, "wb") as f:
        pickle.dump(metadata, f)


@pytest.mark.parametrize("how", ["relative", "absolute"])
def test_metadata_pointing_at_another_directorys_shards_is_refused(two_checkpoints, how):
    other, own = two_checkpoints
    shard = other / "__0_0.distcp"
    assert shard.is_file()
    _point_shards_at(own, os.path.relpath(shard, own) if how == "relative" else str(shard))
    state = {"app": {"model": {"w": torch.zeros(4)}}}
    with pytest.raises(safe_load.ForbiddenPickle, match="outside the step directory"):
        safe_load.load(state, str(own), no_dist=True)
    assert torch.equal(state["app"]["model"]["w"], torch.zeros(4)), "another directory's weights were read"


def test_an_untouched_checkpoint_still_loads(two_checkpoints):
    _, own = two_checkpoints
    state = {"app": {"model": {"w": torch.zeros(4)}}}
    safe_load.load(state, str(own), no_dist=True)
    assert torch.equal(state["app"]["model"]["w"], torch.full((4,), 1.0))
