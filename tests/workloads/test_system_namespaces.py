"""Controller namespaces, the bootstrap-admin transform and argument checks, without a plan."""
from __future__ import annotations

from types import SimpleNamespace

import pulumi
import pytest

from components.cluster import ClusterArgs, NodeGroupArgs, UpgradePolicy, disable_bootstrap_cluster_admin
from components.gpu_enablement import GpuEnablementArgs
from workloads.system_namespaces import (
    PodSecurityLevel, SystemNamespaceSpec, karpenter_flow_schemas, namespace_objects,
)
from tests.support.validation import validate_core

SPEC = SystemNamespaceSpec(name="ctl", pod_security=PodSecurityLevel.RESTRICTED, vpc_cidr="10.0.0.0/16",
                           service_cidr="172.20.0.0/16", api_server_ingress_ports=(9443,), metrics_ports=(8080,),
                           probe_ports=(8081,), uses_aws=True, same_namespace=True)


def test_every_object_validates_against_kubernetes_1_32():
    objects = [*namespace_objects(SPEC), *karpenter_flow_schemas("karpenter", "karpenter")]
    for obj in objects:
        assert validate_core(obj) == [], (obj["kind"], obj["metadata"]["name"])


def test_restricted_namespace_labels_and_default_deny_first():
    ns, deny, *rest = namespace_objects(SPEC)
    labels = ns["metadata"]["labels"]
    assert {labels[f"pod-security.kubernetes.io/{m}"] for m in ("enforce", "audit", "warn")} == {"restricted"}
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    egress_peers = [(peer.get("ipBlock", {}).get("cidr"), port["port"]) for p in rest for rule in p["spec"].get("egress", [])
                    for peer in rule["to"] for port in rule.get("ports", [])]
    assert ("169.254.170.23/32", 80) in egress_peers  # EKS Pod Identity agent
    assert ("172.20.0.0/16", 443) in egress_peers and ("10.0.0.0/16", 443) in egress_peers


def test_below_restricted_needs_a_reason():
    with pytest.raises(ValueError, match="pod_security_reason"):
        SystemNamespaceSpec(name="x", pod_security="privileged", vpc_cidr="10.0.0.0/16", service_cidr="172.20.0.0/16")
    spec = SystemNamespaceSpec(name="x", pod_security="privileged", vpc_cidr="10.0.0.0/16",
                               service_cidr="172.20.0.0/16", pod_security_reason="hostPath device plugins")
    ns = namespace_objects(spec)[0]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert ns["metadata"]["annotations"]["mlplatform.io/pod-security-reason"] == "hostPath device plugins"


def _transform(type_, props):
    return disable_bootstrap_cluster_admin(pulumi.ResourceTransformArgs(
        custom=True, type_=type_, name="c", props=props, opts=pulumi.ResourceOptions()))


def test_transform_turns_off_bootstrap_admin_on_the_eks_cluster_only():
    # The props pulumi-eks sends for its child (nodejs/eks/cluster/cluster.ts).
    result = _transform("aws:eks/cluster:Cluster", {
        "name": "c", "accessConfig": {"authenticationMode": "API", "bootstrapClusterCreatorAdminPermissions": True}})
    assert result.props["accessConfig"] == {"authenticationMode": "API", "bootstrapClusterCreatorAdminPermissions": False}
    assert result.props["name"] == "c"
    assert _transform("aws:iam/role:Role", {"name": "r"}) is None


def test_service_monitor_needs_the_prometheus_operator_crds():
    cluster = SimpleNamespace()
    with pytest.raises(ValueError, match="prometheus_operator_crds"):
        GpuEnablementArgs(cluster=cluster, service_monitor=True)
    assert GpuEnablementArgs(cluster=cluster, service_monitor=True, prometheus_operator_crds=True).service_monitor
    assert GpuEnablementArgs(cluster=cluster, mode="gpu-operator").mode.value == "gpu-operator"


def _cluster_args(**overrides):
    network = SimpleNamespace(args=SimpleNamespace(cidr="10.40.0.0/16"))
    values = dict(cluster_name="c", version="1.32", upgrade_policy=UpgradePolicy.STANDARD, network=network,
                  system_node_group=NodeGroupArgs(instance_types=["m7i.large"], min_size=2, max_size=3, desired_size=2),
                  kubeconfig_role_arn="arn:aws:iam::111122223333:role/deploy")
    values.update(overrides)
    return ClusterArgs(**values)


def test_cluster_args_access_rules():
    assert _cluster_args().service_ipv4_cidr == "172.20.0.0/16"
    with pytest.raises(ValueError, match="kubeconfig_role_arn"):
        _cluster_args(kubeconfig_role_arn=None)
    with pytest.raises(ValueError, match="one access entry per principal"):
        _cluster_args(admin_role_arns=["arn:aws:iam::111122223333:role/deploy"])
    with pytest.raises(ValueError, match="no namespaces"):
        _cluster_args(namespace_editors={"arn:aws:iam::111122223333:role/team": []})
    with pytest.raises(ValueError, match="overlaps the VPC"):
        _cluster_args(service_ipv4_cidr="10.40.128.0/20")


def test_metrics_only_from_scraper_namespaces_probes_from_the_vpc():
    """A pod in any namespace (a team's) is not a scraper: metrics ports admit only namespaces
    labelled as scrapers; the VPC CIDR (which holds every pod's address) only reaches probes."""
    policies = {p["metadata"]["name"]: p for p in namespace_objects(SPEC)[1:]}
    (scrape,) = policies["allow-metrics-scrapers"]["spec"]["ingress"]
    assert scrape["from"] == [{"namespaceSelector": {"matchLabels": {"mlplatform.io/metrics-scraper": "true"}}}]
    assert scrape["ports"] == [{"protocol": "TCP", "port": 8080}]
    vpc_ports = {port["port"] for rule in policies["allow-metrics-and-probes"]["spec"]["ingress"] for port in rule["ports"]}
    assert vpc_ports == {8081}
    host = SystemNamespaceSpec(name="gpu", pod_security="privileged", pod_security_reason="device plugin",
                               vpc_cidr="10.0.0.0/16", service_cidr="172.20.0.0/16", metrics_ports=(9400,),
                               host_network_scrapers=True)
    names = {p["metadata"]["name"] for p in namespace_objects(host)[1:]}
    assert "allow-metrics-scrapers" not in names and "allow-metrics-and-probes" in names
