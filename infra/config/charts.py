"""The ``chartMirror`` section: where every Helm chart comes from when the cluster cannot (or must
not) reach the charts' upstream repositories; its rules.

The mirror is an OCI registry (``oci://<registry>/<path>``: ECR in production, each chart a
repository ``<path>/<chart name>`` as ``helm push <archive> oci://<registry>/<path>`` creates it)
or a Helm chart repository (``https://...`` serving ``index.yaml``). The program downloads every
chart the stack installs from it at the pinned version, and refuses the stack unless each archive's
SHA-256 is the one catalog/versions.py pins (infra/chart_mirror.py).
"""
from __future__ import annotations

import ipaddress
from typing import Optional
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from infra.config.common import _Model
from infra.config.syntax import checked, dns_name_problem

_SCHEMES = ("oci", "https", "http")
_EXAMPLE = "e.g. oci://123456789012.dkr.ecr.us-west-2.amazonaws.com/charts or https://charts.example.com/platform"


def is_loopback_host(host: str) -> bool:
    """localhost or a loopback address: the only hosts plain http:// may name."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def mirror_url_problem(value: str) -> Optional[str]:
    """Why ``value`` is not a chart mirror URL the program can read, or None."""
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as error:
        return f"is not a URL ({error})"
    if parts.scheme not in _SCHEMES:
        return "is not an oci:// registry or an https:// Helm repository"
    if parts.username is not None or parts.password is not None:
        return "carries credentials, which the stack file must not hold"
    if parts.query or parts.fragment:
        return "has a query or fragment, which neither Helm repositories nor OCI registries use"
    host = parts.hostname or ""
    if not host:
        return "names no host"
    if parts.scheme == "http" and not is_loopback_host(host):
        return "is plain http:// to a host other than this machine (loopback only: a local test mirror)"
    if port == 0:
        return "has port 0"
    if not is_loopback_host(host):
        problem = dns_name_problem(host.lower())
        if problem is not None and not _is_ip(host):
            return f"has a host that {problem}"
    if any(segment in (".", "..") for segment in parts.path.split("/")):
        return "has a '.' or '..' path segment"
    if parts.scheme == "oci" and parts.path.rstrip("/") != parts.path.rstrip("/").lower():
        return "has upper-case letters in its repository path (OCI repository names are lower-case)"
    return None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class ChartMirrorConfig(_Model):
    """Install every Helm chart from this mirror instead of the charts' upstream repositories,
    each archive verified against the SHA-256 pinned in catalog/versions.py before anything is deployed."""

    url: str = Field(description=(
        "`oci://<registry>/<path>` (charts pushed with `helm push <archive> oci://<registry>/<path>`; ECR: log in "
        "with `helm registry login`) or an `https://` Helm repository serving index.yaml; `http://` to loopback only."))

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return checked(mirror_url_problem(value), f"use the mirror's address, {_EXAMPLE}", value).rstrip("/")
