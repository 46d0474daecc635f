"""Files that survive a crash or a power loss: written, fsynced, renamed into place; a file's
SHA-256. Torch-free; shared by the checkpointer (trainer/checkpoint/), the checkpoint trust check
(trainer/trust.py) and dataset uploads (jobs/data.py). The names of the checkpoint layout (the
completion marker among them) are trainer/contract/layout.py's."""
from __future__ import annotations

import hashlib
import json
import os

_HASH_CHUNK_BYTES = 8 << 20


def write_json_atomic(path: str, payload: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")  # the rename itself must survive a power loss


def fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(files) -> None:
    """(path, bytes) pairs, each written and fsynced."""
    for path, data in files:
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def fsync_dir(path: str) -> None:
    try:
        fsync_file(path)
    except OSError:  # some file systems refuse fsync on a directory; the rename is still atomic
        pass


def sha256_file(path: "str | os.PathLike[str]") -> str:
    """The file's SHA-256, hex, read in 8 MiB chunks (multi-GB shards never sit in memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
