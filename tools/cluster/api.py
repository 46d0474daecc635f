"""A small Kubernetes API client for the harness (the standard library only), and the one way the
harness and the cluster tests wait: ``eventually``.

Requests go to the API server with the kubeconfig's identity (a client certificate or a bearer
token); ``watch`` streams the API server's watch events (``?watch=1``, one JSON object per line),
so stand-ins react to a change instead of polling with a kubectl process a second.
"""
from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, TypeVar

import yaml

T = TypeVar("T")


class ApiError(RuntimeError):
    def __init__(self, status: int, reason: str, body: str, what: str):
        self.status, self.reason, self.body = status, reason, body
        try:
            message = json.loads(body).get("message", body)
        except ValueError:
            message = body
        super().__init__(f"{what}: {status} {reason}: {message}")


class EventuallyTimeout(AssertionError, TimeoutError):
    """``eventually`` gave up: an assertion failure in a test, a TimeoutError to the harness."""


def eventually(predicate: Callable[[], T], what: str, timeout_s: float = 60.0, interval_s: float = 0.5,
               diagnose: Optional[Callable[[], str]] = None) -> T:
    """Call ``predicate`` until it returns something truthy and return that; after ``timeout_s``
    raise with ``what`` and, when given, ``diagnose()`` (the state that explains the wait)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = ""
            if diagnose is not None:
                try:
                    detail = "\n" + diagnose()
                except Exception as exc:  # noqa: BLE001 - the timeout is the error to report
                    detail = f"\n(diagnosis failed: {exc})"
            raise EventuallyTimeout(f"timed out after {timeout_s:.0f} s: {what}{detail}")
        time.sleep(interval_s)


@dataclass(frozen=True)
class Credentials:
    server: str
    ca_file: str
    cert_file: Optional[str] = None
    key_file: Optional[str] = None
    token: Optional[str] = None

    @classmethod
    def from_kubeconfig(cls, path: Path) -> "Credentials":
        config = yaml.safe_load(Path(path).read_text())
        context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        return cls(cluster["server"], cluster["certificate-authority"], user.get("client-certificate"),
                   user.get("client-key"), user.get("token"))


def resource_path(api_version: str, plural: str, namespace: Optional[str] = None, name: Optional[str] = None,
                  subresource: Optional[str] = None) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    parts = [base]
    if namespace:
        parts.append(f"namespaces/{namespace}")
    parts.append(plural)
    if name:
        parts.append(name)
    if subresource:
        parts.append(subresource)
    return "/".join(parts)


class Api:
    def __init__(self, credentials: Credentials, timeout_s: float = 30.0):
        self.credentials = credentials
        self.timeout_s = timeout_s
        url = urllib.parse.urlsplit(credentials.server)
        self.host, self.port = url.hostname, url.port or 443
        self.context = ssl.create_default_context(cafile=credentials.ca_file)
        if credentials.cert_file:
            self.context.load_cert_chain(credentials.cert_file, credentials.key_file)

    @classmethod
    def from_kubeconfig(cls, path: Path, timeout_s: float = 30.0) -> "Api":
        return cls(Credentials.from_kubeconfig(path), timeout_s)

    def _connection(self, timeout_s: Optional[float]) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=timeout_s)

    def _headers(self, content_type: Optional[str] = None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.credentials.token:
            headers["Authorization"] = f"Bearer {self.credentials.token}"
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                query: Optional[dict[str, Any]] = None) -> Any:
        if query:
            path = f"{path}?{urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})}"
        data = None if body is None else (body if isinstance(body, (bytes, str)) else json.dumps(body))
        conn = self._connection(self.timeout_s)
        try:
            conn.request(method, path, body=data, headers=self._headers(content_type if data is not None else None))
            response = conn.getresponse()
            text = response.read().decode()
        finally:
            conn.close()
        if response.status >= 300:
            raise ApiError(response.status, response.reason, text, f"{method} {path}")
        return json.loads(text) if text else None

    def get(self, path: str, **query) -> Any:
        return self.request("GET", path, query=query or None)

    def get_or_none(self, path: str) -> Any:
        try:
            return self.get(path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, path: str, obj: dict) -> Any:
        return self.request("POST", path, obj)

    def merge_patch(self, path: str, patch: dict) -> Any:
        return self.request("PATCH", path, patch, "application/merge-patch+json")

    def json_patch(self, path: str, operations: list[dict]) -> Any:
        return self.request("PATCH", path, operations, "application/json-patch+json")

    def apply(self, path: str, obj: dict, manager: str = "cluster-test", force: bool = True) -> Any:
        return self.request("PATCH", path, obj, "application/apply-patch+yaml",
                            query={"fieldManager": manager, "force": "true" if force else None})

    def delete(self, path: str, body: Optional[dict] = None, missing_ok: bool = True) -> Any:
        try:
            return self.request("DELETE", path, body)
        except ApiError as exc:
            if missing_ok and exc.status == 404:
                return None
            raise

    def watch(self, path: str, resource_version: Optional[str] = None, timeout_s: int = 300,
              **query) -> Iterator[dict]:
        """Watch events (``{"type", "object"}``) until the server ends the watch after
        ``timeout_s``; a 410 (resource version too old) surfaces as an ERROR event."""
        if not resource_version:
            # From the current state on: a list's version (a watch without one would ask for a
            # consistent read from the watch cache, which needs etcd's progress notifications,
            # missing from the Debian etcd 3.4 here: tools/cluster/RUNNING.md).
            resource_version = self.get(path, limit=1, **query)["metadata"]["resourceVersion"]
        params = {"watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout_s), **query,
                  "resourceVersion": resource_version}
        full = f"{path}?{urllib.parse.urlencode(params)}"
        conn = self._connection(timeout_s + 30)
        try:
            conn.request("GET", full, headers=self._headers())
            response = conn.getresponse()
            if response.status >= 300:
                raise ApiError(response.status, response.reason, response.read().decode(), f"WATCH {path}")
            buffer = b""
            while True:
                chunk = response.read1(65536) if hasattr(response, "read1") else response.read(65536)
                if not chunk:
                    return
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            conn.close()


class Informer:
    """List, then watch, a collection; keeps the objects by (namespace, name) and calls
    ``on_change(kind, obj)`` for every change (kind: ADDED, MODIFIED, DELETED). Relists on a
    watch error or an expired resource version."""

    def __init__(self, api: Api, path: str, on_change: Callable[[str, dict], None], **query):
        self.api, self.path, self.on_change, self.query = api, path, on_change, query
        self.objects: dict[tuple[str, str], dict] = {}

    @staticmethod
    def key(obj: dict) -> tuple[str, str]:
        meta = obj["metadata"]
        return meta.get("namespace", ""), meta["name"]

    def run(self, stop) -> None:
        while not stop.is_set():
            try:
                listed = self.api.get(self.path, **self.query)
                seen = set()
                for item in listed["items"]:
                    key = self.key(item)
                    seen.add(key)
                    kind = "MODIFIED" if key in self.objects else "ADDED"
                    self.objects[key] = item
                    self.on_change(kind, item)
                for key in set(self.objects) - seen:
                    self.on_change("DELETED", self.objects.pop(key))
                version = listed["metadata"].get("resourceVersion")
                for event in self.api.watch(self.path, version, **self.query):
                    if stop.is_set():
                        return
                    kind, obj = event["type"], event["object"]
                    if kind == "BOOKMARK":
                        continue
                    if kind == "ERROR":
                        break
                    key = self.key(obj)
                    if kind == "DELETED":
                        self.objects.pop(key, None)
                    else:
                        self.objects[key] = obj
                    self.on_change(kind, obj)
            except Exception:  # noqa: BLE001 - the API server restarting, a dropped watch: list again
                if stop.wait(1.0):
                    return
