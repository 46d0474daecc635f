"""Kueue's flavors, the teams' queues and the namespace quotas behind them, from the teams and
the pools alone (``workloads.kueue.queues_for``); and the storage startup taints a stack's nodes
start with (``workloads.karpenter.storage_startup_taints``)."""
from __future__ import annotations

import dataclasses

import pytest

from workloads import kueue
from workloads.gpu_sharing import GpuSharing, PoolSharing
from workloads.karpenter import (
    EFS_STARTUP_TAINT, FSX_STARTUP_TAINT, POOL_LABEL, S3_MOUNTPOINT_STARTUP_TAINT, CapacityType, CpuPoolSpec, GpuPoolSpec,
    storage_startup_taints,
)

H100 = GpuPoolSpec(name="h100", gpu_type="h100", gpus_per_node=8, capacity_types=(CapacityType.ON_DEMAND,), max_gpus=64,
                   efa=True)
L4 = GpuPoolSpec(name="l4", gpu_type="l4", gpus_per_node=1, capacity_types=(CapacityType.SPOT,), max_gpus=4)
# 4 pods per GPU: a team's quota on this pool counts slices of nvidia.com/gpu.shared.
L4_SHARED = GpuPoolSpec(name="l4-shared", gpu_type="l4", gpus_per_node=1, capacity_types=(CapacityType.SPOT,), max_gpus=2,
                        sharing=PoolSharing(GpuSharing.TIME_SLICING, time_slicing_replicas=4))
CPU = CpuPoolSpec(name="general", max_cpu=1000, max_memory_gib=4001)


def team(name: str, quota: dict[str, int], *, borrowing: bool = True) -> kueue.TeamQueueSpec:
    return kueue.TeamQueueSpec(team=name, namespace=f"team-{name}", gpu_quota=quota, borrowing=borrowing)


TEAMS = [team("a", {"h100": 16, "l4": 2, "l4-shared": 3}), team("b", {"h100": 8, "l4-shared": 5}, borrowing=False),
         team("c", {"l4": 1})]


def test_a_team_that_borrows_gets_the_cohorts_gpus_as_namespace_quota_one_that_does_not_its_own():
    """Kueue admits a borrowing job up to the cohort's GPUs; a namespace quota below that refuses
    the pods of a job Kueue already admitted (evicted and requeued until deactivated)."""
    queues = kueue.queues_for(TEAMS, [H100, L4, L4_SHARED], CPU)
    assert queues.namespace_gpus == {"a": 16 + 2 + 8 + 1, "b": 8, "c": 16 + 2 + 8 + 1}


def test_a_shared_pools_quota_counts_slices_never_whole_gpus():
    queues = kueue.queues_for(TEAMS, [H100, L4, L4_SHARED], CPU)
    assert queues.namespace_slices == {"a": {"nvidia.com/gpu.shared": 8}, "b": {"nvidia.com/gpu.shared": 5},
                                       "c": {"nvidia.com/gpu.shared": 8}}
    # Without the pool's sharing the same quota is whole GPUs.
    plain = kueue.queues_for(TEAMS, [H100, L4, dataclasses.replace(L4_SHARED, sharing=PoolSharing())], CPU)
    assert plain.namespace_gpus["b"] == 8 + 5 and plain.namespace_slices["b"] == {}


def test_the_general_cpu_pool_is_split_evenly_and_is_the_cpu_flavor():
    queues = kueue.queues_for(TEAMS, [H100], CPU)
    assert [(t.general_cpu, t.general_memory_gib) for t in queues.teams] == [(333, 1333)] * 3
    assert queues.cpu_flavor == kueue.CpuFlavorSpec(name="general", node_labels={POOL_LABEL: "general"},
                                                    max_cpu=1000, max_memory_gib=4001)
    # The teams' own fields pass through unchanged.
    assert [(t.team, t.namespace, dict(t.gpu_quota), t.borrowing) for t in queues.teams] == \
        [(t.team, t.namespace, dict(t.gpu_quota), t.borrowing) for t in TEAMS]


