"""Helm charts from the stack's chart mirror, each archive verified against its pinned SHA-256.

    python -m infra.plan.charts --stack prod   # download and verify what `pulumi up` will install

With ``chartMirror`` set, the program's entry point (``infra/__main__.py``) calls ``prepare``
once the config is valid and before any resource is registered: it downloads every chart the
stack installs (``infra.capabilities.charts_used``) at its pinned version, keeps an archive only if
its SHA-256 is the one catalog/versions.py pins, and writes it read-only under ``build/charts``.
The releases install those files by path (components/charts.py), so Helm installs exactly the
bytes that were checked. A mirror that lacks a chart, serves other bytes or cannot be reached
stops the preview or update with one line per chart, naming chart, version and mirror; no resource
has been registered by then, so nothing is applied. The offline plan (``python -m infra.plan``)
does not download: it records the same release inputs without touching the network.

Two kinds of mirror (``infra.config.charts``):

- an OCI registry, ``oci://<registry>/<path>`` (ECR in production): the chart is the repository
  ``<path>/<name>`` at tag ``<version>`` (``+`` written ``_``), as ``helm push`` stores it, and its
  archive is the manifest's layer of media type ``application/vnd.cncf.helm.chart.content.v1.tar+gzip``
  (Helm's registry client, pkg/registry/constants.go). The registry's token or basic-auth challenge
  is answered with the credentials ``helm registry login`` / ``docker login`` stored (Helm's
  registry config, then Docker's config: ``auths``, ``credHelpers``, ``credsStore``);
- a Helm chart repository, ``https://...``: its ``index.yaml`` lists the chart's archive URL
  (relative URLs against the repository's), read without credentials.

Plain ``http://`` is accepted for loopback only (a local test mirror; tools/chart_mirror.py).
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import yaml

from catalog.versions import HelmChart
from components.charts import ChartSource, archive_path
from workloads.problems import Problem
from infra.capabilities import charts_used
from infra.config import ConfigError, PlatformConfig
from infra.config.charts import is_loopback_host

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 60
# No chart the platform installs is near this (kube-prometheus-stack 88.5.3: 0.9 MB).
MAX_ARCHIVE_BYTES = 64 * 1024 * 1024
HELM_CHART_LAYER = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


class ChartMirrorError(RuntimeError):
    """A chart the mirror cannot give, or gives with bytes other than the pinned ones; one line each."""


# -- what the program installs from where -------------------------------------------------------
def chart_source(config: PlatformConfig) -> ChartSource:
    """Where the stack's releases take their charts: upstream, or the verified archives of the mirror."""
    mirror = config.chart_mirror
    if mirror is None:
        return ChartSource()
    return ChartSource(mirror=mirror.url, charts=frozenset(c.name for c in charts_used(config)))


def pin_problems(config: PlatformConfig) -> list[Problem]:
    """A mirror can serve only charts with a pinned archive SHA-256 (catalog/versions.py)."""
    if config.chart_mirror is None:
        return []
    return [Problem("chartMirror.url", config.chart_mirror.url,
                    f"the stack installs {chart.name} {chart.version}, whose archive SHA-256 is not pinned, so the "
                    f"mirror's copy cannot be verified ({chart.source})",
                    f"add the SHA-256 of {chart.archive} to catalog/versions.py, or remove chartMirror")
            for chart in charts_used(config) if chart.sha256 is None]


def check_pins(config: PlatformConfig) -> None:
    """Offline, before any resource: raises ``ConfigError`` (one line per unpinned chart)."""
    problems = pin_problems(config)
    if problems:
        raise ConfigError("chart mirror: charts without a pinned archive", problems)


# -- downloading ---------------------------------------------------------------------------------
class _Unreachable(ChartMirrorError):
    """The mirror itself does not answer: every other chart would say the same."""


def _get(url: str, headers: Optional[dict[str, str]] = None, *, auth: Optional[str] = None) -> tuple[bytes, Any]:
    request = urllib.request.Request(url, headers=headers or {})
    if auth:
        # Not sent on along a redirect (urllib copies only the ordinary headers to the new request):
        # a registry redirects blob downloads to object storage, which refuses a second credential.
        request.add_unredirected_header("Authorization", auth)
    with urllib.request.build_opener().open(request, timeout=TIMEOUT_S) as response:  # noqa: S310 - the configured mirror
        data = response.read(MAX_ARCHIVE_BYTES + 1)
        if len(data) > MAX_ARCHIVE_BYTES:
            raise ChartMirrorError(f"{url} is larger than {MAX_ARCHIVE_BYTES} bytes")
        return data, response.headers


