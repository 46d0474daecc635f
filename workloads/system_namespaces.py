"""Namespaces of the platform's controllers (Karpenter, Kueue, GPU enablement): created by us,
not by Helm's ``create_namespace``, so they carry Pod Security Admission labels, and locked
down by a default-deny NetworkPolicy plus the flows each controller needs.

Pure functions (spec in, manifests out), validated against Kubernetes 1.32 in tests.

Flows, and why each exists (the VPC CNI enforces these; see components.cluster):
- DNS to CoreDNS in kube-system (UDP/TCP 53).
- The Kubernetes API server on TCP 443: pods dial the ``kubernetes`` Service address, which
  kube-proxy translates to the control plane's ENIs in the VPC (private endpoint); the rule
  names both the Service CIDR and the VPC CIDR, whichever form the enforcing agent sees.
- AWS APIs (Karpenter: EC2, SQS, SSM, IAM, EKS, Pricing) on TCP 443 through the NAT gateway
  or interface endpoints, so anywhere on 443; and the EKS Pod Identity agent on the node at
  169.254.170.23:80 (EKS User Guide, "Set up the Amazon EKS Pod Identity Agent").
- Webhooks and aggregated APIs: the API server calls in from its ENIs in the VPC. EKS places
  those ENIs in the cluster's subnets, which the nodes and (VPC CNI) pods share, so the VPC CIDR
  is the narrowest source a policy can name; team pods cannot reach these ports anyway, because
  their own egress (which they cannot edit) allows only HTTPS and Lustre into the VPC.
- Metrics: only from namespaces labelled ``mlplatform.io/metrics-scraper: "true"`` (a
  Prometheus the operator installs), unless the scraper uses the host network (the CloudWatch
  agent scraping DCGM): then from the VPC, the nodes' addresses.
- Health probes: the kubelet, from its node's address in the VPC.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Sequence

from workloads.problems import accepts_enum_values

PSA_VERSION = "v1.32"
POD_IDENTITY_AGENT_CIDR = "169.254.170.23/32"
POD_IDENTITY_AGENT_PORT = 80
# A namespace whose pods scrape controllers' metrics carries this label (set by whoever installs it).
METRICS_SCRAPER_LABEL = "mlplatform.io/metrics-scraper"


class PodSecurityLevel(str, Enum):
    RESTRICTED = "restricted"
    BASELINE = "baseline"
    PRIVILEGED = "privileged"


@accepts_enum_values
@dataclass(frozen=True)
class SystemNamespaceSpec:
    """One controller namespace.

    name: the namespace.
    pod_security: PSA level enforced (restricted unless a DaemonSet needs host access).
    pod_security_reason: why the level is below restricted; required when it is.
    vpc_cidr: the VPC's CIDR (API server ENIs, nodes, scrapers).
    service_cidr: the cluster's Service CIDR (the ``kubernetes`` Service address).
    api_server_ingress_ports: ports the API server calls (webhooks, aggregated APIs).
    metrics_ports: ingress from namespaces labelled ``METRICS_SCRAPER_LABEL``.
    host_network_scrapers: the metrics are scraped from the host network (node addresses): admit
        the VPC instead.
    probe_ports: ingress from inside the VPC (kubelets).
    uses_aws: egress to AWS APIs (TCP 443) and to the Pod Identity agent.
    same_namespace: let the namespace's pods talk to each other (multi-component charts).
    """

    name: str
    pod_security: PodSecurityLevel
    vpc_cidr: str
    service_cidr: str
    pod_security_reason: str = ""
    api_server_ingress_ports: Sequence[int] = ()
    metrics_ports: Sequence[int] = ()
    probe_ports: Sequence[int] = ()
    host_network_scrapers: bool = False
    uses_aws: bool = False
    same_namespace: bool = False
    labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        level = PodSecurityLevel(self.pod_security)
        if level is not PodSecurityLevel.RESTRICTED and not self.pod_security_reason:
            raise ValueError(f"SystemNamespaceSpec({self.name}): pod_security {level.value} needs a "
                             "pod_security_reason (which workload needs host access, and why)")


def namespace(spec: SystemNamespaceSpec) -> dict[str, Any]:
    level = PodSecurityLevel(spec.pod_security).value
    labels = {
        "app.kubernetes.io/part-of": "mlplatform",
        **{f"pod-security.kubernetes.io/{mode}": level for mode in ("enforce", "audit", "warn")},
        **{f"pod-security.kubernetes.io/{mode}-version": PSA_VERSION for mode in ("enforce", "audit", "warn")},
        **spec.labels,
    }
    metadata: dict[str, Any] = {"name": spec.name, "labels": labels}
    if spec.pod_security_reason:
        metadata["annotations"] = {"mlplatform.io/pod-security-reason": spec.pod_security_reason}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}


def _tcp(ports: Sequence[int]) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": port} for port in ports]


def network_policies(spec: SystemNamespaceSpec) -> list[dict[str, Any]]:
    ns = spec.name

    def policy(name: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": name, "namespace": ns}, "spec": {"podSelector": {}, **body}}

    vpc = [{"ipBlock": {"cidr": spec.vpc_cidr}}]
    out = [
        policy("default-deny", {"policyTypes": ["Ingress", "Egress"]}),
        policy("allow-dns", {"policyTypes": ["Egress"], "egress": [{
            "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        }]}),
        policy("allow-api-server", {"policyTypes": ["Egress"], "egress": [
            {"to": [{"ipBlock": {"cidr": spec.service_cidr}}, *vpc], "ports": _tcp([443])}]}),
    ]
    if spec.uses_aws:
        out.append(policy("allow-aws-apis", {"policyTypes": ["Egress"], "egress": [
            {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": _tcp([443])},
            {"to": [{"ipBlock": {"cidr": POD_IDENTITY_AGENT_CIDR}}], "ports": _tcp([POD_IDENTITY_AGENT_PORT])},
        ]}))
    if spec.api_server_ingress_ports:
        out.append(policy("allow-api-server-callbacks", {"policyTypes": ["Ingress"], "ingress": [
            {"from": vpc, "ports": _tcp(spec.api_server_ingress_ports)}]}))
    in_vpc = [*(spec.metrics_ports if spec.host_network_scrapers else ()), *spec.probe_ports]
    if in_vpc:
        out.append(policy("allow-metrics-and-probes", {"policyTypes": ["Ingress"], "ingress": [
            {"from": vpc, "ports": _tcp(in_vpc)}]}))
    if spec.metrics_ports and not spec.host_network_scrapers:
        out.append(policy("allow-metrics-scrapers", {"policyTypes": ["Ingress"], "ingress": [
            {"from": [{"namespaceSelector": {"matchLabels": {METRICS_SCRAPER_LABEL: "true"}}}],
             "ports": _tcp(spec.metrics_ports)}]}))
    if spec.same_namespace:
        out.append(policy("allow-same-namespace", {
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": {}}]}],
            "egress": [{"to": [{"podSelector": {}}]}],
        }))
    return out


# Under the VPC CNI's strict enforcement (components/addons.py) a pod that no NetworkPolicy selects
# has no network at all: "In Strict Mode, you must have a network policy defined for every pod in
# your cluster. Host Networking pods are exempted" (amazon-vpc-cni-k8s v1.20.1 README,
# NETWORK_POLICY_ENFORCING_MODE).
UNRESTRICTED_POLICY = "allow-all-pods"


def unrestricted_policy(namespace: str) -> dict[str, Any]:
    """A NetworkPolicy that selects every pod of ``namespace`` and allows all its traffic: the
    reachability those pods have without any policy, for namespaces whose pods the platform does
    not shape (kube-system's EKS add-ons, the Training Operator's kubeflow), so that strict
    enforcement gives them a policy instead of none."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": UNRESTRICTED_POLICY, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "pulumi"}},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"], "ingress": [{}], "egress": [{}]}}


