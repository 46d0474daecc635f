"""The Services that charts and operators the platform installs create, as each would create them
at the version the platform pins, for the live selector tests (tests/cluster/test_selectors_live.py).

Helm is not available here and the charts' registries are not reachable, so each Service is built
from its template's literal labels and port names, with the release's name, namespace and values
from the recorded plan where the template reads them. Each builder names its source (repository,
tag, commit, path) and quotes the template lines it relies on.

Where the chart's source is a Go module (Karpenter, Kueue: verified by Go's checksum database),
the builder reads the template at the pinned version and refuses to build when a quoted line is
no longer there, so a version bump that changes a label or a port name fails the test instead of
testing a stale copy. NVIDIA's repositories are not served by the module proxy (403), so the
DCGM exporter's sources are quoted with the commit and blob ids read from a clone.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional


class ChartSourceChanged(AssertionError):
    pass


@dataclass(frozen=True)
class Release:
    """A Helm release as the recorded plan declares it."""

    name: str
    chart: str
    version: str
    namespace: str
    values: Mapping[str, Any]

    @property
    def chart_name(self) -> str:
        return self.chart.rstrip("/").rsplit("/", 1)[-1]


def _require_lines(path: Path, lines: tuple[str, ...]) -> None:
    text = path.read_text()
    missing = [line for line in lines if line not in text]
    if missing:
        raise ChartSourceChanged(f"{path}: the template no longer has {missing}; rebuild the Service from it")


def _name(release: Release, chart_name: str) -> str:
    """``<chart>.name``: ``default .Chart.Name .Values.nameOverride`` (the same helper in each chart below)."""
    return release.values.get("nameOverride") or chart_name


def _fullname(release: Release, chart_name: str) -> str:
    """``<chart>.fullname``: fullnameOverride, else the release name if it contains the chart's
    name, else ``<release>-<name>``."""
    if release.values.get("fullnameOverride"):
        return release.values["fullnameOverride"][:63].rstrip("-")
    name = _name(release, chart_name)
    return (release.name if name in release.name else f"{release.name}-{name}")[:63].rstrip("-")


def _service(name: str, namespace: str, labels: dict[str, str], selector: dict[str, str],
             ports: list[dict[str, Any]], source: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": namespace, "labels": labels,
                         "annotations": {"mlplatform.io/test-source": source}},
            "spec": {"type": "ClusterIP", "selector": selector, "ports": ports}}


def dcgm_exporter_chart(release: Release) -> list[dict[str, Any]]:
    """NVIDIA/dcgm-exporter, chart 4.1.1 = tag ``4.2.3-4.1.1`` (commit c0d04b77ace0, ``deployment/``
    tree e7a540b17d68; the tags ``4.1.1-4.0.x`` carry chart 4.0.x). ``templates/service.yaml``::

        labels:
          {{- include "dcgm-exporter.labels" . | nindent 4 }}
          app.kubernetes.io/component: "dcgm-exporter"
        ports:
        - name: "metrics"
          port: {{ .Values.service.port }}
        selector:
          {{- include "dcgm-exporter.selectorLabels" . | nindent 4 }}

    ``_helpers.tpl``: ``dcgm-exporter.labels`` includes ``dcgm-exporter.selectorLabels`` =
    ``app.kubernetes.io/name: {{ include "dcgm-exporter.name" . }}`` and
    ``app.kubernetes.io/instance: {{ .Release.Name }}``; namespace ``namespaceOverride`` else the
    release's. ``values.yaml``: ``service.enable: true``, ``service.port: 9400``.
    """
    if not release.values.get("service", {}).get("enable", True):
        return []
    chart = "dcgm-exporter"
    selector = {"app.kubernetes.io/name": _name(release, chart), "app.kubernetes.io/instance": release.name}
    labels = {**selector, "helm.sh/chart": f"{chart}-{release.version}", "app.kubernetes.io/managed-by": "Helm",
              "app.kubernetes.io/component": "dcgm-exporter"}
    port = release.values.get("service", {}).get("port", 9400)
    return [_service(_fullname(release, chart), release.values.get("namespaceOverride") or release.namespace, labels,
                     selector, [{"name": "metrics", "port": port, "targetPort": port, "protocol": "TCP"}],
                     "NVIDIA/dcgm-exporter 4.2.3-4.1.1 deployment/templates/service.yaml")]


def gpu_operator(release: Release) -> list[dict[str, Any]]:
    """NVIDIA/gpu-operator v25.3.0 (commit b5479aaa85c7, ``assets/state-dcgm-exporter`` tree
    af54b71ea660), ``assets/state-dcgm-exporter/0600_service.yaml`` (blob 6f9781aeda95)::

        name: nvidia-dcgm-exporter
        labels:
          app: nvidia-dcgm-exporter
        spec:
          selector:
            app: nvidia-dcgm-exporter
          ports:
          - name: gpu-metrics
            port: 9400
            targetPort: 9400

    The operator creates it in its own namespace and changes nothing else
    (``controllers/object_controls.go`` ``func Service``: ``obj.Namespace = n.operatorNamespace``),
    only while the dcgm-exporter state is enabled (``dcgmExporter.enabled``, default true).
    """
    if not release.values.get("dcgmExporter", {}).get("enabled", True):
        return []
    return [_service("nvidia-dcgm-exporter", release.namespace, {"app": "nvidia-dcgm-exporter"},
                     {"app": "nvidia-dcgm-exporter"},
                     [{"name": "gpu-metrics", "port": 9400, "targetPort": 9400, "protocol": "TCP"}],
                     "NVIDIA/gpu-operator v25.3.0 assets/state-dcgm-exporter/0600_service.yaml")]


def karpenter(release: Release) -> list[dict[str, Any]]:
    """aws/karpenter-provider-aws v1.14.1 (Go module, checksum-verified) ``charts/karpenter``:
    ``templates/service.yaml`` labels ``karpenter.labels`` (which include ``karpenter.selectorLabels``:
    ``app.kubernetes.io/name: {{ include "karpenter.name" . }}``, ``app.kubernetes.io/instance``),
    port ``- name: http-metrics`` (``controller.metrics.port``, 8080 in values.yaml), in the
    release's namespace; ``additionalLabels`` are added to the labels."""
    from tools.cluster.layer import go_module_dir

    chart_dir = go_module_dir("github.com/aws/karpenter-provider-aws", f"v{release.version}") / "charts" / "karpenter"
    _require_lines(chart_dir / "templates" / "service.yaml", (
        "namespace: {{ .Release.Namespace }}", '{{- include "karpenter.labels" . | nindent 4 }}',
        "- name: http-metrics", "targetPort: http-metrics", '{{- include "karpenter.selectorLabels" . | nindent 4 }}'))
    _require_lines(chart_dir / "templates" / "_helpers.tpl", (
        '{{ include "karpenter.selectorLabels" . }}', 'app.kubernetes.io/name: {{ include "karpenter.name" . }}',
        "app.kubernetes.io/instance: {{ .Release.Name }}"))
    chart = "karpenter"
    selector = {"app.kubernetes.io/name": _name(release, chart), "app.kubernetes.io/instance": release.name}
    labels = {**selector, "helm.sh/chart": f"{chart}-{release.version}", "app.kubernetes.io/managed-by": "Helm",
              **release.values.get("additionalLabels", {})}
    port = release.values.get("controller", {}).get("metrics", {}).get("port", 8080)
    return [_service(_fullname(release, chart), release.namespace, labels, selector,
                     [{"name": "http-metrics", "port": port, "targetPort": "http-metrics", "protocol": "TCP"}],
                     f"aws/karpenter-provider-aws v{release.version} charts/karpenter/templates/service.yaml")]