def _describe(error: BaseException) -> str:
    if isinstance(error, urllib.error.HTTPError):
        return f"HTTP {error.code} {error.reason}"
    if isinstance(error, urllib.error.URLError):
        return str(error.reason)
    return str(error) or type(error).__name__


def _missing(mirror: str, chart: HelmChart, detail: str) -> ChartMirrorError:
    how = (f"helm push {chart.archive} {mirror}" if mirror.startswith("oci://")
           else f"add {chart.archive} to the repository and regenerate its index.yaml (helm repo index)")
    return ChartMirrorError(f"chart mirror {mirror} has no {chart.name} {chart.version} ({detail}). FIX: {how}; "
                            f"the pinned archive is {chart.source}")


def _unreachable(mirror: str, error: BaseException) -> _Unreachable:
    return _Unreachable(f"chart mirror {mirror} cannot be reached ({_describe(error)}). FIX: check chartMirror.url "
                        "and this machine's route and DNS to it")


def fetch_helm_repo(mirror: str, chart: HelmChart) -> bytes:
    """The archive of ``chart`` from a Helm chart repository (its index.yaml, then the archive)."""
    base = mirror.rstrip("/") + "/"
    try:
        index_bytes, _ = _get(base + "index.yaml")
    except urllib.error.HTTPError as error:
        raise _missing(mirror, chart, f"no index.yaml: {_describe(error)}") from None
    except (urllib.error.URLError, OSError) as error:
        raise _unreachable(mirror, error) from None
    try:
        index = yaml.safe_load(index_bytes)
    except yaml.YAMLError:
        raise _missing(mirror, chart, "its index.yaml is not YAML") from None
    entries = (index or {}).get("entries") if isinstance(index, dict) else None
    versions = [e for e in (entries or {}).get(chart.name) or [] if isinstance(e, dict)]
    entry = next((e for e in versions if str(e.get("version")) == chart.version), None)
    if entry is None:
        listed = sorted(str(e.get("version")) for e in versions)
        raise _missing(mirror, chart, f"index.yaml lists versions {listed}" if listed else "not in index.yaml")
    urls = entry.get("urls") or []
    if not urls:
        raise _missing(mirror, chart, "its index.yaml entry has no urls")
    url = urllib.parse.urljoin(base, str(urls[0]))
    try:
        data, _ = _get(url)
    except urllib.error.HTTPError as error:
        raise _missing(mirror, chart, f"{url}: {_describe(error)}") from None
    except (urllib.error.URLError, OSError) as error:
        raise _unreachable(mirror, error) from None
    return data


@dataclass(frozen=True)
class _Oci:
    scheme: str
    host: str  # host[:port], as registries and credential stores name them
    path: str

    @classmethod
    def parse(cls, mirror: str) -> "_Oci":
        parts = urllib.parse.urlsplit(mirror)
        # Plain HTTP to a loopback registry only (a local test mirror; `helm --plain-http`).
        return cls("http" if is_loopback_host(parts.hostname or "") else "https", parts.netloc, parts.path.strip("/"))

    def repository(self, chart: HelmChart) -> str:
        return f"{self.path}/{chart.name}" if self.path else chart.name

    def url(self, chart: HelmChart, kind: str, reference: str) -> str:
        return f"{self.scheme}://{self.host}/v2/{self.repository(chart)}/{kind}/{reference}"


