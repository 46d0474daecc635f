"""Kubernetes-side security and deploy-order checks on the recorded graph of both stacks.

Each test states the rule it enforces and where the rule comes from (AWS, Karpenter, Kubernetes),
and derives its expectation from that rule, not from the platform's own constants.
"""
from __future__ import annotations

import json
import re
from typing import Any

import pytest

from infra.config import ConfigError, load_platform_config
from tests.conftest import stack_config
from tests.support.validation import validate_core

RELEASE = "kubernetes:helm.sh/v3:Release"
POD_IDENTITY_PRINCIPAL = "pods.eks.amazonaws.com"
SESSION_TAGS = ("aws:RequestTag/eks-cluster-arn", "aws:RequestTag/kubernetes-namespace",
                "aws:RequestTag/kubernetes-service-account")


# -- helpers ---------------------------------------------------------------------------------
def _by_urn(plan):
    return {r.urn: r for r in plan.recording.resources}


def _release(plan, release_name):
    return next(r for r in plan.recording.by_type(RELEASE) if r.inputs.get("name") == release_name)


def _node_group(plan):
    return plan.recording.one("aws:eks/nodeGroup:NodeGroup")


def _addon(plan, addon_name):
    return next(r for r in plan.recording.by_type("aws:eks/addon:Addon") if r.inputs["addonName"] == addon_name)


def _eks_cluster(plan):
    return plan.recording.one("aws:eks/cluster:Cluster")


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def _k8s_object(record) -> dict[str, Any]:
    _, group_version, kind = record.type.split(":")
    api_version = group_version.removeprefix("core/")
    return {"apiVersion": api_version, "kind": kind, **{k: v for k, v in record.inputs.items() if k != "kind"}}


def _k8s_objects(plan, kind):
    return [_k8s_object(r) for r in plan.recording.resources if r.type.startswith("kubernetes:") and r.type.endswith(f":{kind}")]


# -- Karpenter's controller policy: upstream v1.14.1, statement by statement -----------------
# Written from aws/karpenter-provider-aws v1.14.1,
# website/content/en/docs/getting-started/getting-started-with-karpenter/cloudformation.yaml:
# every statement of NodeLifecyclePolicy, IAMIntegrationPolicy, EKSIntegrationPolicy,
# InterruptionPolicy, ZonalShiftPolicy and ResourceDiscoveryPolicy. ${...} are CloudFormation
# substitutions, filled in below with the stack's partition, region, account and cluster.
_EC2 = "arn:${AWS::Partition}:ec2:${AWS::Region}:*:"
_PROFILE = "arn:${AWS::Partition}:iam::${AWS::AccountId}:instance-profile/*"
_CLUSTER_ARN = "arn:${AWS::Partition}:eks:${AWS::Region}:${AWS::AccountId}:cluster/${ClusterName}"
_TAGGED = [_EC2 + k for k in ("fleet/*", "instance/*", "volume/*", "network-interface/*", "launch-template/*",
                              "spot-instances-request/*")]
_OWNED_RESOURCE = {"StringEquals": {"aws:ResourceTag/kubernetes.io/cluster/${ClusterName}": "owned"},
                   "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"}}
_OWNED_REQUEST = {"StringEquals": {"aws:RequestTag/kubernetes.io/cluster/${ClusterName}": "owned",
                                   "aws:RequestTag/eks:eks-cluster-name": "${ClusterName}"},
                  "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"}}
