"""The one node model (catalog/node_model.py) against upstream's numbers.

Upstream, quoted (awslabs/amazon-eks-ami):

- ``nodeadm/internal/kubelet/eni-max-pods.txt``: "Mapping is calculated from AWS EC2 API using the
  following formula: # of ENI * (# of IPv4 per ENI - 1) + 2" and its lines below (EXPECTED_MAX_PODS);
- ``templates/al2/runtime/max-pods-calculator.sh``: ``MAX_POD_CEILING_FOR_LOW_CPU=110``,
  ``MAX_POD_CEILING_FOR_HIGH_CPU=250``, ``if [ "$CPU_COUNT" -gt 30 ]`` (managed node groups);
- ``nodeadm/internal/kubelet/config.go``: ``getMemoryMebibytesToReserve(maxPods) = 11*maxPods + 255``;
  ``cpuRanges := []int{0, 1000, 2000, 4000, totalCPUMillicores}``,
  ``cpuPercentageReservedForRanges := []int{600, 100, 50, 25}``,
  ``(reserved - startRange) * percentage / 10000``; ``"memory.available": "100Mi"``.

karpenter-provider-aws ``pkg/providers/instancetype/types.go``: memory capacity
``mem.Sub(ceil(mem * VMMemoryOverheadPercent))``, default 0.075; ``resolver.go`` passes the
ENI-limited pods to the kubelet as ``maxPods`` (no ceiling).

The expected figures are computed here from those quotes and the EC2 shapes, not from the model's
constants.
"""
from __future__ import annotations

import math

import pytest

from catalog import node_model
from catalog.gpus import instance_shapes
from catalog.node_model import (ENI_LIMITS, eni_max_pods, gpu_pod_allocatable, kube_reserved_cpu_millicores,
                                max_pods, node_allocatable, node_model_problems)

# eni-max-pods.txt (amazon-eks-ami main, nodeadm/internal/kubelet), one line per type we use.
EXPECTED_MAX_PODS = {
    "g5.xlarge": 58, "g5.2xlarge": 58, "g5.4xlarge": 234, "g5.8xlarge": 234, "g5.12xlarge": 737,
    "g5.16xlarge": 234, "g5.24xlarge": 737, "g5.48xlarge": 345,
    "g6.xlarge": 58, "g6.2xlarge": 58, "g6.4xlarge": 234, "g6.8xlarge": 234, "g6.12xlarge": 234,
    "g6.16xlarge": 737, "g6.24xlarge": 737, "g6.48xlarge": 737,
    "g6e.xlarge": 58, "g6e.2xlarge": 58, "g6e.4xlarge": 234, "g6e.8xlarge": 234, "g6e.12xlarge": 292,
    "g6e.16xlarge": 737, "g6e.24xlarge": 492, "g6e.48xlarge": 492,
    "p4d.24xlarge": 737, "p4de.24xlarge": 737, "p5.48xlarge": 100, "p5.4xlarge": 118, "p5e.48xlarge": 100,
    "p5en.48xlarge": 198,
    "m7i.large": 29, "m6i.large": 29, "m6a.large": 29, "m5.large": 29, "t3.large": 35, "t3.medium": 17,
    "m7i.xlarge": 58, "m6i.xlarge": 58, "m5.xlarge": 58, "m7i.2xlarge": 58, "m6i.2xlarge": 58,
}


def _nodeadm_cpu_reserve(vcpus: int) -> int:
    total = vcpus * 1000
    ranges = [0, 1000, 2000, 4000, total]
    out = 0
    for i, pct in enumerate([600, 100, 50, 25]):
        if total <= ranges[i]:
            continue
        out += (min(total, ranges[i + 1]) - ranges[i]) * pct // 10000
    return out


def test_every_type_reproduces_the_amis_eni_max_pods_table():
    for instance_type, (enis, ips) in ENI_LIMITS.items():
        assert enis * (ips - 1) + 2 == EXPECTED_MAX_PODS[instance_type], instance_type
        assert max_pods(instance_type, "karpenter") == EXPECTED_MAX_PODS[instance_type], instance_type
    assert set(instance_shapes()) <= set(ENI_LIMITS)


def test_managed_node_groups_cap_max_pods_by_vcpus():
    """max-pods-calculator.sh caps at 110 (<= 30 vCPUs) / 250; Karpenter passes the raw figure."""
    assert max_pods("g5.12xlarge", "managed-node-group") == 250  # 48 vCPUs, 737 uncapped
    assert max_pods("g5.12xlarge", "karpenter") == 737
    assert max_pods("g6e.12xlarge", "managed-node-group") == 250  # 48 vCPUs, 292
    assert max_pods("m7i.2xlarge", "managed-node-group") == 58  # below the 110 ceiling


@pytest.mark.parametrize("instance_type,vcpus,memory_gib,launcher", [
    ("p5.48xlarge", 192, 2048, "karpenter"),
    ("g6e.xlarge", 4, 32, "karpenter"),
    ("g5.2xlarge", 8, 32, "karpenter"),
    ("m7i.2xlarge", 8, 32, "managed-node-group"),
])
def test_allocatable_matches_upstreams_formulas(instance_type, vcpus, memory_gib, launcher):
    pods = EXPECTED_MAX_PODS[instance_type]
    if launcher == "managed-node-group":
        pods = min(250 if vcpus > 30 else 110, pods)
    memory = memory_gib * 1024
    if launcher == "karpenter":
        memory -= math.ceil(memory * 0.075)
    memory -= (11 * pods + 255) + 100
    cpu = vcpus * 1000 - _nodeadm_cpu_reserve(vcpus)
    node = node_allocatable(instance_type, launcher)
    assert (node.max_pods, node.cpu_millicores, node.memory_mib) == (pods, cpu, memory)


def test_cpu_reserve_matches_nodeadm_for_every_shape():
    for vcpus in (1, 2, 3, 4, 8, 16, 48, 96, 192):
        assert kube_reserved_cpu_millicores(vcpus) == _nodeadm_cpu_reserve(vcpus), vcpus
    assert kube_reserved_cpu_millicores(4) == 60 + 10 + 10
    assert kube_reserved_cpu_millicores(192) == 60 + 10 + 10 + 188 * 25 // 10


def test_gpu_pods_get_allocatable_minus_the_gpu_nodes_daemonsets():
    node = node_allocatable("g6.xlarge", "karpenter")
    cpu, memory = gpu_pod_allocatable("g6.xlarge")
    assert (node.cpu_millicores - cpu, node.memory_mib - memory) == (
        node_model.GPU_NODE_DAEMONSET_CPU_MILLICORES, node_model.GPU_NODE_DAEMONSET_MEMORY_MIB)


def test_a_gpu_shape_without_eni_limits_is_refused(monkeypatch):
    """A new shape used to fall back silently to 737 pods (design-4 §1.3)."""
    monkeypatch.setattr(node_model, "ENI_LIMITS", {k: v for k, v in ENI_LIMITS.items() if k != "g6.xlarge"})
    assert node_model_problems() == [
        "g6.xlarge: no ENI limits in catalog/node_model.py ENI_LIMITS (EC2 User Guide, AvailableIpPerENI)"]
    with pytest.raises(KeyError, match="g6.xlarge"):
        node_model.node_shape("g6.xlarge")
