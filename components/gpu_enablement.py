"""Make GPUs schedulable and observable: NVIDIA device plugin (or GPU Operator), DCGM exporter,
EFA device plugin. Every chart is pinned, tolerates the GPU taint and runs only on GPU nodes.

The AL2023 NVIDIA AMI (and Bottlerocket's NVIDIA variant) ships the driver and the container
toolkit, so the GPU Operator runs with both off: it only adds the device plugin, GPU feature
discovery and DCGM.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping, Optional

import pulumi
import pulumi_kubernetes as k8s

from components.helm_addon import helm_addon
from components.cluster import Cluster
from components.k8s import apply_namespace_objects, apply_object
from catalog.versions import HelmChart
from components.charts import ChartSource
from catalog.versions import (
    DCGM_EXPORTER, EFA_DEVICE_PLUGIN, NVIDIA_DEVICE_PLUGIN, NVIDIA_GPU_OPERATOR, NVIDIA_MIG_MANAGER_IMAGE,
    PROMETHEUS_OPERATOR_CRDS,
)
from workloads import gpu_runtime, gpu_sharing
from workloads.gpu_sharing import MIG_PENDING_TAINT, SHARING_TAINT, PoolSharing
from workloads.karpenter import EFA_LABEL, GPU_TAINT, NODE_ROLE_LABEL, READINESS_STARTUP_TAINT, STORAGE_STARTUP_TAINTS
from workloads.node_health import node_health_objects
from workloads.placement import system_pod_placement
from workloads.system_namespaces import PodSecurityLevel, SystemNamespaceSpec, namespace_objects
from workloads.problems import accepts_enum_values
from workloads.monitoring.dcgm import counters_csv

NAMESPACE = "gpu-system"
DCGM_METRICS_PORT = 9400
GPU_OPERATOR_METRICS_PORT = 8080
# Below `restricted` on purpose: every chart here is a node agent.
POD_SECURITY_REASON = (
    "node agents: the NVIDIA and EFA device plugins mount the kubelet's device-plugin socket "
    "directory (hostPath) and DCGM exporter reads the GPUs through /dev and the pod-resources "
    "socket with SYS_ADMIN; baseline forbids hostPath and added capabilities"
)


class GpuEnablementMode(str, Enum):
    DEVICE_PLUGIN = "device-plugin"
    GPU_OPERATOR = "gpu-operator"


def gpu_tolerations() -> list[dict[str, Any]]:
    # The startup taints (storage CSI drivers, GPU readiness) are tolerated so GPUs and EFA devices are advertised
    # and measured while the node is still being checked; shared nodes are tainted for slice pods
    # only, and MIG nodes stay tainted until the MIG manager (an operand itself) and the device
    # plugin have done their work.
    return [
        {"key": taint["key"], "operator": "Exists", "effect": taint["effect"]}
        for taint in (GPU_TAINT, *STORAGE_STARTUP_TAINTS, READINESS_STARTUP_TAINT, SHARING_TAINT, MIG_PENDING_TAINT)
    ]


def node_affinity(label: str, value: str) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": label, "operator": "In", "values": [value]}]}]}}}


def gpu_node_placement() -> dict[str, Any]:
    """``affinity`` + ``tolerations`` that put a DaemonSet on every GPU node and nowhere else."""
    return {"affinity": node_affinity(NODE_ROLE_LABEL, "gpu"), "tolerations": gpu_tolerations()}




def device_plugin_values(pool_sharing: Optional[Mapping[str, PoolSharing]] = None) -> dict[str, Any]:
    # Shared pools: named configs in the chart's ConfigMap; each node's config-manager sidecar
    # picks its pool's by the nvidia.com/device-plugin.config label (workloads.gpu_sharing).
    # GPUs reach containers only through the plugin's volume mounts (workloads/gpu_runtime.py, security-4 N2).
    return {**gpu_node_placement(), "gfd": {"enabled": False}, "nfd": {"enabled": False},
            "priorityClassName": "system-node-critical", **gpu_runtime.device_plugin_values(),
            **gpu_sharing.device_plugin_chart_config(pool_sharing or {})}


def gpu_operator_values(*, service_monitor: bool, pool_sharing: Optional[Mapping[str, PoolSharing]] = None) -> dict[str, Any]:
    placement = gpu_node_placement()
    sharing = gpu_sharing.gpu_operator_sharing_values(pool_sharing or {})
    return {
        "operator": system_pod_placement(),
        "driver": {"enabled": False},  # shipped by the AL2023 NVIDIA AMI
        "toolkit": {"enabled": False},  # shipped by the AL2023 NVIDIA AMI
        "daemonsets": {"tolerations": placement["tolerations"], "priorityClassName": "system-node-critical"},
        "devicePlugin": {"enabled": True, "env": gpu_runtime.gpu_operator_device_plugin_env(), **sharing.get("devicePlugin", {})},
        **{k: v for k, v in sharing.items() if k != "devicePlugin"},
        # The chart turns config.data into a ConfigMap (key dcgm-metrics.csv) the ClusterPolicy
        # points the exporter at (gpu-operator v25.3.0 templates/dcgm_exporter_config.yaml).
        "dcgmExporter": {"enabled": True, "serviceMonitor": {"enabled": service_monitor},
                         "config": {"name": "mlplatform-dcgm-metrics", "create": True, "data": counters_csv()}},
        # NFD master and gc are Deployments the release's atomic wait must see Ready; the subchart
        # (node-feature-discovery v0.17.2 in gpu-operator v25.3.0) tolerates only control-plane
        # taints for master and nothing for gc, so without this they wait for a Karpenter general
        # node and can outlast the Helm timeout (aws-readiness-4 K1). They run on the system nodes.
        "node-feature-discovery": {"worker": {"tolerations": placement["tolerations"]},
                                   "master": system_pod_placement(), "gc": system_pod_placement()},
    }


def dcgm_exporter_values(*, service_monitor: bool) -> dict[str, Any]:
    # customMetrics becomes the chart's exporter-metrics-config-map (templates/metrics-configmap.yaml,
    # key "metrics"); the published 4.1.1 archive's default extraConfigMapVolumes/extraVolumeMounts
    # mount that key over /etc/dcgm-exporter/default-counters.csv, the file its default arguments
    # read with -f (values.yaml). Its git tag 4.2.3-4.1.1 has no such mount; the archive is what installs.
    return {**gpu_node_placement(), "serviceMonitor": {"enabled": service_monitor, "interval": "15s"},
            "priorityClassName": "system-node-critical", "customMetrics": counters_csv()}


def efa_device_plugin_values() -> dict[str, Any]:
    """aws-efa-k8s-device-plugin v0.5.6 builds the DaemonSet's node affinity only from
    ``supportedInstanceLabels`` (one ``key In values`` term per key, plus compute-type NotIn auto)
    and hard-codes ``priorityClassName: system-node-critical`` (templates/daemonset.yaml): it reads
    no ``affinity`` or ``priorityClassName`` value. Its default is a frozen list of EFA instance
    types; the platform's EFA node label instead puts the plugin on every EFA node the pools launch,
    whatever the instance type."""
    return {"supportedInstanceLabels": {"keys": [EFA_LABEL], "values": ["true"]}, "tolerations": gpu_tolerations()}


@accepts_enum_values
@dataclass(frozen=True)
class GpuEnablementArgs:
    """GPU and EFA device plugins and GPU metrics.

    cluster: the platform cluster; releases wait for its static node group and CoreDNS.
    mode: device plugin alone, or the GPU Operator (driver and toolkit off); enum or its value.
    dcgm_exporter: GPU metrics (bundled by the operator in gpu-operator mode).
    service_monitor: a Prometheus-operator ServiceMonitor for DCGM; needs
        ``prometheus_operator_crds`` (Helm refuses a chart with an unknown kind and the
        atomic release rolls back).
    prometheus_operator_crds: install the pinned ``prometheus-operator-crds`` chart first.
    efa: install the EFA device plugin (some pool has EFA).
    node_health_image: the GPU node readiness agent's image (workloads/node_health.py); None
        deploys no agent (only for clusters without GPU pools: their nodes would stay tainted).
    pool_sharing: pool name -> its GPU sharing; shared pools get device-plugin configs, MIG pools
        the MIG manager's layouts and the MIG gate (MIG needs ``mode`` gpu-operator).
    charts: where the charts come from (upstream by default, or the stack's verified chart mirror).
    """

    cluster: Cluster
    mode: GpuEnablementMode = GpuEnablementMode.DEVICE_PLUGIN
    dcgm_exporter: bool = True
    service_monitor: bool = False
    prometheus_operator_crds: bool = False
    efa: bool = False
    node_health_image: Optional[str] = None
    pool_sharing: Mapping[str, PoolSharing] = field(default_factory=dict)
    charts: ChartSource = ChartSource()

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", GpuEnablementMode(self.mode))
        if gpu_sharing.any_mig(self.pool_sharing) and self.mode is not GpuEnablementMode.GPU_OPERATOR:
            mig = sorted(n for n, s in self.pool_sharing.items() if s.mode is gpu_sharing.GpuSharing.MIG)
            raise ValueError(f"GpuEnablementArgs.pool_sharing: MIG pools {mig} need mode gpu-operator (its MIG manager "
                             "pauses the operator's device plugin while it repartitions the GPUs)")
        if self.service_monitor and not self.prometheus_operator_crds:
            raise ValueError(
                "GpuEnablementArgs.service_monitor: True needs the Prometheus operator CRDs (ServiceMonitor); "
                "set prometheus_operator_crds=True or service_monitor=False")


def namespace_spec(vpc_cidr: str, service_cidr: str, mode: GpuEnablementMode) -> SystemNamespaceSpec:
    operator = mode is GpuEnablementMode.GPU_OPERATOR
    return SystemNamespaceSpec(
        name=NAMESPACE, pod_security=PodSecurityLevel.PRIVILEGED, pod_security_reason=POD_SECURITY_REASON,
        vpc_cidr=vpc_cidr, service_cidr=service_cidr,
        metrics_ports=(DCGM_METRICS_PORT, GPU_OPERATOR_METRICS_PORT) if operator else (DCGM_METRICS_PORT,),
        # The CloudWatch agent (host network) scrapes the DCGM exporter from the node's address.
        host_network_scrapers=True,
        # The operator's components (NFD master/worker, validators) talk to each other.
        same_namespace=operator,
    )


class GpuEnablement(pulumi.ComponentResource):
    def __init__(self, name: str, args: GpuEnablementArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:gpu_enablement:GpuEnablement", name, None, opts)
        cluster = args.cluster
        objects = namespace_objects(namespace_spec(cluster.vpc_cidr, cluster.service_cidr, args.mode))
        self.namespace, self.network_policies = apply_namespace_objects(name, objects, self)
        self._cluster = cluster
        self._charts = args.charts
        self._depends_on: list[pulumi.Resource] = [self.namespace, *self.network_policies]
        self.releases: dict[str, k8s.helm.v3.Release] = {}
        if args.prometheus_operator_crds:
            self._release(name, "prometheus-operator-crds", PROMETHEUS_OPERATOR_CRDS, {})
            # ServiceMonitor objects in the charts below need these CRDs.
            self._depends_on.append(self.releases["prometheus-operator-crds"])
        if args.mode is GpuEnablementMode.GPU_OPERATOR:
            self._release(name, "gpu-operator", NVIDIA_GPU_OPERATOR,
                          gpu_operator_values(service_monitor=args.service_monitor, pool_sharing=args.pool_sharing))
        else:
            self._release(name, "nvidia-device-plugin", NVIDIA_DEVICE_PLUGIN, device_plugin_values(args.pool_sharing))
            if args.dcgm_exporter:
                self._release(name, "dcgm-exporter", DCGM_EXPORTER,
                              dcgm_exporter_values(service_monitor=args.service_monitor))
        self.mig_gate: list[pulumi.CustomResource] = []
        if gpu_sharing.any_mig(args.pool_sharing):
            # Lifts the MIG startup taint once the operator's MIG manager reports success.
            in_namespace = pulumi.ResourceOptions(parent=self, depends_on=[self.namespace])
            for obj in gpu_sharing.mig_gate_objects(NAMESPACE, NVIDIA_MIG_MANAGER_IMAGE, gpu_tolerations()):
                self.mig_gate.append(apply_object(f"{name}-mig-gate-{obj['kind'].lower()}", obj, in_namespace))
        if args.efa:
            self._release(name, "efa-device-plugin", EFA_DEVICE_PLUGIN, efa_device_plugin_values())
        self.node_health: list[pulumi.CustomResource] = []
        if args.node_health_image:
            for obj in node_health_objects(image=args.node_health_image):
                meta = obj["metadata"]
                self.node_health.append(apply_object(
                    f"{name}-node-health-{obj['kind'].lower()}-{meta.get('namespace', 'cluster')}", obj,
                    pulumi.ResourceOptions(parent=self, depends_on=[self.namespace, *self.network_policies])))
        self.register_outputs({"releases": sorted(self.releases), "node_health": len(self.node_health)})

    def _release(self, name: str, key: str, chart: HelmChart, values: dict[str, Any]) -> None:
        self.releases[key] = helm_addon(
            f"{name}-{key}", parent=self, cluster=self._cluster, release=key, chart=chart, source=self._charts,
            namespace=NAMESPACE, values=values, depends_on=list(self._depends_on),
        )