UPSTREAM_STATEMENTS: dict[str, dict[str, Any]] = {
    "AllowScopedEC2InstanceAccessActions": {
        "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
        "Resource": ["arn:${AWS::Partition}:ec2:${AWS::Region}::image/*", "arn:${AWS::Partition}:ec2:${AWS::Region}::snapshot/*",
                     _EC2 + "security-group/*", _EC2 + "subnet/*", _EC2 + "capacity-reservation/*", _EC2 + "placement-group/*"]},
    "AllowScopedEC2LaunchTemplateAccessActions": {
        "Action": ["ec2:RunInstances", "ec2:CreateFleet"], "Resource": [_EC2 + "launch-template/*"],
        "Condition": _OWNED_RESOURCE},
    "AllowScopedEC2InstanceActionsWithTags": {
        "Action": ["ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate"], "Resource": _TAGGED,
        "Condition": _OWNED_REQUEST},
    "AllowScopedResourceCreationTagging": {
        "Action": ["ec2:CreateTags"], "Resource": _TAGGED,
        "Condition": {"StringEquals": {**_OWNED_REQUEST["StringEquals"],
                                       "ec2:CreateAction": ["RunInstances", "CreateFleet", "CreateLaunchTemplate"]},
                      "StringLike": _OWNED_REQUEST["StringLike"]}},
    "AllowScopedResourceTagging": {
        "Action": ["ec2:CreateTags"], "Resource": [_EC2 + "instance/*"],
        "Condition": {**_OWNED_RESOURCE,
                      "StringEqualsIfExists": {"aws:RequestTag/eks:eks-cluster-name": "${ClusterName}"},
                      "ForAllValues:StringEquals": {"aws:TagKeys": ["eks:eks-cluster-name", "karpenter.sh/nodeclaim", "Name"]}}},
    "AllowScopedDeletion": {
        "Action": ["ec2:TerminateInstances", "ec2:DeleteLaunchTemplate"],
        "Resource": [_EC2 + "instance/*", _EC2 + "launch-template/*"], "Condition": _OWNED_RESOURCE},
    "AllowPassingInstanceRole": {
        "Action": ["iam:PassRole"], "Resource": ["${KarpenterNodeRole.Arn}"],
        "Condition": {"StringEquals": {"iam:PassedToService": ["ec2.amazonaws.com", "ec2.amazonaws.com.cn"]}}},
    "AllowScopedInstanceProfileCreationActions": {
        "Action": ["iam:CreateInstanceProfile"], "Resource": [_PROFILE],
        "Condition": {"StringEquals": {"aws:RequestTag/kubernetes.io/cluster/${ClusterName}": "owned",
                                       "aws:RequestTag/eks:eks-cluster-name": "${ClusterName}",
                                       "aws:RequestTag/topology.kubernetes.io/region": "${AWS::Region}"},
                      "StringLike": {"aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*"}}},
    "AllowScopedInstanceProfileTagActions": {
        "Action": ["iam:TagInstanceProfile"], "Resource": [_PROFILE],
        "Condition": {"StringEquals": {"aws:ResourceTag/kubernetes.io/cluster/${ClusterName}": "owned",
                                       "aws:ResourceTag/topology.kubernetes.io/region": "${AWS::Region}",
                                       "aws:RequestTag/kubernetes.io/cluster/${ClusterName}": "owned",
                                       "aws:RequestTag/eks:eks-cluster-name": "${ClusterName}",
                                       "aws:RequestTag/topology.kubernetes.io/region": "${AWS::Region}"},
                      "StringLike": {"aws:ResourceTag/karpenter.k8s.aws/ec2nodeclass": "*",
                                     "aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*"}}},
    "AllowScopedInstanceProfileActions": {
        "Action": ["iam:AddRoleToInstanceProfile", "iam:RemoveRoleFromInstanceProfile", "iam:DeleteInstanceProfile"],
        "Resource": [_PROFILE],
        "Condition": {"StringEquals": {"aws:ResourceTag/kubernetes.io/cluster/${ClusterName}": "owned",
                                       "aws:ResourceTag/topology.kubernetes.io/region": "${AWS::Region}"},
                      "StringLike": {"aws:ResourceTag/karpenter.k8s.aws/ec2nodeclass": "*"}}},
    "AllowAPIServerEndpointDiscovery": {"Action": ["eks:DescribeCluster"], "Resource": [_CLUSTER_ARN]},
    "AllowInterruptionQueueActions": {
        "Action": ["sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"],
        "Resource": ["${KarpenterInterruptionQueue.Arn}"]},
    "AllowZonalShiftStatusReadOnly": {
        "Action": ["arc-zonal-shift:GetManagedResource"], "Resource": ["*"],
        "Condition": {"StringEquals": {"arc-zonal-shift:ResourceIdentifier": _CLUSTER_ARN}}},
    "AllowRegionalReadActions": {
        "Action": ["ec2:DescribeCapacityReservations", "ec2:DescribeImages", "ec2:DescribeInstances",
                   "ec2:DescribeInstanceStatus", "ec2:DescribeInstanceTypeOfferings", "ec2:DescribeInstanceTypes",
                   "ec2:DescribeLaunchTemplates", "ec2:DescribePlacementGroups", "ec2:DescribeSecurityGroups",
                   "ec2:DescribeSpotPriceHistory", "ec2:DescribeSubnets"],
        "Resource": ["*"], "Condition": {"StringEquals": {"aws:RequestedRegion": "${AWS::Region}"}}},
    "AllowSSMReadActions": {"Action": ["ssm:GetParameter"],
                            "Resource": ["arn:${AWS::Partition}:ssm:${AWS::Region}::parameter/aws/service/*"]},
    "AllowPricingReadActions": {"Action": ["pricing:GetProducts"], "Resource": ["*"]},
    "AllowUnscopedInstanceProfileListAction": {"Action": ["iam:ListInstanceProfiles"], "Resource": ["*"]},
    "AllowInstanceProfileReadActions": {"Action": ["iam:GetInstanceProfile"], "Resource": [_PROFILE]},
}
# The reference template's EventBridge rules (ScheduledChangeRule, SpotInterruptionRule,
# RebalanceRule, InstanceStateChangeRule, CapacityReservationInterruptionRule).
UPSTREAM_RULES = [
    {"source": ["aws.health"], "detail-type": ["AWS Health Event"]},
    {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]},
    {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]},
    {"source": ["aws.ec2"], "detail-type": ["EC2 Instance State-change Notification"]},
    {"source": ["aws.ec2"], "detail-type": ["EC2 Capacity Reservation Instance Interruption Warning"]},
]


