"""Where every Helm release's chart comes from: its upstream repository, or the stack's chart mirror.

Upstream (the default): the release names the chart and its upstream repository
(``catalog.versions.HelmChart.repo``) and Helm downloads it at install.

Mirror (``chartMirror`` in the stack file; air-gapped clusters, ECR in production): the program's
entry point downloads each chart the stack installs from the mirror at the pinned version and
keeps it only if its SHA-256 is the pinned one (``infra/chart_mirror.py``), before any resource
is registered. The release is then given that verified archive by path, not the mirror's address
and a version: what Helm installs is the file whose bytes were checked, so a mirror that changes
between the check and the install (a mutable tag or index) cannot slip another chart in. The path
is relative to the program's working directory, the same text on every machine (an absolute path
would differ between checkouts and show as a change on every `up`); the pulumi-kubernetes
provider loads a local chart from its own working directory, which is the program's
(pulumi-kubernetes provider/pkg/provider/helm_release.go ``locateChart``: an existing path is a
local chart, and a name starting with ``.`` that is not there is "path not found"), and its Check sets the release's version from the
loaded chart (``new.Version = chart.Metadata.Version``), so ``version`` stays the pin.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from catalog.versions import CHART_ARCHIVE_DIR, HelmChart

_PROJECT_ROOT = Path(__file__).resolve().parent.parent


def archive_path(chart: HelmChart, root: Path = _PROJECT_ROOT) -> Path:
    """Where the verified archive of ``chart`` is kept (absolute)."""
    return root / CHART_ARCHIVE_DIR / chart.archive


@dataclass(frozen=True)
class ChartSource:
    """mirror: None for the charts' upstream repositories, else the chart mirror's URL (the
    release installs the archive the program verified from it). charts: the names of the charts
    verified from the mirror; a release of any other chart is a program error (the list of charts
    a stack installs, ``infra.charts.charts_used``, missed it)."""

    mirror: Optional[str] = None
    charts: frozenset[str] = frozenset()

    def release_args(self, chart: HelmChart) -> dict[str, Any]:
        """``chart``, ``version`` and ``repository_opts`` of a ``kubernetes.helm.v3.Release``."""
        if self.mirror is None:
            repo = None if chart.oci else {"repo": chart.repo}
            return {"chart": chart.reference, "version": chart.version, "repository_opts": repo}
        if chart.name not in self.charts:
            raise ValueError(
                f"chart {chart.name} {chart.version} is installed but was not verified from the chart mirror "
                f"{self.mirror}: add it to the charts its capability lists (infra/charts.py)")
        return {"chart": local_reference(archive_path(chart)), "version": chart.version, "repository_opts": None}


def local_reference(path: Path) -> str:
    """``path`` relative to the working directory, always starting with ``.``: a missing file is
    then "path not found" (locateChart), never looked up as ``<repo>/<chart>`` in Helm's repositories."""
    relative = os.path.relpath(path)
    return relative if relative.startswith(".") else os.path.join(".", relative)
