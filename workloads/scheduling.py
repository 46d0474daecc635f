"""Scheduling guardrails for team namespaces (built-in kinds only; validated against Kubernetes 1.32).

- PriorityClasses production > research > default (default is the cluster default, never preempts).
- A namespace per team with Pod Security Admission labels, a ResourceQuota on GPU requests,
  a LimitRange (pods without requests would defeat quotas and bin packing), and NetworkPolicies:
  default deny, then only what distributed training needs.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional, Sequence

from workloads.karpenter import GPU_RESOURCE
from workloads.problems import accepts_enum_values


class Priority(str, Enum):
    PRODUCTION = "production"
    RESEARCH = "research"
    DEFAULT = "default"


def team_namespace(team: str) -> str:
    """The namespace of team ``team``: the one spelling of the rule (stack config, job specs, the job CLI)."""
    return f"team-{team}"


def team_of_namespace(namespace: str) -> str:
    """The inverse of ``team_namespace``."""
    return namespace.removeprefix("team-")


# Values leave room for Kueue's borrowWithinCohort.maxPriorityThreshold (see workloads.kueue).
PRIORITY_VALUES = {Priority.PRODUCTION: 1000, Priority.RESEARCH: 100, Priority.DEFAULT: 0}
PRIORITY_CLASS_PREFIX = "training-"


def priority_class_name(priority: Priority) -> str:
    return f"{PRIORITY_CLASS_PREFIX}{priority.value}"


def priority_classes() -> list[dict[str, Any]]:
    descriptions = {
        Priority.PRODUCTION: "Production training: preempts research and default work.",
        Priority.RESEARCH: "Research training: preempts default work.",
        Priority.DEFAULT: "Everything else; the cluster default. Never preempts.",
    }
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": priority_class_name(priority)},
            "value": PRIORITY_VALUES[priority],
            "globalDefault": priority is Priority.DEFAULT,
            "preemptionPolicy": "Never" if priority is Priority.DEFAULT else "PreemptLowerPriority",
            "description": descriptions[priority],
        }
        for priority in Priority
    ]


@accepts_enum_values
@dataclass(frozen=True)
class TeamNamespaceSpec:
    team: str
    namespace: str
    gpu_quota: int
    vpc_cidr: str
    default_priority: Priority = Priority.DEFAULT
    # Restricted: non-root, no privilege escalation, all capabilities dropped, RuntimeDefault
    # seccomp. The trainer complies (workloads.trainingjob); a root pod would bypass the FSx
    # ownership that keeps teams apart (root is squashed on the file system as well).
    pod_security_enforce: str = "restricted"
    pod_security_warn: str = "restricted"
    max_pods: int = 500
    extra_labels: dict[str, str] = field(default_factory=dict)
    # Read by the team admission policies (workloads.tenancy): the entitled priority classes.
    annotations: dict[str, str] = field(default_factory=dict)
    # CIDRs of the S3 gateway endpoint's prefix list (outside the VPC CIDR): a list of strings,
    # or a deploy-time value with ``.apply`` (a pulumi Output of the endpoint's cidr_blocks).
    # None: no S3 egress policy.
    s3_prefix_list_cidrs: Any = None
    # The cluster's Service CIDR: workflow pods may reach the `kubernetes` Service address
    # (``api_server_egress_policy``). None: no such policy.
    service_cidr: Optional[str] = None
    # Shared GPU pools: extended resource (nvidia.com/gpu.shared, nvidia.com/mig-1g.10gb) -> slices
    # the namespace may request; the same backstop as gpu_quota, in slices.
    slice_quota: dict[str, int] = field(default_factory=dict)


def namespace(spec: TeamNamespaceSpec) -> dict[str, Any]:
    labels = {
        "mlplatform.io/team": spec.team,
        "pod-security.kubernetes.io/enforce": spec.pod_security_enforce,
        "pod-security.kubernetes.io/enforce-version": "v1.32",
        "pod-security.kubernetes.io/warn": spec.pod_security_warn,
        "pod-security.kubernetes.io/warn-version": "v1.32",
        "pod-security.kubernetes.io/audit": spec.pod_security_warn,
        "pod-security.kubernetes.io/audit-version": "v1.32",
        **spec.extra_labels,
    }
    metadata: dict[str, Any] = {"name": spec.namespace, "labels": labels}
    if spec.annotations:
        metadata["annotations"] = dict(spec.annotations)
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}


def resource_quota(spec: TeamNamespaceSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpu-quota", "namespace": spec.namespace},
        "spec": {"hard": {f"requests.{GPU_RESOURCE}": str(spec.gpu_quota),
                          **{f"requests.{r}": str(n) for r, n in sorted(spec.slice_quota.items())},
                          "pods": str(spec.max_pods)}},
    }


def limit_range(spec: TeamNamespaceSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": "defaults", "namespace": spec.namespace},
        "spec": {
            # Default requests only: pods without requests would defeat bin packing, but default
            # *limits* would also land on training containers that set none (a 4 GiB cap on a
            # trainer). Training pods set requests == limits themselves (workloads.trainingjob).
            "limits": [{"type": "Container", "defaultRequest": {"cpu": "500m", "memory": "1Gi"}}]
        },
    }


# torchrun's c10d rendezvous, NCCL's bootstrap and socket transport use ephemeral ports between
# pods of a job: allow everything inside the namespace rather than guessing ports.
# No Lustre (988, 1018-1023) or NFS (2049) egress: the FSx and EFS clients are the node's kernel
# (mounted by the CSI node plugins), outside the pod's network namespace, so pods never need them,
# and a user-space client in a pod would reach the file system with a uid it chooses
# (Lustre trusts the client's uid; security-4 N8).
# The EKS Pod Identity agent serves credentials on this link-local address (EKS User Guide,
# "Pod Identity agent": 169.254.170.23, port 80); without it boto3 finds no credentials.
POD_IDENTITY_AGENT_CIDR = "169.254.170.23/32"
POD_IDENTITY_AGENT_PORT = 80


def ip_block_peers(cidrs: Sequence[str]) -> list[dict[str, Any]]:
    """NetworkPolicy peers for these CIDRs. An empty list would make an egress rule match every
    destination, so it is refused rather than rendered."""
    cidrs = sorted(set(cidrs or []))
    if not cidrs:
        raise ValueError("no CIDRs: an egress rule without peers allows every destination; refusing to render it")
    return [{"ipBlock": {"cidr": cidr}} for cidr in cidrs]


def _peers(cidrs: Any) -> Any:
    if hasattr(cidrs, "apply"):  # resolved at deploy time (the gateway endpoint's prefix-list CIDRs)
        return cidrs.apply(ip_block_peers)
    return ip_block_peers(cidrs)


def network_policies(spec: TeamNamespaceSpec) -> list[dict[str, Any]]:
    ns = spec.namespace

    def policy(name: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": name, "namespace": ns}, "spec": body}

    vpc_ports: list[dict[str, Any]] = [{"protocol": "TCP", "port": 443}]  # MLflow ALB, VPC endpoints
    policies = [
        policy("default-deny", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
        policy("allow-same-namespace", {
            "podSelector": {},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": {}}]}],
            "egress": [{"to": [{"podSelector": {}}]}],
        }),
        policy("allow-dns", {
            "podSelector": {},
            "policyTypes": ["Egress"],
            "egress": [{
                "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
            }],
        }),
        policy("allow-vpc-services", {
            "podSelector": {},
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"ipBlock": {"cidr": spec.vpc_cidr}}], "ports": vpc_ports}],
        }),
        policy("allow-pod-identity-agent", {
            "podSelector": {},
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"ipBlock": {"cidr": POD_IDENTITY_AGENT_CIDR}}],
                        "ports": [{"protocol": "TCP", "port": POD_IDENTITY_AGENT_PORT}]}],
        }),
    ]
    if spec.s3_prefix_list_cidrs is not None:
        # S3 through the gateway endpoint: traffic goes to S3's public ranges (the prefix list),
        # HTTPS only.
        policies.append(policy("allow-s3-gateway-endpoint", {
            "podSelector": {},
            "policyTypes": ["Egress"],
            "egress": [{"to": _peers(spec.s3_prefix_list_cidrs), "ports": [{"protocol": "TCP", "port": 443}]}],
        }))
    return policies


# Argo Workflows labels every pod of a workflow with the workflow's name (workflow/common/common.go
# LabelKeyWorkflow); its executor (init/wait containers) and resource steps call the API server.
ARGO_WORKFLOW_POD_LABEL = "workflows.argoproj.io/workflow"
API_SERVER_POLICY_NAME = "allow-workflow-pods-api-server"


def kubernetes_service_ip(service_cidr: str) -> str:
    """The `kubernetes` Service's ClusterIP: the first address of the Service range
    (kube-apiserver pkg/controlplane: ``GetIndexedIP(serviceClusterIPRange, 1)``; EKS: 172.20.0.1
    or 10.100.0.1)."""
    return str(ipaddress.ip_network(service_cidr)[1])


def api_server_egress_policy(spec: TeamNamespaceSpec) -> list[dict[str, Any]]:
    """Workflow pods to the `kubernetes` Service address on 443, and nothing else.

    The VPC CIDR rule does not cover it: the AWS network policy agent matches egress before the
    Service's DNAT and only resolves ClusterIPs of Services whose selector matches the egress
    rule's pods (amazon-network-policy-controller-k8s pkg/resolvers/endpoints.go); the
    `kubernetes` Service has no selector, so only an ipBlock of its address allows it.
    """
    if spec.service_cidr is None:
        return []
    return [{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
             "metadata": {"name": API_SERVER_POLICY_NAME, "namespace": spec.namespace},
             "spec": {"podSelector": {"matchExpressions": [{"key": ARGO_WORKFLOW_POD_LABEL, "operator": "Exists"}]},
                      "policyTypes": ["Egress"],
                      "egress": [{"to": [{"ipBlock": {"cidr": f"{kubernetes_service_ip(spec.service_cidr)}/32"}}],
                                  "ports": [{"protocol": "TCP", "port": 443}]}]}}]


def team_objects(spec: TeamNamespaceSpec) -> list[dict[str, Any]]:
    """Everything a team namespace holds, namespace first."""
    return [namespace(spec), resource_quota(spec), limit_range(spec), *network_policies(spec),
            *api_server_egress_policy(spec)]


def all_priority_class_names() -> Sequence[str]:
    return [priority_class_name(p) for p in Priority]
