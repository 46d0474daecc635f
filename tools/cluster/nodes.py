"""The test cluster's nodes: the harness's kubelet registers them, keeps their leases and runs their pods.

``Nodes(plane, setup).start()`` starts, inside the plane's machine, the kubelet
(tools/cluster/kubelet.py) for every node annotated ``kwok.x-k8s.io/node=fake`` (Karpenter's kwok
provider annotates each node it writes; the harness's system nodes carry the same annotation),
configured with what it may run (``RUNNERS``: the image repositories of the controllers the
platform deploys, each with its binary built here) and what the node agents do (``NodeSetup``).

kwok itself is not run: v0.8.0's informers ask the API server for watch streams, which need etcd's
progress notifications (missing from the Debian etcd 3.4 here: tools/cluster/RUNNING.md), so its
node-lease cache never syncs, it never holds a node's Lease, and every node went NotReady ~40 s
after it registered (the node lifecycle controller's grace period). The kubelet renews the Leases
itself.

It also registers the nodes EKS would register for the stack's managed node groups (their labels
and taints from the plan's ``aws:eks/nodeGroup:NodeGroup`` inputs), which is where the charts'
controllers and the platform's Deployments land.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional


from tools.cluster import machine
from tools.cluster.api import ApiError, eventually
from tools.cluster.kubelet import KWOK_NODE_ANNOTATION
from tools.cluster.paths import ROOT, tool_path

KWOK_ANNOTATION = {KWOK_NODE_ANNOTATION[0]: KWOK_NODE_ANNOTATION[1]}
# Every node's InternalIP (kwok's --node-ip did the same): only data, nothing dials it.
NODE_IP = "10.0.0.10"
# The zones of the test cluster's nodes (the system nodes spread over them, as a managed node group
# over its subnets' zones; Karpenter's offerings use the same): labels only, nothing routes by zone.
ZONES = ("zone-a", "zone-b")
REGION = "us-west-2"


@dataclass(frozen=True)
class Runner:
    """Pods whose container image is ``images`` run ``binary`` (from the cluster tools) at the
    container's command path, or at ``entrypoint`` when the pod gives no command (the image's
    ENTRYPOINT)."""

    name: str
    binary: str
    images: tuple[str, ...]
    entrypoint: str = "/manager"


RUNNERS = (
    Runner("kueue", "kueue", ("registry.k8s.io/kueue/kueue",)),
    # Karpenter's image is built with ko: its entry point is /ko-app/controller.
    Runner("karpenter", "karpenter-kwok-aws", ("public.ecr.aws/karpenter/controller",), "/ko-app/controller"),
    # The image the platform's overlay deploys (upstream's v1.9.4 manifests/base name it).
    Runner("training-operator", "training-operator", ("ghcr.io/kubeflow/training-v1/training-operator",
                                                      "kubeflow/training-operator")),
    Runner("jobset", "jobset", ("registry.k8s.io/jobset/jobset",)),
    Runner("trainer", "trainer-controller-manager", ("ghcr.io/kubeflow/trainer/trainer-controller-manager",)),
)


def runner_binaries() -> tuple[str, ...]:
    return tuple(r.binary for r in RUNNERS)


def runnable_images() -> set[str]:
    """Image repositories whose controller this machine has built (a pod of one runs for real)."""
    return {image for r in RUNNERS if tool_path(r.binary) is not None for image in r.images}


@dataclass
class NodeSetup:
    """What the node agents do for a stack (see tools/cluster/kubelet.py)."""

    # (key, namespace, daemonset): a startup taint and the DaemonSet whose Ready pod lifts it.
    taint_owners: list[dict[str, str]] = field(default_factory=list)
    # Device plugins: {kind, namespace, daemonset, ...} (kubelet.advertised).
    device_plugins: list[dict[str, Any]] = field(default_factory=list)
    # Per instance type: {"gpus": n, "efa": m}.
    instance_facts: dict[str, dict[str, int]] = field(default_factory=dict)
    # {namespace, daemonset, labels, gpu_nodes_only}: labels a node gets once that DaemonSet's pod
    # is Ready there (node-feature-discovery and the GPU Operator's node labelling).
    node_labels: list[dict[str, Any]] = field(default_factory=list)
    # {namespace, daemonset, config_label, state_label}: the MIG manager's verdict.
    mig_managers: list[dict[str, Any]] = field(default_factory=list)
    # Extra env and files for a runner (by runner name): the stand-in's own settings.
    runner_env: dict[str, dict[str, str]] = field(default_factory=dict)
    runner_mounts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


class Nodes:
    def __init__(self, plane, setup: Optional[NodeSetup] = None):
        self.plane = plane
        self.setup = setup or NodeSetup()
        self.workdir = plane.workdir / "kubelet"

    def start(self) -> "Nodes":
        if any(p.name == "kubelet" for p in self.plane.processes):
            return self
        self.workdir.mkdir(parents=True, exist_ok=True)
        kubeconfig = self.plane.inner_kubeconfig("system:node-agents", ["system:masters"])
        kubelet_config = self.workdir / "config.json"
        kubelet_config.write_text(json.dumps(self.kubelet_config(kubeconfig), indent=1))
        self.plane.spawn("kubelet", [sys.executable, "-m", "tools.cluster.kubelet", str(kubelet_config)],
                         env={"PYTHONPATH": str(ROOT)})
        return self

    def kubelet_config(self, kubeconfig: Path) -> dict[str, Any]:
        from tools.cluster.controlplane import POD_API_SERVER

        runners = []
        for runner in RUNNERS:
            binary = tool_path(runner.binary)
            if binary is None:
                continue
            for image in runner.images:
                runners.append({"name": runner.name, "kind": "binary", "image": image, "binary": str(binary),
                                "entrypoint": runner.entrypoint, "env": self.setup.runner_env.get(runner.name, {}),
                                "mounts": list((self.setup.runner_mounts or {}).get(runner.name, []))})
        runners.append({"name": "trainer-workload", "kind": "workload", "command_contains": "trainer.launch",
                        "python": sys.executable, "pythonpath": str(ROOT), "module": "tools.cluster.workload"})
        return {
            "workdir": str(self.workdir), "kubeconfig": str(kubeconfig), "pythonpath": str(ROOT),
            "pod_cidr": machine.POD_CIDR, "pod_gateway": machine.POD_GATEWAY, "pod_prefix": machine.POD_PREFIX,
            "bridge": machine.BRIDGE, "pod_api_server": POD_API_SERVER, "node_ip": NODE_IP,
            "runners": runners, "startup_taint_owners": self.setup.taint_owners,
            "device_plugins": self.setup.device_plugins, "instance_facts": self.setup.instance_facts,
            "node_labels": self.setup.node_labels, "mig_managers": self.setup.mig_managers,
        }


def system_nodes_from_groups(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The nodes EKS registers for each managed node group (``{"name", "inputs"}`` of the plan's
    ``aws:eks/nodeGroup:NodeGroup``): the group's ``labels`` and ``taints`` (EKS API
    ``NO_SCHEDULE`` -> ``NoSchedule``), ``desiredSize`` of them, each with its first instance
    type's allocatable."""
    effects = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
    nodes = []
    for index, group in enumerate(groups):
        inputs = group["inputs"]
        size = (inputs.get("scalingConfig") or {}).get("desiredSize", 1) or 1
        instance_type = (inputs.get("instanceTypes") or ["m7i.xlarge"])[0]
        capacity = node_capacity(instance_type)
        for replica in range(int(size)):
            name = f"system-{index}-{replica}"
            # The well-known labels the kubelet and the cloud provider set on an EKS node.
            labels = {**(inputs.get("labels") or {}), "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                      "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": instance_type,
                      "topology.kubernetes.io/zone": ZONES[replica % len(ZONES)], "topology.kubernetes.io/region": REGION,
                      "eks.amazonaws.com/nodegroup": group["name"], "eks.amazonaws.com/capacityType": "ON_DEMAND",
                      "type": "kwok"}
            nodes.append({"apiVersion": "v1", "kind": "Node",
                          "metadata": {"name": name, "annotations": dict(KWOK_ANNOTATION), "labels": labels},
                          "spec": {"taints": [{"key": t["key"], "value": t.get("value", ""), "effect": effects[t["effect"]]}
                                              for t in inputs.get("taints") or []]},
                          "status": {"capacity": capacity, "allocatable": capacity}})
    return nodes