def test_without_a_cpu_pool_there_is_no_cpu_flavor_and_no_cpu_share():
    queues = kueue.queues_for(TEAMS, [H100], None)
    assert queues.cpu_flavor is None
    assert {(t.general_cpu, t.general_memory_gib) for t in queues.teams} == {(0, 0)}


def test_a_flavor_per_pool_in_the_pools_order_with_efa_devices_and_slices():
    flavors = kueue.queues_for(TEAMS, [L4_SHARED, H100, L4], CPU).flavors
    assert [f.name for f in flavors] == ["l4-shared", "h100", "l4"]
    shared, h100, l4 = flavors
    assert h100.efa_devices_per_node == H100.shapes[0].num_efa_network_cards > 0 and l4.efa_devices_per_node == 0
    assert shared.slices_per_gpu == {"nvidia.com/gpu.shared": 4} and not l4.shared
    assert (h100.max_gpus, h100.gpus_per_node, dict(h100.node_labels)) == (64, 8, dict(H100.node_labels))


def test_no_teams_still_gives_the_flavors():
    queues = kueue.queues_for([], [H100], CPU)
    assert queues.teams == () and [f.name for f in queues.flavors] == ["h100"]


# -- storage startup taints --------------------------------------------------------------------
def test_each_storage_mode_starts_nodes_with_its_own_drivers_taints_only():
    """A startup taint whose driver the stack does not install is never lifted: the node never
    becomes Initialized (Karpenter 1.14.1 nodeclaim/lifecycle/initialization.go)."""
    assert storage_startup_taints("fsx") == (FSX_STARTUP_TAINT,)
    assert storage_startup_taints("s3-mountpoint") == (EFS_STARTUP_TAINT, S3_MOUNTPOINT_STARTUP_TAINT)
    assert storage_startup_taints(None) == ()


def test_storage_startup_taints_take_the_enum_and_refuse_an_unknown_mode():
    from components.datasets import DatasetsStorage

    assert storage_startup_taints(DatasetsStorage.S3_MOUNTPOINT) == storage_startup_taints("s3-mountpoint")
    assert {DatasetsStorage(mode).value for mode in ("fsx", "s3-mountpoint")} == {m.value for m in DatasetsStorage}
    with pytest.raises(ValueError, match="'efs'"):
        storage_startup_taints("efs")
    # The caller gets copies: changing one cannot change the next stack's taints.
    storage_startup_taints("fsx")[0]["effect"] = "NoSchedule"
    assert storage_startup_taints("fsx") == (FSX_STARTUP_TAINT,) and FSX_STARTUP_TAINT["effect"] == "NoExecute"


def test_jobs_name_the_teams_own_local_queue_whatever_the_plans_order(prod_plan):
    """Each team namespace holds two LocalQueues on its ClusterQueue: the team's own (jobs name it)
    and Kueue's default one for unlabelled pods. The facts jobs are rendered from name the team's
    own, in whichever order the plan recorded them."""
    from jobs.facts import _kubernetes_manifests
    from workloads.platform_facts import facts_from_manifests

    manifests = _kubernetes_manifests(prod_plan.recording)
    queues = [m for m in manifests if m.get("kind") == "LocalQueue"]
    assert {q["metadata"]["name"] for q in queues} >= {kueue.LOCAL_QUEUE_NAME, kueue.DEFAULT_LOCAL_QUEUE_NAME}
    others = [m for m in manifests if m.get("kind") != "LocalQueue"]
    for ordered in (queues, list(reversed(queues))):
        facts = facts_from_manifests(others + ordered, stack="prod", region="us-west-2", tracking_secret_name="mlflow")
        assert facts.teams and {t.local_queue for t in facts.teams} == {kueue.LOCAL_QUEUE_NAME}
