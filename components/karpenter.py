"""Karpenter: AWS-side prerequisites and the in-cluster Helm release (two components).

``KarpenterPrerequisites`` (AWS only): the controller's IAM role (EKS Pod Identity only) with
the v1 controller policy scoped by tags to this cluster, the Pod Identity association, the
node role with its EC2_LINUX access entry, the SQS interruption queue and the EventBridge
rules that feed it.

``Karpenter`` (Kubernetes): the pinned chart on the static CPU nodes, pointed at the queue by
NAME, two replicas and a PodDisruptionBudget in prod.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from components.helm_addon import helm_addon
from components.cluster import Cluster
from components.k8s import apply_namespace_objects, apply_object
from components.names import EVENT_RULE_NAME_MAX, IAM_ROLE_NAME_MAX, fitted_name
from components.charts import ChartSource
from catalog.versions import KARPENTER, KARPENTER_CRD
from workloads.node_health import karpenter_node_repair_settings as node_repair_settings
from workloads.placement import system_pod_placement
from workloads.system_namespaces import (
    PodSecurityLevel, SystemNamespaceSpec, karpenter_flow_schemas, namespace_objects,
)

SERVICE_ACCOUNT = "karpenter"
# Karpenter's own namespace, not kube-system: kube-system runs privileged node agents (CNI,
# kube-proxy, CSI node plugins) and cannot enforce `restricted`, while the Karpenter controller
# meets `restricted` as shipped (non-root, no privilege escalation, all capabilities dropped,
# RuntimeDefault seccomp). Upstream's guide allows another namespace and gives the FlowSchemas
# that keep its API priority (applied below); the Pod Identity association follows it.
NAMESPACE = "karpenter"
# Controller ports (chart values controller.metrics.port / healthProbe.port, v1.14.1).
METRICS_PORT = 8080
HEALTH_PROBE_PORT = 8081

# Node role: join the cluster, run the VPC CNI, pull images, be reachable by SSM (no SSH).
NODE_MANAGED_POLICIES = (
    "AmazonEKSWorkerNodePolicy",
    "AmazonEKS_CNI_Policy",
    "AmazonEC2ContainerRegistryPullOnly",
    "AmazonSSMManagedInstanceCore",
)

# EventBridge events Karpenter acts on: the five rules of Karpenter v1.14.1's reference
# CloudFormation (ScheduledChangeRule, SpotInterruptionRule, RebalanceRule,
# InstanceStateChangeRule, CapacityReservationInterruptionRule), patterns verbatim.
INTERRUPTION_EVENT_PATTERNS: dict[str, dict[str, list[str]]] = {
    "health": {"source": ["aws.health"], "detail-type": ["AWS Health Event"]},
    "spot-interruption": {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]},
    "rebalance": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]},
    "instance-state-change": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance State-change Notification"]},
    "capacity-reservation-interruption": {
        "source": ["aws.ec2"], "detail-type": ["EC2 Capacity Reservation Instance Interruption Warning"]},
}
# Karpenter acts on a message within seconds; older ones describe instances already gone.
QUEUE_RETENTION_SECONDS = 300


def controller_policy(*, partition: str, region: str, account_id: str, cluster_name: str,
                      queue_arn: str, node_role_arn: str, cluster_arn: str) -> dict[str, Any]:
    """Karpenter v1.14.1 controller policy: upstream's reference CloudFormation, statement by statement.

    Source: aws/karpenter-provider-aws v1.14.1,
    website/content/en/docs/getting-started/getting-started-with-karpenter/cloudformation.yaml
    (NodeLifecyclePolicy, IAMIntegrationPolicy, EKSIntegrationPolicy, InterruptionPolicy,
    ZonalShiftPolicy, ResourceDiscoveryPolicy), merged into one document with the same Sids.
    Everything Karpenter launches, tags or deletes must carry this cluster's
    ``kubernetes.io/cluster/<name>=owned`` tag and a ``karpenter.sh/nodepool`` tag; the only
    ``Resource: "*"`` statements are upstream's read-only ones (region- or resource-scoped by
    condition where upstream scopes them).
    """
    statements = [
        *_node_lifecycle_statements(partition=partition, region=region, cluster_name=cluster_name),
        *_iam_integration_statements(partition=partition, region=region, account_id=account_id,
                                     cluster_name=cluster_name, node_role_arn=node_role_arn),
        # -- EKSIntegrationPolicy
        {"Sid": "AllowAPIServerEndpointDiscovery", "Effect": "Allow", "Action": "eks:DescribeCluster",
         "Resource": cluster_arn},
        # -- InterruptionPolicy
        {"Sid": "AllowInterruptionQueueActions", "Effect": "Allow",
         "Action": ["sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"], "Resource": queue_arn},
        # -- ZonalShiftPolicy (read-only; used when settings.enableZonalShift is on)
        {"Sid": "AllowZonalShiftStatusReadOnly", "Effect": "Allow", "Action": ["arc-zonal-shift:GetManagedResource"],
         "Resource": "*", "Condition": {"StringEquals": {"arc-zonal-shift:ResourceIdentifier": cluster_arn}}},
        *_resource_discovery_statements(partition=partition, region=region, account_id=account_id),
    ]
    return {"Version": "2012-10-17", "Statement": statements}


def _owned(tag: str, cluster_name: str, *, request: bool) -> dict[str, Any]:
    """The condition that a resource (``request=False``) or a request's tags carry this cluster's
    ``owned`` tag and a ``karpenter.sh/nodepool`` tag (a request also the EKS cluster name)."""
    if request:
        return {"StringEquals": {f"aws:RequestTag/{tag}": "owned", "aws:RequestTag/eks:eks-cluster-name": cluster_name},
                "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"}}
    return {"StringEquals": {f"aws:ResourceTag/{tag}": "owned"},
            "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"}}


def _node_lifecycle_statements(*, partition: str, region: str, cluster_name: str) -> list[dict[str, Any]]:
    """Upstream's NodeLifecyclePolicy: launch, tag and delete only what carries the cluster's tags."""
    arn = f"arn:{partition}:ec2:{region}:*"
    cluster_tag = f"kubernetes.io/cluster/{cluster_name}"
    owned_request = _owned(cluster_tag, cluster_name, request=True)
    owned_resource = _owned(cluster_tag, cluster_name, request=False)
    tagged = [f"{arn}:fleet/*", f"{arn}:instance/*", f"{arn}:volume/*", f"{arn}:network-interface/*",
              f"{arn}:launch-template/*", f"{arn}:spot-instances-request/*"]
    return [
        {"Sid": "AllowScopedEC2InstanceAccessActions", "Effect": "Allow",
         "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
         "Resource": [f"arn:{partition}:ec2:{region}::image/*", f"arn:{partition}:ec2:{region}::snapshot/*",
                      f"{arn}:security-group/*", f"{arn}:subnet/*", f"{arn}:capacity-reservation/*",
                      f"{arn}:placement-group/*"]},
        {"Sid": "AllowScopedEC2LaunchTemplateAccessActions", "Effect": "Allow",
         "Action": ["ec2:RunInstances", "ec2:CreateFleet"], "Resource": f"{arn}:launch-template/*",
         "Condition": owned_resource},
        {"Sid": "AllowScopedEC2InstanceActionsWithTags", "Effect": "Allow",
         "Action": ["ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate"],
         "Resource": tagged, "Condition": owned_request},
        {"Sid": "AllowScopedResourceCreationTagging", "Effect": "Allow", "Action": "ec2:CreateTags",
         "Resource": tagged,
         "Condition": {**owned_request, "StringEquals": {
             **owned_request["StringEquals"], "ec2:CreateAction": ["RunInstances", "CreateFleet", "CreateLaunchTemplate"]}}},
        {"Sid": "AllowScopedResourceTagging", "Effect": "Allow", "Action": "ec2:CreateTags",
         "Resource": f"{arn}:instance/*",
         "Condition": {
             "StringEquals": {f"aws:ResourceTag/{cluster_tag}": "owned"},
             "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
             "StringEqualsIfExists": {"aws:RequestTag/eks:eks-cluster-name": cluster_name},
             "ForAllValues:StringEquals": {"aws:TagKeys": ["eks:eks-cluster-name", "karpenter.sh/nodeclaim", "Name"]},
         }},
        {"Sid": "AllowScopedDeletion", "Effect": "Allow",
         "Action": ["ec2:TerminateInstances", "ec2:DeleteLaunchTemplate"],
         "Resource": [f"{arn}:instance/*", f"{arn}:launch-template/*"], "Condition": owned_resource},
    ]


def _iam_integration_statements(*, partition: str, region: str, account_id: str, cluster_name: str,
                                node_role_arn: str) -> list[dict[str, Any]]:
    """Upstream's IAMIntegrationPolicy: pass the node role; manage only this cluster's instance profiles."""
    cluster_tag = f"kubernetes.io/cluster/{cluster_name}"
    profile_arn = f"arn:{partition}:iam::{account_id}:instance-profile/*"
    profile_resource = {
        "StringEquals": {f"aws:ResourceTag/{cluster_tag}": "owned", "aws:ResourceTag/topology.kubernetes.io/region": region},
        "StringLike": {"aws:ResourceTag/karpenter.k8s.aws/ec2nodeclass": "*"},
    }
    profile_request = {
        "StringEquals": {f"aws:RequestTag/{cluster_tag}": "owned", "aws:RequestTag/eks:eks-cluster-name": cluster_name,
                         "aws:RequestTag/topology.kubernetes.io/region": region},
        "StringLike": {"aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*"},
    }
    return [
        {"Sid": "AllowPassingInstanceRole", "Effect": "Allow", "Action": "iam:PassRole", "Resource": node_role_arn,
         "Condition": {"StringEquals": {"iam:PassedToService": ["ec2.amazonaws.com", "ec2.amazonaws.com.cn"]}}},
        {"Sid": "AllowScopedInstanceProfileCreationActions", "Effect": "Allow", "Action": ["iam:CreateInstanceProfile"],
         "Resource": profile_arn, "Condition": profile_request},
        {"Sid": "AllowScopedInstanceProfileTagActions", "Effect": "Allow", "Action": ["iam:TagInstanceProfile"],
         "Resource": profile_arn,
         "Condition": {"StringEquals": {**profile_resource["StringEquals"], **profile_request["StringEquals"]},
                       "StringLike": {**profile_resource["StringLike"], **profile_request["StringLike"]}}},
        {"Sid": "AllowScopedInstanceProfileActions", "Effect": "Allow",
         "Action": ["iam:AddRoleToInstanceProfile", "iam:RemoveRoleFromInstanceProfile", "iam:DeleteInstanceProfile"],
         "Resource": profile_arn, "Condition": profile_resource},
    ]


def _resource_discovery_statements(*, partition: str, region: str, account_id: str) -> list[dict[str, Any]]:
    """Upstream's ResourceDiscoveryPolicy: read-only, region-scoped where upstream scopes it."""
    return [
        {"Sid": "AllowRegionalReadActions", "Effect": "Allow",
         "Action": ["ec2:DescribeCapacityReservations", "ec2:DescribeImages", "ec2:DescribeInstances",
                    "ec2:DescribeInstanceStatus", "ec2:DescribeInstanceTypeOfferings", "ec2:DescribeInstanceTypes",
                    "ec2:DescribeLaunchTemplates", "ec2:DescribePlacementGroups", "ec2:DescribeSecurityGroups",
                    "ec2:DescribeSpotPriceHistory", "ec2:DescribeSubnets"],
         "Resource": "*", "Condition": {"StringEquals": {"aws:RequestedRegion": region}}},
        {"Sid": "AllowSSMReadActions", "Effect": "Allow", "Action": "ssm:GetParameter",
         "Resource": f"arn:{partition}:ssm:{region}::parameter/aws/service/*"},
        {"Sid": "AllowPricingReadActions", "Effect": "Allow", "Action": "pricing:GetProducts", "Resource": "*"},
        # EC2NodeClass finalizers list instance profiles; without it deletion hangs.
        {"Sid": "AllowUnscopedInstanceProfileListAction", "Effect": "Allow", "Action": "iam:ListInstanceProfiles",
         "Resource": "*"},
        {"Sid": "AllowInstanceProfileReadActions", "Effect": "Allow", "Action": "iam:GetInstanceProfile",
         "Resource": f"arn:{partition}:iam::{account_id}:instance-profile/*"},
    ]