def node_capacity(instance_type: str) -> dict[str, str]:
    """What the node's kubelet reports allocatable, from the platform's node model (max pods from
    the ENI limits, kube-reserved, system-reserved, eviction threshold): catalog/node_model.py."""
    from catalog.node_model import node_allocatable

    node = node_allocatable(instance_type, "managed-node-group")
    return {"cpu": f"{node.cpu_millicores}m", "memory": f"{node.memory_mib}Mi", "pods": str(node.max_pods),
            "ephemeral-storage": "100Gi"}


def register(plane, nodes: Iterable[dict[str, Any]]) -> None:
    """Create each node with its status (capacity, allocatable): a kubelet's registration."""
    api = plane.api
    for node in nodes:
        node = json.loads(json.dumps(node))
        status = node.pop("status", None)
        try:
            api.create("/api/v1/nodes", node)
        except ApiError as exc:
            if exc.status != 409:
                raise
        if status:
            api.merge_patch(f"/api/v1/nodes/{node['metadata']['name']}/status", {"status": status})
    names = [n["metadata"]["name"] for n in nodes]
    eventually(lambda: all(_ready(api.get(f"/api/v1/nodes/{n}")) for n in names),
               f"kwok reports the nodes Ready: {names}", timeout_s=60)


def _ready(node: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node.get("status", {}).get("conditions", []))
