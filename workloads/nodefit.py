"""Right-sized training pods: CPU, memory and /dev/shm from the smallest instance of the pool that fits.

A GPU pool's NodePool lists several instance types with the same GPUs per node (g6.xlarge ...
g6.16xlarge for one L4). Karpenter launches the cheapest one whose allocatable resources hold the
pending pod and the node's DaemonSets, so the pod's CPU and memory request *chooses* the instance:
asking for 12 CPU and 120 GiB per L4 buys a g6.16xlarge ($3.40/h) where a g6.xlarge ($0.80/h)
would do. The pod therefore takes the GPU's share of the cheapest instance's allocatable
resources (and never more than the team's Kueue share per GPU), unless the spec overrides it.

Allocatable comes from the one node model, catalog/node_model.py (Karpenter's pre-launch
estimate: VM overhead, kube-reserved from the ENI-limited max pods, eviction threshold, then the
GPU node's DaemonSets).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional

from catalog.node_model import gpu_pod_allocatable
from catalog.prices import PRICES

CPU_STEP_MILLICORES = 100  # requests are rounded down to a tenth of a core
SHM_MAX_GIB = 64
SHM_FRACTION_OF_MEMORY = 0.25  # /dev/shm (memory-backed emptyDir) counts against the pod's memory limit


@dataclass(frozen=True)
class NodeAllocatable:
    """What pods other than DaemonSets may request on one node of this instance type."""

    instance_type: str
    gpus: int
    cpu_millicores: int
    memory_mib: int

    def share(self, gpus: int) -> tuple[int, int]:
        """(CPU millicores, memory MiB) for a pod holding ``gpus`` of the node's GPUs."""
        return self.cpu_millicores * gpus // self.gpus, self.memory_mib * gpus // self.gpus


def node_allocatable(instance_type: str, gpus: int) -> NodeAllocatable:
    cpu, memory_mib = gpu_pod_allocatable(instance_type)
    return NodeAllocatable(instance_type, gpus, cpu, memory_mib)


@dataclass(frozen=True)
class PodSize:
    """The pod's resources and the instance type Karpenter is expected to launch for it."""

    instance_type: str
    cpu_millicores: int
    memory_gib: int
    shm_gib: int
    usd_per_hour: Optional[float]
    source: str  # "smallest instance" | "spec" (overridden) | "Kueue share" (capped)

    @property
    def cpu_quantity(self) -> str:
        cores, rest = divmod(self.cpu_millicores, 1000)
        return str(cores) if rest == 0 else f"{self.cpu_millicores}m"

    @property
    def cpu_cores(self) -> float:
        return self.cpu_millicores / 1000


def _price(instance_type: str) -> float:
    found = PRICES.get(instance_type)
    return found.on_demand_usd_per_hour if found else float("inf")


def _round_down(millicores: int) -> int:
    return millicores - millicores % CPU_STEP_MILLICORES