def kueue(release: Release) -> list[dict[str, Any]]:
    """kubernetes-sigs/kueue v0.19.2 (Go module ``sigs.k8s.io/kueue``, checksum-verified)
    ``charts/kueue/templates/manager/auth_proxy_service.yaml``: name
    ``{{ include "kueue.fullname" . }}-controller-manager-metrics-service``, labels
    ``kueue.metricsService.labels`` (``kueue.labels`` + ``app.kubernetes.io/component:
    metrics-service``; ``kueue.labels`` includes ``kueue.selectorLabels``: name, instance,
    ``control-plane: controller-manager``), ports ``.Values.metricsService.ports`` (values.yaml:
    ``- name: https``, 8443)."""
    from tools.cluster.layer import go_module_dir

    chart_dir = go_module_dir("sigs.k8s.io/kueue", f"v{release.version}") / "charts" / "kueue"
    _require_lines(chart_dir / "templates" / "manager" / "auth_proxy_service.yaml", (
        'name: {{ include "kueue.fullname" . }}-controller-manager-metrics-service',
        "namespace: '{{ .Release.Namespace }}'", '{{- include "kueue.metricsService.labels" . | nindent 4 }}',
        '{{- include "kueue.selectorLabels" . | nindent 4 }}', "{{- .Values.metricsService.ports | toYaml | nindent 2 -}}"))
    _require_lines(chart_dir / "templates" / "_helpers.tpl", (
        '{{ include "kueue.labels" . }}\napp.kubernetes.io/component: metrics-service',
        'app.kubernetes.io/name: {{ include "kueue.name" . }}', "control-plane: controller-manager"))
    _require_lines(chart_dir / "values.yaml", ("metricsService:\n  # -- metricsService's ports\n  ports:\n    - name: https\n      port: 8443",))
    chart = "kueue"
    selector = {"app.kubernetes.io/name": _name(release, chart), "app.kubernetes.io/instance": release.name,
                "control-plane": "controller-manager"}
    labels = {**selector, "helm.sh/chart": f"{chart}-{release.version}", "app.kubernetes.io/managed-by": "Helm",
              "app.kubernetes.io/component": "metrics-service"}
    ports = release.values.get("metricsService", {}).get("ports") or [
        {"name": "https", "port": 8443, "protocol": "TCP", "targetPort": 8443}]
    return [_service(f"{_fullname(release, chart)}-controller-manager-metrics-service", release.namespace, labels,
                     selector, ports, f"kubernetes-sigs/kueue v{release.version} charts/kueue/templates/manager/auth_proxy_service.yaml")]