def _substitute(value: Any, subs: dict[str, str]) -> Any:
    if isinstance(value, str):
        return re.sub(r"\$\{([^}]+)\}", lambda m: subs[m.group(1)], value)
    if isinstance(value, list):
        return [_substitute(v, subs) for v in value]
    if isinstance(value, dict):
        return {_substitute(k, subs): _substitute(v, subs) for k, v in value.items()}
    return value


def _normalize(statement: dict[str, Any]) -> dict[str, Any]:
    def norm_condition(condition):
        return {op: {key: sorted(_as_list(v)) for key, v in keys.items()} for op, keys in (condition or {}).items()}

    return {"Effect": statement.get("Effect", "Allow"), "Action": sorted(_as_list(statement["Action"])),
            "Resource": sorted(_as_list(statement["Resource"])), "Condition": norm_condition(statement.get("Condition"))}


def _karpenter_policy(plan):
    role = next(r for r in plan.recording.by_type("aws:iam/role:Role") if r.name.endswith("karpenter-aws-controller-role"))
    policy = next(r for r in plan.recording.by_type("aws:iam/rolePolicy:RolePolicy") if r.parent == role.urn)
    return role, json.loads(policy.inputs["policy"])


def test_karpenter_controller_policy_is_upstreams_statement_by_statement(plan):
    _, policy = _karpenter_policy(plan)
    queue = next(r for r in plan.recording.by_type("aws:sqs/queue:Queue") if "karpenter" in r.name)
    node_role = next(r for r in plan.recording.by_type("aws:iam/role:Role") if r.name.endswith("karpenter-aws-node-role"))
    subs = {"AWS::Partition": "aws", "AWS::Region": plan.config.region, "AWS::AccountId": plan.config.accounts.workload.id,
            "ClusterName": plan.config.cluster_name, "KarpenterNodeRole.Arn": node_role.outputs["arn"],
            "KarpenterInterruptionQueue.Arn": queue.outputs["arn"]}
    ours = {s["Sid"]: _normalize(s) for s in policy["Statement"]}
    assert sorted(ours) == sorted(UPSTREAM_STATEMENTS)
    for sid, upstream in UPSTREAM_STATEMENTS.items():
        assert ours[sid] == _normalize(_substitute(upstream, subs)), sid
    actions = {a for s in policy["Statement"] for a in _as_list(s["Action"])}
    assert {"iam:ListInstanceProfiles", "ec2:DescribeInstanceStatus"} <= actions


