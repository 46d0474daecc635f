"""One building block for the platform's Helm add-ons (controllers installed from a chart).

Every release is atomic with cleanup on failure (a failed install or upgrade rolls back instead
of leaving a half-applied release) and, when it runs pods, waits for what those pods need: the
static system nodes (platform controllers tolerate only their taint) and CoreDNS, because Helm
waits for an atomic release's pods to become ready. A component keeps its own values, ports and
policies and names the release as before, so URNs do not move. Where the chart comes from (its
upstream repository or the stack's verified chart mirror) is the caller's ``ChartSource``
(components/charts.py); the chart and its version are always a pin of catalog/versions.py.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from catalog.versions import HelmChart
from components.charts import ChartSource

if TYPE_CHECKING:
    from components.cluster import Cluster


def system_ready(cluster: "Cluster") -> list[pulumi.Resource]:
    """What a platform controller's pods need before they can start: the system nodes and DNS."""
    return [cluster.node_group, cluster.addons["coredns"]]


def helm_addon(
    resource_name: str,
    *,
    parent: pulumi.Resource,
    cluster: Optional["Cluster"],
    release: str,
    chart: HelmChart,
    namespace: str,
    source: ChartSource,
    values: Optional[Mapping[str, Any]] = None,
    timeout_seconds: int = 600,
    runs_pods: bool = True,
    skip_crds: Optional[bool] = None,
    create_namespace: Optional[bool] = None,
    depends_on: Sequence[pulumi.Resource] = (),
) -> k8s.helm.v3.Release:
    """The Helm release ``release`` of ``chart`` from ``source`` (``resource_name`` is its Pulumi
    name, under ``parent``).

    ``runs_pods=False`` for a CRD-only chart: nothing to wait for on the nodes. ``cluster`` may be
    None for a library caller deploying into a cluster this program did not create.
    """
    ready = system_ready(cluster) if runs_pods and cluster is not None else []
    where = source.release_args(chart)
    optional = {key: value for key, value in (
        ("repository_opts", where["repository_opts"]), ("values", values),
        ("skip_crds", skip_crds), ("create_namespace", create_namespace)) if value is not None}
    return k8s.helm.v3.Release(
        resource_name, name=release, chart=where["chart"], version=where["version"], namespace=namespace,
        atomic=True, cleanup_on_fail=True, timeout=timeout_seconds, **optional,
        opts=pulumi.ResourceOptions(parent=parent, depends_on=[*depends_on, *ready]),
    )
