"""Karpenter NodePool and EC2NodeClass manifests (``karpenter.sh/v1``, ``karpenter.k8s.aws/v1``).

Pure builders: a spec in, a manifest dict out. A GPU pool is training-safe by construction:
nodes are only consolidated when empty, GPUs are tainted so only GPU pods land there, the storage
CSI driver's startup taint keeps pods off a node until its node plugin is ready, and the termination
grace period is sized to the checkpoint budget (below the 2-minute spot notice).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping, Optional, Sequence

from workloads import gpu_runtime, gpu_sharing
from workloads.gpu_catalog import InstanceShape, gpu_type
from workloads.node_health_agent import READINESS_TAINT as READINESS_STARTUP_TAINT
from workloads.gpu_sharing import PoolSharing
from workloads.problems import accepts_enum_values

NODE_POOL_API = "karpenter.sh/v1"
NODE_CLASS_API = "karpenter.k8s.aws/v1"
DISCOVERY_TAG = "karpenter.sh/discovery"

GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
GPU_TAINT = {"key": GPU_RESOURCE, "effect": "NoSchedule"}
# The FSx CSI node plugin removes this taint once its Lustre client is up. It must be a
# startup taint: as a regular taint it would stay forever and nothing would schedule.
FSX_STARTUP_TAINT = {"key": "fsx.csi.aws.com/agent-not-ready", "effect": "NoExecute"}
# The same for the other storage mode's drivers, each removed only by its own node plugin:
# aws-efs-csi-driver pkg/driver/driver.go AgentNotReadyNodeTaintKey ("taints to be removed on
# driver startup"); awslabs/mountpoint-s3-csi-driver v2.2.2 pkg/driver/node/taint.go
# AgentNotReadyNodeTaintKey, watched for 10 minutes from the node plugin's start (driver.go:196).
EFS_STARTUP_TAINT = {"key": "efs.csi.aws.com/agent-not-ready", "effect": "NoExecute"}
S3_MOUNTPOINT_STARTUP_TAINT = {"key": "s3.csi.aws.com/agent-not-ready", "effect": "NoExecute"}
# Every storage startup taint a pool may start with (agents on every node tolerate them all).
STORAGE_STARTUP_TAINTS = (FSX_STARTUP_TAINT, EFS_STARTUP_TAINT, S3_MOUNTPOINT_STARTUP_TAINT)


@dataclass(frozen=True)
class StartupTaintOwner:
    """What removes one startup taint in a customer's cluster: a pod of ``daemonset`` (namespace,
    name) once it runs on the node, either an EKS add-on's node plugin (``addon``) or one of the
    platform's agents. ``lifts``: what that pod's code does, quoted from its source."""

    key: str
    daemonset: tuple[str, str]
    lifts: str
    addon: Optional[str] = None


# Every startup taint a pool may declare, beside its key: the plan check (tests/infra) and the
# cluster tests' node agents (tools/cluster/kubelet.py) read this one table.
STARTUP_TAINT_OWNERS: dict[str, StartupTaintOwner] = {o.key: o for o in (
    StartupTaintOwner(
        FSX_STARTUP_TAINT["key"], ("kube-system", "fsx-csi-node"), addon="aws-fsx-csi-driver",
        lifts="kubernetes-sigs/aws-fsx-csi-driver pkg/driver/node.go: the node service starts "
              "`go removeTaintInBackground(cloud.DefaultKubernetesAPIClient, removeNotReadyTaint)`, which patches "
              "its own node (CSI_NODE_NAME) without the taint, retrying `Steps: 10, // Max delay = 0.5 * 2^9 = ~4 minutes`"),
    StartupTaintOwner(
        EFS_STARTUP_TAINT["key"], ("kube-system", "efs-csi-node"), addon="aws-efs-csi-driver",
        lifts="kubernetes-sigs/aws-efs-csi-driver pkg/driver/driver.go `AgentNotReadyNodeTaintKey = "
              "\"efs.csi.aws.com/agent-not-ready\"` (\"the key of taints to be removed on driver startup\"); "
              "node.go `removeNotReadyTaint` \"removes the taint efs.csi.aws.com/agent-not-ready from the local node\" "
              "(CSI_NODE_NAME), unless DISABLE_TAINT_WATCHER is set"),
    StartupTaintOwner(
        S3_MOUNTPOINT_STARTUP_TAINT["key"], ("kube-system", "s3-csi-node"), addon="aws-mountpoint-s3-csi-driver",
        lifts="awslabs/mountpoint-s3-csi-driver pkg/driver/node/taint.go `RemoveTaintInBackground` \"waits for CSI "
              "driver registration and then removes the taint\": it polls the driver's socket for up to 30 s, then "
              "JSON-patches its node (CSI_NODE_NAME: `test` the taints, `replace` them without the key)"),
    StartupTaintOwner(
        READINESS_STARTUP_TAINT["key"], ("gpu-system", "gpu-node-health"),
        lifts="workloads/node_health_agent.py: the readiness agent lifts it once every GPU, ECC, DCGM and EFA check passes"),
    StartupTaintOwner(
        gpu_sharing.MIG_PENDING_TAINT["key"], ("gpu-system", gpu_sharing.MIG_GATE_NAME),
        lifts="workloads/gpu_sharing.py mig-ready-gate: lifts it while the MIG manager reports "
              "nvidia.com/mig.config.state=success"),
)}
# Every GPU node starts with this taint; the readiness agent (workloads/node_health.py) lifts it
# once the node's GPUs, ECC, DCGM diagnostics and EFA devices check out. Karpenter 1.14.1
# (pkg/apis/v1/nodepool.go): "startupTaints are taints that are applied to nodes upon startup
# which are expected to be removed automatically within a short period of time, typically by a
# DaemonSet that tolerates the taint. [...] StartupTaints are ignored for provisioning purposes
# in that pods are not required to tolerate a StartupTaint in order to have nodes provisioned
# for them." A node keeping it never becomes Initialized (nodeclaim/lifecycle/initialization.go).

# Labels a TrainingJob selects on (Karpenter copies template labels onto the node).
POOL_LABEL = "mlplatform.io/pool"
# The general CPU pool's name (its nodes' POOL_LABEL value); the stack config does not rename it.
GENERAL_POOL = "general"
GPU_TYPE_LABEL = "mlplatform.io/gpu-type"
NODE_ROLE_LABEL = "node.mlplatform.io/role"
EFA_LABEL = "mlplatform.io/efa"

# Karpenter's well-known labels.
GPU_NAME_KEY = "karpenter.k8s.aws/instance-gpu-name"
GPU_COUNT_KEY = "karpenter.k8s.aws/instance-gpu-count"
FAMILY_KEY = "karpenter.k8s.aws/instance-family"
CATEGORY_KEY = "karpenter.k8s.aws/instance-category"
GENERATION_KEY = "karpenter.k8s.aws/instance-generation"
CAPACITY_TYPE_KEY = "karpenter.sh/capacity-type"
INSTANCE_TYPE_KEY = "node.kubernetes.io/instance-type"
ARCH_KEY = "kubernetes.io/arch"
OS_KEY = "kubernetes.io/os"
ZONE_KEY = "topology.kubernetes.io/zone"


class CapacityType(str, Enum):
    SPOT = "spot"
    ON_DEMAND = "on-demand"
    RESERVED = "reserved"


class AmiFamily(str, Enum):
    AL2023 = "al2023"
    BOTTLEROCKET = "bottlerocket"


class ConsolidationPolicy(str, Enum):
    WHEN_EMPTY = "WhenEmpty"
    WHEN_EMPTY_OR_UNDERUTILIZED = "WhenEmptyOrUnderutilized"


@accepts_enum_values
@dataclass(frozen=True)
class NodeClassSpec:
    """What an EC2NodeClass needs from the cluster, shared by every pool."""

    cluster_name: str
    node_role_name: Any  # str, or a pulumi Output[str] when built by a component
    cluster_security_group_id: Any = None  # the EKS-created primary SG, selected by id
    tags: Mapping[str, str] = field(default_factory=dict)


@accepts_enum_values
@dataclass(frozen=True)
class GpuPoolSpec:
    """One GPU pool as an ML engineer declares it (see infra.config.GpuPoolConfig)."""

    name: str
    gpu_type: str
    gpus_per_node: int
    capacity_types: Sequence[CapacityType]
    max_gpus: int
    efa: bool = False
    zones: Sequence[str] = ()
    capacity_reservation_ids: Sequence[str] = ()
    root_volume_gib: int = 200
    consolidate_after: str = "10m"
    expire_after: str = "720h"
    termination_grace_period_seconds: int = 110
    ami_alias: str = "al2023@latest"
    consolidation_policy: ConsolidationPolicy = ConsolidationPolicy.WHEN_EMPTY
    weight: Optional[int] = None
    sharing: PoolSharing = PoolSharing()

    @property
    def resource_name(self) -> str:
        return f"gpu-{self.name}"

    @property
    def slices_per_node(self) -> dict[str, int]:
        """Extended resource -> slices one node offers (empty for whole-GPU pools)."""
        return self.sharing.slices_per_node(self.gpus_per_node)

    @property
    def ami_family(self) -> AmiFamily:
        return AmiFamily(self.ami_alias.split("@", 1)[0])

    @property
    def shapes(self) -> tuple[InstanceShape, ...]:
        return gpu_type(self.gpu_type).shapes_for(self.gpus_per_node, efa=self.efa)

    @property
    def instance_types(self) -> list[str]:
        return [s.instance_type for s in self.shapes]

    @property
    def node_labels(self) -> dict[str, str]:
        """Labels every node of the pool carries; TrainingJob and Kueue flavors select on these."""
        labels = {POOL_LABEL: self.name, GPU_TYPE_LABEL: self.gpu_type, NODE_ROLE_LABEL: "gpu"}
        if self.efa:
            labels[EFA_LABEL] = "true"
        # Shared pools: the device plugin's (and MIG manager's) per-node config selectors.
        labels.update(gpu_sharing.node_labels(self.name, self.sharing))
        return labels


@accepts_enum_values
@dataclass(frozen=True)
class CpuPoolSpec:
    """The general CPU pool for non-GPU work (data prep, evaluation, CI)."""

    name: str = GENERAL_POOL
    capacity_types: Sequence[CapacityType] = (CapacityType.SPOT, CapacityType.ON_DEMAND)
    max_cpu: int = 256
    max_memory_gib: int = 1024
    instance_categories: Sequence[str] = ("c", "m", "r")
    root_volume_gib: int = 100
    consolidate_after: str = "1m"
    expire_after: str = "720h"
    ami_alias: str = "al2023@latest"

    @property
    def resource_name(self) -> str:
        return f"cpu-{self.name}"


def duration_seconds(duration: Optional[str]) -> Optional[int]:
    """Seconds of a Karpenter duration ("10m", "1h30m", "90s"); None for "Never" or unset."""
    if not duration or duration == "Never":
        return None
    units = {"s": 1, "m": 60, "h": 3600}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([smh])", str(duration)))


def _requirement(key: str, values: Sequence[str], operator: str = "In") -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": [str(v) for v in values]}


def gpu_pool_requirements(pool: GpuPoolSpec) -> list[dict[str, Any]]:
    """Karpenter requirements: exactly this GPU, this many per node, these capacity types."""
    gpu = gpu_type(pool.gpu_type)
    shapes = pool.shapes
    requirements = [
        _requirement(GPU_NAME_KEY, [gpu.karpenter_gpu_name]),
        _requirement(FAMILY_KEY, sorted({s.family for s in shapes})),
        _requirement(GPU_COUNT_KEY, [str(pool.gpus_per_node)]),
    ]
    if pool.efa:
        # No well-known label says "has EFA": pin the EFA-capable sizes.
        requirements.append(_requirement(INSTANCE_TYPE_KEY, [s.instance_type for s in shapes]))
    requirements += [
        _requirement(CAPACITY_TYPE_KEY, [c.value for c in pool.capacity_types]),
        _requirement(ARCH_KEY, ["amd64"]),
        _requirement(OS_KEY, ["linux"]),
    ]
    if pool.zones:
        requirements.append(_requirement(ZONE_KEY, list(pool.zones)))
    return requirements


def gpu_disruption(pool: GpuPoolSpec) -> dict[str, Any]:
    """Never take a busy GPU node away to save money: consolidation only when empty, and
    drift (AMI or config change) waits until the node is empty instead of draining training.
    """
    return {
        "consolidationPolicy": pool.consolidation_policy.value,
        "consolidateAfter": pool.consolidate_after,
        "budgets": [
            {"nodes": "0", "reasons": ["Drifted", "Underutilized"]},
            {"nodes": "20%", "reasons": ["Empty"]},
        ],
    }


# -- which storage startup taints a stack's nodes start with ------------------------------------------
# The CSI drivers each datasets storage mode installs (components/datasets.py ``DatasetsStorage``):
# FSx's Lustre client; or EFS (team subtrees) and Mountpoint (datasets), whose volumes every team
# pod mounts together.
_STORAGE_MODE_STARTUP_TAINTS = {
    "fsx": (FSX_STARTUP_TAINT,),
    "s3-mountpoint": (EFS_STARTUP_TAINT, S3_MOUNTPOINT_STARTUP_TAINT),
}


def storage_startup_taints(storage: Optional[str]) -> tuple[dict[str, str], ...]:
    """The node startup taints of the CSI drivers the datasets storage mode ``storage`` installs
    (``DatasetsStorage`` or its value; None: no datasets, no storage driver, no taint), each lifted
    by its own node plugin once it runs."""
    if storage is None:
        return ()
    mode = getattr(storage, "value", storage)
    if mode not in _STORAGE_MODE_STARTUP_TAINTS:
        raise ValueError(f"storage mode {mode!r}: expected one of {sorted(_STORAGE_MODE_STARTUP_TAINTS)}")
    return tuple(dict(taint) for taint in _STORAGE_MODE_STARTUP_TAINTS[mode])


def gpu_node_pool(pool: GpuPoolSpec, *, storage_startup_taints: Sequence[Mapping[str, str]] = ()) -> dict[str, Any]:
    """``storage_startup_taints``: the taints of the storage CSI node plugins the stack installs
    (``storage_startup_taints(mode)`` above), never one whose driver is absent: a startup
    taint nothing lifts keeps the node un-Initialized and unschedulable forever (Karpenter 1.14.1
    nodeclaim/lifecycle/initialization.go)."""
    name = pool.resource_name
    spec: dict[str, Any] = {
        "template": {
            "metadata": {"labels": pool.node_labels},
            "spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": name},
                "requirements": gpu_pool_requirements(pool),
                "taints": [dict(GPU_TAINT), *gpu_sharing.taints(pool.sharing)],
                "startupTaints": [*map(dict, storage_startup_taints), dict(READINESS_STARTUP_TAINT),
                                  *gpu_sharing.startup_taints(pool.sharing)],
                "expireAfter": pool.expire_after,
                "terminationGracePeriod": f"{pool.termination_grace_period_seconds}s",
            },
        },
        "limits": {GPU_RESOURCE: str(pool.max_gpus)},
        "disruption": gpu_disruption(pool),
    }
    if pool.weight is not None:
        spec["weight"] = pool.weight
    return {
        "apiVersion": NODE_POOL_API,
        "kind": "NodePool",
        "metadata": {"name": name, "labels": {POOL_LABEL: pool.name}},
        "spec": spec,
    }


def gpu_node_overlay(pool: GpuPoolSpec) -> Optional[dict[str, Any]]:
    """The pool's slice capacity per instance type (``workloads.gpu_sharing.node_overlay``); None
    for a whole-GPU pool."""
    return gpu_sharing.node_overlay(pool.name, pool.resource_name, pool.instance_types, pool.gpus_per_node, pool.sharing,
                                    pool_label=POOL_LABEL)


def metadata_options() -> dict[str, Any]:
    # IMDSv2 only, hop limit 1: pods (one hop further) cannot read the node role's credentials.
    return {"httpEndpoint": "enabled", "httpProtocolIPv6": "disabled", "httpPutResponseHopLimit": 1, "httpTokens": "required"}


def root_volume(ami_family: AmiFamily, size_gib: int) -> dict[str, Any]:
    # Bottlerocket's images and containers live on its second (data) volume.
    device = "/dev/xvda" if ami_family is AmiFamily.AL2023 else "/dev/xvdb"
    return {
        "deviceName": device,
        "rootVolume": ami_family is AmiFamily.AL2023,
        "ebs": {"volumeSize": f"{size_gib}Gi", "volumeType": "gp3", "encrypted": True, "deleteOnTermination": True},
    }


def efa_network_interfaces(num_network_cards: int) -> list[dict[str, Any]]:
    """EC2's recommended EFA layout: an ENA primary interface, then one EFA-only interface per card."""
    interfaces = [
        {"networkCardIndex": 0, "deviceIndex": 0, "interfaceType": "interface"},
        {"networkCardIndex": 0, "deviceIndex": 1, "interfaceType": "efa-only"},
    ]
    interfaces += [{"networkCardIndex": card, "deviceIndex": 0, "interfaceType": "efa-only"} for card in range(1, num_network_cards)]
    return interfaces