# (chart name, version) -> builder. A release whose pinned version has no builder here creates
# Services the tests do not know; `chart_services` says so when a monitor needs one.
BUILDERS: dict[tuple[str, str], Callable[[Release], list[dict[str, Any]]]] = {
    ("dcgm-exporter", "4.1.1"): dcgm_exporter_chart,
    ("gpu-operator", "v25.3.0"): gpu_operator,
    ("karpenter", "1.14.1"): karpenter,
    ("kueue", "0.19.2"): kueue,
}


def releases(plan) -> list[Release]:
    from infra.plan import resource_graph

    found = []
    for resource in resource_graph(plan.recording, plan.config):
        if resource["type"] == "kubernetes:helm.sh/v3:Release":
            inputs = resource["inputs"]
            found.append(Release(inputs["name"], inputs["chart"], str(inputs.get("version")),
                                 inputs.get("namespace") or "default", inputs.get("values") or {}))
    return found


def chart_services(plan) -> tuple[list[dict[str, Any]], list[str]]:
    """(Services the stack's charts create, releases with no builder here)."""
    services, unknown = [], []
    for release in releases(plan):
        builder: Optional[Callable[[Release], list[dict[str, Any]]]] = BUILDERS.get((release.chart_name, release.version))
        if builder is None:
            unknown.append(f"{release.name} ({release.chart_name} {release.version})")
            continue
        services.extend(builder(release))
    return services, unknown