def test_karpenter_interruption_rules_are_upstreams_and_feed_the_queue(plan):
    queue = next(r for r in plan.recording.by_type("aws:sqs/queue:Queue") if "karpenter" in r.name)
    rules = [r for r in plan.recording.by_type("aws:cloudwatch/eventRule:EventRule") if "karpenter" in r.name]
    assert sorted((json.loads(r.inputs["eventPattern"]) for r in rules), key=json.dumps) == sorted(UPSTREAM_RULES, key=json.dumps)
    targets = {t.inputs["rule"]: t for t in plan.recording.by_type("aws:cloudwatch/eventTarget:EventTarget") if "karpenter" in t.name}
    for rule in rules:
        assert targets[rule.outputs["name"]].inputs["arn"] == queue.outputs["arn"]


def test_no_wildcard_privileges_in_platform_k8s_roles(plan):
    """Allow statements never grant '*' or 'service:*' actions; a '*' resource appears only in
    upstream Karpenter's statements, with upstream's conditions (compared above)."""
    _, policy = _karpenter_policy(plan)
    for statement in policy["Statement"]:
        assert all(a != "*" and not a.endswith(":*") for a in _as_list(statement["Action"])), statement["Sid"]
        if "*" in _as_list(statement["Resource"]):
            assert _normalize(statement)["Resource"] == ["*"]
            upstream = UPSTREAM_STATEMENTS[statement["Sid"]]
            assert (statement.get("Condition") is None) == ("Condition" not in upstream), statement["Sid"]


# -- Pod Identity trust ------------------------------------------------------------------------
def _pod_identity_bindings(plan) -> set[tuple[str, str, str, str]]:
    """(cluster name, namespace, service account, role ARN) of every Pod Identity association."""
    out = set()
    for r in plan.recording.by_type("aws:eks/podIdentityAssociation:PodIdentityAssociation"):
        out.add((r.inputs["clusterName"], r.inputs["namespace"], r.inputs["serviceAccount"], r.inputs["roleArn"]))
    for addon in plan.recording.by_type("aws:eks/addon:Addon"):
        for association in addon.inputs.get("podIdentityAssociations") or []:
            # AWS-published add-ons run their controllers in kube-system.
            out.add((addon.inputs["clusterName"], "kube-system", association["serviceAccount"], association["roleArn"]))
    return out


def test_every_pod_identity_role_trusts_only_its_association(plan):
    """EKS Pod Identity tags the session with the cluster ARN, namespace and service account
    (EKS User Guide, pod-id-abac); a role that trusts pods.eks.amazonaws.com without conditions
    on all three can be used by any association in the account."""
    cluster = _eks_cluster(plan)
    bindings = _pod_identity_bindings(plan)
    roles = [r for r in plan.recording.by_type("aws:iam/role:Role")
             if POD_IDENTITY_PRINCIPAL in json.dumps(json.loads(r.inputs["assumeRolePolicy"]))]
    assert len(roles) >= 2  # EBS CSI and the Karpenter controller at least
    for role in roles:
        for statement in json.loads(role.inputs["assumeRolePolicy"])["Statement"]:
            if POD_IDENTITY_PRINCIPAL not in json.dumps(statement.get("Principal")):
                continue
            conditions = statement.get("Condition", {}).get("StringEquals", {})
            assert set(SESSION_TAGS) <= set(conditions), role.name
            arn, namespace, account = (conditions[k] for k in SESSION_TAGS)
            assert arn == cluster.outputs["arn"], role.name
            assert (cluster.inputs["name"], namespace, account, role.outputs["arn"]) in bindings, role.name
    # ...and every association's role is one of these (no unconditioned role behind an association).
    assert {b[3] for b in bindings} <= {r.outputs["arn"] for r in roles}


# -- cluster access -----------------------------------------------------------------------------
def test_cluster_creator_gets_no_hidden_admin(plan):
    """The transform reaches pulumi-eks's aws:eks/cluster:Cluster child (the mock engine calls
    the program's transform callbacks the way the engine does)."""
    child = _eks_cluster(plan)
    assert child.inputs["accessConfig"] == {"authenticationMode": "API", "bootstrapClusterCreatorAdminPermissions": False}


