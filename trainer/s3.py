"""Optional mirror of complete checkpoints to S3 (boto3), marker uploaded last.

The mirror follows the local directory: a checkpoint pruned by retention is deleted from
S3 too (its marker first, so an S3 marker, like a local one, always means a whole
checkpoint); a rollback deletes the abandoned checkpoints' S3 copies (FSx keeps them under
`abandoned/`), so a lost volume never restores the abandoned branch; a directory pruned before
its queued upload started is skipped; and on
shutdown the mirror waits only as long as the caller's budget allows (the FSx copy is the
durable one; S3 is the copy for a lost volume)."""
from __future__ import annotations

import json
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from urllib.parse import urlparse

log = logging.getLogger(__name__)


class _Stopped(Exception):
    """The shutdown budget is spent: stop uploading."""


class NoMirror:
    def upload(self, path: str) -> None:
        pass

    def prune(self, steps: list[int]) -> None:
        pass

    def ensure(self, path: str) -> None:
        pass

    def download_latest(self, root: str) -> None:
        pass

    def close(self, budget_seconds: float | None = None) -> None:
        pass


class S3Mirror:
    def __init__(self, uri: str, client=None):
        import boto3

        parsed = urlparse(uri)
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        self.client = client or boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL_S3") or None)
        # One upload at a time, off the training thread: the FSx copy is already durable.
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="s3-mirror")
        self.futures: list[Future] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def upload(self, path: str) -> None:
        self.futures.append(self.pool.submit(self._upload, path))

    def _upload(self, path: str) -> None:
        from trainer.contract.layout import MARKER

        name = os.path.basename(path.rstrip("/"))
        try:
            files = sorted(f for f in os.listdir(path) if f != MARKER)
            # A re-used name (a rollback's new branch, a re-save): the old S3 marker must not
            # stand over a mix of old and new files while (or if only partly) this uploads.
            self.client.delete_object(Bucket=self.bucket, Key=self._key(name, MARKER))
            for f in files + [MARKER]:  # marker last: a partial upload never looks complete
                if self.stopping.is_set():
                    raise _Stopped()
                # The callback runs per transferred chunk: the shutdown budget also stops a
                # large file already uploading (boto3 aborts the multipart upload).
                self.client.upload_file(os.path.join(path, f), self.bucket, self._key(name, f),
                                        Callback=self._check_stopping)
        except _Stopped:
            log.warning("S3 mirror of %s abandoned at shutdown (no marker uploaded)", name)
        except FileNotFoundError:
            # Retention removed it while the upload was queued: a newer checkpoint exists.
            log.info("S3 mirror of %s skipped: pruned locally before its upload finished", name)
            self._delete(name)
        except Exception as exc:  # the local checkpoint is what resume relies on first
            log.warning("S3 mirror of %s failed: %s", path, exc)

    def _check_stopping(self, _bytes: int) -> None:
        if self.stopping.is_set():
            raise _Stopped()

    def ensure(self, path: str) -> None:
        """Uploads `path` unless S3 already has this very checkpoint: its marker with the same
        content (step, save time, config hash). A marker of the same name from another branch
        (before a rollback) or an upload a shutdown cut short does not count."""
        from trainer.contract.layout import MARKER

        name = os.path.basename(path.rstrip("/"))
        try:
            with open(os.path.join(path, MARKER)) as f:
                local = json.load(f)
            remote = json.loads(self.client.get_object(Bucket=self.bucket, Key=self._key(name, MARKER))["Body"].read())
            same = all(local.get(k) == remote.get(k) for k in ("step", "saved_at", "config_hash"))
        except Exception:
            same = False
        if not same:
            self.upload(path)

    def prune(self, steps: list[int]) -> None:
        """Deletes pruned checkpoints from S3, in upload order (after any queued upload)."""
        from trainer.checkpoint.layout import step_dir

        for step in steps:
            self.futures.append(self.pool.submit(self._delete, os.path.basename(step_dir("", step))))

    def _delete(self, name: str) -> None:
        from trainer.contract.layout import MARKER

        try:
            marker = self._key(name, MARKER)
            self.client.delete_object(Bucket=self.bucket, Key=marker)  # the marker first
            keys = []
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                               Prefix=self._key(name) + "/"):
                keys += [{"Key": o["Key"]} for o in page.get("Contents", []) if o["Key"] != marker]
            for i in range(0, len(keys), 1000):
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys[i:i + 1000], "Quiet": True})
        except Exception as exc:
            log.warning("S3 delete of %s failed: %s", name, exc)

    def download_latest(self, root: str) -> None:
        from trainer.contract.layout import MARKER, STEP_DIR

        paginator = self.client.get_paginator("list_objects_v2")
        complete = []
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key("")):
            for obj in page.get("Contents", []):
                parts = obj["Key"].split("/")
                if parts[-1] == MARKER and STEP_DIR.match(parts[-2]):
                    complete.append(parts[-2])
        if not complete:
            return
        newest = max(complete, key=lambda n: int(STEP_DIR.match(n).group(1)))
        local = os.path.join(root, newest)
        os.makedirs(local, exist_ok=True)
        keys = []
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(newest) + "/"):
            keys += [o["Key"] for o in page.get("Contents", [])]
        for key in sorted(keys, key=lambda k: k.endswith(MARKER)):  # marker last here too
            self.client.download_file(self.bucket, key, os.path.join(local, key.rsplit("/", 1)[-1]))
        log.info("restored %s from s3://%s/%s", newest, self.bucket, self._key(newest))

    def close(self, budget_seconds: float | None = None) -> None:
        """Waits for queued uploads and deletions, at most `budget_seconds` (None: all).
        Past the budget, queued work is dropped and a running upload stops before its
        marker: the checkpoint stays on FSx and the next attempt mirrors again."""
        done, not_done = wait(self.futures, timeout=budget_seconds)
        if not_done:
            self.stopping.set()
            for f in not_done:
                f.cancel()
            log.warning("S3 mirror: %d queued upload(s)/deletion(s) dropped at shutdown after %.0f s",
                        len(not_done), budget_seconds or 0)
        self.pool.shutdown(wait=not not_done, cancel_futures=True)


def mirror_for(uri: str | None):
    return S3Mirror(uri) if uri else NoMirror()
