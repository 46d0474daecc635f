"""EC2 facts about the GPU instance types of the catalog that jobs and readiness checks need.

vCPUs, memory and network bandwidth from the EC2 accelerated-computing instance pages
(https://aws.amazon.com/ec2/instance-types/p5/, /p4/, /g6/, /g5/, /g6e/; Nov 2026), and the
peak dense BF16 tensor throughput of each GPU from NVIDIA's data sheets (the same figures as
trainer/metrics.py; A10G is not published by NVIDIA: the A10 figure is used).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from workloads.gpu_catalog import GPU_TYPES


@dataclass(frozen=True)
class InstanceFacts:
    instance_type: str
    vcpus: int
    memory_gib: int
    network_gbps: float

    # What the kubelet, the system daemons and the node's DaemonSets (device plugins, DCGM,
    # FSx CSI, VPC CNI, Pod Identity agent) keep: one training pod per node takes the rest.
    @property
    def allocatable_cpu(self) -> int:
        return self.vcpus - max(2, self.vcpus // 24)

    @property
    def allocatable_memory_gib(self) -> int:
        return int(self.memory_gib * 0.9) - 4


def _g(family: str, memory: dict[str, int], network: dict[str, float]) -> list[InstanceFacts]:
    vcpus = {"xlarge": 4, "2xlarge": 8, "4xlarge": 16, "8xlarge": 32, "16xlarge": 64, "12xlarge": 48, "24xlarge": 96, "48xlarge": 192}
    return [InstanceFacts(f"{family}.{size}", cpus, memory[size], network[size]) for size, cpus in vcpus.items()]


_G_MEMORY = {"xlarge": 16, "2xlarge": 32, "4xlarge": 64, "8xlarge": 128, "16xlarge": 256, "12xlarge": 192, "24xlarge": 384, "48xlarge": 768}
_G6E_MEMORY = {k: v * 2 for k, v in _G_MEMORY.items()}
_G_NETWORK = {"xlarge": 10, "2xlarge": 10, "4xlarge": 25, "8xlarge": 25, "16xlarge": 25, "12xlarge": 40, "24xlarge": 50, "48xlarge": 100}
_G6E_NETWORK = {"xlarge": 20, "2xlarge": 20, "4xlarge": 20, "8xlarge": 25, "16xlarge": 35, "12xlarge": 100, "24xlarge": 200, "48xlarge": 400}

INSTANCES: Mapping[str, InstanceFacts] = {
    i.instance_type: i
    for i in (
        InstanceFacts("p4d.24xlarge", 96, 1152, 400),
        InstanceFacts("p4de.24xlarge", 96, 1152, 400),
        InstanceFacts("p5.48xlarge", 192, 2048, 3200),
        InstanceFacts("p5.4xlarge", 16, 256, 100),
        InstanceFacts("p5e.48xlarge", 192, 2048, 3200),
        InstanceFacts("p5en.48xlarge", 192, 2048, 3200),
        *_g("g6", _G_MEMORY, _G_NETWORK),
        *_g("g5", _G_MEMORY, _G_NETWORK),
        *_g("g6e", _G6E_MEMORY, _G6E_NETWORK),
    )
}

# Peak dense bf16 TFLOP/s per GPU type: trainer/model_facts.py (one table for preflight and MFU).

# A 2-node all-reduce moves data over the instance network; nccl-tests' bus bandwidth
# (busbw = algbw * 2(n-1)/n, nccl-tests doc/PERFORMANCE.md) of a healthy pair reaches well
# over half the line rate with EFA. The readiness floor is this fraction of the line rate:
# below it, EFA is off (NCCL fell back to TCP sockets) or a link is degraded.
BUSBW_FLOOR_FRACTION_EFA = 0.6
BUSBW_FLOOR_FRACTION_TCP = 0.25


def instance(instance_type: str) -> InstanceFacts:
    try:
        return INSTANCES[instance_type]
    except KeyError:
        raise KeyError(f"no instance facts for {instance_type!r}; add it to workloads/instances.py") from None


def busbw_floor_gb_per_s(instance_type: str, *, efa: bool) -> float:
    """Minimum 2-node all-reduce bus bandwidth (GB/s) a healthy pair of these nodes reaches."""
    line_rate_gb_per_s = instance(instance_type).network_gbps / 8
    return round(line_rate_gb_per_s * (BUSBW_FLOOR_FRACTION_EFA if efa else BUSBW_FLOOR_FRACTION_TCP), 1)


def _check_catalog() -> None:
    missing = [s.instance_type for g in GPU_TYPES.values() for s in g.shapes if s.instance_type not in INSTANCES]
    if missing:
        raise RuntimeError(f"workloads/instances.py lacks {missing}")


_check_catalog()