def test_access_entries_deploy_role_admin_teams_namespace_edit(plan):
    config = plan.config
    entries = {r.inputs["principalArn"]: r for r in plan.recording.by_type("aws:eks/accessEntry:AccessEntry")}
    associations = {r.inputs["principalArn"]: r for r in plan.recording.by_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")}
    cluster_wide = {arn for arn, a in associations.items() if a.inputs["accessScope"]["type"] == "cluster"}
    deploy = config.accounts.workload.role_arn  # the role Pulumi (and its kubeconfig) uses
    expected_admins = {deploy, *config.cluster.admin_role_arns, *([config.cluster.deploy_role_arn] if config.cluster.deploy_role_arn else [])}
    assert cluster_wide == expected_admins
    for arn in expected_admins:
        assert entries[arn].inputs["type"] == "STANDARD"
        assert associations[arn].inputs["policyArn"].endswith(":eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy")
    for team in config.scheduling.teams:
        for arn in team.role_arns:
            # No EKS access policy: the team's Kubernetes group, bound to the platform's team Role.
            assert arn not in associations
            assert f"mlplatform:team-{team.name}" in entries[arn].inputs["kubernetesGroups"]
    # Nothing reaches the cluster before the deploy role can: the provider waits for its entry.
    # (The platform's provider; pulumi-eks's own `-eks-k8s` one deploys nothing.)
    eks = plan.recording.one("eks:index:Cluster")
    provider = next(r for r in plan.recording.resources if r.type == "pulumi:providers:kubernetes" and r.parent != eks.urn)
    assert {entries[deploy].urn, associations[deploy].urn} <= set(provider.dependencies)


def test_team_roles_get_their_group_and_no_access_policy(plan_config):
    raw = stack_config("dev")
    role = "arn:aws:iam::444455556666:role/research-ml"
    raw["scheduling"]["teams"][0]["roleArns"] = [role]
    plan = plan_config("dev", raw)
    assert not [r for r in plan.recording.by_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")
                if r.inputs["principalArn"] == role]
    (entry,) = [r for r in plan.recording.by_type("aws:eks/accessEntry:AccessEntry") if r.inputs["principalArn"] == role]
    namespace = f"team-{raw['scheduling']['teams'][0]['name']}"
    assert entry.inputs["kubernetesGroups"] == [f"mlplatform:{namespace}"]
    (binding,) = [r for r in plan.recording.by_type("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")
                  if r.inputs["metadata"]["namespace"] == namespace]
    assert binding.inputs["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": f"mlplatform:{namespace}"}]


def test_team_role_that_is_already_admin_is_refused():
    raw = stack_config("dev")
    raw["scheduling"]["teams"][0]["roleArns"] = [raw["cluster"]["adminRoleArns"][0]]
    with pytest.raises(ConfigError) as info:
        load_platform_config(raw)
    (problem,) = [p for p in info.value.problems if p.path == "scheduling.teams[0].roleArns"]
    assert problem.value == raw["cluster"]["adminRoleArns"][0]


def test_prod_api_endpoint_is_private(prod_plan):
    inputs = prod_plan.recording.one("eks:index:Cluster").inputs
    assert inputs["endpointPrivateAccess"] is True and inputs["endpointPublicAccess"] is False


def test_every_node_requires_imdsv2_with_hop_limit_one(plan):
    """Pods must not reach node credentials through IMDS (EKS Best Practices, "Restrict access
    to the instance profile assigned to the worker node")."""
    for template in plan.recording.by_type("aws:ec2/launchTemplate:LaunchTemplate"):
        metadata = template.inputs["metadataOptions"]
        assert metadata["httpTokens"] == "required" and metadata["httpPutResponseHopLimit"] == 1
    node_classes = [r.inputs for r in plan.recording.resources if r.inputs.get("kind") == "EC2NodeClass"]
    assert node_classes
    for node_class in node_classes:
        assert node_class["spec"]["metadataOptions"]["httpTokens"] == "required"
        assert node_class["spec"]["metadataOptions"]["httpPutResponseHopLimit"] == 1


