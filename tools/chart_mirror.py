"""A chart mirror on loopback, for tests and local runs: a directory of chart archives served as a
Helm chart repository or as an OCI registry, and the check of such a directory against the pins.

    python -m tools.chart_mirror serve DIR [--oci] [--port N]   # prints the chartMirror.url to use
    python -m tools.chart_mirror verify DIR                      # every archive against catalog/versions.py

Helm 3 cannot `helm repo add` a ``file://`` directory, so a local directory of archives is served
over HTTP on 127.0.0.1 (the stack config accepts plain http:// to loopback only):

- as a Helm chart repository: ``index.yaml`` (the directory's own if it has one, else one built
  from the archives' Chart.yaml, each with its archive's digest) and the archives, by name;
- as an OCI registry (distribution API v2, the subset `helm pull` and infra/chart_mirror.py use):
  ``/v2/<path>/<name>/manifests/<version>`` answers an OCI image manifest whose one layer is the
  archive (media type ``application/vnd.cncf.helm.chart.content.v1.tar+gzip``, digest = the
  archive's SHA-256) and whose config is the chart's Chart.yaml as JSON, as ``helm push`` stores
  a chart; ``/v2/<...>/blobs/sha256:<hex>`` answers the blobs. Optionally behind a Bearer token
  challenge (the registry token flow) or a Basic challenge (as ECR answers).

The directory is read on every request: a test may replace an archive while the server runs.
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import http.server
import json
import re
import sys
import tarfile
import threading
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import yaml

HELM_CHART_LAYER = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
HELM_CONFIG = "application/vnd.cncf.helm.config.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def chart_metadata(archive: Path) -> dict[str, Any]:
    """The archive's ``<name>/Chart.yaml`` (the top-level one, not a subchart's)."""
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            if len(parts) == 2 and parts[1] == "Chart.yaml" and member.isfile():
                handle = tar.extractfile(member)
                if handle is not None:
                    return yaml.safe_load(handle.read()) or {}
    raise ValueError(f"{archive.name}: no <chart>/Chart.yaml")


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_index(directory: Path) -> dict[str, Any]:
    """index.yaml of the archives in ``directory``, as `helm repo index` writes it (relative URLs)."""
    entries: dict[str, list[dict[str, Any]]] = {}
    for archive in sorted(directory.glob("*.tgz")):
        meta = chart_metadata(archive)
        entries.setdefault(str(meta["name"]), []).append(
            {**meta, "digest": sha256_of(archive), "urls": [archive.name]})
    return {"apiVersion": "v1", "entries": entries}


@dataclass(frozen=True)
class Auth:
    """kind: "bearer" (401 with a token challenge; the token endpoint wants ``user``/``password``
    as Basic credentials when ``user`` is set) or "basic" (401 with a Basic challenge, as ECR)."""

    kind: str
    user: str = "AWS"
    password: str = "secret"
    token: str = "pull-token"

    @property
    def basic(self) -> str:
        return "Basic " + base64.b64encode(f"{self.user}:{self.password}".encode()).decode()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: "_Server"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        return

    def _send(self, status: int, body: bytes = b"", content_type: str = "application/octet-stream",
              headers: Optional[dict[str, str]] = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.server.requests.append(self.path)
        path = urllib.parse.urlsplit(self.path).path
        if self.server.oci:
            self._oci(path)
        else:
            self._helm_repo(path)

    # -- Helm chart repository ---------------------------------------------------------------
    def _helm_repo(self, path: str) -> None:
        directory = self.server.directory
        name = urllib.parse.unquote(path.lstrip("/"))
        if name == "index.yaml":
            own = directory / "index.yaml"
            body = own.read_bytes() if own.is_file() else yaml.safe_dump(build_index(directory)).encode()
            return self._send(200, body, "application/x-yaml")
        target = directory / name
        if "/" in name or not name.endswith(".tgz") or not target.is_file():
            return self._send(404, b"not found\n", "text/plain")
        return self._send(200, target.read_bytes(), "application/gzip")

    # -- OCI registry ------------------------------------------------------------------------
    def _authorized(self) -> bool:
        auth = self.server.auth
        if auth is None:
            return True
        given = self.headers.get("Authorization", "")
        if auth.kind == "basic":
            if given == auth.basic:
                return True
            challenge = f'Basic realm="http://{self.headers.get("Host")}/",service="chart-mirror"'
        else:
            if given == f"Bearer {auth.token}":
                return True
            challenge = (f'Bearer realm="http://{self.headers.get("Host")}/token",service="chart-mirror"')
        self._send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}', "application/json", {"WWW-Authenticate": challenge})
        return False

    def _oci(self, path: str) -> None:
        auth = self.server.auth
        if path == "/token" and auth is not None:
            if self.headers.get("Authorization") != auth.basic:
                return self._send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}', "application/json")
            return self._send(200, json.dumps({"token": auth.token}).encode(), "application/json")
        if path in ("/v2", "/v2/"):
            if self._authorized():
                self._send(200, b"{}", "application/json")
            return None
        match = re.fullmatch(r"/v2/(?P<repo>.+)/(?P<kind>manifests|blobs)/(?P<ref>[^/]+)", path)
        if match is None:
            return self._send(404, b'{"errors":[{"code":"NAME_UNKNOWN"}]}', "application/json")
        if not self._authorized():
            return None
        repo, kind, ref = match["repo"], match["kind"], match["ref"]
        prefix = self.server.path
        if prefix and not repo.startswith(prefix + "/"):
            return self._send(404, b'{"errors":[{"code":"NAME_UNKNOWN"}]}', "application/json")
        name = repo[len(prefix) + 1:] if prefix else repo
        if kind == "manifests":
            archive = self.server.directory / f"{name}-{ref.replace('_', '+')}.tgz"
            if "/" in name or not archive.is_file():
                return self._send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}', "application/json")
            manifest, _ = self.server.manifest(archive)
            return self._send(200, manifest, OCI_MANIFEST, {"Docker-Content-Digest": "sha256:" + hashlib.sha256(manifest).hexdigest()})
        blob = self.server.blob(name, ref)
        if blob is None:
            return self._send(404, b'{"errors":[{"code":"BLOB_UNKNOWN"}]}', "application/json")
        return self._send(200, blob)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, directory: Path, *, oci: bool, path: str, auth: Optional[Auth], port: int = 0):
        super().__init__(("127.0.0.1", port), _Handler)
        self.directory = directory
        self.oci = oci
        self.path = path.strip("/")
        self.auth = auth
        self.requests: list[str] = []

    def manifest(self, archive: Path) -> tuple[bytes, bytes]:
        data = archive.read_bytes()
        config = json.dumps(chart_metadata(archive), sort_keys=True).encode()
        manifest = {
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": {"mediaType": HELM_CONFIG, "digest": "sha256:" + hashlib.sha256(config).hexdigest(), "size": len(config)},
            "layers": [{"mediaType": HELM_CHART_LAYER, "digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data)}],
        }
        return json.dumps(manifest).encode(), config

    def blob(self, name: str, digest: str) -> Optional[bytes]:
        for archive in self.directory.glob(f"{name}-*.tgz"):
            data = archive.read_bytes()
            if digest == "sha256:" + hashlib.sha256(data).hexdigest():
                return data
            _, config = self.manifest(archive)
            if digest == "sha256:" + hashlib.sha256(config).hexdigest():
                return config
        return None


@dataclass
class RunningMirror:
    url: str  # what chartMirror.url takes: http://127.0.0.1:PORT or oci://127.0.0.1:PORT/<path>
    server: _Server

    @property
    def requests(self) -> list[str]:
        return self.server.requests


@contextlib.contextmanager
def serve(directory: Path, *, oci: bool = False, path: str = "charts", auth: Optional[Auth] = None,
          port: int = 0) -> Iterator[RunningMirror]:
    """Serve ``directory`` on 127.0.0.1 (an ephemeral port unless ``port``) while in the block."""
    server = _Server(Path(directory), oci=oci, path=path if oci else "", auth=auth, port=port)
    thread = threading.Thread(target=server.serve_forever, name="chart-mirror", daemon=True)
    thread.start()
    host, bound = server.server_address[:2]
    url = f"oci://{host}:{bound}/{server.path}".rstrip("/") if oci else f"http://{host}:{bound}"
    try:
        yield RunningMirror(url, server)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# -- checking a directory against the pins -------------------------------------------------------
def verify(directory: Path) -> list[str]:
    """Problems of ``directory`` as a mirror of the pinned charts: an archive whose SHA-256 is not
    its pin (or that no pin names); pinned archives that are absent are listed as notes by ``main``."""
    from catalog.versions import HELM_CHARTS

    pins = {chart.archive: chart for chart in HELM_CHARTS}
    problems = []
    for archive in sorted(directory.glob("*.tgz")):
        chart = pins.get(archive.name)
        if chart is None:
            problems.append(f"{archive.name}: no chart of catalog/versions.py has this name and version")
        elif chart.sha256 is None:
            problems.append(f"{archive.name}: catalog/versions.py pins no SHA-256 for it; verify it and pin it")
        elif sha256_of(archive) != chart.sha256:
            problems.append(f"{archive.name}: SHA-256 {sha256_of(archive)}, pinned {chart.sha256}")
    return problems


def absent(directory: Path) -> list[str]:
    from catalog.versions import HELM_CHARTS

    return [chart.archive for chart in HELM_CHARTS if not (directory / chart.archive).is_file()]


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.chart_mirror", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serve_command = commands.add_parser("serve", help="serve DIR on 127.0.0.1 until interrupted")
    serve_command.add_argument("directory", type=Path)
    serve_command.add_argument("--oci", action="store_true", help="as an OCI registry (default: a Helm repository)")
    serve_command.add_argument("--port", type=int, default=0)
    verify_command = commands.add_parser("verify", help="check DIR's archives against catalog/versions.py")
    verify_command.add_argument("directory", type=Path)
    args = parser.parse_args(argv)
    if not args.directory.is_dir():
        print(f"error: {args.directory} is not a directory", file=sys.stderr)
        return 2
    if args.command == "verify":
        problems = verify(args.directory)
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        for name in absent(args.directory):
            print(f"note: {name} is not in {args.directory}")
        if not problems:
            print(f"{args.directory}: every archive matches its pinned SHA-256")
        return 1 if problems else 0
    with serve(args.directory, oci=args.oci, port=args.port) as mirror:
        print(f"chartMirror.url: {mirror.url}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
