"""The GPU capacity sections: ``karpenter``, ``gpuPools`` and ``gpuEnablement``; their rules."""
from __future__ import annotations

import re
from typing import Annotated, Any, Iterator, Optional, Union

from pydantic import Field, field_validator

from catalog.gpus import GPU_TYPES
from components.gpu_enablement import GpuEnablementMode
from workloads.problems import Problem
from catalog.versions import EKS_RELEASES, ami_release_date
from catalog import limits
from infra.config.common import Environment, ImageRef, _Model
from infra.config.engine import Rule, invalid
from infra.config.common import at_most
from workloads.gpu_catalog import gpu_pool_problems
from workloads.gpu_sharing import GpuSharing, PoolSharing, parse_mig_layout, sharing_problems
from workloads.karpenter import CapacityType as KarpenterCapacityType, ConsolidationPolicy, CpuPoolSpec, GpuPoolSpec


_DURATION = r"^(([0-9]+(s|m|h))+|Never)$"


class CpuPoolConfig(_Model):
    """Karpenter's general CPU pool for non-GPU work (spot + on-demand, consolidation on)."""

    enabled: bool = True
    capacity_types: list[KarpenterCapacityType] = Field(
        default_factory=lambda: list(CpuPoolSpec.capacity_types), min_length=1)
    max_cpu: int = Field(CpuPoolSpec.max_cpu, ge=1, description="NodePool limit on vCPUs.")
    max_memory_gib: int = Field(CpuPoolSpec.max_memory_gib, ge=1)
    root_volume_gib: Annotated[int, at_most(limits.EBS_GP3_VOLUME_GIB)] = Field(CpuPoolSpec.root_volume_gib, ge=20)

    def spec(self, ami_alias: str) -> Optional[CpuPoolSpec]:
        """The pool's NodePool spec (None when disabled); ``ami_alias``: karpenter.amiAlias."""
        return self.copy_into(CpuPoolSpec, ami_alias=ami_alias) if self.enabled else None


class KarpenterConfig(_Model):
    """Karpenter controller (Helm) and defaults shared by every pool."""

    ami_alias: str = Field("al2023@latest", pattern=r"^(al2023|bottlerocket)@(latest|v[0-9][0-9.]*)$",
                           description="EKS AMI alias, e.g. al2023@v20251023; prod must pin a version.")
    replicas: Optional[int] = Field(None, ge=1, le=5, description="Controller replicas; default 2 in prod (with a PDB), 1 in dev.")
    log_level: str = Field("info", pattern="^(debug|info|error)$")
    cpu_pool: CpuPoolConfig = Field(default_factory=CpuPoolConfig)