# -- security groups ----------------------------------------------------------------------------
def test_groups_with_standalone_rules_have_no_inline_rules(plan):
    """An aws.ec2.SecurityGroup with inline ingress/egress revokes standalone rules on the same
    group at the next update (pulumi-aws / Terraform aws_security_group)."""
    groups = {g.id: g for g in plan.recording.by_type("aws:ec2/securityGroup:SecurityGroup")}
    standalone = [r for t in ("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
                              "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule",
                              "aws:ec2/securityGroupRule:SecurityGroupRule")
                  for r in plan.recording.by_type(t)]
    targeted = {r.inputs["securityGroupId"] for r in standalone}
    node_sg = plan.recording.one("aws:ec2/securityGroup:SecurityGroup", f"{plan.config.name}-cluster-node-sg")
    assert node_sg.id in targeted
    for group_id in targeted & set(groups):
        group = groups[group_id]
        assert not group.inputs.get("ingress") and not group.inputs.get("egress"), group.name


def test_node_and_fsx_groups_admit_nothing_from_the_internet(plan):
    """Nodes are private; the only sources allowed in are security groups (CIS EKS 5.4 / EKS BPG)."""
    name = plan.config.name
    # The shared file system's group: FSx (prod) or EFS (dev, datasets storage s3-mountpoint).
    storage = "fsx" if plan.config.datasets.fsx is not None else "efs"
    groups = [plan.recording.one("aws:ec2/securityGroup:SecurityGroup", f"{name}-cluster-node-sg"),
              plan.recording.one("aws:ec2/securityGroup:SecurityGroup", f"{name}-datasets-{storage}-sg")]
    for group in groups:
        ingress = [r for r in plan.recording.by_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
                   if r.inputs["securityGroupId"] == group.id]
        assert ingress, group.name
        for rule in ingress:
            assert rule.inputs.get("referencedSecurityGroupId"), rule.name
            assert not rule.inputs.get("cidrIpv4") and not rule.inputs.get("cidrIpv6"), rule.name


def test_node_group_allows_all_traffic_to_and_from_itself_for_efa(plan):
    """EFA: the security group must allow all inbound and outbound traffic to and from itself
    (EC2 User Guide, "Prepare an EFA-enabled security group")."""
    node_sg = plan.recording.one("aws:ec2/securityGroup:SecurityGroup", f"{plan.config.name}-cluster-node-sg")
    for kind in ("Ingress", "Egress"):
        rules = [r for r in plan.recording.by_type(f"aws:vpc/securityGroup{kind}Rule:SecurityGroup{kind}Rule")
                 if r.inputs["securityGroupId"] == node_sg.id and r.inputs.get("referencedSecurityGroupId") == node_sg.id]
        assert any(r.inputs["ipProtocol"] == "-1" for r in rules), kind


# -- deploy order: what each release needs to run ---------------------------------------------
CRD_ONLY_CHARTS = ("karpenter-crd", "prometheus-operator-crds")  # no pods to schedule


def test_controller_releases_wait_for_nodes_and_dns(plan):
    """An atomic Helm release waits for its pods; they need the static node group to schedule
    on and CoreDNS to resolve AWS and in-cluster names (Karpenter exits without DNS)."""
    releases = [r for r in plan.recording.by_type(RELEASE) if not r.inputs["chart"].endswith(CRD_ONLY_CHARTS)]
    names = {r.inputs["name"] for r in releases}
    # gpu-operator mode (prod: MIG needs its MIG manager) bundles the device plugin and DCGM.
    operator = plan.config.gpu_enablement.mode.value == "gpu-operator"
    assert {"karpenter", "kueue", *(("gpu-operator",) if operator else ("nvidia-device-plugin", "dcgm-exporter"))} <= names
    if any(p.efa for p in plan.config.gpu_pools):
        assert "efa-device-plugin" in names
    for release in releases:
        assert _node_group(plan).urn in release.dependencies, release.name
        assert _addon(plan, "coredns").urn in release.dependencies, release.name


def test_karpenter_also_waits_for_its_pod_identity_association(plan):
    release = _release(plan, "karpenter")
    association = next(r for r in plan.recording.by_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
                       if r.inputs["serviceAccount"] == "karpenter")
    assert association.urn in release.dependencies
    assert association.inputs["namespace"] == release.inputs["namespace"]


