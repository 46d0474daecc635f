"""Rendering the program's Helm releases with real Helm: the pinned archive, the values the program
passes (the recorded plan's ``kubernetes:helm.sh/v3:Release`` inputs), the release's name and
namespace, and the stack's Kubernetes version.

Helm is the binary `make engine-tools` builds (``.cache/engine-tools/bin/helm``, or
``$ML_PLATFORM_HELM``); the archives are the pinned ones (``tests.conftest.charts_dir``).
"""
from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

import yaml

from catalog.versions import HELM_CHARTS, HelmChart

ROOT = Path(__file__).resolve().parents[2]
RELEASE_TYPE = "kubernetes:helm.sh/v3:Release"
RENDER_TIMEOUT_S = 120


def helm_binary() -> Optional[Path]:
    path = Path(os.environ.get("ML_PLATFORM_HELM") or ROOT / ".cache" / "engine-tools" / "bin" / "helm")
    return path if path.is_file() and os.access(path, os.X_OK) else None


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """YAML 1.1's ``=`` (the 'value' tag) appears as a plain string in rendered Prometheus rules."""


_Loader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))
YamlLoader = _Loader  # the same reading of Helm's output, for manifests read back from a release


class RenderError(RuntimeError):
    """`helm template` refused the chart with these values (a template's `fail`, a type error...)."""


def render(helm: Path, archive: Path, *, release: str, namespace: str, values: Mapping[str, Any],
           kube_version: str, skip_crds: bool = False) -> list[dict[str, Any]]:
    """Every object the release installs, as `helm template` renders it: templates, and the charts'
    (and enabled subcharts') crds/ unless the release skips them, in the order Helm prints them."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(values, handle)
    try:
        command = [str(helm), "template", release, str(archive), "--namespace", namespace, "--values", handle.name,
                   "--kube-version", kube_version, "--skip-crds" if skip_crds else "--include-crds"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=RENDER_TIMEOUT_S, check=False)
    finally:
        os.unlink(handle.name)
    if done.returncode != 0:
        raise RenderError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}")
    return [with_namespace(doc, namespace) for doc in yaml.load_all(done.stdout, Loader=_Loader) if isinstance(doc, dict)]


# Kinds without a namespace, among those the platform's charts render (Kubernetes API reference;
# gpu-operator's ClusterPolicy and Kueue's cluster-level CRs are cluster-scoped CRDs).
CLUSTER_SCOPED = frozenset({
    "Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "APIService",
    "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding", "PriorityClass", "StorageClass", "RuntimeClass", "IngressClass",
    "PersistentVolume", "CSIDriver", "FlowSchema", "PriorityLevelConfiguration", "ClusterPolicy", "NVIDIADriver",
    "ClusterQueue", "ResourceFlavor", "Cohort", "WorkloadPriorityClass", "NodePool", "EC2NodeClass", "NodeOverlay",
})


def with_namespace(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The object as the API stores it: a namespaced object a chart leaves without a namespace
    lands in the release's (Helm installs into ``--namespace``)."""
    if obj.get("kind") not in CLUSTER_SCOPED:
        meta = obj.setdefault("metadata", {}) or {}
        obj["metadata"] = meta
        meta.setdefault("namespace", namespace)
    return obj


def pin_of(chart_input: str) -> HelmChart:
    """The pin a recorded release installs, from its ``chart`` input (upstream reference or archive path)."""
    for chart in HELM_CHARTS:
        if chart_input in (chart.reference, chart.name) or chart_input.endswith(f"/{chart.archive}"):
            return chart
    raise KeyError(f"release chart {chart_input!r} is no pin of catalog/versions.py")


@dataclass(frozen=True, eq=False)  # hashed by identity: the render caches key on it
class PlannedRelease:
    """One ``kubernetes:helm.sh/v3:Release`` of a recorded plan, with the pin it installs."""

    stack: str
    resource: str  # the Pulumi resource name
    release: str  # Helm's release name
    namespace: str
    chart: HelmChart
    values: Mapping[str, Any]
    skip_crds: bool
    kube_version: str

    @property
    def id(self) -> str:
        return f"{self.stack}:{self.release}"

    def archive(self, charts: Path) -> Path:
        return charts / self.chart.archive

    def render(self, helm: Path, charts: Path, values: Optional[Mapping[str, Any]] = None) -> list[dict[str, Any]]:
        return _render_cached(str(helm), str(self.archive(charts)), self.release, self.namespace,
                              json.dumps(self.values if values is None else values, sort_keys=True),
                              self.kube_version, self.skip_crds)