class GpuPoolConfig(_Model):
    """One GPU pool: what an ML engineer means (GPU type, GPUs per node, capacity, EFA)."""

    name: str = Field(pattern=r"^[a-z]([a-z0-9-]{0,30}[a-z0-9])?$", description="Pool name; nodes get label mlplatform.io/pool=<name>.")
    gpu_type: str = Field(description=" | ".join(GPU_TYPES))  # catalog/gpus.py: the README lists what it holds
    gpus_per_node: int = Field(ge=1, description="GPUs per node; the type must offer it (e.g. h100: 1 or 8).")
    capacity_types: list[KarpenterCapacityType] = Field(min_length=1, description="spot | on-demand | reserved: what the pool may launch. The order does not matter: Karpenter takes reserved, then spot, then on-demand, the first with an available offering.")
    capacity_reservation_ids: list[str] = Field(default_factory=list, description="cr-... ids; required with `reserved`.")
    max_gpus: int = Field(ge=1, description="NodePool limit on nvidia.com/gpu; at least one node's GPUs.")
    efa: bool = Field(GpuPoolSpec.efa, description="Attach EFA interfaces (multi-node NCCL); the type must support EFA.")
    zones: list[str] = Field(default_factory=list, description="Restrict to these AZs (default: every AZ of the network).")
    root_volume_gib: Annotated[int, at_most(limits.EBS_GP3_VOLUME_GIB)] = Field(GpuPoolSpec.root_volume_gib, ge=50, description="Encrypted gp3 root volume.")
    consolidation_policy: ConsolidationPolicy = Field(GpuPoolSpec.consolidation_policy, description="WhenEmpty keeps running training safe.")
    consolidate_after: str = Field(GpuPoolSpec.consolidate_after, pattern=_DURATION, description="Idle time before an empty node goes away.")
    expire_after: str = Field(GpuPoolSpec.expire_after, pattern=_DURATION, description="Node lifetime; an expiring node is drained like a spot notice.")
    checkpoint_seconds: int = Field(60, ge=1, description="Measured time to save a checkpoint on this hardware.")
    termination_grace_period_seconds: int = Field(GpuPoolSpec.termination_grace_period_seconds, ge=10, le=3600, description="Drain budget; > checkpointSeconds, < 120 with spot.")
    ami_alias: Optional[str] = Field(None, pattern=r"^(al2023|bottlerocket)@(latest|v[0-9][0-9.]*)$", description="Overrides karpenter.amiAlias.")
    # NodePool CRD (karpenter 1.14.1, spec.weight): integer, minimum 1, maximum 100.
    weight: Annotated[Optional[int], at_most(limits.KARPENTER_NODEPOOL_WEIGHT)] = Field(
        GpuPoolSpec.weight, ge=1, description="Karpenter NodePool weight 1-100 (higher is tried first).")
    sharing: GpuSharing = Field(GpuSharing.NONE, description="none | time-slicing | mig: how pods share a GPU (never with efa).")
    time_slicing_replicas: Optional[int] = Field(
        None, description="sharing: time-slicing: pods per GPU (2-16); each gets nvidia.com/gpu.shared, no memory isolation.")
    mig_layout: Optional[Union[str, dict[str, Any]]] = Field(
        None, description="sharing: mig: all-<profile> (e.g. all-1g.10gb) or {profile: instances per GPU}; A100/H100/H200 only.")

    def sharing_spec(self) -> PoolSharing:
        """The pool's sharing for the renderers (valid config only)."""
        if self.sharing is GpuSharing.MIG:
            return PoolSharing(GpuSharing.MIG, mig_layout=parse_mig_layout(self.gpu_type, self.mig_layout))
        if self.sharing is GpuSharing.TIME_SLICING:
            return PoolSharing(GpuSharing.TIME_SLICING, time_slicing_replicas=int(self.time_slicing_replicas or 1))
        return PoolSharing()

    @property
    def max_quota_units(self) -> int:
        """What a team quota on this pool counts: GPUs, or slices (all profiles) for a shared pool."""
        if self.sharing is GpuSharing.NONE:
            return self.max_gpus
        return sum(self.sharing_spec().slices_per_gpu().values()) * self.max_gpus

    def spec(self, default_ami_alias: str) -> GpuPoolSpec:
        """The pool's NodePool/EC2NodeClass spec: the same fields (and defaults, read from the spec),
        with karpenter.amiAlias where the pool names no AMI; checkpointSeconds, timeSlicingReplicas and
        migLayout are config-only (``sharing`` is given as the spec's PoolSharing, built from the three)."""
        return self.copy_into(GpuPoolSpec, ami_alias=self.ami_alias or default_ami_alias, sharing=self.sharing_spec())

    @field_validator("capacity_reservation_ids")
    @classmethod
    def _reservations(cls, value: list[str]) -> list[str]:
        bad = [v for v in value if not re.match(r"^cr-[0-9a-z]+$", v)]
        if bad:
            raise invalid(f"{bad} are not capacity reservation ids", "use ids such as cr-0123456789abcdef0")
        return value


class GpuEnablementConfig(_Model):
    """How GPUs become schedulable: NVIDIA device plugin or GPU Operator, plus DCGM and EFA plugins."""

    mode: GpuEnablementMode = Field(GpuEnablementMode.DEVICE_PLUGIN, description="device-plugin | gpu-operator (driver and toolkit off).")
    dcgm_exporter: bool = Field(True, description="GPU metrics (DCGM exporter) on GPU nodes.")
    service_monitor: bool = Field(False, description="ServiceMonitor for DCGM; needs prometheusOperatorCrds.")
    prometheus_operator_crds: bool = Field(
        False, description="Install the pinned prometheus-operator-crds chart (ServiceMonitor CRDs); serviceMonitor needs it.")
    node_health_image: Optional[ImageRef] = Field(
        None, description="Image of the GPU node readiness agent (docker/node-health: DCGM tools + python3), by digest in "
                          "prod, pushed to the stack's repository (output nodeHealthImageRepository). Every GPU node "
                          "starts tainted until this agent's checks pass, so GPU pools need it.")


def _service_monitor_needs_crds(service_monitor: bool, prometheus_operator_crds: bool) -> Iterator[Problem]:
    if service_monitor and not prometheus_operator_crds:
        yield Problem(
            "gpuEnablement.serviceMonitor", True,
            "a ServiceMonitor needs the Prometheus operator CRDs; without them Helm refuses the chart and rolls it back",
            "set gpuEnablement.prometheusOperatorCrds: true (installs the pinned prometheus-operator-crds chart) "
            "or serviceMonitor: false",
        )


def _node_health_image(environment: Environment, node_health_image: Optional[str], gpu_pools: list[GpuPoolConfig]) -> Iterator[Problem]:
    if gpu_pools and not node_health_image:
        yield Problem("gpuEnablement.nodeHealthImage", node_health_image,
                      "every GPU node starts with the readiness taint, which only the readiness agent lifts: "
                      "without it no GPU node would ever take a job",
                      "build docker/node-health, push it to the stack's node-health repository (stack output "
                      "nodeHealthImageRepository, docs/runbooks/first-deploy.md step 5) and set "
                      "gpuEnablement.nodeHealthImage to its URI")
    elif environment is Environment.PROD and node_health_image and "@sha256:" not in node_health_image:
        yield Problem("gpuEnablement.nodeHealthImage", node_health_image, "prod images are pinned by digest",
                      "use REPOSITORY@sha256:<digest>")