def test_karpenter_crds_are_their_own_release_and_pools_wait_for_them(plan):
    """Helm installs a chart's crds/ once and never upgrades them; Karpenter ships the
    karpenter-crd chart for that (Karpenter upgrade guide, "CRD Upgrades")."""
    controller, crds = _release(plan, "karpenter"), _release(plan, "karpenter-crd")
    assert crds.inputs["chart"] == "oci://public.ecr.aws/karpenter/karpenter-crd"
    assert crds.inputs["version"] == controller.inputs["version"]
    assert controller.inputs["skipCrds"] is True and not crds.inputs.get("skipCrds")
    assert crds.urn in controller.dependencies
    pools = [r for r in plan.recording.resources if r.inputs.get("kind") in ("NodePool", "EC2NodeClass")]
    assert pools and all(crds.urn in r.dependencies for r in pools)


# -- ServiceMonitor needs the Prometheus operator CRDs -----------------------------------------
def test_service_monitor_is_off_in_both_stacks(plan):
    assert plan.config.gpu_enablement.service_monitor is False
    if plan.config.gpu_enablement.mode.value == "gpu-operator":
        assert _release(plan, "gpu-operator").inputs["values"]["dcgmExporter"]["serviceMonitor"]["enabled"] is False
    else:
        assert _release(plan, "dcgm-exporter").inputs["values"]["serviceMonitor"]["enabled"] is False


def test_service_monitor_without_crds_is_refused():
    raw = stack_config("prod")
    raw.pop("monitoring")  # the monitoring section owns the CRDs and DCGM's scrape when present
    raw["gpuEnablement"].update(serviceMonitor=True, prometheusOperatorCrds=False)
    with pytest.raises(ConfigError) as info:
        load_platform_config(raw)
    (problem,) = [p for p in info.value.problems if p.path == "gpuEnablement.serviceMonitor"]
    assert "prometheusOperatorCrds" in problem.fix


def test_service_monitor_with_crds_depends_on_the_crd_release(plan_config):
    # The standalone DCGM exporter release: the dev stack's device-plugin mode (prod runs the operator).
    raw = stack_config("dev")
    raw.pop("monitoring")
    for team in raw["scheduling"]["teams"]:
        team.pop("alertEmails", None)  # team alerts need monitoring's Alertmanager
    raw["gpuEnablement"].update(serviceMonitor=True, prometheusOperatorCrds=True)
    plan = plan_config("dev", raw)
    crds, dcgm = _release(plan, "prometheus-operator-crds"), _release(plan, "dcgm-exporter")
    assert crds.inputs["chart"] == "prometheus-operator-crds" and re.fullmatch(r"\d+\.\d+\.\d+", crds.inputs["version"])
    assert dcgm.inputs["values"]["serviceMonitor"]["enabled"] is True
    assert crds.urn in dcgm.dependencies


def test_monitoring_refuses_a_second_crds_release_and_a_double_dcgm_scrape():
    """Helm refuses to install objects another release owns ("invalid ownership metadata"), so
    with the monitoring section installing prometheus-operator-crds, gpuEnablement must not."""
    raw = stack_config("prod")
    raw["gpuEnablement"].update(serviceMonitor=True, prometheusOperatorCrds=True)
    with pytest.raises(ConfigError) as info:
        load_platform_config(raw)
    paths = {p.path for p in info.value.problems}
    assert {"gpuEnablement.prometheusOperatorCrds", "gpuEnablement.serviceMonitor"} <= paths


