"""Where a job's checkpoints and attempt history can be read from outside the cluster.

A job writes both to its checkpoint directory on FSx (``/fsx/checkpoints/<namespace>/<job>``):
complete steps (``step-NNNNNN/complete.json``) and one JSON line per attempt per node
(``attempts/node-<rank>.jsonl``): the layout of trainer/contract/layout.py. The file system's
``/checkpoints`` data repository association exports that tree to the checkpoints bucket
(Pulumi.*.yaml ``datasets.fsx.dataRepositoryAssociations``; FSx auto-export of NEW/CHANGED/
DELETED), so ``/fsx/checkpoints/<rest>`` is ``s3://<checkpoints bucket>/<rest>``: the team's
prefix (components.training.team_checkpoint_prefix). ``S3Store`` reads it there; ``LocalStore``
reads a directory (a ``submit --local`` work directory, or a mounted file system).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Optional, Protocol

from trainer.contract.layout import ATTEMPTS_DIR, ATTEMPTS_FILE, MARKER, STEP_DIR, complete_steps, step_dir_name
from workloads.fsx import CHECKPOINTS_DIR, FSX_MOUNT_PATH

_FSX_CHECKPOINTS = f"{FSX_MOUNT_PATH}/{CHECKPOINTS_DIR}/"


class StoreError(RuntimeError):
    """The store cannot be read (credentials, bucket, path): one line for the user."""


@dataclass(frozen=True)
class AttemptRecord:
    node_rank: int
    exit_code: int
    step_at_start: Optional[int]
    step_at_end: Optional[int]
    started_at: Optional[float]
    ended_at: Optional[float]


class CheckpointStore(Protocol):
    def uri(self, checkpoint_dir: str, step: Optional[int] = None) -> str: ...

    def complete_steps(self, checkpoint_dir: str) -> list[int]: ...

    def attempts(self, checkpoint_dir: str) -> list[AttemptRecord]: ...


def _parse_attempts(node_rank: int, text: str) -> list[AttemptRecord]:
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:  # a line cut by a kill mid-write (trainer.retries reads past it too)
            continue
        if isinstance(row, dict) and isinstance(row.get("exit_code"), int):
            rows.append(AttemptRecord(node_rank, row["exit_code"], row.get("checkpoint_step_at_start"),
                                      row.get("checkpoint_step_at_end"), row.get("started_at"), row.get("ended_at")))
    return rows


class LocalStore:
    """A directory tree laid out like /fsx/checkpoints (``root`` stands in for it)."""

    def __init__(self, root: Optional[str] = None):
        self.root = root

    def _path(self, checkpoint_dir: str) -> str:
        if self.root and checkpoint_dir.startswith(_FSX_CHECKPOINTS):
            return os.path.join(self.root, checkpoint_dir[len(_FSX_CHECKPOINTS):])
        return checkpoint_dir

    def uri(self, checkpoint_dir, step=None):
        path = self._path(checkpoint_dir)
        return os.path.join(path, step_dir_name(step)) if step is not None else path

    def complete_steps(self, checkpoint_dir):
        return complete_steps(self._path(checkpoint_dir))

    def attempts(self, checkpoint_dir):
        folder = os.path.join(self._path(checkpoint_dir), ATTEMPTS_DIR)
        rows: list[AttemptRecord] = []
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            if m := ATTEMPTS_FILE.match(name):
                with open(os.path.join(folder, name)) as f:
                    rows += _parse_attempts(int(m.group(1)), f.read())
        return rows


# Where a checkpoint directory is in the checkpoints bucket:
# - EXPORT (FSx for Lustre): the /checkpoints data repository association exports
#   /fsx/checkpoints/<rest> to <rest>, attempt history included;
# - MIRROR (EFS, datasets storage s3-mountpoint): nothing is exported; only a job with
#   `s3Mirror: true` copies its complete steps, to <namespace>/mirror/<job>/ (trainer/s3.py, the
#   prefix workloads/trainingjob.py gives TRAINER_CHECKPOINT_S3_URI); the attempt history stays on EFS.
EXPORT = "export"
MIRROR = "mirror"


class S3Store:
    """The checkpoints bucket: the file system's export of /fsx/checkpoints (``layout=EXPORT``)
    or, where checkpoints live on EFS, the jobs' S3 mirrors (``layout=MIRROR``)."""

    def __init__(self, bucket: str, *, region: Optional[str] = None, client: Any = None, layout: str = EXPORT,
                 file_system: str = "FSx for Lustre", placeholder: bool = False):
        """``placeholder``: the bucket name is the offline plan's, not the deployed one (said in errors)."""
        self.bucket = bucket
        self.placeholder = placeholder
        self._client = client
        self.region = region
        self.layout = layout
        self.file_system = file_system

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3

            self._client = boto3.client("s3", region_name=self.region)
        return self._client

    def prefix(self, checkpoint_dir: str) -> str:
        if not checkpoint_dir.startswith(_FSX_CHECKPOINTS):
            raise StoreError(f"checkpoint directory {checkpoint_dir} is not under {_FSX_CHECKPOINTS}: "
                             "it is not exported to the checkpoints bucket")
        rest = checkpoint_dir[len(_FSX_CHECKPOINTS):].strip("/")
        if self.layout == MIRROR:
            # <namespace>/.../<job> -> <namespace>/mirror/<job>/ (the job's own directory name).
            namespace, _, below = rest.partition("/")
            return f"{namespace}/mirror/{below.rsplit('/', 1)[-1]}/"
        return rest + "/"

    def uri(self, checkpoint_dir, step=None):
        return f"s3://{self.bucket}/{self.prefix(checkpoint_dir)}{step_dir_name(step) + '/' if step is not None else ''}"

    def _keys(self, prefix: str, delimiter: Optional[str] = None) -> tuple[list[str], list[str]]:
        from botocore.exceptions import BotoCoreError, ClientError

        keys, prefixes = [], []
        kwargs = {"Bucket": self.bucket, "Prefix": prefix, **({"Delimiter": delimiter} if delimiter else {})}
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(**kwargs):
                keys += [o["Key"] for o in page.get("Contents", [])]
                prefixes += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        except (BotoCoreError, ClientError) as exc:
            why = (" (the bucket name is the offline plan's placeholder: the deployed name was not readable from the "
                   "stack's outputs or the cluster)" if self.placeholder else "")
            raise StoreError(f"cannot list s3://{self.bucket}/{prefix}: {exc}{why}. Fix: log in to AWS with your team's "
                             "role (aws sso login, or export AWS_PROFILE=...) and reach the cluster") from None
        return keys, prefixes

    def complete_steps(self, checkpoint_dir):
        prefix = self.prefix(checkpoint_dir)
        _, step_prefixes = self._keys(prefix, "/")
        steps = []
        for sub in step_prefixes:
            m = STEP_DIR.match(sub[len(prefix):].strip("/"))
            if m and f"{sub}{MARKER}" in self._keys(f"{sub}{MARKER}")[0]:
                steps.append(int(m.group(1)))
        return sorted(steps)

    def attempts(self, checkpoint_dir):
        from botocore.exceptions import BotoCoreError, ClientError

        if self.layout == MIRROR:
            raise StoreError(f"the attempt history is on {self.file_system} (not exported to S3 on this stack); "
                             "read it in the cluster: `logs --all`, or the job's attempts/ directory")
        prefix = f"{self.prefix(checkpoint_dir)}{ATTEMPTS_DIR}/"
        rows: list[AttemptRecord] = []
        for key in sorted(self._keys(prefix)[0]):
            if m := ATTEMPTS_FILE.match(key[len(prefix):]):
                try:
                    body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read().decode()
                except (BotoCoreError, ClientError) as exc:
                    raise StoreError(f"cannot read s3://{self.bucket}/{key}: {exc}") from None
                rows += _parse_attempts(int(m.group(1)), body)
        return rows
