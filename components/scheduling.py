"""Scheduling guardrails: priority classes, team namespaces (quota, limits, PSA, network
policies) and Kueue (pinned Helm release, flavors, cluster queues, local queues).

Manifests come from ``workloads.scheduling`` and ``workloads.kueue`` (pure, golden-tested).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import pulumi

from components.helm_addon import helm_addon
from components.cluster import Cluster
from components.k8s import apply_namespace_objects, apply_object
from components.charts import ChartSource
from catalog.versions import KUEUE
from workloads import kueue, scheduling, tenancy
from workloads.placement import system_pod_placement
from workloads.system_namespaces import PodSecurityLevel, SystemNamespaceSpec, namespace_objects

KUEUE_NAMESPACE = "kueue-system"
# Kueue 0.19.2 chart: webhook server 9443 and visibility API 8082 (called by the API server),
# metrics 8443, health probes 8081 (charts/kueue/values.yaml, templates/manager/manager.yaml).
KUEUE_WEBHOOK_PORT = 9443
KUEUE_VISIBILITY_PORT = 8082
KUEUE_METRICS_PORT = 8443
KUEUE_HEALTH_PORT = 8081


def kueue_namespace_spec(vpc_cidr: str, service_cidr: str) -> SystemNamespaceSpec:
    # The manager runs non-root, read-only, no privilege escalation, all capabilities dropped,
    # RuntimeDefault seccomp (chart defaults): `restricted` admits it.
    return SystemNamespaceSpec(
        name=KUEUE_NAMESPACE, pod_security=PodSecurityLevel.RESTRICTED, vpc_cidr=vpc_cidr, service_cidr=service_cidr,
        api_server_ingress_ports=(KUEUE_WEBHOOK_PORT, KUEUE_VISIBILITY_PORT),
        metrics_ports=(KUEUE_METRICS_PORT,), probe_ports=(KUEUE_HEALTH_PORT,),
    )


def kueue_values(manager: kueue.ManagerConfigSpec, *, replicas: int) -> dict[str, Any]:
    placement = system_pod_placement()
    return {
        "controllerManager": {
            "replicas": replicas,
            "nodeSelector": placement["nodeSelector"],
            "tolerations": placement["tolerations"],
        },
        "managerConfig": {"controllerManagerConfigYaml": kueue.manager_config_yaml(manager)},
    }


@dataclass(frozen=True)
class SchedulingArgs:
    """Priority classes, team namespaces and Kueue.

    cluster: the platform cluster; Kueue waits for its static node group and CoreDNS.
    teams: one namespace + ClusterQueue + LocalQueue each.
    flavors: one Kueue ResourceFlavor per GPU pool.
    cpu_flavor: the general CPU pool's flavor, first in every ClusterQueue (pods without a GPU
        request are admitted there), or None without that pool.
    manager: Kueue manager configuration (waitForPodsReady, fair sharing).
    kueue_replicas: Kueue controller replicas (2 in prod).
    depends_on: resources the namespaces' workloads need first (e.g. the GPU pools).
    charts: where the charts come from (upstream by default, or the stack's verified chart mirror).
    """

    cluster: Cluster
    teams: Sequence[tuple[scheduling.TeamNamespaceSpec, kueue.TeamQueueSpec]]
    flavors: Sequence[kueue.FlavorSpec]
    cpu_flavor: Optional[kueue.CpuFlavorSpec] = None
    manager: kueue.ManagerConfigSpec = field(default_factory=kueue.ManagerConfigSpec)
    kueue_replicas: int = 1
    charts: ChartSource = ChartSource()


class Scheduling(pulumi.ComponentResource):
    def __init__(self, name: str, args: SchedulingArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:scheduling:Scheduling", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        for pc in scheduling.priority_classes():
            apply_object(f"{name}-priority-{pc['metadata']['name']}", pc, child)

        cluster = args.cluster
        objects = namespace_objects(kueue_namespace_spec(cluster.vpc_cidr, cluster.service_cidr))
        self.kueue_namespace, self.kueue_network_policies = apply_namespace_objects(f"{name}-kueue", objects, self)
        self.kueue = helm_addon(
            f"{name}-kueue", parent=self, cluster=cluster, release="kueue", chart=KUEUE, source=args.charts,
            namespace=KUEUE_NAMESPACE, values=kueue_values(args.manager, replicas=args.kueue_replicas),
            depends_on=[self.kueue_namespace, *self.kueue_network_policies],
        )
        after_kueue = pulumi.ResourceOptions(parent=self, depends_on=[self.kueue])
        for flavor in args.flavors:
            apply_object(f"{name}-flavor-{flavor.name}", kueue.resource_flavor(flavor), after_kueue)
        if args.cpu_flavor is not None:
            apply_object(f"{name}-cpu-flavor-{args.cpu_flavor.name}", kueue.resource_flavor(args.cpu_flavor), after_kueue)

        # The tenant boundary (workloads.tenancy): policies first, so no team namespace ever
        # exists without them.
        self.admission_policies = [
            apply_object(f"{name}-{obj['kind'].lower()}-{obj['metadata']['name']}", obj, child)
            for obj in tenancy.admission_policies(gpu_pools=[f.name for f in args.flavors])]
        self.namespaces: dict[str, pulumi.CustomResource] = {}
        for ns_spec, queue_spec in args.teams:
            ns = apply_object(f"{name}-{ns_spec.team}-namespace", scheduling.namespace(ns_spec),
                              pulumi.ResourceOptions(parent=self, depends_on=self.admission_policies))
            self.namespaces[ns_spec.team] = ns
            in_ns = pulumi.ResourceOptions(parent=self, depends_on=[ns])
            for obj in [*scheduling.team_objects(ns_spec)[1:], tenancy.team_role(ns_spec.namespace),
                        tenancy.team_role_binding(ns_spec.namespace)]:
                apply_object(f"{name}-{ns_spec.team}-{obj['kind'].lower()}-{obj['metadata']['name']}", obj, in_ns)
            cq = apply_object(f"{name}-{queue_spec.team}-clusterqueue", kueue.cluster_queue(queue_spec, args.flavors, args.cpu_flavor),
                              after_kueue)
            apply_object(f"{name}-{queue_spec.team}-localqueue", kueue.local_queue(queue_spec),
                         pulumi.ResourceOptions(parent=self, depends_on=[ns, cq, self.kueue]))
            apply_object(f"{name}-{queue_spec.team}-default-localqueue",
                         kueue.local_queue(queue_spec, kueue.DEFAULT_LOCAL_QUEUE_NAME),
                         pulumi.ResourceOptions(parent=self, depends_on=[ns, cq, self.kueue]))
        self.register_outputs({"namespaces": sorted(n.namespace for n, _ in args.teams)})
