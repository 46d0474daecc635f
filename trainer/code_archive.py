"""Your code archive in the pod: download, verify its SHA-256 against the pin, unpack.

The launcher (trainer/launch.py) calls ``materialize`` before torchrun starts whenever the pod
names an archive (``MLP_CODE_URI``, ``MLP_CODE_SHA256``, ``MLP_CODE_DIR``; rendered by
workloads/owncode.py from the job spec's ``code:``). The digest is checked on the bytes that
were downloaded, before a single member is unpacked: an archive replaced in the bucket after
submit (the team's pods may write their prefix) is refused, never run. A refusal is a
permanent failure (exit 2): retrying would fetch the same wrong bytes.

Unpacking refuses members that would land outside the directory (absolute paths, ``..``,
links, devices): ``tarfile``'s "data" filter (Python docs, tarfile "Extraction filters").
"""
from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
import tempfile
from urllib.parse import urlparse

from trainer.contract.environment import ENV_CODE_DIR as ENV_DIR, ENV_CODE_SHA256 as ENV_SHA256, ENV_CODE_URI as ENV_URI


class CodeArchiveError(RuntimeError):
    pass


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def download(uri: str, *, s3_client=None) -> bytes:
    """The archive's bytes: ``s3://bucket/key`` (the pod's role), or ``file://`` (local runs)."""
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        if s3_client is None:
            import boto3

            s3_client = boto3.client("s3")
        try:
            return s3_client.get_object(Bucket=parsed.netloc, Key=parsed.path.lstrip("/"))["Body"].read()
        except Exception as exc:  # botocore's ClientError and friends, without importing botocore here
            raise CodeArchiveError(f"cannot download {uri}: {exc}") from None
    if parsed.scheme == "file":
        try:
            with open(parsed.path, "rb") as f:
                return f.read()
        except OSError as exc:
            raise CodeArchiveError(f"cannot read {uri}: {exc}") from None
    raise CodeArchiveError(f"{uri}: not an s3:// or file:// URI")


def verify(data: bytes, expected_sha256: str, uri: str) -> None:
    actual = sha256_hex(data)
    if actual != expected_sha256.lower():
        raise CodeArchiveError(f"{uri} has SHA-256 {actual}, not the pinned {expected_sha256}: the archive changed "
                               "after submit; refusing to run it (submit again to pin the new code)")


def unpack(data: bytes, dest: str) -> None:
    """Into ``dest`` (emptied first), through a temporary sibling renamed into place."""
    os.makedirs(os.path.dirname(os.path.abspath(dest)) or ".", exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".code-", dir=os.path.dirname(os.path.abspath(dest)))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            tar.extractall(staging, filter="data")
    except (tarfile.TarError, OSError) as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise CodeArchiveError(f"cannot unpack the code archive: {exc}") from None
    if os.path.isdir(dest):
        # The emptyDir's mount point itself cannot be renamed over: move the members in.
        for name in os.listdir(dest):
            target = os.path.join(dest, name)
            shutil.rmtree(target) if os.path.isdir(target) and not os.path.islink(target) else os.remove(target)
        for name in os.listdir(staging):
            os.replace(os.path.join(staging, name), os.path.join(dest, name))
        os.rmdir(staging)
    else:
        os.replace(staging, dest)


def materialize(environ=None, *, s3_client=None) -> str | None:
    """The directory the code was unpacked into, or None when the pod names no archive."""
    env = os.environ if environ is None else environ
    uri = env.get(ENV_URI)
    if not uri:
        return None
    expected, dest = env.get(ENV_SHA256, ""), env.get(ENV_DIR, "")
    if not expected or not dest:
        raise CodeArchiveError(f"{ENV_URI} is set but {ENV_SHA256} or {ENV_DIR} is not: an archive is run only pinned")
    data = download(uri, s3_client=s3_client)
    verify(data, expected, uri)
    unpack(data, dest)
    return dest
