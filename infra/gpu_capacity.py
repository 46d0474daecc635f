"""GPU capacity capability: Karpenter, GPU pools, GPU/EFA enablement, queues and quotas.

Reads the ``karpenter``, ``gpuPools``, ``gpuEnablement`` and ``scheduling`` sections, creates the
components in the workload account / cluster, and adds a plan section per GPU pool plus
warnings for any setting that lets Karpenter (or quotas) disturb running training.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Optional

from catalog.versions import (
    DCGM_EXPORTER, EFA_DEVICE_PLUGIN, KARPENTER, KARPENTER_CRD, KUEUE, NVIDIA_DEVICE_PLUGIN, NVIDIA_GPU_OPERATOR,
    PROMETHEUS_OPERATOR_CRDS, HelmChart,
)
from components.gpu_enablement import GpuEnablement, GpuEnablementArgs, GpuEnablementMode
from components.gpu_pools import GpuPools, GpuPoolsArgs
from components.karpenter import Karpenter, KarpenterArgs, KarpenterPrerequisites, KarpenterPrerequisitesArgs
from components.scheduling import Scheduling, SchedulingArgs
from infra.capability import Capability
from infra.config import GpuPoolConfig, PlatformConfig, TeamConfig
from infra.recording import Recording, RecordedResource
from infra.platform import Platform
from workloads import kueue, scheduling, tenancy
from workloads import gpu_sharing
from workloads.gpu_catalog import SPOT_NOTICE_SECONDS, gpu_type
from catalog.prices import PRICES, SPOT_DISCOUNT
from workloads.karpenter import CpuPoolSpec, duration_seconds, storage_startup_taints

NODE_POOL_TYPE = "kubernetes:karpenter.sh/v1:NodePool"


def cpu_pool_spec(config: PlatformConfig) -> Optional[CpuPoolSpec]:
    """``config.cpu_pool_spec``; kept for the job renderer (jobs/render.py) until it reads the config."""
    return config.cpu_pool_spec


def tenancy_spec(team: TeamConfig) -> tenancy.TeamTenancy:
    return tenancy.TeamTenancy(namespace=team.namespace, posix_id=team.uid, default_priority=team.priority,
                               local_queue=kueue.LOCAL_QUEUE_NAME)


def queues(config: PlatformConfig) -> kueue.Queues:
    """The Kueue flavors and queues of ``scheduling.teams`` over the stack's pools (workloads/kueue.py)."""
    teams = [team.copy_into(kueue.TeamQueueSpec, team=team.name, namespace=team.namespace) for team in config.scheduling.teams]
    return kueue.queues_for(teams, config.gpu_pool_specs, config.cpu_pool_spec)


def team_specs(config: PlatformConfig, s3_prefix_list_cidrs: Any = None,
               service_cidr: Optional[str] = None) -> list[tuple[scheduling.TeamNamespaceSpec, kueue.TeamQueueSpec]]:
    """Each team's namespace and queue. ``s3_prefix_list_cidrs``: the S3 gateway endpoint's CIDRs
    (an Output at deploy time); ``service_cidr``: the cluster's Service CIDR (workflow pods reach
    the API server's address)."""
    found = queues(config)
    out = []
    for team, queue in zip(config.scheduling.teams, found.teams):
        tenancy_ = tenancy_spec(team)
        out.append((
            scheduling.TeamNamespaceSpec(
                # Kueue decides per GPU type (the ClusterQueue's flavors); the namespace quota is
                # the backstop at what Kueue can admit (kueue.queues_for).
                team=team.name, namespace=team.namespace, gpu_quota=found.namespace_gpus[team.name],
                slice_quota=dict(found.namespace_slices[team.name]),
                vpc_cidr=str(config.network.cidr), default_priority=team.priority,
                extra_labels={"mlplatform.io/default-priority-class": scheduling.priority_class_name(team.priority),
                              **tenancy_.namespace_labels()},
                annotations=tenancy_.namespace_annotations(),
                s3_prefix_list_cidrs=s3_prefix_list_cidrs, service_cidr=service_cidr,
            ),
            queue,
        ))
    return out