@functools.lru_cache(maxsize=512)
def _render_cached(helm: str, archive: str, release: str, namespace: str, values_json: str, kube_version: str,
                   skip_crds: bool) -> list[dict[str, Any]]:
    return render(Path(helm), Path(archive), release=release, namespace=namespace, values=json.loads(values_json),
                  kube_version=kube_version, skip_crds=skip_crds)


def planned_releases(stack: str, plan: Any) -> list[PlannedRelease]:
    """The releases a recorded plan installs (``tests.conftest`` plans), values as the program passes them."""
    kube_version = f"v{plan.config.cluster.version}.0"
    found = []
    for resource in plan.recording.by_type(RELEASE_TYPE):
        inputs = resource.inputs
        found.append(PlannedRelease(
            stack=stack, resource=resource.name, release=inputs["name"], namespace=inputs["namespace"],
            chart=pin_of(inputs["chart"]), values=copy.deepcopy(inputs.get("values") or {}),
            skip_crds=bool(inputs.get("skipCrds", False)), kube_version=kube_version))
    return sorted(found, key=lambda r: r.resource)


def objects_of_kind(objects: Iterable[Mapping[str, Any]], *kinds: str) -> list[Mapping[str, Any]]:
    return [o for o in objects if o.get("kind") in kinds]


# -- what each value the program sets does to the render ----------------------------------------------
def canonical(objects: Iterable[Mapping[str, Any]], skip: frozenset = frozenset()) -> dict[tuple[str, str, str], str]:
    """Objects by (kind, namespace, name) as sorted JSON, leaving out the ``skip`` keys."""
    out = {}
    for obj in objects:
        meta = obj.get("metadata") or {}
        item = (obj.get("kind", ""), meta.get("namespace") or "", meta.get("name", ""))
        if item not in skip:
            out[item] = json.dumps(obj, sort_keys=True, default=str)
    return out


def mutated(value: Any) -> Any:
    """A different value of the same shape: every leaf changed (bools flipped, numbers + 1, strings
    extended), a list emptied (or given an item), an empty map given a key. A chart that reads a
    value renders something else for it; one that ignores it renders the same."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if value is None:
        return "x"
    if isinstance(value, list):
        return [] if value else [{"mlplatformProbe": "x"}]
    if isinstance(value, Mapping):
        return {k: mutated(v) for k, v in value.items()} if value else {"mlplatformProbe": "x"}
    return value


@dataclass(frozen=True)
class ValueEffect:
    """What one top-level value does: ``changed`` the objects whose render differs without it (or
    with it mutated), ``refused`` the render error without it (the chart requires it)."""

    key: str
    changed: frozenset
    refused: Optional[str] = None

    @property
    def dead(self) -> bool:
        return not self.changed and self.refused is None


@functools.lru_cache(maxsize=64)
def _effects(release: PlannedRelease, helm: str, charts: str) -> tuple[frozenset, tuple[ValueEffect, ...]]:
    full = release.render(Path(helm), Path(charts))
    # Helm's genCA/randAlphaNum make some objects differ between identical renders: not evidence.
    again = render(Path(helm), release.archive(Path(charts)), release=release.release, namespace=release.namespace,
                   values=release.values, kube_version=release.kube_version, skip_crds=release.skip_crds)
    first, second = canonical(full), canonical(again)
    noisy = frozenset(k for k in first.keys() | second.keys() if first.get(k) != second.get(k))
    baseline = canonical(full, noisy)
    effects = []
    for name in sorted(release.values):
        changed: set = set()
        refused = None
        for variant in ({k: v for k, v in release.values.items() if k != name},
                        {**release.values, name: mutated(release.values[name])}):
            try:
                other = canonical(release.render(Path(helm), Path(charts), variant), noisy)
            except RenderError as error:
                refused = refused or str(error)
                continue
            changed |= {k for k in baseline.keys() | other.keys() if baseline.get(k) != other.get(k)}
            if changed:
                break
        effects.append(ValueEffect(name, frozenset(changed), None if changed else refused))
    return noisy, tuple(effects)


def value_effects(release: PlannedRelease, helm: Path, charts: Path) -> tuple[frozenset, tuple[ValueEffect, ...]]:
    """(objects that differ between two identical renders, the effect of each top-level value)."""
    return _effects(release, str(helm), str(charts))