def _gpu_pool_rules(environment: Environment, ami_alias: str, gpu_pools: list[GpuPoolConfig]) -> Iterator[Problem]:
    yield from gpu_pool_problems(
        "gpuPools", gpu_pools, is_prod=environment is Environment.PROD, default_ami_alias=ami_alias)
    if environment is Environment.PROD and ami_alias.endswith("@latest"):
        yield Problem("karpenter.amiAlias", ami_alias, "prod nodes must not follow @latest (every AMI release drifts every node)",
                      "pin a release, e.g. al2023@v20251023")


def _gpu_pool_sharing(mode: GpuEnablementMode, gpu_pools: list[GpuPoolConfig]) -> Iterator[Problem]:
    yield from sharing_problems("gpuPools", gpu_pools, gpu_operator=mode is GpuEnablementMode.GPU_OPERATOR)


def _gpu_pool_zones(availability_zones: list[str], gpu_pools: list[GpuPoolConfig]) -> Iterator[Problem]:
    for index, pool in enumerate(gpu_pools):
        for zone in pool.zones:
            if zone not in availability_zones:
                yield Problem(f"gpuPools[{index}].zones", zone, "is not an AZ of the network (no subnet there)",
                              f"use one of {availability_zones}")


def _pool_node_limits(gpu_pools: list[GpuPoolConfig]) -> Iterator[Problem]:
    limit = limits.KUBERNETES_NODES_PER_CLUSTER
    for index, pool in enumerate(gpu_pools):
        num_nodes = pool.max_gpus // pool.gpus_per_node
        if num_nodes > limit.maximum:
            yield Problem(f"gpuPools[{index}].maxGpus", pool.max_gpus,
                          f"allows {num_nodes} nodes, above {limit.what} (source: {limit.source})",
                          f"use at most {int(limit.maximum) * pool.gpus_per_node} GPUs")


def _cluster_node_limit(gpu_pools: list[GpuPoolConfig], system_max_size: int) -> Iterator[Problem]:
    limit = limits.KUBERNETES_NODES_PER_CLUSTER
    num_nodes = [pool.max_gpus // pool.gpus_per_node for pool in gpu_pools]
    total = system_max_size + sum(num_nodes)
    if total > limit.maximum and all(n <= limit.maximum for n in num_nodes):
        yield Problem("gpuPools", [p.name for p in gpu_pools],
                      f"the GPU pools and the system node group together allow {total} nodes, above {limit.what} "
                      f"(source: {limit.source})", "lower the pools' maxGpus")


def _ami_alias_ships_version(version: str, ami_alias: str, gpu_pools: list[GpuPoolConfig]) -> Iterator[Problem]:
    """A pinned alias must be a release that ships the cluster's minor (catalog/versions.py EKS_RELEASES)."""
    release = EKS_RELEASES.get(version)
    if release is None:
        return
    known = ami_release_date(release.ami_release)
    pinned = [("karpenter.amiAlias", ami_alias)] + [
        (f"gpuPools[{i}].amiAlias", pool.ami_alias) for i, pool in enumerate(gpu_pools) if pool.ami_alias]
    for path, alias in pinned:
        date = ami_release_date(alias)
        if date is not None and known is not None and date < known:
            yield Problem(path, alias,
                          f"AMI release {alias.split('@')[-1]} is older than {release.ami_release}, the first release known to "
                          f"ship Kubernetes {version}: Karpenter may resolve no AMI for the cluster and launch no node",
                          f"pin {alias.split('@')[0]}@{release.ami_release} or later in the same change as cluster.version")


# Listed in the order the loader runs them (infra.config.platform.RULES).
RULES: tuple[Rule, ...] = (
    Rule(("gpuEnablement.serviceMonitor", "gpuEnablement.prometheusOperatorCrds"), _service_monitor_needs_crds),
    Rule(("environment", "karpenter.amiAlias", "gpuPools"), _gpu_pool_rules),
    Rule(("environment", "gpuEnablement.nodeHealthImage", "gpuPools"), _node_health_image),
    Rule(("cluster.version", "karpenter.amiAlias", "gpuPools"), _ami_alias_ships_version),
    Rule(("network.availabilityZones", "gpuPools"), _gpu_pool_zones),
    Rule(("gpuEnablement.mode", "gpuPools"), _gpu_pool_sharing),
    Rule(("gpuPools",), _pool_node_limits),
    Rule(("gpuPools", "cluster.systemNodeGroup.maxSize"), _cluster_node_limit),
)
