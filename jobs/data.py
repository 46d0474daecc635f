"""`python -m workloads data upload DIR --dataset NAME --team T --stack S`: a directory becomes a
dataset version that jobs read on FSx.

Where it goes: ``s3://<datasets bucket>/<namespace>/<dataset>/<version>/``. The file system's
``/datasets`` data repository association links that bucket (Pulumi.*.yaml
``datasets.fsx.dataRepositoryAssociations``, importEvents NEW/CHANGED/DELETED: FSx imports new
objects' metadata automatically, "Automatically import updates from your S3 bucket", FSx for
Lustre User Guide), so the files appear at ``/fsx/datasets/<namespace>/<dataset>/<version>``,
which every team pod mounts read-only (workloads/fsx.py) and the job spec's ``dataset`` takes.

The version is the content digest: SHA-256 over every file's relative path and SHA-256, so the
same bytes are the same version (an upload of them again sends nothing) and the pods' lineage
(``DATASET_VERSION``, the path's last part) names exactly what was trained on. A manifest of every
file and its digest goes last: its presence marks the version complete.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from trainer.durable import sha256_file
from workloads.fsx import DATASETS_DIR, FSX_MOUNT_PATH
from workloads.problems import InvalidInputError, Problem
from workloads.scheduling import team_namespace

MANIFEST = "_dataset.json"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9._]{0,61}[a-z0-9])?$")


class DataUploadError(InvalidInputError):
    """Every problem of one upload request."""


@dataclass(frozen=True)
class UploadResult:
    dataset: str
    version: str
    files: int
    bytes: int
    s3_uri: str
    fsx_path: str
    uploaded: bool  # False: this version was already complete in the bucket


def dataset_files(root: Path) -> list[Path]:
    """Regular files under ``root``, sorted; symbolic links are not followed (they could point
    outside the directory the user named)."""
    out = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs.sort()
        out += [Path(folder, f) for f in sorted(files) if Path(folder, f).is_file() and not Path(folder, f).is_symlink()]
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def content_version(root: Path, files: list[Path]) -> tuple[str, dict[str, str]]:
    """("sha256-<16 hex>", {relative path: sha256}): the version names the content."""
    digests = {p.relative_to(root).as_posix(): sha256_file(p) for p in files}
    whole = hashlib.sha256("".join(f"{rel}\0{d}\n" for rel, d in sorted(digests.items())).encode()).hexdigest()
    return f"sha256-{whole[:16]}", digests


def upload_problems(directory: str, dataset: str, team: str, facts: Any) -> list[Problem]:
    problems = []
    path = Path(directory)
    if not path.exists():
        problems.append(Problem("DIR", directory, "does not exist", "give the directory that holds the dataset's files"))
    elif not path.is_dir():
        problems.append(Problem("DIR", directory, "is not a directory", "give a directory (its files become the dataset)"))
    elif not dataset_files(path):
        problems.append(Problem("DIR", directory, "holds no regular file", "put the dataset's files in it"))
    if not _NAME.match(dataset or ""):
        problems.append(Problem("--dataset", dataset, "is not a dataset name",
                                "use lowercase letters, digits, '-', '.', '_' (at most 63), e.g. tinystories-gpt2"))
    if facts is not None and facts.team(team) is None:
        problems.append(Problem("--team", team, f"is not a team of stack {facts.stack}",
                                f"use one of {[t.name for t in facts.teams]}"))
    return problems


class _Progress:
    """tqdm when installed (the trainer's extra brings it), else a percentage line."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled, self._bar, self._shown = total, 0, enabled, None, -1
        if enabled:
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, unit="B", unit_scale=True, desc="upload", file=sys.stderr)
            except ImportError:
                self._bar = None

    def __call__(self, amount: int) -> None:
        self.done += amount
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(amount)
            return
        percent = int(100 * self.done / max(1, self.total))
        if percent // 10 != self._shown // 10 or self.done >= self.total:
            self._shown = percent
            print(f"upload: {percent}% ({self.done:,} of {self.total:,} bytes)", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def datasets_bucket(stack: str, *, use_outputs: bool = True) -> Optional[str]:
    """The stack's datasets bucket: the deployed name from `pulumi stack output`, else None."""
    from jobs.facts import stack_outputs

    outputs = stack_outputs(stack) if use_outputs else None
    return (outputs or {}).get("datasetsBucket")


def upload_dataset(directory: str, *, dataset: str, team: str, facts: Any = None, bucket: Optional[str] = None,
                   client: Any = None, progress: bool = True, use_outputs: bool = True) -> UploadResult:
    problems = upload_problems(directory, dataset, team, facts)
    if bucket is None and facts is not None:
        bucket = datasets_bucket(facts.stack, use_outputs=use_outputs)
        if bucket is None:
            problems.append(Problem("--stack", facts.stack, "the datasets bucket's deployed name is not readable "
                                    "(`pulumi stack output datasetsBucket` failed)",
                                    "log in to the stack's Pulumi backend, or pass the bucket to upload_dataset()"))
    if problems:
        raise DataUploadError(f"data upload {directory}", problems)
    if client is None:
        import boto3

        client = boto3.client("s3", region_name=getattr(facts, "region", None))
    root = Path(directory)
    files = dataset_files(root)
    version, digests = content_version(root, files)
    namespace = team_namespace(team)
    prefix = f"{namespace}/{dataset}/{version}/"
    fsx_path = f"{FSX_MOUNT_PATH}/{DATASETS_DIR}/{prefix.rstrip('/')}"
    total = sum(p.stat().st_size for p in files)
    result = UploadResult(dataset, version, len(files), total, f"s3://{bucket}/{prefix}", fsx_path, True)
    if _complete(client, bucket, prefix, version):
        return UploadResult(**{**result.__dict__, "uploaded": False})
    bar = _Progress(total, progress)
    try:
        for path in files:
            rel = path.relative_to(root).as_posix()
            client.upload_file(str(path), bucket, prefix + rel, Callback=bar,
                               ExtraArgs={"Metadata": {"sha256": digests[rel]}})
    finally:
        bar.close()
    manifest = {"dataset": dataset, "version": version, "team": team, "files": digests, "bytes": total}
    client.put_object(Bucket=bucket, Key=prefix + MANIFEST, Body=json.dumps(manifest, indent=1, sort_keys=True).encode(),
                      ContentType="application/json")
    return result


def _complete(client: Any, bucket: str, prefix: str, version: str) -> bool:
    from botocore.exceptions import ClientError

    try:
        body = client.get_object(Bucket=bucket, Key=prefix + MANIFEST)["Body"].read()
    except ClientError:
        return False
    try:
        return json.loads(body).get("version") == version
    except ValueError:
        return False
