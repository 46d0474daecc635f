"""Reading a DCP checkpoint without running anything it holds: the layer under trainer/trust.py.

The trust layer decides whose checkpoint may be read; this one makes reading it unable to run
code even when that decision is wrong (a key that leaked, a reader with more rights than the
writer). torch 2.13's DCP unpickles twice:
- `FileSystemReader.read_metadata` is `pickle.load(metadata_file)` of `.metadata`
  (`torch/distributed/checkpoint/filesystem.py`);
- `DefaultLoadPlanner.load_bytes` is `torch.load(value, weights_only=False)` of every non-tensor
  item (`default_planner.py`: the optimizer's param_groups, here).
Tensors are already read with `weights_only=True` (`FileSystemReader.read_data`).

Here `.metadata` goes through an unpickler that admits only the globals DCP's metadata holds, and
byte items through `torch.load(weights_only=True)`. The allowlist is what a tracing unpickler
found in this trainer's DDP and FSDP2 checkpoints (torch 2.13; tests/trainer/
test_checkpoint_operator_attacks.py reads real ones), plus every torch dtype (a checkpoint of
bf16 weights names torch.bfloat16). A global outside it is refused by name before anything is
called. Every reader of a checkpoint goes through `load` and `read_metadata` below.
"""
from __future__ import annotations

import io
import os
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from trainer.guards import TrainingStopped

METADATA_FILE = ".metadata"
_DCP_METADATA = "torch.distributed.checkpoint.metadata"
ALLOWED_GLOBALS = frozenset({
    (_DCP_METADATA, "Metadata"),
    (_DCP_METADATA, "StorageMeta"),
    (_DCP_METADATA, "MetadataIndex"),
    (_DCP_METADATA, "TensorStorageMetadata"),
    (_DCP_METADATA, "BytesStorageMetadata"),
    (_DCP_METADATA, "ChunkStorageMetadata"),
    (_DCP_METADATA, "TensorProperties"),
    # TensorProperties pickles its memory format as this enum and its layout by name
    # (metadata.py `TensorProperties.__getstate__`, torch.serialization `_get_layout`).
    (_DCP_METADATA, "_MEM_FORMAT_ENCODING"),
    ("torch.serialization", "_get_layout"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    # StorageMeta.checkpoint_id: the path the checkpoint was saved to.
    ("pathlib", "PosixPath"),
})


class ForbiddenPickle(TrainingStopped):
    """A checkpoint file asked for more than data: refused, nothing of it was run (exit 1)."""


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file, where: str):
        super().__init__(file)
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise ForbiddenPickle(
            f"{self.where}: refused: it names {module}.{name}, which is not one of the classes a DCP checkpoint's "
            "metadata holds (trainer/safe_load.py ALLOWED_GLOBALS). DCP did not write this file, or it was changed "
            "after the save; nothing in it was run.")


def restricted_load(file, where: str) -> Metadata:
    """DCP metadata from an open binary file, without calling anything outside the allowlist."""
    try:
        metadata = _MetadataUnpickler(file, where).load()
    except ForbiddenPickle:
        raise
    except Exception as exc:  # truncated or garbage bytes: report, never a traceback
        raise ForbiddenPickle(f"{where}: unreadable as DCP metadata ({type(exc).__name__}: {exc})") from None
    if not isinstance(metadata, Metadata):
        raise ForbiddenPickle(f"{where}: refused: it holds a {type(metadata).__name__}, not DCP's Metadata")
    return metadata


def check_storage_paths(metadata: Metadata, where: str) -> None:
    """Every shard file the metadata names is a plain file name in the step directory. DCP writes
    them so (torch 2.13 filesystem.py ``write_data``: ``f"{prefix}{count}{DEFAULT_SUFFIX}"``
    joined to the checkpoint path), and ``read_data`` opens ``concat_path(self.path,
    relative_path)``: a ``../`` or absolute path in a crafted ``.metadata`` would make the reader
    read another directory's shards with the reader's rights (another team's weights pulled into
    an export or an evaluation)."""
    for index, info in (metadata.storage_data or {}).items():
        relative = getattr(info, "relative_path", None)
        if not isinstance(relative, str) or relative in ("", ".", "..") or os.path.basename(relative) != relative \
                or "\\" in relative:
            raise ForbiddenPickle(
                f"{where}: refused: {getattr(index, 'fqn', index)} is stored at {relative!r}, outside the step directory "
                "(DCP names every shard file inside it); this metadata was not written by DCP or was changed after the save")


class SafeFileSystemReader(FileSystemReader):
    """DCP's file-system reader with `.metadata` read by the restricted unpickler and its shard
    paths held to the step directory. The body is torch 2.13's `FileSystemReader.read_metadata`
    with `pickle.load` replaced."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as metadata_file:
            metadata = restricted_load(metadata_file, str(path))
        check_storage_paths(metadata, str(path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner with byte items read as data only (`weights_only=True`): the
    trainer's own byte items are the optimizer's param_groups (numbers, booleans, None, tuples,
    lists of names), all of which the weights-only unpickler reads. The body is torch 2.13's
    `DefaultLoadPlanner.load_bytes` with `weights_only=True`."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise ForbiddenPickle(
                f"{fqn}: refused: a byte item of a checkpoint is read with torch.load(weights_only=True) only, and "
                f"this one asks for more ({str(exc).splitlines()[0][:300]}); nothing in it was run.") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


def read_metadata(path: str) -> Metadata:
    """The DCP metadata of the step directory `path`."""
    return SafeFileSystemReader(path).read_metadata()


def _forbidden(exc: BaseException) -> ForbiddenPickle | None:
    """DCP wraps a rank's exception in CheckpointException(failures={rank: exc}) (a
    BaseException): find ours in it."""
    if isinstance(exc, ForbiddenPickle):
        return exc
    for failure in (getattr(exc, "failures", None) or {}).values():
        inner = failure[0] if isinstance(failure, tuple) else getattr(failure, "exc", failure)
        if isinstance(inner, ForbiddenPickle):
            return inner
    cause = exc.__cause__ or exc.__context__
    return _forbidden(cause) if cause is not None and cause is not exc else None


def load(state_dict: dict, path: str, **kwargs: Any) -> None:
    """`dcp.load` of the step directory `path` through the restricted reader and planner.
    `kwargs`: dcp.load's process_group and no_dist."""
    import torch.distributed.checkpoint as dcp

    # DCP turns an exception of read_metadata into an AssertionError holding only its text
    # (state_dict_loader.py `local_step`): read it once here, so a refusal keeps its type.
    read_metadata(path)
    try:
        dcp.load(state_dict, checkpoint_id=path, storage_reader=SafeFileSystemReader(path),
                 planner=SafeLoadPlanner(), **kwargs)
    except BaseException as exc:
        refused = None if isinstance(exc, (KeyboardInterrupt, SystemExit)) else _forbidden(exc)
        if refused is not None:
            raise ForbiddenPickle(f"checkpoint {os.path.normpath(path)}: {refused}") from None
        raise