def deploy(platform: Platform) -> dict[str, Any]:
    config: PlatformConfig = platform.config
    tags = config.resource_tags
    cluster = platform.cluster
    prerequisites = KarpenterPrerequisites(
        f"{config.name}-karpenter-aws", KarpenterPrerequisitesArgs(cluster=cluster, tags=tags),
        opts=platform.workload_opts(),
    )
    replicas = config.karpenter.replicas or (2 if config.is_prod else 1)
    pools = config.gpu_pool_specs
    karpenter = Karpenter(
        f"{config.name}-karpenter",
        KarpenterArgs(cluster=cluster, prerequisites=prerequisites, replicas=replicas, log_level=config.karpenter.log_level,
                      node_overlay=any(p.sharing.shared for p in pools), charts=platform.charts),
        opts=platform.kubernetes_opts(),
    )
    platform.node_pools = GpuPools(
        f"{config.name}-node-pools",
        GpuPoolsArgs(cluster=cluster, prerequisites=prerequisites, karpenter=karpenter, gpu_pools=pools,
                     cpu_pool=config.cpu_pool_spec, tags=tags,
                     # Only the taints of drivers this stack installs: a startup taint whose driver
                     # is absent is never lifted, and no node would ever become Initialized.
                     storage_startup_taints=storage_startup_taints(
                         config.datasets.storage if config.datasets is not None else None)),
        opts=platform.kubernetes_opts(),
    )
    enablement = config.gpu_enablement
    GpuEnablement(
        f"{config.name}-gpu-enablement",
        enablement.copy_into(GpuEnablementArgs, cluster=cluster, efa=any(p.efa for p in pools),
                             pool_sharing={p.name: p.sharing for p in pools if p.sharing.shared},
                             charts=platform.charts),
        opts=platform.kubernetes_opts(),
    )
    # The gateway endpoint's cidr_blocks are S3's prefix-list ranges for the region.
    found = queues(config)
    platform.scheduling = Scheduling(
        f"{config.name}-scheduling",
        SchedulingArgs(cluster=cluster, teams=team_specs(config, platform.network.s3_endpoint.cidr_blocks,
                                                          cluster.service_cidr), flavors=list(found.flavors),
                       cpu_flavor=found.cpu_flavor,
                       manager=kueue.ManagerConfigSpec(wait_for_pods_ready_timeout=config.scheduling.wait_for_pods_ready_timeout),
                       kueue_replicas=2 if config.is_prod else 1, charts=platform.charts),
        opts=platform.kubernetes_opts(),
    )
    return {
        "karpenterInterruptionQueue": prerequisites.queue.name,
        "karpenterNodeRoleName": prerequisites.node_role.name,
        "gpuPools": [p.name for p in pools],
        "teamNamespaces": config.team_namespaces,
    }


# -- offline plan ------------------------------------------------------------------------
def recorded_gpu_node_pools(recording: Recording) -> list[RecordedResource]:
    return [r for r in recording.by_type(NODE_POOL_TYPE)
            if r.inputs.get("metadata", {}).get("name", "").startswith("gpu-")]


def eviction_risks(config: PlatformConfig, node_pool: dict[str, Any]) -> Iterator[str]:
    """Why a recorded GPU NodePool could take a node away from running training."""
    name = node_pool.get("metadata", {}).get("name")
    spec = node_pool.get("spec", {})
    disruption = spec.get("disruption", {})
    template = spec.get("template", {}).get("spec", {})
    if disruption.get("consolidationPolicy") != "WhenEmpty":
        yield (f"GPU pool {name}: consolidationPolicy {disruption.get('consolidationPolicy')} lets Karpenter drain busy "
               "GPU nodes to repack them; use WhenEmpty (pods must also carry karpenter.sh/do-not-disrupt)")
    budgets = disruption.get("budgets") or []
    blocks_drift = any(b.get("nodes") == "0" and "Drifted" in (b.get("reasons") or []) for b in budgets)
    if not blocks_drift:
        yield (f"GPU pool {name}: no disruption budget with nodes \"0\" for Drifted: an AMI or pool change drains "
               "running training; add {nodes: \"0\", reasons: [Drifted]}")
    grace = duration_seconds(template.get("terminationGracePeriod")) or 0
    requirements = {r["key"]: r.get("values", []) for r in template.get("requirements", [])}
    capacity = requirements.get("karpenter.sh/capacity-type", [])
    if grace < 30:
        yield f"GPU pool {name}: terminationGracePeriod {grace}s is too short to save a checkpoint"
    if "spot" in capacity and grace >= SPOT_NOTICE_SECONDS:
        yield (f"GPU pool {name}: terminationGracePeriod {grace}s is longer than the {SPOT_NOTICE_SECONDS} s spot notice; "
               "the instance disappears before the grace period ends")
    if config.is_prod and capacity == ["spot"]:
        yield f"GPU pool {name}: spot only in prod; add on-demand (or reserved) as a fallback"
    expire = duration_seconds(template.get("expireAfter"))
    if expire is not None and expire < 24 * 3600:
        yield (f"GPU pool {name}: expireAfter {template.get('expireAfter')} recycles nodes daily or faster; "
               "every expiry interrupts running training")


def _gpu_pool_eviction(config: PlatformConfig, recording: Recording) -> Iterable[str]:
    for resource in recorded_gpu_node_pools(recording):
        yield from eviction_risks(config, resource.inputs)


def _gpu_quota_oversubscribed(config: PlatformConfig, recording: Recording) -> Iterable[str]:
    for pool in config.gpu_pools:
        total = sum(t.gpu_quota.get(pool.name, 0) for t in config.scheduling.teams)
        unit = "GPUs" if pool.sharing.value == "none" else "slices"
        if total > pool.max_quota_units:
            yield (f"GPU pool {pool.name}: teams' nominal quotas sum to {total} {unit} but the pool launches at most "
                   f"{pool.max_quota_units}; quotas are not guaranteed (raise maxGpus or lower gpuQuota)")


