"""The bus bandwidth a healthy pair of GPU nodes reaches.

The EC2 facts (vCPUs, memory, network bandwidth) are the shapes of catalog/gpus.py; what a node
leaves its pods is catalog/node_model.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from catalog.gpus import instance_shapes


@dataclass(frozen=True)
class InstanceFacts:
    instance_type: str
    vcpus: int
    memory_gib: int
    network_gbps: float


INSTANCES: Mapping[str, InstanceFacts] = {
    name: InstanceFacts(name, shape.vcpus, shape.memory_gib, shape.network_gbps)
    for name, shape in instance_shapes().items()
}

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
        raise KeyError(f"no instance facts for {instance_type!r}; add its shape to catalog/gpus.py") from None


def busbw_floor_gb_per_s(instance_type: str, *, efa: bool) -> float:
    """Minimum 2-node all-reduce bus bandwidth (GB/s) a healthy pair of these nodes reaches."""
    line_rate_gb_per_s = instance(instance_type).network_gbps / 8
    return round(line_rate_gb_per_s * (BUSBW_FLOOR_FRACTION_EFA if efa else BUSBW_FLOOR_FRACTION_TCP), 1)