def registry_credentials(host: str, env: Optional[dict[str, str]] = None) -> Optional[tuple[str, str]]:
    """(user, secret) stored for ``host`` by `helm registry login` or `docker login`, else None.

    Helm 3 keeps registry logins in $HELM_REGISTRY_CONFIG (default
    $XDG_CONFIG_HOME/helm/registry/config.json, helm.sh/helm/v3 pkg/helmpath), a Docker config file;
    Docker keeps them in $DOCKER_CONFIG/config.json (default ~/.docker). In each: ``auths[host].auth``
    (base64 of user:secret), else the credential helper ``credHelpers[host]`` or ``credsStore``
    (``docker-credential-<name> get`` with the host on stdin; amazon-ecr-credential-helper is
    ``ecr-login``)."""
    env = dict(os.environ if env is None else env)
    home = Path(env.get("HOME", str(Path.home())))
    config_home = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
    files = [Path(env["HELM_REGISTRY_CONFIG"]) if env.get("HELM_REGISTRY_CONFIG") else config_home / "helm/registry/config.json",
             Path(env.get("DOCKER_CONFIG") or home / ".docker") / "config.json"]
    for path in files:
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        auths = document.get("auths") or {}
        auth = (auths.get(host) or auths.get(f"https://{host}") or {}).get("auth")
        if auth:
            user, _, secret = base64.b64decode(auth).decode().partition(":")
            return user, secret
        helper = (document.get("credHelpers") or {}).get(host) or document.get("credsStore")
        if helper:
            found = _credential_helper(helper, host, env)
            if found:
                return found
    return None