def queue_policy(queue_arn: str, rule_arns: Sequence[str] = ()) -> dict[str, Any]:
    """Only this stack's EventBridge rules may send to the queue, over TLS.

    ``aws:SourceArn`` names each rule, as the EventBridge User Guide documents for SQS
    targets ("Using resource-based policies for Amazon EventBridge", Amazon SQS permissions).
    Upstream's reference CloudFormation also admits ``sqs.amazonaws.com`` with no
    condition; nothing of ours sends as that principal, so it is left out.
    """
    send: dict[str, Any] = {"Sid": "EventBridgeWrite", "Effect": "Allow",
                            "Principal": {"Service": "events.amazonaws.com"},
                            "Action": "sqs:SendMessage", "Resource": queue_arn}
    if rule_arns:
        send["Condition"] = {"ArnEquals": {"aws:SourceArn": sorted(rule_arns)}}
    return {
        "Version": "2012-10-17",
        "Statement": [
            send,
            {"Sid": "DenyHTTP", "Effect": "Deny", "Principal": "*", "Action": "sqs:*", "Resource": queue_arn,
             "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
        ],
    }


@dataclass(frozen=True)
class KarpenterPrerequisitesArgs:
    """AWS resources Karpenter needs before its chart is installed.

    cluster: the platform cluster (name, ARN, partition).
    tags: on every taggable child.
    """

    cluster: Cluster
    tags: Mapping[str, str] = field(default_factory=dict)


class KarpenterPrerequisites(pulumi.ComponentResource):
    controller_role: aws.iam.Role
    node_role: aws.iam.Role
    queue: aws.sqs.Queue

    def __init__(self, name: str, args: KarpenterPrerequisitesArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:karpenter:KarpenterPrerequisites", name, None, opts)
        tags = dict(args.tags)
        child = pulumi.ResourceOptions(parent=self)
        invoke = pulumi.InvokeOutputOptions(parent=self)
        cluster = args.cluster
        cluster_name = cluster.cluster_name
        partition = aws.get_partition_output(opts=invoke).partition
        region = aws.get_region_output(opts=invoke).region
        account_id = aws.get_caller_identity_output(opts=invoke).account_id

        # Long-lived name the Helm values point at; SQS names are unique per account+region.
        self.queue = aws.sqs.Queue(
            f"{name}-interruption",
            name=pulumi.Output.concat(cluster_name, "-karpenter"),
            message_retention_seconds=QUEUE_RETENTION_SECONDS,
            sqs_managed_sse_enabled=True,
            tags=tags, opts=child,
        )
        self.rules: dict[str, aws.cloudwatch.EventRule] = {}
        for key, pattern in INTERRUPTION_EVENT_PATTERNS.items():
            rule = aws.cloudwatch.EventRule(
                f"{name}-{key}", name=fitted_name(f"{name}-{key}", EVENT_RULE_NAME_MAX),
                description=f"Karpenter interruption handling: {pattern['detail-type'][0]}",
                event_pattern=json.dumps(pattern), tags=tags, opts=child,
            )
            aws.cloudwatch.EventTarget(
                f"{name}-{key}-target", rule=rule.name, arn=self.queue.arn, target_id="karpenter-interruption-queue",
                opts=pulumi.ResourceOptions(parent=rule),
            )
            self.rules[key] = rule
        # Registered after the rules so that it can name each one as the only allowed sender.
        aws.sqs.QueuePolicy(
            f"{name}-interruption-policy", queue_url=self.queue.id,
            policy=pulumi.Output.all(self.queue.arn, *[r.arn for r in self.rules.values()]).apply(
                lambda arns: json.dumps(queue_policy(arns[0], arns[1:]))),
            opts=child,
        )

        self.node_role = aws.iam.Role(
            f"{name}-node-role", name=fitted_name(f"{name}-node-role", IAM_ROLE_NAME_MAX),
            assume_role_policy=json.dumps({"Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}),
            description="Nodes launched by Karpenter", tags=tags, opts=child,
        )
        for policy in NODE_MANAGED_POLICIES:
            aws.iam.RolePolicyAttachment(
                f"{name}-node-{policy}", role=self.node_role.name,
                policy_arn=pulumi.Output.concat("arn:", partition, ":iam::aws:policy/", policy),
                opts=pulumi.ResourceOptions(parent=self.node_role),
            )
        self.node_access_entry = aws.eks.AccessEntry(
            f"{name}-node-access", cluster_name=cluster_name, principal_arn=self.node_role.arn, type="EC2_LINUX",
            tags=tags, opts=child,
        )

        policy = pulumi.Output.all(
            partition, region, account_id, cluster_name, self.queue.arn, self.node_role.arn,
            cluster.eks_cluster.eks_cluster.arn,
        ).apply(lambda v: json.dumps(controller_policy(
            partition=v[0], region=v[1], account_id=v[2], cluster_name=v[3], queue_arn=v[4],
            node_role_arn=v[5], cluster_arn=v[6]), separators=(",", ":")))
        # Inline: the policy is ~5 KB, over the 6,144-character limit of a managed policy.
        controller = cluster.pod_identity(f"{name}-controller", namespace=NAMESPACE, service_account=SERVICE_ACCOUNT,
                                          parent=self, tags=tags, policies={"policy": policy})
        self.controller_role = controller.role
        self.controller_policy = controller.policies["policy"]
        self.pod_identity = controller.association
        self.queue_name = self.queue.name
        self.register_outputs({
            "queue_name": self.queue.name,
            "node_role_name": self.node_role.name,
            "controller_role_arn": self.controller_role.arn,
        })


@dataclass(frozen=True)
class KarpenterArgs:
    """The Karpenter Helm release.

    cluster: the platform cluster (its static CPU nodes run the controller).
    prerequisites: queue, roles and Pod Identity association created beforehand.
    replicas: controller replicas; > 1 also enables the chart's PodDisruptionBudget.
    log_level: debug | info | error.
    node_overlay: turn on the alpha NodeOverlay feature gate (shared GPU pools declare slices).
    charts: where the chart comes from (upstream by default, or the stack's verified chart mirror).
    """

    cluster: Cluster
    prerequisites: KarpenterPrerequisites
    replicas: int = 1
    log_level: str = "info"
    # Alpha NodeOverlay API (karpenter.sh/v1alpha1): slice capacity of shared GPU pools.
    node_overlay: bool = False
    charts: ChartSource = ChartSource()


def helm_values(*, cluster_name: Any, queue_name: Any, replicas: int, log_level: str, node_overlay: bool = False) -> dict[str, Any]:
    placement = system_pod_placement()
    return {
        "replicas": replicas,
        # Two replicas + PDB keep one controller up through node drains; dev keeps the chart default.
        "podDisruptionBudget": {"name": "karpenter", "maxUnavailable": 1} if replicas > 1 else None,
        "nodeSelector": placement["nodeSelector"],
        "tolerations": placement["tolerations"],
        "logLevel": log_level,
        "serviceAccount": {"create": True, "name": SERVICE_ACCOUNT},
        # Both feature gates are alpha and off by default in chart 1.14.1 (values.yaml
        # settings.featureGates, rendered into FEATURE_GATES by templates/deployment.yaml).
        # NodeRepair: Karpenter replaces a node whose AcceleratedHardwareReady condition has been
        # False for 10 minutes, the condition the GPU readiness agent sets (workloads/node_health.py).
        # NodeOverlay: shared GPU pools declare their slices.
        "settings": {"clusterName": cluster_name, "interruptionQueue": queue_name,
                     "featureGates": {**node_repair_settings()["featureGates"],
                                      **({"nodeOverlay": True} if node_overlay else {})}},
        "controller": {"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}},
    }


def namespace_spec(vpc_cidr: str, service_cidr: str) -> SystemNamespaceSpec:
    # Karpenter 1.14 serves no webhooks; it calls the API server and AWS (through Pod Identity).
    return SystemNamespaceSpec(
        name=NAMESPACE, pod_security=PodSecurityLevel.RESTRICTED, vpc_cidr=vpc_cidr, service_cidr=service_cidr,
        metrics_ports=(METRICS_PORT,), probe_ports=(HEALTH_PROBE_PORT,), uses_aws=True,
    )


class Karpenter(pulumi.ComponentResource):
    """The ``karpenter`` namespace (PSA restricted, default-deny network policies), the
    ``karpenter-crd`` release and the controller release (``skip_crds``), both pinned to the
    same version. The controller waits for what it needs to start: the CRDs, its namespace,
    Pod Identity association and node access entry, the static node group it runs on and
    CoreDNS (it resolves AWS endpoints at start and exits without DNS)."""

    release: k8s.helm.v3.Release
    crds: k8s.helm.v3.Release

    def __init__(self, name: str, args: KarpenterArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:karpenter:Karpenter", name, None, opts)
        cluster = args.cluster
        child = pulumi.ResourceOptions(parent=self)
        objects = namespace_objects(namespace_spec(cluster.vpc_cidr, cluster.service_cidr))
        self.namespace, self.network_policies = apply_namespace_objects(name, objects, self)
        self.flow_schemas = [apply_object(f"{name}-flowschema-{obj['metadata']['name']}", obj, child)
                             for obj in karpenter_flow_schemas(NAMESPACE, SERVICE_ACCOUNT)]

        self.crds = helm_addon(
            f"{name}-crds", parent=self, cluster=cluster, release="karpenter-crd", chart=KARPENTER_CRD,
            source=args.charts, namespace=NAMESPACE, timeout_seconds=300, runs_pods=False,
            depends_on=[self.namespace],
        )
        values = helm_values(cluster_name=cluster.cluster_name, queue_name=args.prerequisites.queue.name,
                             replicas=args.replicas, log_level=args.log_level, node_overlay=args.node_overlay)
        values = {k: v for k, v in values.items() if v is not None}
        self.release = helm_addon(
            f"{name}-chart", parent=self, cluster=cluster, release="karpenter", chart=KARPENTER,
            source=args.charts, namespace=NAMESPACE, values=values,
            # CRDs come from the karpenter-crd release above, which Helm upgrades.
            skip_crds=True,
            depends_on=[self.crds, self.namespace, *self.network_policies, *self.flow_schemas,
                        args.prerequisites.pod_identity, args.prerequisites.node_access_entry],
        )
        self.register_outputs({"release_status": self.release.status})
