"""Optional mirror of complete checkpoints to S3 (boto3), marker uploaded last."""
from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from urllib.parse import urlparse

log = logging.getLogger(__name__)


class NoMirror:
    def upload(self, path: str) -> None:
        pass

    def download_latest(self, root: str) -> None:
        pass

    def close(self) -> None:
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

    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def upload(self, path: str) -> None:
        self.futures.append(self.pool.submit(self._upload, path))

    def _upload(self, path: str) -> None:
        from trainer.checkpoint import MARKER

        name = os.path.basename(path.rstrip("/"))
        files = sorted(f for f in os.listdir(path) if f != MARKER)
        try:
            for f in files + [MARKER]:  # marker last: a partial upload never looks complete
                self.client.upload_file(os.path.join(path, f), self.bucket, self._key(name, f))
        except Exception as exc:  # the local checkpoint is what resume relies on first
            log.warning("S3 mirror of %s failed: %s", path, exc)

    def download_latest(self, root: str) -> None:
        from trainer.checkpoint import MARKER, STEP_DIR

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

    def close(self) -> None:
        for f in self.futures:
            f.result()
        self.pool.shutdown()


def mirror_for(uri: str | None):
    return S3Mirror(uri) if uri else NoMirror()