def _credential_helper(helper: str, host: str, env: dict[str, str]) -> Optional[tuple[str, str]]:
    try:
        result = subprocess.run([f"docker-credential-{helper}", "get"], input=host, capture_output=True, text=True,
                                timeout=TIMEOUT_S, env=env, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    try:
        answer = json.loads(result.stdout)
    except ValueError:
        return None
    return (answer.get("Username", ""), answer.get("Secret", "")) if answer.get("Secret") else None


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, rest = header.strip().partition(" ")
    return scheme.lower(), dict(re.findall(r'(\w+)="([^"]*)"', rest))


def _authorization(oci: _Oci, chart: HelmChart, header: str, mirror: str) -> str:
    """The Authorization header answering a registry's 401 challenge (distribution's token
    authentication: Bearer realm/service/scope, or Basic)."""
    scheme, params = _challenge(header)
    credentials = registry_credentials(oci.host)
    basic = ("Basic " + base64.b64encode(f"{credentials[0]}:{credentials[1]}".encode()).decode()) if credentials else None
    login = (f"log in first: aws ecr get-login-password --region <region> | helm registry login --username AWS "
             f"--password-stdin {oci.host} (or `helm registry login {oci.host}` for another registry)")
    if scheme == "basic":
        if basic is None:
            raise ChartMirrorError(f"chart mirror {mirror} needs credentials for {chart.name} {chart.version} and "
                                   f"none are stored for {oci.host}. FIX: {login}")
        return basic
    if scheme != "bearer" or "realm" not in params:
        raise ChartMirrorError(f"chart mirror {mirror} answered {chart.name} {chart.version} with an authentication "
                               f"challenge this client does not speak ({header!r})")
    query = {k: v for k, v in (("service", params.get("service")),
                               ("scope", params.get("scope") or f"repository:{oci.repository(chart)}:pull")) if v}
    token_url = params["realm"] + ("&" if "?" in params["realm"] else "?") + urllib.parse.urlencode(query)
    try:
        body, _ = _get(token_url, auth=basic)
        token = json.loads(body).get("token") or json.loads(body).get("access_token")
    except (urllib.error.URLError, OSError, ValueError, AttributeError) as error:
        raise ChartMirrorError(f"chart mirror {mirror} refused a pull token for {chart.name} {chart.version} "
                               f"({_describe(error)}). FIX: {login}") from None
    if not token:
        raise ChartMirrorError(f"chart mirror {mirror} gave no pull token for {chart.name} {chart.version}. FIX: {login}")
    return f"Bearer {token}"


def fetch_oci(mirror: str, chart: HelmChart) -> bytes:
    """The chart layer of ``<mirror>/<name>:<version>`` from an OCI registry (distribution API v2)."""
    oci = _Oci.parse(mirror)
    tag = chart.version.replace("+", "_")  # OCI tags cannot hold '+' (Helm's registry client does the same)
    manifest_url = oci.url(chart, "manifests", tag)
    headers = {"Accept": OCI_MANIFEST}
    auth: Optional[str] = None
    for attempt in range(2):
        try:
            body, _ = _get(manifest_url, headers, auth=auth)
            break
        except urllib.error.HTTPError as error:
            if error.code == 401 and attempt == 0 and error.headers.get("WWW-Authenticate"):
                auth = _authorization(oci, chart, error.headers["WWW-Authenticate"], mirror)
                continue
            if error.code in (401, 403):
                raise ChartMirrorError(f"chart mirror {mirror} refused {chart.name} {chart.version} "
                                       f"({_describe(error)}). FIX: give this machine pull access to "
                                       f"{oci.host}/{oci.repository(chart)}") from None
            raise _missing(mirror, chart, f"{oci.repository(chart)}:{tag}: {_describe(error)}") from None
        except (urllib.error.URLError, OSError) as error:
            raise _unreachable(mirror, error) from None
    try:
        manifest = json.loads(body)
        layers = [layer for layer in manifest.get("layers") or [] if layer.get("mediaType") == HELM_CHART_LAYER]
    except (ValueError, AttributeError):
        raise _missing(mirror, chart, f"{oci.repository(chart)}:{tag} has no OCI manifest") from None
    if len(layers) != 1 or not str(layers[0].get("digest", "")).startswith("sha256:"):
        raise _missing(mirror, chart, f"{oci.repository(chart)}:{tag} is not a Helm chart (no single {HELM_CHART_LAYER} layer)")
    digest = layers[0]["digest"]
    try:
        data, _ = _get(oci.url(chart, "blobs", digest), auth=auth)
    except urllib.error.HTTPError as error:
        raise _missing(mirror, chart, f"blob {digest}: {_describe(error)}") from None
    except (urllib.error.URLError, OSError) as error:
        raise _unreachable(mirror, error) from None
    if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
        raise ChartMirrorError(f"chart mirror {mirror} sent {chart.name} {chart.version} bytes that do not match its own "
                               f"manifest's digest {digest}; refusing them")
    return data


def fetch(mirror: str, chart: HelmChart) -> bytes:
    return fetch_oci(mirror, chart) if mirror.startswith("oci://") else fetch_helm_repo(mirror, chart)


def verified(mirror: str, chart: HelmChart, data: bytes) -> bytes:
    """``data`` if its SHA-256 is the pin, else ``ChartMirrorError`` naming chart, version and mirror."""
    found = hashlib.sha256(data).hexdigest()
    if chart.sha256 is None:
        raise ChartMirrorError(f"chart mirror {mirror}: {chart.name} {chart.version} has no pinned SHA-256 in "
                               "catalog/versions.py, so its archive cannot be verified")
    if found != chart.sha256:
        raise ChartMirrorError(
            f"chart mirror {mirror} serves {chart.name} {chart.version} with SHA-256 {found}, pinned {chart.sha256} "
            f"(catalog/versions.py); refusing it. FIX: replace the mirror's archive with the pinned one "
            f"({chart.source}), or verify the new archive and update the pin")
    return data


def _write(path: Path, data: bytes) -> None:
    """Atomically, read-only: a concurrent run sees the old verified file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, 0o444)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


Fetch = Callable[[str, HelmChart], bytes]


def download(mirror: str, charts: Sequence[HelmChart], root: Optional[Path] = None, fetcher: Fetch = fetch) -> list[Path]:
    """Fetch and verify every chart; write them under ``root`` (default: the project)/build/charts
    only if all verify. Raises ``ChartMirrorError`` with one line per chart that failed."""
    root = ROOT if root is None else root
    verified_archives: list[tuple[Path, bytes]] = []
    failures: list[str] = []
    for chart in charts:
        try:
            verified_archives.append((archive_path(chart, root), verified(mirror, chart, fetcher(mirror, chart))))
        except _Unreachable as error:
            raise ChartMirrorError(str(error)) from None
        except ChartMirrorError as error:
            failures.append(str(error))
    if failures:
        raise ChartMirrorError("\n".join(failures))
    for path, data in verified_archives:
        _write(path, data)
    return [path for path, _ in verified_archives]


def prepare(config: PlatformConfig, root: Optional[Path] = None, fetcher: Fetch = fetch) -> list[Path]:
    """What `pulumi up` needs before the program registers anything: with a chart mirror, every
    chart the stack installs, verified, under ``build/charts``. Nothing without one."""
    if config.chart_mirror is None:
        return []
    check_pins(config)
    return download(config.chart_mirror.url, charts_used(config), root, fetcher)
