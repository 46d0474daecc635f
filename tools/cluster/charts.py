"""The stack's Helm releases, rendered by the real Helm from the pinned chart archives.

Each ``kubernetes:helm.sh/v3:Release`` of the recorded plan is rendered as Helm 3 installs it:
``helm template <release> <archive> --namespace <ns> --values <the plan's values>`` with the
Kubernetes version of the control plane (so ``kubeVersion`` constraints and capability checks
answer as on EKS 1.32), every API version the layer installs (``--api-versions``: a chart that
renders a ServiceMonitor only when the CRD exists sees it), and the chart's ``crds/`` unless the
release skips them (``skipCrds``). Helm hooks (``helm.sh/hook``) are not part of the release's
manifest and run only at install time; they are listed, not applied.

The archives are the pinned ones (``<name>-<version>.tgz`` in ``.cache/charts``, the chart mirror's
layout), each checked against its SHA-256 before use; a release whose archive is not there is
listed with the reason, never replaced by another version.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

import yaml

from tools.cluster.paths import _cache_root

KUBE_VERSION = "v1.32.13"  # the control plane's (tools/cluster/kubernetes/go.mod)
HOOK_ANNOTATION = "helm.sh/hook"


class ChartError(RuntimeError):
    pass


class YamlLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """A safe loader (libyaml's when PyYAML has it: the CRDs and rendered charts are megabytes).
    YAML 1.1's ``=`` (the "value" type) appears as a plain enum member in some CRDs (Argo
    Workflows', the Prometheus operator's); kubectl's YAML 1.2 parser reads it as the string "="."""


YamlLoader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


def yaml_documents(text: str) -> list[Any]:
    """Every document of ``text``, parsed once per content: the parse (seconds for a chart's CRDs
    on a busy machine) is kept as JSON under ``.cache/cluster-tools/parsed``, keyed by SHA-256."""
    import json

    digest = hashlib.sha256(text.encode()).hexdigest()
    cached = _cache_root() / "cluster-tools" / "parsed" / f"{digest}.json"
    if cached.exists():
        try:
            return json.loads(cached.read_text())
        except ValueError:
            pass
    docs = list(yaml.load_all(text, Loader=YamlLoader))
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(docs, default=str))
    os.replace(tmp, cached)
    return docs


def helm_path() -> Optional[Path]:
    """``$HELM``, else the engine tools' build (``make engine-tools``), else PATH."""
    override = os.environ.get("HELM")
    if override:
        return Path(override)
    built = _cache_root() / "engine-tools" / "bin" / "helm"
    if built.is_file() and os.access(built, os.X_OK):
        return built
    found = shutil.which("helm")
    return Path(found) if found else None


def charts_dir() -> Path:
    return Path(os.environ.get("MLPLATFORM_CHARTS_DIR") or _cache_root() / "charts")


def chart_name(chart: str) -> str:
    """``oci://registry/path/name`` or ``name`` (with a repository): the chart's name."""
    return chart.rstrip("/").rsplit("/", 1)[-1]


def pinned_sha256(name: str, version: str) -> Optional[str]:
    """The archive's SHA-256 pinned with the chart (catalog/versions.py ``HelmChart``), else the
    mirror's own ``SHA256SUMS`` beside the archives."""
    try:
        from catalog import versions
    except ImportError:  # pragma: no cover - the catalog always imports
        versions = None
    for value in vars(versions).values() if versions else ():
        if getattr(value, "name", None) == name and getattr(value, "version", None) == version \
                and getattr(value, "sha256", None):
            return value.sha256
    sums = charts_dir() / "SHA256SUMS"
    if sums.exists():
        for line in sums.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].lstrip("*") == f"{name}-{version}.tgz":
                return parts[0]
    return None


def archive(name: str, version: str) -> Path:
    path = charts_dir() / f"{name}-{version}.tgz"
    if not path.exists():
        raise ChartError(f"chart archive {path.name} is not in {charts_dir()} (the chart mirror's files)")
    want = pinned_sha256(name, version)
    if want is None:
        raise ChartError(f"chart {name} {version}: no SHA-256 pinned for its archive")
    got = hashlib.sha256(path.read_bytes()).hexdigest()
    if got != want:
        raise ChartError(f"chart {name} {version}: {path} has SHA-256 {got}, the pin is {want}")
    return path


@dataclass
class Release:
    name: str
    chart: str
    version: str
    namespace: str
    values: dict[str, Any]
    skip_crds: bool = False
    objects: list[dict[str, Any]] = field(default_factory=list)
    hooks: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_inputs(cls, inputs: dict[str, Any]) -> "Release":
        return cls(inputs["name"], chart_name(inputs["chart"]), inputs["version"], inputs.get("namespace") or "default",
                   dict(inputs.get("values") or {}), bool(inputs.get("skipCrds")))


def render(release: Release, api_versions: Iterable[str] = (), chart_path: Optional[Path] = None) -> Release:
    """``chart_path``: a chart directory to render instead of the pinned archive (a chart the
    caller assembled from pinned sources)."""
    helm = helm_path()
    if helm is None:
        raise ChartError("helm is not built (run: make engine-tools)")
    path = chart_path or archive(release.chart, release.version)
    with tempfile.TemporaryDirectory(prefix="helm-values-") as tmp:
        values = Path(tmp) / "values.yaml"
        values.write_text(yaml.safe_dump(release.values, sort_keys=False))
        argv = [str(helm), "template", release.name, str(path), "--namespace", release.namespace,
                "--values", str(values), "--kube-version", KUBE_VERSION]
        if not release.skip_crds:
            argv.append("--include-crds")
        for version in sorted(set(api_versions)):
            argv += ["--api-versions", version]
        env = {**os.environ, "HELM_CACHE_HOME": tmp, "HELM_CONFIG_HOME": tmp, "HELM_DATA_HOME": tmp}
        result = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    if result.returncode != 0:
        raise ChartError(f"helm template {release.name} ({release.chart} {release.version}): {result.stderr.strip()}")
    for doc in yaml_documents(result.stdout):
        if not isinstance(doc, dict) or not doc.get("kind"):
            continue
        meta = doc.setdefault("metadata", {})
        if HOOK_ANNOTATION in (meta.get("annotations") or {}):
            release.hooks.append(doc)
            continue
        # Helm sets the release namespace on namespaced objects that name none (the API server
        # defaults it when the client sends one: helm's kube client does).
        if doc["kind"] != "CustomResourceDefinition" and "namespace" not in meta and not _cluster_scoped(doc):
            meta["namespace"] = release.namespace
        meta["labels"] = meta.get("labels") or {}
        meta["annotations"] = meta.get("annotations") or {}
        meta["annotations"].update({"meta.helm.sh/release-name": release.name,
                                                    "meta.helm.sh/release-namespace": release.namespace})
        meta["labels"].setdefault("app.kubernetes.io/managed-by", "Helm")
        release.objects.append(doc)
    return release


CLUSTER_SCOPED = {
    "Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "PriorityClass", "StorageClass",
    "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration", "APIService", "FlowSchema",
    "PriorityLevelConfiguration", "CSIDriver", "RuntimeClass", "IngressClass", "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding", "NodePool", "EC2NodeClass", "NodeOverlay", "ClusterPolicy", "NVIDIADriver",
    "ClusterQueue", "ResourceFlavor", "Cohort", "Topology", "WorkloadPriorityClass", "AdmissionCheck",
    "ClusterTrainingRuntime", "PodSecurityPolicy",
}


def _cluster_scoped(doc: dict[str, Any]) -> bool:
    return doc["kind"] in CLUSTER_SCOPED
