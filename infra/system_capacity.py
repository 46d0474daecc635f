"""Do the static system nodes hold everything scheduled on them? Requests vs allocatable.

Every controller the platform installs runs on the system node group (``workloads.placement``),
and every node runs the DaemonSets. This sums, from the recorded graph, the CPU and memory each
release and EKS add-on requests (the values the platform sets, else the chart's default at the
pinned version) and compares them with what the kubelet leaves allocatable on the group's
instance type, as the scheduler would. Pods that request nothing are counted as pods (the
ENI-based max-pods limit) and listed, since their memory is not reserved.

Allocatable: catalog/node_model.py, the one node model (an EKS managed node group: the ENI max
pods capped as the AMI's max-pods-calculator caps them, kube-reserved, eviction threshold).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional

from catalog.node_model import CPU_SHAPES, NodeAllocatable, node_allocatable
from infra.recording import Recording

HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
ADDON = "aws:eks/addon:Addon"


@dataclass(frozen=True)
class NodeShape:
    """One system-node instance type as the kubelet of a managed node group sees it."""

    instance_type: str

    @property
    def _node(self) -> NodeAllocatable:
        return node_allocatable(self.instance_type, "managed-node-group")

    @property
    def max_pods(self) -> int:
        return self._node.max_pods

    @property
    def allocatable_cpu_m(self) -> int:
        return self._node.cpu_millicores

    @property
    def allocatable_memory_mib(self) -> int:
        return self._node.memory_mib


SYSTEM_NODE_SHAPES: Mapping[str, NodeShape] = {t: NodeShape(t) for t in CPU_SHAPES}


@dataclass(frozen=True)
class PodSpec:
    """One workload of a chart or add-on.

    replicas / requests: the chart default at the pinned version; ``replicas_path`` /
    ``resources_path`` (dotted, in the release's values) override them when the platform sets
    them. per_node: a DaemonSet (one pod per node). enabled_path: a values switch that removes it.
    """

    name: str
    cpu_m: int = 0
    memory_mib: int = 0
    replicas: int = 1
    per_node: bool = False
    replicas_path: Optional[str] = None
    resources_path: Optional[str] = None
    enabled_path: Optional[str] = None


# Chart defaults at the pinned versions (values.yaml of each chart's release tag).
CHART_PODS: Mapping[str, tuple[PodSpec, ...]] = {
    # Karpenter 1.14.1: the platform sets replicas and controller.resources.
    "oci://public.ecr.aws/karpenter/karpenter": (
        PodSpec("karpenter", replicas=2, replicas_path="replicas", resources_path="controller.resources"),),
    # Kueue 0.19.2 charts/kueue/values.yaml: controllerManager.manager.resources requests 500m / 512Mi.
    "oci://registry.k8s.io/kueue/charts/kueue": (
        PodSpec("kueue-controller-manager", 500, 512, replicas_path="controllerManager.replicas",
                resources_path="controllerManager.manager.resources"),),
    # amazon-cloudwatch-observability 6.2.0 values.yaml: manager 100m/64Mi; agent DaemonSet 250m/128Mi.
    "amazon-cloudwatch-observability": (
        PodSpec("cloudwatch-operator", 100, 64, resources_path="manager.resources"),
        PodSpec("cloudwatch-agent", 250, 128, per_node=True, resources_path="agent.resources"),),
    # aws-for-fluent-bit 0.2.0 values.yaml: resources requests 50m / 50Mi (DaemonSet).
    "aws-for-fluent-bit": (PodSpec("fluent-bit", 50, 50, per_node=True, resources_path="resources"),),
    # argo-cd 10.x values.yaml: every component's resources {} (no request).
    "argo-cd": tuple(PodSpec(f"argocd-{c}", replicas_path=f"{c}.replicas", resources_path=f"{c}.resources")
                     for c in ("controller", "server", "repoServer", "applicationSet"))
    + tuple(PodSpec(f"argocd-{c}", resources_path=f"{c}.resources", enabled_path=f"{c}.enabled")
            for c in ("redis", "dex", "notifications")),
    # argo-workflows 1.0.x values.yaml: controller and server resources {}.
    "argo-workflows": (PodSpec("workflow-controller", replicas_path="controller.replicas", resources_path="controller.resources"),
                       PodSpec("argo-server", replicas_path="server.replicas", resources_path="server.resources",
                               enabled_path="server.enabled")),
    # kube-prometheus-stack 88.5.3 values.yaml (and its subcharts'): resources {} everywhere; the
    # platform sets Prometheus's.
    "kube-prometheus-stack": (
        PodSpec("prometheus", replicas_path="prometheus.prometheusSpec.replicas",
                resources_path="prometheus.prometheusSpec.resources"),
        PodSpec("alertmanager", replicas_path="alertmanager.alertmanagerSpec.replicas",
                resources_path="alertmanager.alertmanagerSpec.resources", enabled_path="alertmanager.enabled"),
        PodSpec("prometheus-operator", resources_path="prometheusOperator.resources"),
        PodSpec("kube-state-metrics", resources_path="kube-state-metrics.resources"),
        PodSpec("grafana", resources_path="grafana.resources", enabled_path="grafana.enabled"),
        PodSpec("node-exporter", per_node=True, resources_path="prometheus-node-exporter.resources"),
    ),
    # gpu-operator v25.3.0 values.yaml: operator requests 200m/100Mi; its node-feature-discovery
    # v0.17.2 subchart: master 100m/128Mi, gc 10m/128Mi. The platform puts all three on the system
    # nodes (components/gpu_enablement.py, aws-readiness-4 K1); its operands run on GPU nodes.
    "gpu-operator": (
        PodSpec("gpu-operator", 200, 100, resources_path="operator.resources"),
        PodSpec("nfd-master", 100, 128, replicas_path="node-feature-discovery.master.replicaCount",
                resources_path="node-feature-discovery.master.resources"),
        PodSpec("nfd-gc", 10, 128, replicas_path="node-feature-discovery.gc.replicaCount",
                resources_path="node-feature-discovery.gc.resources"),
    ),
    # Kubeflow Trainer 2.3 chart: controller manager, no request in the chart.
    "oci://ghcr.io/kubeflow/charts/kubeflow-trainer": (PodSpec("kubeflow-trainer-controller"),),
}

# Charts that put no pod on the system nodes (CRDs only, or GPU nodes only by nodeSelector).
NO_SYSTEM_PODS = frozenset({
    "oci://public.ecr.aws/karpenter/karpenter-crd", "prometheus-operator-crds", "nvidia-device-plugin",
    "dcgm-exporter", "aws-efa-k8s-device-plugin",
})

# EKS add-ons. CoreDNS: 2 replicas, requests 100m/70Mi (the EKS CoreDNS Deployment); aws-node:
# cpu 25m (amazon-vpc-cni-k8s config/master/aws-k8s-cni.yaml); kube-proxy: cpu 100m (EKS kube-proxy
# DaemonSet). The others' requests are not verified offline: counted as pods without requests.
ADDON_PODS: Mapping[str, tuple[PodSpec, ...]] = {
    "coredns": (PodSpec("coredns", 100, 70, replicas=2),),
    "vpc-cni": (PodSpec("aws-node", 25, 0, per_node=True),),
    "kube-proxy": (PodSpec("kube-proxy", 100, 0, per_node=True),),
    "eks-pod-identity-agent": (PodSpec("eks-pod-identity-agent", per_node=True),),
    "aws-ebs-csi-driver": (PodSpec("ebs-csi-controller", replicas=2), PodSpec("ebs-csi-node", per_node=True)),
    "aws-fsx-csi-driver": (PodSpec("fsx-csi-controller", replicas=2), PodSpec("fsx-csi-node", per_node=True)),
    "aws-efs-csi-driver": (PodSpec("efs-csi-controller", replicas=2), PodSpec("efs-csi-node", per_node=True)),
    "aws-mountpoint-s3-csi-driver": (PodSpec("s3-csi-controller"), PodSpec("s3-csi-node", per_node=True)),
}
# The Training Operator v1.9.4 Deployment (manifests/base/deployment.yaml): 1 replica, no request.
KUSTOMIZE_PODS = (PodSpec("training-operator"),)


@dataclass(frozen=True)
class Placed:
    name: str
    pods: int
    cpu_m: int
    memory_mib: int
    per_node: bool = False


@dataclass(frozen=True)
class SystemCapacity:
    instance_type: str
    nodes: int
    shape: NodeShape
    placed: tuple[Placed, ...]

    @property
    def cpu_requested_m(self) -> int:
        return sum(p.cpu_m for p in self.placed)

    @property
    def memory_requested_mib(self) -> int:
        return sum(p.memory_mib for p in self.placed)

    @property
    def pods(self) -> int:
        return sum(p.pods for p in self.placed)

    @property
    def cpu_allocatable_m(self) -> int:
        return self.nodes * self.shape.allocatable_cpu_m

    @property
    def memory_allocatable_mib(self) -> int:
        return self.nodes * self.shape.allocatable_memory_mib

    @property
    def pod_slots(self) -> int:
        return self.nodes * self.shape.max_pods

    @property
    def fits(self) -> bool:
        return (self.cpu_requested_m <= self.cpu_allocatable_m and self.memory_requested_mib <= self.memory_allocatable_mib
                and self.pods <= self.pod_slots)

    @property
    def fits_with_one_node_lost(self) -> bool:
        """After a spot interruption, until the group replaces the node: the survivors' room vs
        everything but the lost node's DaemonSet pods."""
        if self.nodes < 2:
            return False
        per_node_cpu = sum(p.cpu_m for p in self.placed if p.per_node) // self.nodes
        per_node_mem = sum(p.memory_mib for p in self.placed if p.per_node) // self.nodes
        return (self.cpu_requested_m - per_node_cpu <= (self.nodes - 1) * self.shape.allocatable_cpu_m
                and self.memory_requested_mib - per_node_mem <= (self.nodes - 1) * self.shape.allocatable_memory_mib)

    @property
    def unrequested(self) -> list[str]:
        return [p.name for p in self.placed if p.cpu_m == 0 and p.memory_mib == 0]


def _get(values: Mapping[str, Any], path: Optional[str]) -> Any:
    node: Any = values
    for part in (path or "").split("."):
        if not path or not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def parse_cpu_m(value: Any) -> int:
    text = str(value)
    return int(float(text[:-1])) if text.endswith("m") else int(float(text) * 1000)


def parse_memory_mib(value: Any) -> int:
    text = str(value)
    for suffix, factor in (("Gi", 1024), ("Mi", 1), ("G", 1000 ** 3 / 2 ** 20), ("M", 1000 ** 2 / 2 ** 20)):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(int(text) / 2 ** 20)


def _place(spec: PodSpec, values: Mapping[str, Any], nodes: int, owner: str) -> Optional[Placed]:
    if spec.enabled_path is not None and _get(values, spec.enabled_path) is False:
        return None
    replicas = nodes if spec.per_node else int(_get(values, spec.replicas_path) or spec.replicas)
    cpu, memory = spec.cpu_m, spec.memory_mib
    resources = _get(values, spec.resources_path)
    if isinstance(resources, Mapping) and resources.get("requests"):
        requests = resources["requests"]
        cpu = parse_cpu_m(requests["cpu"]) if "cpu" in requests else 0
        memory = parse_memory_mib(requests["memory"]) if "memory" in requests else 0
    return Placed(f"{owner}/{spec.name}", replicas, replicas * cpu, replicas * memory, spec.per_node)


def system_capacity(recording: Recording) -> Optional[SystemCapacity]:
    """The static node group's load: every recorded release, add-on and the Training Operator."""
    groups = recording.by_type("aws:eks/nodeGroup:NodeGroup")
    if not groups:
        return None
    group = groups[0]
    instance_type = group.inputs["instanceTypes"][0]
    shape = SYSTEM_NODE_SHAPES.get(instance_type)
    if shape is None:
        return None
    # The group's smallest type decides (a spot group may launch any of its types).
    shape = min((SYSTEM_NODE_SHAPES[t] for t in group.inputs["instanceTypes"] if t in SYSTEM_NODE_SHAPES),
                key=lambda s: (s.allocatable_cpu_m, s.allocatable_memory_mib))
    nodes = int(group.inputs["scalingConfig"]["desiredSize"])
    placed: list[Placed] = []
    for release in recording.by_type(HELM_RELEASE):
        chart = str(release.inputs.get("chart"))
        if chart in NO_SYSTEM_PODS:
            continue
        for spec in CHART_PODS.get(chart, (PodSpec(chart),)):
            item = _place(spec, release.inputs.get("values") or {}, nodes, release.name)
            if item is not None:
                placed.append(item)
    for addon in recording.by_type(ADDON):
        name = str(addon.inputs.get("addonName"))
        for spec in ADDON_PODS.get(name, (PodSpec(name),)):
            item = _place(spec, {}, nodes, f"add-on {name}")
            if item is not None:
                placed.append(item)
    if recording.by_type("kubernetes:kustomize/v2:Directory"):
        placed += [p for p in (_place(s, {}, nodes, "training-operator") for s in KUSTOMIZE_PODS) if p]
    return SystemCapacity(instance_type, nodes, shape, tuple(placed))


# Charts whose only pods are DaemonSets on the GPU nodes (components/gpu_enablement.py). The
# platform sets no requests for them; a request set in the release's values is counted.
GPU_NODE_CHART_PODS: Mapping[str, tuple[PodSpec, ...]] = {
    "nvidia-device-plugin": (PodSpec("nvidia-device-plugin", per_node=True, resources_path="resources"),),
    "dcgm-exporter": (PodSpec("dcgm-exporter", per_node=True, resources_path="resources"),),
    "aws-efa-k8s-device-plugin": (PodSpec("aws-efa-k8s-device-plugin", per_node=True, resources_path="resources"),),
}


def gpu_node_daemonsets(recording: Recording) -> tuple[Placed, ...]:
    """The DaemonSet pods one GPU node runs, as the recorded releases and add-ons set them (an
    upper bound: every per-node pod of the system nodes is counted, whether or not it tolerates the
    GPU taints). The workloads' own DaemonSets (node health agent, MIG gate) are not in the graph."""
    placed: list[Placed] = []
    for release in recording.by_type(HELM_RELEASE):
        chart = str(release.inputs.get("chart"))
        for spec in (*CHART_PODS.get(chart, ()), *GPU_NODE_CHART_PODS.get(chart, ())):
            item = _place(spec, release.inputs.get("values") or {}, 1, release.name) if spec.per_node else None
            if item is not None:
                placed.append(item)
    for addon in recording.by_type(ADDON):
        name = str(addon.inputs.get("addonName"))
        placed += [p for p in (_place(s, {}, 1, f"add-on {name}") for s in ADDON_PODS.get(name, ()) if s.per_node) if p]
    return tuple(placed)


def plan_lines(capacity: SystemCapacity) -> Iterator[str]:
    c = capacity
    yield (f"{c.nodes} x {c.instance_type} (smallest of the group): allocatable {c.cpu_allocatable_m}m CPU, "
           f"{c.memory_allocatable_mib} MiB, {c.pod_slots} pods")
    yield (f"requested by system pods: {c.cpu_requested_m}m CPU ({c.cpu_requested_m / c.cpu_allocatable_m:.0%}), "
           f"{c.memory_requested_mib} MiB ({c.memory_requested_mib / c.memory_allocatable_mib:.0%}), {c.pods} pods: "
           + ("fits" if c.fits else "DOES NOT FIT"))
    yield ("with one node lost (spot interruption, until the group replaces it): "
           + ("the rest still fit" if c.fits_with_one_node_lost else "the rest do NOT fit; some controllers wait Pending"))
    if c.unrequested:
        yield f"no request (memory not reserved): {', '.join(sorted(c.unrequested))}"


def warnings(capacity: Optional[SystemCapacity]) -> Iterator[str]:
    if capacity is None:
        return
    if not capacity.fits:
        yield (f"system nodes: requests ({capacity.cpu_requested_m}m CPU, {capacity.memory_requested_mib} MiB, "
               f"{capacity.pods} pods) exceed {capacity.nodes} x {capacity.instance_type} allocatable "
               f"({capacity.cpu_allocatable_m}m, {capacity.memory_allocatable_mib} MiB, {capacity.pod_slots} pods): "
               "raise cluster.systemNodeGroup.desiredSize or pick a larger type, or lower monitoring's requests")