def slice_pod_size(instance_types: Iterable[str], slices_per_node: int) -> tuple[int, int]:
    """(CPU millicores, memory GiB) of one slice pod of a shared pool: its share of the pool's
    smallest node (the same allocatable model as whole-GPU pods) split evenly over every slice the
    node offers, whatever their sizes. The one rule for both sides: the renderers request it and
    Kueue grants a team's slice quota as that many of it (workloads/kueue.py). CPU is rounded down
    to a tenth of a core and memory to whole GiB, at least one of each, so the slices of a node
    always fit it together."""
    nodes = [gpu_pod_allocatable(t) for t in instance_types]
    if not nodes or slices_per_node < 1:
        raise ValueError(f"a shared pool needs instance types and slices per node (got {list(instance_types)}, {slices_per_node})")
    cpu = min(cpu for cpu, _ in nodes) // slices_per_node
    memory_mib = min(memory for _, memory in nodes) // slices_per_node
    return max(CPU_STEP_MILLICORES, _round_down(cpu)), max(1, memory_mib // 1024)


class DoesNotFit(ValueError):
    """The requested pod fits no instance type of the pool: (field, value, message, fix)."""

    def __init__(self, field: str, value: object, message: str, fix: str):
        super().__init__(message)
        self.field, self.value, self.message, self.fix = field, value, message, fix


def size_pod(instance_types: Iterable[str], *, node_gpus: int, gpus: int,
             cpu_per_gpu: Optional[float] = None, memory_gib_per_gpu: Optional[float] = None,
             shm_gib: Optional[int] = None, kueue_cpu_per_gpu: Optional[float] = None,
             kueue_memory_gib_per_gpu: Optional[float] = None) -> PodSize:
    """Size a pod holding ``gpus`` of a node's ``node_gpus`` GPUs on the cheapest instance type
    (on-demand price; spot follows it) that fits; raise ``DoesNotFit`` when none does.

    Without overrides the pod takes its GPUs' share of that instance's allocatable CPU and
    memory, capped at the team's Kueue share per GPU (more would need borrowed CPU quota)."""
    want_cpu = None if cpu_per_gpu is None else int(round(cpu_per_gpu * 1000 * gpus))
    want_mem = None if memory_gib_per_gpu is None else int(math.ceil(memory_gib_per_gpu * 1024 * gpus))
    candidates = sorted(instance_types, key=lambda t: (_price(t), t))
    if not candidates:
        raise DoesNotFit("pool", None, "the pool lists no instance types", "ask the platform team")
    for instance_type in candidates:
        cpu_share, mem_share = node_allocatable(instance_type, node_gpus).share(gpus)
        if (want_cpu or 0) <= cpu_share and (want_mem or 0) <= mem_share:
            break
    else:
        largest = max(candidates, key=lambda t: node_allocatable(t, node_gpus).share(gpus))
        cpu_share, mem_share = node_allocatable(largest, node_gpus).share(gpus)
        too_much = [(f, v, lim) for f, v, lim, w in (
            ("resources.cpuPerGpu", cpu_per_gpu, cpu_share / 1000 / gpus, want_cpu and want_cpu > cpu_share),
            ("resources.memoryGibPerGpu", memory_gib_per_gpu, mem_share / 1024 / gpus, want_mem and want_mem > mem_share)) if w]
        field, value, limit = too_much[0]
        raise DoesNotFit(field, value, f"no instance type of the pool has that much per GPU: the largest, {largest}, "
                         f"leaves {limit:.1f} per GPU after the kubelet's reserve and the node's DaemonSets",
                         f"ask for at most {math.floor(limit * 10) / 10:g} per GPU, or leave it out (sized from the instance)")
    source = "smallest instance"
    cpu = want_cpu if want_cpu is not None else cpu_share
    mem_mib = want_mem if want_mem is not None else mem_share
    if want_cpu is None and kueue_cpu_per_gpu and cpu > kueue_cpu_per_gpu * 1000 * gpus:
        cpu, source = int(kueue_cpu_per_gpu * 1000 * gpus), "Kueue share"
    if want_mem is None and kueue_memory_gib_per_gpu and mem_mib > kueue_memory_gib_per_gpu * 1024 * gpus:
        mem_mib, source = int(kueue_memory_gib_per_gpu * 1024 * gpus), "Kueue share"
    if want_cpu is not None or want_mem is not None:
        source = "spec"
    memory_gib = max(1, mem_mib // 1024)
    shm = shm_gib if shm_gib is not None else max(1, min(SHM_MAX_GIB, int(memory_gib * SHM_FRACTION_OF_MEMORY)))
    if shm >= memory_gib:
        raise DoesNotFit("resources.shmGib", shm_gib, f"/dev/shm is memory: {shm} GiB leaves nothing of the pod's "
                         f"{memory_gib} GiB for the trainer", f"use at most {max(1, memory_gib // 2)} GiB")
    return PodSize(instance_type, max(CPU_STEP_MILLICORES, _round_down(cpu)), memory_gib, shm,
                   None if _price(instance_type) == float("inf") else _price(instance_type), source)