def _selector_terms(node_class: NodeClassSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    discovery = {DISCOVERY_TAG: node_class.cluster_name}
    subnets = [{"tags": dict(discovery)}]
    groups: list[dict[str, Any]] = [{"tags": dict(discovery)}]
    if node_class.cluster_security_group_id is not None:
        # The EKS-created cluster SG lets nodes reach the control plane and system pods.
        groups.append({"id": node_class.cluster_security_group_id})
    return subnets, groups


def _node_class(name: str, node_class: NodeClassSpec, *, ami_alias: str, root_gib: int, tags: Mapping[str, str]) -> dict[str, Any]:
    ami_family = AmiFamily(ami_alias.split("@", 1)[0])
    subnets, groups = _selector_terms(node_class)
    return {
        "apiVersion": NODE_CLASS_API,
        "kind": "EC2NodeClass",
        "metadata": {"name": name},
        "spec": {
            "amiSelectorTerms": [{"alias": ami_alias}],
            "role": node_class.node_role_name,
            "subnetSelectorTerms": subnets,
            "securityGroupSelectorTerms": groups,
            "metadataOptions": metadata_options(),
            "blockDeviceMappings": [root_volume(ami_family, root_gib)],
            # Local NVMe (p4d/p5/g6e...) as one RAID0 array for images, dataset cache and scratch.
            "instanceStorePolicy": "RAID0",
            "tags": {**node_class.tags, **tags},
        },
    }


def gpu_node_class(pool: GpuPoolSpec, node_class: NodeClassSpec) -> dict[str, Any]:
    manifest = _node_class(
        pool.resource_name, node_class, ami_alias=pool.ami_alias, root_gib=pool.root_volume_gib,
        tags={POOL_LABEL: pool.name, GPU_TYPE_LABEL: pool.gpu_type},
    )
    spec = manifest["spec"]
    if AmiFamily(pool.ami_alias.split("@", 1)[0]) is AmiFamily.AL2023:
        # The AMI's NVIDIA runtime honours NVIDIA_VISIBLE_DEVICES from any container by default
        # (workloads/gpu_runtime.py). Bottlerocket's NVIDIA variant already defaults to the same
        # two settings (bottlerocket packages/nvidia-container-toolkit/nvidia-container-toolkit-config-k8s:
        # settings.kubernetes.nvidia.container-runtime.visible-devices-as-volume-mounts default true,
        # ...visible-devices-envvar-when-unprivileged default false) and takes no shell user data.
        spec["userData"] = gpu_runtime.al2023_user_data()
    if pool.efa:
        spec["networkInterfaces"] = efa_network_interfaces(pool.shapes[0].num_efa_network_cards)
    if pool.capacity_reservation_ids:
        spec["capacityReservationSelectorTerms"] = [{"id": rid} for rid in pool.capacity_reservation_ids]
    return manifest


def cpu_node_pool(pool: CpuPoolSpec, *, storage_startup_taints: Sequence[Mapping[str, str]] = ()) -> dict[str, Any]:
    """``storage_startup_taints`` as for ``gpu_node_pool``."""
    name = pool.resource_name
    template_spec: dict[str, Any] = {
        "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": name},
        "requirements": [
            _requirement(CATEGORY_KEY, list(pool.instance_categories)),
            _requirement(GENERATION_KEY, ["5"], operator="Gt"),
            _requirement(CAPACITY_TYPE_KEY, [c.value for c in pool.capacity_types]),
            _requirement(ARCH_KEY, ["amd64"]),
            _requirement(OS_KEY, ["linux"]),
        ],
    }
    if storage_startup_taints:
        template_spec["startupTaints"] = [dict(t) for t in storage_startup_taints]
    template_spec["expireAfter"] = pool.expire_after
    return {
        "apiVersion": NODE_POOL_API,
        "kind": "NodePool",
        "metadata": {"name": name, "labels": {POOL_LABEL: pool.name}},
        "spec": {
            "template": {
                "metadata": {"labels": {POOL_LABEL: pool.name, NODE_ROLE_LABEL: "general"}},
                "spec": template_spec,
            },
            "limits": {"cpu": str(pool.max_cpu), "memory": f"{pool.max_memory_gib}Gi"},
            # Stateless CPU work may be packed tighter: consolidation is allowed here.
            "disruption": {
                "consolidationPolicy": ConsolidationPolicy.WHEN_EMPTY_OR_UNDERUTILIZED.value,
                "consolidateAfter": pool.consolidate_after,
                "budgets": [{"nodes": "10%"}],
            },
        },
    }


def cpu_node_class(pool: CpuPoolSpec, node_class: NodeClassSpec) -> dict[str, Any]:
    return _node_class(pool.resource_name, node_class, ami_alias=pool.ami_alias, root_gib=pool.root_volume_gib,
                       tags={POOL_LABEL: pool.name})
