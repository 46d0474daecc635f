"""The platform's Grafana dashboards: pinned JSON files beside this module, shipped as ConfigMaps
that the Grafana sidecar loads (label ``grafana_dashboard: "1"``, kube-prometheus-stack's
grafana.sidecar.dashboards)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

DIRECTORY = Path(__file__).parent / "dashboards"


def load() -> dict[str, dict[str, Any]]:
    """Every dashboard by file stem."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(DIRECTORY.glob("*.json"))}


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel."""
    for panel in dashboard.get("panels", []):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def config_maps(namespace: str, label: str) -> list[dict[str, Any]]:
    return [{"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": f"dashboard-{stem}", "namespace": namespace, "labels": {label: "1"}},
             "data": {f"{stem}.json": json.dumps(board, sort_keys=True)}}
            for stem, board in load().items()]