def pool_lines(config: PlatformConfig, pool: GpuPoolConfig) -> list[str]:
    spec = next(s for s in config.gpu_pool_specs if s.name == pool.name)
    gpu = gpu_type(pool.gpu_type)
    num_nodes = pool.max_gpus // pool.gpus_per_node
    return [
        f"gpu type         {pool.gpu_type} ({gpu.description}, {gpu.gpu_memory_gib} GiB/GPU)",
        f"instance types   {', '.join(spec.instance_types)}",
        f"gpus per node    {pool.gpus_per_node}",
        f"capacity types   {', '.join(c.value for c in pool.capacity_types)}"
        + (f" (reservations {', '.join(pool.capacity_reservation_ids)})" if pool.capacity_reservation_ids else ""),
        f"limits           nvidia.com/gpu {pool.max_gpus} (up to {num_nodes} node{'s' if num_nodes != 1 else ''})",
        f"efa              {'on' if pool.efa else 'off'}",
        f"zones            {', '.join(pool.zones) or 'all private subnets'}",
        f"ami              {spec.ami_alias}",
        f"disruption       {pool.consolidation_policy.value} after {pool.consolidate_after}, "
        f"expireAfter {pool.expire_after}, terminationGracePeriod {pool.termination_grace_period_seconds}s",
        f"sharing          {spec.sharing.describe()}",
        *slice_price_lines(spec),
    ]


def slice_price_lines(spec: Any) -> list[str]:
    """$/slice-hour of a shared pool: the instance's price x the slice's share of one GPU."""
    lines = []
    for resource, per_node in spec.slices_per_node.items():
        prices = [PRICES[t] for t in spec.instance_types if t in PRICES]
        if not prices:
            continue
        cheapest = min(prices, key=lambda p: p.on_demand_usd_per_hour)
        usd = gpu_sharing.usd_per_slice_hour(cheapest.on_demand_usd_per_hour, spec.gpus_per_node, spec.sharing, resource)
        lines.append(f"slice price      {resource}: ${usd:.4f}/slice-hour on-demand (${usd * (1 - SPOT_DISCOUNT):.4f} spot) = "
                     f"{cheapest.instance_type} ${cheapest.on_demand_usd_per_hour:.4f}/h / {spec.gpus_per_node} GPU(s) x "
                     f"{gpu_sharing.slice_fraction(spec.sharing, resource):.4g} of a GPU; {per_node} per node")
    return lines


def plan_sections(config: PlatformConfig, recording: Recording) -> Iterator[tuple[str, list[str]]]:
    for pool in config.gpu_pools:
        yield f"GPU pool {pool.name}", pool_lines(config, pool)
    if config.scheduling.teams:
        yield "Security: tenant isolation", list(isolation_lines(config, recording))


def isolation_lines(config: PlatformConfig, recording: Recording) -> Iterator[str]:
    """Each control of the tenant boundary, as the recording holds it (docs/architecture.md)."""
    policies = sorted(r.inputs["metadata"]["name"] for r in recording.by_type(
        "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"))
    yield f"admission policies on team namespaces: {', '.join(policies) or 'none'}"
    cohort = sum(sum(t.gpu_quota.values()) for t in config.scheduling.teams)
    for team in config.scheduling.teams:
        spec = tenancy_spec(team)
        yield (f"{team.namespace}: uid/gid {team.uid}; PSA restricted; priorities "
               f"{', '.join(tenancy.entitled_priority_classes(team.priority))}; Kueue queue {kueue.LOCAL_QUEUE_NAME} "
               f"(unlabelled jobs managed and refused); namespace GPU quota {cohort if team.borrowing else sum(team.gpu_quota.values())}"
               f"; group {tenancy.team_group(spec.namespace)} -> Role {tenancy.TEAM_ROLE} "
               f"({len(team.role_arns)} IAM role{'s' if len(team.role_arns) != 1 else ''}); "
               f"FSx: /checkpoints/{team.namespace} read-write, /datasets read-only")
    yield "FSx root squash 65534:65534; no team mounts the file-system root"
    yield "team Role: no NetworkPolicies, no Service writes, no impersonation; LoadBalancer/NodePort Services refused"


def warnings(config: PlatformConfig, recording: Recording) -> Iterator[str]:
    yield from _gpu_pool_eviction(config, recording)
    yield from _gpu_quota_oversubscribed(config, recording)


def charts(config: PlatformConfig) -> list[HelmChart]:
    """The charts ``deploy`` installs: Karpenter, GPU enablement (components/gpu_enablement.py) and Kueue."""
    enablement = config.gpu_enablement
    found = [KARPENTER_CRD, KARPENTER]
    if enablement.prometheus_operator_crds:
        found.append(PROMETHEUS_OPERATOR_CRDS)
    if enablement.mode is GpuEnablementMode.GPU_OPERATOR:
        found.append(NVIDIA_GPU_OPERATOR)
    else:
        found += [NVIDIA_DEVICE_PLUGIN, *([DCGM_EXPORTER] if enablement.dcgm_exporter else [])]
    if any(p.efa for p in config.gpu_pool_specs):
        found.append(EFA_DEVICE_PLUGIN)
    return [*found, KUEUE]


CAPABILITY = Capability("gpu capacity", deploy=deploy, plan_sections=plan_sections, warnings=warnings, charts=charts)
