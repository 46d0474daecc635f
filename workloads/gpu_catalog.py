"""What each GPU type an ML engineer names means on EC2 (pure data, no Pulumi).

A pool is declared as "h100, 8 per node, EFA": this catalog turns that into the instance
families and types Karpenter may launch, the value of Karpenter's well-known label
``karpenter.k8s.aws/instance-gpu-name``, GPU memory, and which sizes have EFA (and how many
network cards, for the EC2NodeClass's EFA interfaces).

Instance data from the EC2 accelerated-computing instance pages (Nov 2026). Where two GPU types
share a Karpenter gpu-name (a100 40 GB on p4d, a100 80 GB on p4de), the instance family tells
them apart.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

from workloads.problems import Problem

# EC2 gives a spot instance two minutes between the interruption notice and reclaiming it.
SPOT_NOTICE_SECONDS = 120


@dataclass(frozen=True)
class InstanceShape:
    """One EC2 instance type of a GPU type."""

    instance_type: str
    num_gpus: int
    # 0 = no EFA; otherwise the number of network cards that each get an EFA interface.
    num_efa_network_cards: int = 0

    @property
    def family(self) -> str:
        return self.instance_type.split(".", 1)[0]

    @property
    def efa(self) -> bool:
        return self.num_efa_network_cards > 0


@dataclass(frozen=True)
class GpuType:
    """A GPU model as ML engineers name it, and where EC2 offers it."""

    name: str  # the config value: "h100"
    karpenter_gpu_name: str  # value of karpenter.k8s.aws/instance-gpu-name
    gpu_memory_gib: int
    shapes: tuple[InstanceShape, ...] = field(default_factory=tuple)
    description: str = ""

    @property
    def families(self) -> tuple[str, ...]:
        return tuple(sorted({s.family for s in self.shapes}))

    @property
    def gpus_per_node_options(self) -> tuple[int, ...]:
        return tuple(sorted({s.num_gpus for s in self.shapes}))

    @property
    def efa_gpus_per_node_options(self) -> tuple[int, ...]:
        return tuple(sorted({s.num_gpus for s in self.shapes if s.efa}))

    @property
    def supports_efa(self) -> bool:
        return any(s.efa for s in self.shapes)

    def shapes_for(self, num_gpus: int, *, efa: bool) -> tuple[InstanceShape, ...]:
        """Instance types a pool of ``num_gpus`` GPUs per node may launch.

        With EFA, only EFA-capable types that share the first one's network-card layout: one
        EC2NodeClass describes one set of EFA interfaces, and a layout with fewer cards than the
        instance has would leave bandwidth unused.
        """
        shapes = tuple(s for s in self.shapes if s.num_gpus == num_gpus and (s.efa or not efa))
        if efa and shapes:
            shapes = tuple(s for s in shapes if s.num_efa_network_cards == shapes[0].num_efa_network_cards)
        return shapes


def _g_family(family: str, *, efa_cards_48xl: int) -> tuple[InstanceShape, ...]:
    """g5 / g6 / g6e share one size ladder: 1 GPU up to 16xlarge, 4 GPUs at 12/24xlarge, 8 at 48xlarge.

    EFA exists from 8xlarge up (one network card, except 48xlarge).
    """
    return (
        InstanceShape(f"{family}.xlarge", 1),
        InstanceShape(f"{family}.2xlarge", 1),
        InstanceShape(f"{family}.4xlarge", 1),
        InstanceShape(f"{family}.8xlarge", 1, 1),
        InstanceShape(f"{family}.16xlarge", 1, 1),
        InstanceShape(f"{family}.12xlarge", 4, 1),
        InstanceShape(f"{family}.24xlarge", 4, 1),
        InstanceShape(f"{family}.48xlarge", 8, efa_cards_48xl),
    )


GPU_TYPES: Mapping[str, GpuType] = {
    t.name: t
    for t in (
        GpuType("a100", "a100", 40, (InstanceShape("p4d.24xlarge", 8, 4),), "NVIDIA A100 40 GB (p4d)"),
        GpuType("a100-80gb", "a100", 80, (InstanceShape("p4de.24xlarge", 8, 4),), "NVIDIA A100 80 GB (p4de)"),
        GpuType(
            "h100", "h100", 80,
            # p5.4xlarge (1 GPU) is listed without EFA here: multi-node jobs use p5.48xlarge.
            (InstanceShape("p5.48xlarge", 8, 32), InstanceShape("p5.4xlarge", 1)),
            "NVIDIA H100 80 GB (p5)",
        ),
        GpuType(
            "h200", "h200", 141,
            # p5en first: an EFA pool uses one network-card layout (see shapes_for).
            (InstanceShape("p5en.48xlarge", 8, 16), InstanceShape("p5e.48xlarge", 8, 32)),
            "NVIDIA H200 141 GB (p5e, p5en)",
        ),
        GpuType("l4", "l4", 24, _g_family("g6", efa_cards_48xl=1), "NVIDIA L4 24 GB (g6)"),
        GpuType("a10g", "a10g", 24, _g_family("g5", efa_cards_48xl=1), "NVIDIA A10G 24 GB (g5)"),
        GpuType("l40s", "l40s", 48, _g_family("g6e", efa_cards_48xl=4), "NVIDIA L40S 48 GB (g6e)"),
    )
}


def gpu_type(name: str) -> GpuType:
    try:
        return GPU_TYPES[name]
    except KeyError:
        raise KeyError(f"unknown GPU type {name!r}; known: {', '.join(sorted(GPU_TYPES))}") from None


# -- config rules (pure; called from the infra.config section rules) ----------------------------
def gpu_pool_problems(path: str, pools: Sequence[Any], *, is_prod: bool, default_ami_alias: str) -> Iterator[Problem]:
    """Every problem of the GPU pool list at once. ``pools`` are infra.config.GpuPoolConfig."""
    seen: dict[str, int] = {}
    for index, pool in enumerate(pools):
        at = f"{path}[{index}]"
        if pool.name in seen:
            yield Problem(f"{at}.name", pool.name, f"duplicates the name of {path}[{seen[pool.name]}]",
                          "give every pool a unique name (it names the NodePool and the Kueue flavor)")
        seen.setdefault(pool.name, index)

        gpu = GPU_TYPES.get(pool.gpu_type)
        if gpu is None:
            close = difflib.get_close_matches(pool.gpu_type, list(GPU_TYPES), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            yield Problem(f"{at}.gpuType", pool.gpu_type, "is not a known GPU type",
                          f"{hint}use one of {', '.join(sorted(GPU_TYPES))}")
        else:
            options = gpu.gpus_per_node_options
            if pool.gpus_per_node not in options:
                yield Problem(f"{at}.gpusPerNode", pool.gpus_per_node,
                              f"{pool.gpu_type} instances come with {', '.join(map(str, options))} GPUs per node",
                              f"use one of {list(options)}")
            elif pool.efa and not gpu.supports_efa:
                yield Problem(f"{at}.efa", True, f"no {pool.gpu_type} instance type ({', '.join(gpu.families)}) supports EFA",
                              "set efa: false, or pick a type with EFA (a100, a100-80gb, h100, h200, or l4/a10g/l40s from 8xlarge)")
            elif pool.efa and not gpu.shapes_for(pool.gpus_per_node, efa=True):
                yield Problem(f"{at}.efa", True,
                              f"no {pool.gpu_type} instance with {pool.gpus_per_node} GPU(s) supports EFA",
                              f"use gpusPerNode in {list(gpu.efa_gpus_per_node_options)} or set efa: false")
            elif pool.max_gpus < pool.gpus_per_node:
                yield Problem(f"{at}.maxGpus", pool.max_gpus,
                              f"is below one node's {pool.gpus_per_node} GPUs, so Karpenter could never launch a node",
                              f"set maxGpus to a multiple of {pool.gpus_per_node} (e.g. {pool.gpus_per_node * 2})")
            elif pool.max_gpus % pool.gpus_per_node:
                yield Problem(f"{at}.maxGpus", pool.max_gpus, f"is not a multiple of {pool.gpus_per_node} GPUs per node",
                              f"use {pool.max_gpus // pool.gpus_per_node * pool.gpus_per_node} or "
                              f"{(pool.max_gpus // pool.gpus_per_node + 1) * pool.gpus_per_node}")

        capacity = [c.value for c in pool.capacity_types]
        if len(set(capacity)) != len(capacity):
            yield Problem(f"{at}.capacityTypes", capacity, "lists a capacity type twice", "list each once")
        if "reserved" in capacity and not pool.capacity_reservation_ids:
            yield Problem(f"{at}.capacityReservationIds", [], "capacity type `reserved` needs the reservations to use",
                          "list the capacity reservation ids (cr-...) or remove `reserved`")
        if pool.capacity_reservation_ids and "reserved" not in capacity:
            yield Problem(f"{at}.capacityTypes", capacity, "capacityReservationIds are set but `reserved` is not a capacity type",
                          "add `reserved` to capacityTypes or remove capacityReservationIds")

        if pool.termination_grace_period_seconds <= pool.checkpoint_seconds:
            yield Problem(f"{at}.terminationGracePeriodSeconds", pool.termination_grace_period_seconds,
                          f"leaves no time to save a checkpoint (checkpointSeconds is {pool.checkpoint_seconds})",
                          f"set it above {pool.checkpoint_seconds} (and below {SPOT_NOTICE_SECONDS} with spot)")
        if "spot" in capacity and pool.termination_grace_period_seconds >= SPOT_NOTICE_SECONDS:
            yield Problem(f"{at}.terminationGracePeriodSeconds", pool.termination_grace_period_seconds,
                          f"a spot node is reclaimed {SPOT_NOTICE_SECONDS} s after the notice, before this grace period ends",
                          f"set it below {SPOT_NOTICE_SECONDS} (checkpoint budget + margin)")
        if "spot" in capacity and pool.checkpoint_seconds >= SPOT_NOTICE_SECONDS:
            yield Problem(f"{at}.checkpointSeconds", pool.checkpoint_seconds,
                          f"a checkpoint this slow cannot finish inside the {SPOT_NOTICE_SECONDS} s spot notice",
                          "speed up saving (async/sharded checkpoints, faster FSx tier) or drop `spot`")

        alias = pool.ami_alias or default_ami_alias
        if is_prod and alias.endswith("@latest"):
            yield Problem(f"{at}.amiAlias", alias, "prod nodes must not follow @latest (every AMI release drifts every node)",
                          "pin a release, e.g. al2023@v20251023")


def team_quota_problems(path: str, teams: Sequence[Any], pools: Sequence[Any]) -> Iterator[Problem]:
    """Teams name existing pools, once each; one team's quota never exceeds what its pool can launch.

    A team quota above the pool's maxGpus is an error (that quota can never be used). The sum of
    all teams' quotas above a pool's maxGpus is allowed (the plan warns: guaranteed is then not
    guaranteed).
    """
    # A shared pool's quota counts slices (infra.config.GpuPoolConfig.max_quota_units).
    pool_max = {p.name: getattr(p, "max_quota_units", p.max_gpus) for p in pools}
    seen: set[str] = set()
    for index, team in enumerate(teams):
        at = f"{path}[{index}]"
        if team.name in seen:
            yield Problem(f"{at}.name", team.name, "is listed twice", "list each team once")
        seen.add(team.name)
        for pool_name, gpus in team.gpu_quota.items():
            if pool_name not in pool_max:
                yield Problem(f"{at}.gpuQuota.{pool_name}", gpus, "names no GPU pool",
                              f"use one of {sorted(pool_max) or 'the gpuPools names (none defined)'}")
            elif gpus < 0:
                yield Problem(f"{at}.gpuQuota.{pool_name}", gpus, "is negative", "use 0 or more")
            elif gpus > pool_max[pool_name]:
                yield Problem(f"{at}.gpuQuota.{pool_name}", gpus,
                              f"exceeds the pool's maxGpus ({pool_max[pool_name]}) (in slices for a shared pool); "
                              "the quota could never be used",
                              f"lower it to at most {pool_max[pool_name]} or raise gpuPools maxGpus")
