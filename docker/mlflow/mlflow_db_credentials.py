"""The server's database password, read from Secrets Manager when a connection opens.

Why not an ECS ``secrets`` entry: ECS resolves those once, at task start, so a rotated
password would break the running server until someone restarts it. Instead every
SQLAlchemy engine in the process (the tracking store's and the auth app's) gets a
``do_connect`` hook: it fills in the password for connections as ``MLFLOW_DB_USERNAME``
from a per-process cache and, when PostgreSQL rejects it (SQLSTATE 28P01), re-reads the
secret and retries: first ``AWSCURRENT`` (the rotation finished), then ``AWSPENDING``
(AWS's single-user rotation function has already changed the password in the database
but not yet promoted the new version). With ``NullPool`` each request opens its own
connection, so the first request after a rotation pays one extra Secrets Manager call.
SQLAlchemy: "do_connect" on the Engine class applies to every engine
(https://docs.sqlalchemy.org/en/20/core/events.html#sqlalchemy.events.DialectEvents.do_connect).

``sitecustomize.py`` installs the hook in every Python process of the server (uvicorn's
workers are separate interpreters) when ``MLFLOW_DB_SECRET_ID`` is set.
"""
from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Callable, Optional

AUTH_FAILED_SQLSTATE = "28P01"  # invalid_password
REFRESH_MIN_INTERVAL_SECONDS = 2.0  # a burst of failing requests triggers one re-read, not one each


class SecretPassword:
    """The current password of one secret, cached per process."""

    def __init__(self, secret_id: str, fetch: Optional[Callable[[str, str], Optional[str]]] = None):
        self.secret_id = secret_id
        self._fetch = fetch or _fetch_from_secrets_manager
        self._lock = threading.Lock()
        self._password: Optional[str] = None
        self._refreshed_at = 0.0

    def current(self) -> str:
        with self._lock:
            if self._password is None:
                self._password = self._required("AWSCURRENT")
                self._refreshed_at = time.monotonic()
            return self._password

    def candidates_after_failure(self, rejected: str) -> list[str]:
        """Passwords worth one more try after ``rejected`` failed, newest knowledge first."""
        with self._lock:
            if self._password != rejected and self._password is not None:
                return [self._password]  # another thread already refreshed
            if time.monotonic() - self._refreshed_at < REFRESH_MIN_INTERVAL_SECONDS and self._password is not None:
                return []
            self._refreshed_at = time.monotonic()
            found = []
            for stage in ("AWSCURRENT", "AWSPENDING"):
                value = self._fetch(self.secret_id, stage)
                if value is not None and value != rejected and value not in found:
                    found.append(value)
            return found

    def confirm(self, password: str) -> None:
        with self._lock:
            self._password = password

    def _required(self, stage: str) -> str:
        value = self._fetch(self.secret_id, stage)
        if value is None:
            raise RuntimeError(f"secret {self.secret_id} has no {stage} version with a 'password'")
        return value


def _fetch_from_secrets_manager(secret_id: str, stage: str) -> Optional[str]:
    import boto3
    from botocore.exceptions import ClientError

    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not region and secret_id.startswith("arn:"):
        region = secret_id.split(":")[3]
    client = boto3.client("secretsmanager", region_name=region)
    try:
        response = client.get_secret_value(SecretId=secret_id, VersionStage=stage)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "ResourceNotFoundException" and stage != "AWSCURRENT":
            return None  # no rotation in progress
        raise
    value = response.get("SecretString", "")
    try:
        return json.loads(value)["password"]
    except (ValueError, KeyError, TypeError):
        raise RuntimeError(f"secret {secret_id} ({stage}) is not JSON with a 'password' key") from None


def is_authentication_failure(error: BaseException) -> bool:
    if getattr(error, "sqlstate", None) == AUTH_FAILED_SQLSTATE:
        return True
    return "password authentication failed" in str(error)


def connect_hook(username: str, password: SecretPassword) -> Callable[..., Any]:
    def do_connect(dialect, conn_rec, cargs, cparams):
        if cparams.get("user") != username or cparams.get("password"):
            return None  # another user, or a URL with its own password: default behaviour
        tried = password.current()
        try:
            return dialect.connect(*cargs, **{**cparams, "password": tried})
        except dialect.loaded_dbapi.Error as error:
            if not is_authentication_failure(error):
                raise
            last = error
        for candidate in password.candidates_after_failure(tried):
            try:
                connection = dialect.connect(*cargs, **{**cparams, "password": candidate})
            except dialect.loaded_dbapi.Error as error:
                if not is_authentication_failure(error):
                    raise
                last = error
                continue
            password.confirm(candidate)
            return connection
        raise last

    return do_connect


def install(environ: Optional[dict] = None) -> bool:
    """Register the hook for ``MLFLOW_DB_USERNAME`` / ``MLFLOW_DB_SECRET_ID``; False if unset."""
    env = os.environ if environ is None else environ
    secret_id, username = env.get("MLFLOW_DB_SECRET_ID"), env.get("MLFLOW_DB_USERNAME")
    if not secret_id or not username:
        return False
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    event.listen(Engine, "do_connect", connect_hook(username, SecretPassword(secret_id)))
    return True
