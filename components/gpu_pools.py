"""GPU pools (and the general CPU pool) as Karpenter NodePools + EC2NodeClasses.

The manifests come from ``workloads.karpenter`` (pure, golden-tested); this component applies
them after the karpenter-crd release (which installs the CRDs) and the controller.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import pulumi

from components.cluster import Cluster
from components.k8s import apply_object
from components.karpenter import Karpenter, KarpenterPrerequisites
from workloads.karpenter import (
    CpuPoolSpec, GpuPoolSpec, NodeClassSpec, cpu_node_class, cpu_node_pool, gpu_node_class, gpu_node_overlay, gpu_node_pool,
)


@dataclass(frozen=True)
class GpuPoolsArgs:
    """NodePools for every GPU pool and, optionally, the general CPU pool.

    cluster: discovery tag value, cluster security group.
    prerequisites: the Karpenter node role (EC2NodeClass ``role``).
    karpenter: its CRD and controller releases; pools are applied after both.
    gpu_pools: one NodePool + EC2NodeClass each.
    cpu_pool: the general CPU pool, or None.
    storage_startup_taints: the startup taints of the storage CSI drivers the stack installs
        (``workloads.karpenter.storage_startup_taints``), on every pool; empty without one.
    tags: cost-allocation tags on every instance, volume and interface Karpenter launches.
    """

    cluster: Cluster
    prerequisites: KarpenterPrerequisites
    karpenter: Karpenter
    gpu_pools: Sequence[GpuPoolSpec]
    cpu_pool: Optional[CpuPoolSpec] = None
    storage_startup_taints: Sequence[Mapping[str, str]] = ()
    tags: dict[str, str] = field(default_factory=dict)


class GpuPools(pulumi.ComponentResource):
    def __init__(self, name: str, args: GpuPoolsArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:gpu_pools:GpuPools", name, None, opts)
        node_class = NodeClassSpec(
            cluster_name=args.cluster.args.cluster_name,
            node_role_name=args.prerequisites.node_role.name,
            cluster_security_group_id=args.cluster.cluster_security_group_id,
            tags=dict(args.tags),
        )
        # NodePool/EC2NodeClass kinds exist once the karpenter-crd release is in; the controller
        # reconciles them.
        karpenter = [args.karpenter.crds, args.karpenter.release]
        after = pulumi.ResourceOptions(parent=self, depends_on=karpenter)
        self.node_pools: dict[str, pulumi.CustomResource] = {}
        self.node_classes: dict[str, pulumi.CustomResource] = {}
        self.node_overlays: dict[str, pulumi.CustomResource] = {}
        for pool in args.gpu_pools:
            node_class_resource = apply_object(f"{name}-{pool.name}-nodeclass", gpu_node_class(pool, node_class), after)
            self.node_classes[pool.name] = node_class_resource
            self.node_pools[pool.name] = apply_object(
                f"{name}-{pool.name}-nodepool", gpu_node_pool(pool, storage_startup_taints=args.storage_startup_taints),
                pulumi.ResourceOptions(parent=self, depends_on=[*karpenter, node_class_resource]),
            )
            # Shared pools: the slices each instance type offers (NodeOverlay; the controller
            # runs with the NodeOverlay feature gate on when any pool shares).
            overlay = gpu_node_overlay(pool)
            if overlay is not None:
                self.node_overlays[pool.name] = apply_object(f"{name}-{pool.name}-nodeoverlay", overlay, after)
        if args.cpu_pool is not None:
            cpu = args.cpu_pool
            cpu_class = apply_object(f"{name}-{cpu.name}-nodeclass", cpu_node_class(cpu, node_class), after)
            self.node_classes[cpu.name] = cpu_class
            self.node_pools[cpu.name] = apply_object(
                f"{name}-{cpu.name}-nodepool", cpu_node_pool(cpu, storage_startup_taints=args.storage_startup_taints),
                pulumi.ResourceOptions(parent=self, depends_on=[*karpenter, cpu_class]),
            )
        self.register_outputs({"node_pools": sorted(self.node_pools)})