def test_every_monitoring_object_waits_for_the_crds_release(plan):
    by_urn = _by_urn(plan)
    (crds,) = [r for r in plan.recording.by_type(RELEASE) if r.inputs["chart"] == "prometheus-operator-crds"]
    stack_release = next(r for r in plan.recording.by_type(RELEASE) if r.inputs["chart"] == "kube-prometheus-stack")
    assert stack_release.inputs["values"]["crds"] == {"enabled": False}
    assert crds.urn in stack_release.dependencies
    monitors = [r for r in by_urn.values() if r.type.startswith("kubernetes:monitoring.coreos.com/v1:")]
    assert {r.type.rsplit(":", 1)[1] for r in monitors} == {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    assert all(crds.urn in r.dependencies for r in monitors)


# -- controller namespaces: PSA labels and default-deny network policies ------------------------
NAMESPACES = {"karpenter": "restricted", "kueue-system": "restricted", "gpu-system": "privileged"}


def test_controller_namespaces_are_ours_with_pod_security_labels(plan):
    namespaces = {o["metadata"]["name"]: o for o in _k8s_objects(plan, "Namespace")}
    for name, level in NAMESPACES.items():
        labels = namespaces[name]["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == level, name
        assert labels["pod-security.kubernetes.io/enforce-version"] == "v1.32"
        if level != "restricted":
            assert namespaces[name]["metadata"]["annotations"]["mlplatform.io/pod-security-reason"]
        assert validate_core(namespaces[name]) == [], name
    by_urn = _by_urn(plan)
    for release in plan.recording.by_type(RELEASE):
        if release.inputs["namespace"] in NAMESPACES:
            assert not release.inputs.get("createNamespace"), release.name
            deps = [by_urn[u] for u in release.dependencies if u in by_urn]
            assert any(d.type == "kubernetes:core/v1:Namespace" and d.inputs["metadata"]["name"] == release.inputs["namespace"]
                       for d in deps), release.name


def _policies(plan, namespace):
    return [o for o in _k8s_objects(plan, "NetworkPolicy") if o["metadata"]["namespace"] == namespace]


def _allows_egress(policies, cidr_or_selector, port, protocol="TCP"):
    for policy in policies:
        for rule in policy["spec"].get("egress", []):
            ports = rule.get("ports", [])
            if not any(p.get("port") == port and p.get("protocol", "TCP") == protocol for p in ports):
                continue
            for peer in rule.get("to", []):
                if isinstance(cidr_or_selector, str) and peer.get("ipBlock", {}).get("cidr") == cidr_or_selector:
                    return True
                if isinstance(cidr_or_selector, dict) and all(peer.get(k) == v for k, v in cidr_or_selector.items()):
                    return True
    return False


def test_controller_namespaces_default_deny_with_needed_flows(plan):
    vpc = str(plan.config.network.cidr)
    service = plan.recording.one("eks:index:Cluster").inputs["kubernetesServiceIpAddressRange"]
    dns = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
           "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}
    for namespace in NAMESPACES:
        policies = _policies(plan, namespace)
        for policy in policies:
            assert validate_core(policy) == [], policy["metadata"]["name"]
        deny = [p for p in policies if p["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}]
        assert deny, namespace
        assert _allows_egress(policies, dns, 53, "UDP") and _allows_egress(policies, dns, 53, "TCP"), namespace
        # The API server: its Service address (pre-translation) and its ENIs in the VPC.
        assert _allows_egress(policies, vpc, 443), namespace
        assert _allows_egress(policies, service, 443), namespace
    # Karpenter calls AWS through Pod Identity: the agent on the node and AWS endpoints.
    karpenter = _policies(plan, "karpenter")
    assert _allows_egress(karpenter, "169.254.170.23/32", 80)
    assert _allows_egress(karpenter, "0.0.0.0/0", 443)
    # Kueue's webhook is called by the API server from its ENIs in the VPC.
    kueue_ingress = [rule for p in _policies(plan, "kueue-system") for rule in p["spec"].get("ingress", [])]
    assert any({"protocol": "TCP", "port": 9443} in r["ports"] and {"ipBlock": {"cidr": vpc}} in r["from"] for r in kueue_ingress)


def test_karpenter_flow_schemas_validate(plan):
    schemas = [o for o in _k8s_objects(plan, "FlowSchema")]
    assert {s["metadata"]["name"] for s in schemas} == {"karpenter-leader-election", "karpenter-workload"}
    for schema in schemas:
        assert validate_core(schema) == [], schema["metadata"]["name"]
        (rule,) = schema["spec"]["rules"]
        assert rule["subjects"] == [{"kind": "ServiceAccount", "serviceAccount": {"name": "karpenter", "namespace": "karpenter"}}]