def namespace_objects(spec: SystemNamespaceSpec) -> list[dict[str, Any]]:
    """The namespace first, then its policies."""
    return [namespace(spec), *network_policies(spec)]


def karpenter_flow_schemas(namespace_name: str, service_account: str) -> list[dict[str, Any]]:
    """API Priority and Fairness for Karpenter outside kube-system.

    In kube-system Karpenter's calls fall into the ``system-leader-election`` and
    ``kube-system-service-accounts`` FlowSchemas; in its own namespace they would be throttled
    with ordinary workloads. These are the two FlowSchemas Karpenter's v1.14 getting-started
    guide applies for a non-default namespace (scripts/step15-apply-flowschemas.sh).
    """
    subject = [{"kind": "ServiceAccount", "serviceAccount": {"name": service_account, "namespace": namespace_name}}]
    return [
        {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
         "metadata": {"name": "karpenter-leader-election"},
         "spec": {"distinguisherMethod": {"type": "ByUser"}, "matchingPrecedence": 200,
                  "priorityLevelConfiguration": {"name": "leader-election"},
                  "rules": [{"resourceRules": [{"apiGroups": ["coordination.k8s.io"], "namespaces": ["*"],
                                                "resources": ["leases"], "verbs": ["get", "create", "update"]}],
                             "subjects": subject}]}},
        {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
         "metadata": {"name": "karpenter-workload"},
         "spec": {"distinguisherMethod": {"type": "ByUser"}, "matchingPrecedence": 1000,
                  "priorityLevelConfiguration": {"name": "workload-high"},
                  "rules": [{"nonResourceRules": [{"nonResourceURLs": ["*"], "verbs": ["*"]}],
                             "resourceRules": [{"apiGroups": ["*"], "clusterScope": True, "namespaces": ["*"],
                                                "resources": ["*"], "verbs": ["*"]}],
                             "subjects": subject}]}},
    ]
