"""The GPU pool rules of the stack config (pure, yield ``Problem``s): what an ML engineer's pool
declaration ("h100, 8 per node, EFA") may say, checked against the GPU catalog.

The facts themselves (GPU types, their instance shapes, memory, EFA cards, peaks) live in
catalog/gpus.py and are re-exported here for the modules that import them from this name.
"""
from __future__ import annotations

import difflib
from typing import Any, Iterator, Sequence

from catalog.gpus import GPU_TYPES, SPOT_NOTICE_SECONDS, GpuType, InstanceShape, gpu_type  # noqa: F401  (re-exported)
from workloads.problems import Problem


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
