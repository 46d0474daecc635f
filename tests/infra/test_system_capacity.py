"""Issue 24: the static system nodes hold everything scheduled on them (monitoring included),
computed from the recorded releases' values and the pinned charts' defaults."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from infra.system_capacity import SYSTEM_NODE_SHAPES, system_capacity, warnings


def test_allocatable_follows_the_eks_ami_reservation_rule():
    """awslabs/amazon-eks-ami nodeadm: kube-reserved memory "11 * maxPods + 255" MiB; CPU "6% of the
    first core, 1% of the next core (up to 2 cores), 0.5% of the next 2 cores (up to 4 cores), 0.25%
    of any cores above 4"; eviction-hard memory.available<100Mi. eni-max-pods.txt: m7i.large 29."""
    large = SYSTEM_NODE_SHAPES["m7i.large"]
    assert large.max_pods == 29
    assert large.allocatable_cpu_m == 2000 - (60 + 10)
    assert large.allocatable_memory_mib == 8192 - (11 * 29 + 255) - 100
    xlarge = SYSTEM_NODE_SHAPES["m7i.xlarge"]
    assert xlarge.allocatable_cpu_m == 4000 - (60 + 10 + 5 + 5)
    eight = SYSTEM_NODE_SHAPES["m7i.2xlarge"]
    assert eight.allocatable_cpu_m == 8000 - (60 + 10 + 5 + 5 + 4 * 2.5)


def test_dev_system_nodes_hold_the_monitoring_stack_and_every_controller(dev_plan):
    capacity = system_capacity(dev_plan.recording)
    group = dev_plan.recording.one("aws:eks/nodeGroup:NodeGroup")
    assert capacity.nodes == group.inputs["scalingConfig"]["desiredSize"]
    # The requests come from what the platform renders: Prometheus's from its release values.
    release = next(r for r in dev_plan.recording.by_type("kubernetes:helm.sh/v3:Release")
                   if r.inputs["chart"] == "kube-prometheus-stack")
    spec = release.inputs["values"]["prometheus"]["prometheusSpec"]
    (prometheus,) = [p for p in capacity.placed if p.name.endswith("/prometheus")]
    assert prometheus.pods == spec["replicas"]
    assert prometheus.memory_mib == spec["replicas"] * int(spec["resources"]["requests"]["memory"].removesuffix("Gi")) * 1024
    names = {p.name.split("/")[-1] for p in capacity.placed}
    assert {"prometheus", "alertmanager", "grafana", "kube-state-metrics", "node-exporter", "prometheus-operator",
            "fluent-bit", "cloudwatch-agent", "karpenter", "kueue-controller-manager", "coredns"} <= names
    assert capacity.fits, (capacity.cpu_requested_m, capacity.cpu_allocatable_m,
                           capacity.memory_requested_mib, capacity.memory_allocatable_mib, capacity.pods)
    assert not list(warnings(capacity))
    sections = dict(dev_plan.sections)
    assert any("fits" in line for line in sections["System node capacity (monitoring included)"])


@dataclass
class _Resource:
    name: str
    inputs: dict[str, Any]
    dependencies: list = field(default_factory=list)


class _Recording:
    def __init__(self, resources: dict[str, list[_Resource]]):
        self.resources = resources

    def by_type(self, kind: str) -> list[_Resource]:
        return self.resources.get(kind, [])


def test_a_stack_that_outgrows_its_nodes_is_reported():
    """Prometheus asking for 4 CPUs on two m7i.large (1930m allocatable each) cannot be scheduled."""
    group = _Resource("nodes", {"instanceTypes": ["m7i.large"], "scalingConfig": {"desiredSize": 2}})
    prometheus = _Resource("kps", {"chart": "kube-prometheus-stack", "values": {"prometheus": {"prometheusSpec": {
        "replicas": 1, "resources": {"requests": {"cpu": "4", "memory": "2Gi"}}}}}})
    recording = _Recording({"aws:eks/nodeGroup:NodeGroup": [group], "kubernetes:helm.sh/v3:Release": [prometheus]})
    capacity = system_capacity(recording)
    assert capacity.cpu_requested_m == 4000 and not capacity.fits
    (warning,) = warnings(capacity)
    assert "4000m CPU" in warning and "desiredSize" in warning
    prometheus.inputs["values"]["prometheus"]["prometheusSpec"]["resources"]["requests"]["cpu"] = "1500m"
    assert system_capacity(recording).fits


def test_prod_counts_the_gpu_operator_and_nfd_controllers_it_places_on_the_system_nodes(prod_plan):
    """The operator and NFD master/gc Deployments run on the system nodes (aws-readiness-4 K1),
    with the requests of gpu-operator v25.3.0 values.yaml and its NFD v0.17.2 subchart."""
    from infra.system_capacity import system_capacity

    placed = {p.name.rsplit("/", 1)[-1]: (p.cpu_m, p.memory_mib) for p in system_capacity(prod_plan.recording).placed
              if "gpu-operator" in p.name}
    assert placed == {"gpu-operator": (200, 100), "nfd-master": (100, 128), "nfd-gc": (10, 128)}


def test_gpu_node_daemonset_budget_holds_what_the_platform_runs_there(dev_plan, prod_plan):
    """catalog/node_model.py leaves GPU_NODE_DAEMONSET_* for the DaemonSets of a GPU node; Karpenter
    counts their real requests when it picks the instance, so a budget below them makes preflight
    size pods one instance type smaller than Karpenter launches. The sum comes from what the
    platform renders: the recorded releases' and add-ons' per-node pods and the workloads'
    DaemonSets (node health agent, MIG gate)."""
    from catalog.node_model import GPU_NODE_DAEMONSET_CPU_MILLICORES, GPU_NODE_DAEMONSET_MEMORY_MIB
    from infra.system_capacity import gpu_node_daemonsets, parse_cpu_m, parse_memory_mib
    from workloads import gpu_sharing, node_health

    rendered = [node_health.daemon_set(image="node-health@sha256:" + "0" * 64),
                *(o for o in gpu_sharing.mig_gate_objects("kube-system", "gate@sha256:" + "0" * 64, ())
                  if o["kind"] == "DaemonSet")]
    workload_requests = [c.get("resources", {}).get("requests", {}) for ds in rendered
                         for c in ds["spec"]["template"]["spec"]["containers"]]
    assert all(r for r in workload_requests), "every workload DaemonSet container requests CPU and memory"
    for plan in (dev_plan, prod_plan):
        placed = gpu_node_daemonsets(plan.recording)
        names = {p.name.split("/")[-1] for p in placed}
        assert {"aws-node", "kube-proxy", "cloudwatch-agent", "fluent-bit"} <= names, names
        cpu = sum(p.cpu_m for p in placed) + sum(parse_cpu_m(r["cpu"]) for r in workload_requests)
        memory = sum(p.memory_mib for p in placed) + sum(parse_memory_mib(r["memory"]) for r in workload_requests)
        assert cpu <= GPU_NODE_DAEMONSET_CPU_MILLICORES, (plan, cpu, sorted(names))
        assert memory <= GPU_NODE_DAEMONSET_MEMORY_MIB, (plan, memory, sorted(names))
