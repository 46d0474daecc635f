"""What an EKS node leaves its pods: one model for right-sizing, preflight, slice pools, the
readiness job and the system-node capacity check.

A node's kubelet advertises ``allocatable = capacity - kubeReserved - systemReserved -
evictionHard`` (Kubernetes "Reserve Compute Resources for System Daemons"). On the EKS AL2023 AMI
nodeadm writes those values (awslabs/amazon-eks-ami ``nodeadm/internal/kubelet/config.go``,
``withDefaultReservedResources``)::

    ksc.KubeReserved = map[string]string{
        "cpu":               fmt.Sprintf("%dm", getCPUMillicoresToReserve()),
        "ephemeral-storage": "1Gi",
        "memory":            fmt.Sprintf("%dMi", getMemoryMebibytesToReserve(ksc.MaxPods)),
    }
    func getMemoryMebibytesToReserve(maxPods int32) int32 { return 11*maxPods + 255 }
    cpuRanges := []int{0, 1000, 2000, 4000, totalCPUMillicores}
    cpuPercentageReservedForRanges := []int{600, 100, 50, 25}      // hundredths of a percent
    return (reserved - startRange) * percentage / 10000             // per range, integer division
    EvictionHard: {"memory.available": "100Mi", ...}

and sets ``SystemReservedCgroup`` but no ``systemReserved`` amount; the platform's EC2NodeClass
and managed node group set no kubelet block, so system-reserved is 0 here.

maxPods depends on who launched the node:

- **Karpenter** (GPU pools) computes ``ENILimitedPods`` (karpenter-provider-aws
  ``pkg/providers/instancetype/types.go``: "max number of ENIs * (IPv4 Addresses per ENI -1) + 2",
  ENIs of the default network card) and passes it to the kubelet (``pkg/providers/amifamily/
  resolver.go``: ``if kubeletConfig.MaxPods == nil { kubeletConfig.MaxPods = lo.ToPtr(int32(maxPods)) }``),
  uncapped. Before launching it estimates memory capacity as the instance's minus
  ``VM_MEMORY_OVERHEAD_PERCENT`` (default 0.075), so a pod must fit that estimate to get the type.
- **An EKS managed node group** (the system nodes) uses the AMI's recommendation, which is the same
  formula capped by vCPUs (``templates/al2/runtime/max-pods-calculator.sh``)::

      echo $(($enis * ($instance_max_eni_ips - 1) + 2))
      MAX_POD_CEILING_FOR_LOW_CPU=110
      MAX_POD_CEILING_FOR_HIGH_CPU=250
      if [ "$CPU_COUNT" -gt 30 ]; then min(250, max_pods) else min(110, max_pods)

The per-type inputs (ENIs on the default network card, IPv4 addresses per ENI) come from the EC2
User Guide, "Maximum IP addresses per network interface"
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/AvailableIpPerENI.html); their product
reproduces the AMI's ``nodeadm/internal/kubelet/eni-max-pods.txt`` (tests/catalog/test_node_model.py
checks every type against that file's values). vCPUs and memory: catalog/gpus.py for GPU types,
the EC2 general-purpose instance pages for the system-node types below.

This module imports nothing of the project but the catalog.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Mapping

from catalog.gpus import instance_shapes

Launcher = Literal["karpenter", "managed-node-group"]

EVICTION_HARD_MEMORY_MIB = 100  # nodeadm: evictionHard memory.available "100Mi"
SYSTEM_RESERVED_CPU_MILLICORES = 0  # nodeadm sets only systemReservedCgroup; the platform sets none
SYSTEM_RESERVED_MEMORY_MIB = 0
VM_MEMORY_OVERHEAD_FRACTION = 0.075  # Karpenter's VM_MEMORY_OVERHEAD_PERCENT default
MAX_PODS_CEILING_LOW_CPU = 110  # max-pods-calculator.sh, managed node groups
MAX_PODS_CEILING_HIGH_CPU = 250
MAX_PODS_HIGH_CPU_ABOVE_VCPUS = 30  # "-gt 30"

# Requests of the DaemonSets every GPU node runs (VPC CNI, kube-proxy, EKS Pod Identity agent, FSx
# CSI node, NVIDIA device plugin, DCGM exporter, EFA device plugin, node exporter, the CloudWatch
# agent and Fluent Bit of Container Insights, the GPU health agent). A budget, not a measurement:
# it must stay above the sum of their requests, or Karpenter's choice (which counts them) would be
# one size larger than preflight's. tests/infra/test_system_capacity.py sums what the platform
# renders there (recorded releases and add-ons, the workloads' DaemonSets; 2026-11: ~0.5 CPU,
# ~340 MiB with every DaemonSet counted) against it; check it against `kubectl describe node`
# (Allocated resources) on a live GPU node, since charts without a request count as 0.
GPU_NODE_DAEMONSET_CPU_MILLICORES = 1000
GPU_NODE_DAEMONSET_MEMORY_MIB = 1024

# (ENIs on the default network card, IPv4 addresses per ENI): EC2 User Guide, AvailableIpPerENI.
# Multi-card types (p4d, p5, p5e, p5en, g6e.24/48xlarge) count only card 0, as the VPC CNI does.
ENI_LIMITS: Mapping[str, tuple[int, int]] = {
    **{f"{family}.{size}": limits for family in ("g5", "g6")
       for size, limits in (("xlarge", (4, 15)), ("2xlarge", (4, 15)), ("4xlarge", (8, 30)), ("8xlarge", (8, 30)),
                            ("16xlarge", (8, 30) if family == "g5" else (15, 50)),
                            ("12xlarge", (15, 50) if family == "g5" else (8, 30)), ("24xlarge", (15, 50)),
                            ("48xlarge", (7, 50) if family == "g5" else (15, 50)))},
    "g6e.xlarge": (4, 15), "g6e.2xlarge": (4, 15), "g6e.4xlarge": (8, 30), "g6e.8xlarge": (8, 30),
    "g6e.12xlarge": (10, 30), "g6e.16xlarge": (15, 50), "g6e.24xlarge": (10, 50), "g6e.48xlarge": (10, 50),
    "p4d.24xlarge": (15, 50), "p4de.24xlarge": (15, 50),
    "p5.48xlarge": (2, 50), "p5e.48xlarge": (2, 50), "p5en.48xlarge": (4, 50), "p5.4xlarge": (4, 30),
    # System-node types (managed node group).
    "m7i.large": (3, 10), "m6i.large": (3, 10), "m6a.large": (3, 10), "m5.large": (3, 10),
    "t3.large": (3, 12), "t3.medium": (3, 6),
    "m7i.xlarge": (4, 15), "m6i.xlarge": (4, 15), "m5.xlarge": (4, 15),
    "m7i.2xlarge": (4, 15), "m6i.2xlarge": (4, 15),
}

# vCPUs and GiB of the CPU types the system node group may use (EC2 general-purpose instance pages).
CPU_SHAPES: Mapping[str, tuple[int, int]] = {
    "m7i.large": (2, 8), "m6i.large": (2, 8), "m6a.large": (2, 8), "m5.large": (2, 8), "t3.large": (2, 8),
    "t3.medium": (2, 4), "m7i.xlarge": (4, 16), "m6i.xlarge": (4, 16), "m5.xlarge": (4, 16),
    "m7i.2xlarge": (8, 32), "m6i.2xlarge": (8, 32),
}


@dataclass(frozen=True)
class NodeShape:
    instance_type: str
    vcpus: int
    memory_mib: int
    enis: int
    ipv4_per_eni: int


def node_shape(instance_type: str) -> NodeShape:
    if instance_type not in ENI_LIMITS:
        raise KeyError(f"no ENI limits for {instance_type!r}: add them to catalog/node_model.py ENI_LIMITS "
                       "(EC2 User Guide, AvailableIpPerENI)")
    gpu = instance_shapes().get(instance_type)
    if gpu is not None:
        vcpus, memory_gib = gpu.vcpus, gpu.memory_gib
    elif instance_type in CPU_SHAPES:
        vcpus, memory_gib = CPU_SHAPES[instance_type]
    else:
        raise KeyError(f"no vCPUs/memory for {instance_type!r}: add it to catalog/gpus.py or CPU_SHAPES")
    enis, ips = ENI_LIMITS[instance_type]
    return NodeShape(instance_type, vcpus, memory_gib * 1024, enis, ips)


def eni_max_pods(enis: int, ipv4_per_eni: int) -> int:
    """ENIs x (IPv4 per ENI - 1) + 2: each ENI's primary address serves no pod; +2 for the
    host-network pods (VPC CNI, kube-proxy)."""
    return enis * (ipv4_per_eni - 1) + 2


def max_pods(instance_type: str, launcher: Launcher) -> int:
    shape = node_shape(instance_type)
    pods = eni_max_pods(shape.enis, shape.ipv4_per_eni)
    if launcher == "karpenter":
        return pods
    ceiling = MAX_PODS_CEILING_HIGH_CPU if shape.vcpus > MAX_PODS_HIGH_CPU_ABOVE_VCPUS else MAX_PODS_CEILING_LOW_CPU
    return min(ceiling, pods)


def kube_reserved_cpu_millicores(vcpus: int) -> int:
    total = vcpus * 1000
    ranges = (0, 1000, 2000, 4000, total)
    reserved = 0
    for i, hundredths_of_percent in enumerate((600, 100, 50, 25)):
        start, end = ranges[i], ranges[i + 1]
        if total > start:
            reserved += (min(total, end) - start) * hundredths_of_percent // 10000
    return reserved


def kube_reserved_memory_mib(pods: int) -> int:
    return 11 * pods + 255


@dataclass(frozen=True)
class NodeAllocatable:
    """What the kubelet of one node advertises as allocatable (DaemonSets included)."""

    instance_type: str
    launcher: Launcher
    max_pods: int
    cpu_millicores: int
    memory_mib: int


def node_allocatable(instance_type: str, launcher: Launcher) -> NodeAllocatable:
    """Allocatable as the launcher sees it before the node exists: Karpenter's estimate (VM
    overhead off the memory) for Karpenter nodes; the nominal memory for the managed node group."""
    shape = node_shape(instance_type)
    pods = max_pods(instance_type, launcher)
    memory = shape.memory_mib
    if launcher == "karpenter":
        memory -= math.ceil(memory * VM_MEMORY_OVERHEAD_FRACTION)
    memory -= kube_reserved_memory_mib(pods) + SYSTEM_RESERVED_MEMORY_MIB + EVICTION_HARD_MEMORY_MIB
    cpu = shape.vcpus * 1000 - kube_reserved_cpu_millicores(shape.vcpus) - SYSTEM_RESERVED_CPU_MILLICORES
    return NodeAllocatable(instance_type, launcher, pods, max(0, cpu), max(0, memory))


def gpu_pod_allocatable(instance_type: str) -> tuple[int, int]:
    """(CPU millicores, memory MiB) the training pods of one Karpenter GPU node may request
    together: allocatable minus the GPU node's DaemonSets."""
    node = node_allocatable(instance_type, "karpenter")
    return (max(0, node.cpu_millicores - GPU_NODE_DAEMONSET_CPU_MILLICORES),
            max(0, node.memory_mib - GPU_NODE_DAEMONSET_MEMORY_MIB))


def node_model_problems() -> list[str]:
    """GPU instance types of the catalog without ENI limits (a new shape must bring them)."""
    return [f"{t}: no ENI limits in catalog/node_model.py ENI_LIMITS (EC2 User Guide, AvailableIpPerENI)"
            for t in sorted(instance_shapes()) if t not in ENI_LIMITS]


def _check() -> None:
    problems = node_model_problems()
    if problems:
        raise RuntimeError("catalog/node_model.py: " + "; ".join(problems))


_check()
