"""EKS control plane, static CPU node group, managed add-ons and a Kubernetes provider."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Mapping, Optional, Sequence

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks
import pulumi_kubernetes as k8s

from components.k8s import apply_object
from components.kms import create_key
from components.network import Network
from components.versions import EKS_ADDON_VERSIONS, EKS_VERSIONS, SYSTEM_NODE_AMI_TYPE
from workloads.placement import SYSTEM_NODE_LABEL_KEY, SYSTEM_NODE_LABEL_VALUE, SYSTEM_NODE_TAINT
from workloads.storage import gp3_storage_class
from components.validation import accepts_enum_values

CONTROL_PLANE_LOG_TYPES = ("api", "audit", "authenticator", "controllerManager", "scheduler")
CLUSTER_ADMIN_POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
NODE_MANAGED_POLICIES = (
    "AmazonEKSWorkerNodePolicy",
    # The VPC CNI runs on the node role: it must assign pod IPs before Pod Identity works.
    "AmazonEKS_CNI_Policy",
    "AmazonEC2ContainerRegistryPullOnly",
    "AmazonSSMManagedInstanceCore",  # shell access without SSH keys or open ports
)


# Without the CNI's policy agent, NetworkPolicy objects (team namespaces' default deny) are
# accepted by the API server but never enforced.
ADDON_CONFIGURATION = {"vpc-cni": {"enableNetworkPolicy": "true"}}


class UpgradePolicy(str, Enum):
    STANDARD = "STANDARD"
    EXTENDED = "EXTENDED"


@dataclass(frozen=True)
class NodeGroupArgs:
    """Static CPU managed node group for the platform's controllers (AL2023, IMDSv2)."""

    instance_types: Sequence[str]
    min_size: int
    max_size: int
    desired_size: int
    disk_size_gib: int = 50
    capacity_type: str = "ON_DEMAND"

    def __post_init__(self) -> None:
        if not 0 <= self.min_size <= self.desired_size <= self.max_size:
            raise ValueError(
                f"NodeGroupArgs: need 0 <= min_size ({self.min_size}) <= desired_size ({self.desired_size}) "
                f"<= max_size ({self.max_size})"
            )


@accepts_enum_values
@dataclass(frozen=True)
class ClusterArgs:
    """Inputs of ``Cluster``.

    Attributes:
        cluster_name: EKS cluster name (also the Karpenter discovery tag value).
        version: Kubernetes version, a key of ``components.versions.EKS_VERSIONS``.
        upgrade_policy: set explicitly; pulumi-eks would default to EXTENDED ($0.60/h).
        network: the VPC; control plane ENIs and nodes go to its private subnets.
        system_node_group: the static CPU node group.
        public_access_cidrs: empty keeps the API endpoint private.
        admin_role_arns: roles given AmazonEKSClusterAdminPolicy access entries.
        kubeconfig_role_arn: role the kubeconfig assumes (the role Pulumi deploys with).
        log_retention_days: control-plane log retention.
        deletion_protection: EKS deletion protection.
        protect: Pulumi ``protect`` on the cluster and its secrets key.
        tags: tags on every taggable child.
    """

    cluster_name: str
    version: str
    upgrade_policy: UpgradePolicy
    network: Network
    system_node_group: NodeGroupArgs
    public_access_cidrs: Sequence[str] = ()
    admin_role_arns: Sequence[str] = ()
    kubeconfig_role_arn: Optional[str] = None
    log_retention_days: int = 30
    deletion_protection: bool = False
    protect: bool = False
    addon_versions: Mapping[str, str] = field(default_factory=lambda: dict(EKS_ADDON_VERSIONS))
    tags: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.version not in EKS_VERSIONS:
            raise ValueError(f"ClusterArgs.version: {self.version!r} is unknown; use one of {sorted(EKS_VERSIONS)}")
        if any(c.endswith("/0") for c in self.public_access_cidrs):
            raise ValueError("ClusterArgs.public_access_cidrs: 0.0.0.0/0 opens the API to the internet; list your CIDRs")


class Cluster(pulumi.ComponentResource):
    """EKS with a private endpoint, KMS-encrypted secrets, full control-plane logging,
    API authentication with access entries, no default node group, a tainted static CPU
    node group for controllers, pinned managed add-ons and a default gp3 StorageClass.

    ``k8s_provider`` deploys into the cluster; later components take this object.
    """

    eks_cluster: eks.Cluster
    k8s_provider: k8s.Provider
    node_role: aws.iam.Role
    node_security_group: aws.ec2.SecurityGroup

    def __init__(self, name: str, args: ClusterArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:cluster:Cluster", name, None, opts)
        self.args = args
        child = pulumi.ResourceOptions(parent=self)
        tags = dict(args.tags)
        partition = aws.get_partition_output(opts=pulumi.InvokeOutputOptions(parent=self)).partition
        self.partition = partition

        self.secrets_key = create_key(
            f"{name}-secrets", description=f"Envelope encryption of {args.cluster_name} Kubernetes secrets",
            parent=self, tags=tags, protect=args.protect,
        )
        # EKS creates this group on first log write with no retention; own it instead.
        self.control_plane_logs = aws.cloudwatch.LogGroup(
            f"{name}-control-plane-logs", name=f"/aws/eks/{args.cluster_name}/cluster",
            retention_in_days=args.log_retention_days, tags=tags, opts=child,
        )
        self.node_security_group = aws.ec2.SecurityGroup(
            f"{name}-node-sg", vpc_id=args.network.vpc_id,
            description=f"Nodes of {args.cluster_name}: node-to-node traffic (pods, NCCL, EFA)",
            ingress=[{"protocol": "-1", "from_port": 0, "to_port": 0, "self": True,
                      "description": "All traffic between nodes (EFA needs every protocol)"}],
            egress=[{"protocol": "-1", "from_port": 0, "to_port": 0, "cidr_blocks": ["0.0.0.0/0"],
                     "description": "Image pulls, AWS APIs, S3 through endpoints or NAT"}],
            tags={**tags, "Name": f"{name}-node-sg", "karpenter.sh/discovery": args.cluster_name}, opts=child,
        )

        access_entries = {
            f"admin-{index}": {
                "principal_arn": arn,
                "access_policies": {"cluster-admin": {"policy_arn": CLUSTER_ADMIN_POLICY, "access_scope": {"type": "cluster"}}},
            }
            for index, arn in enumerate(args.admin_role_arns)
        }
        self.eks_cluster = eks.Cluster(
            f"{name}-eks",
            name=args.cluster_name,
            version=args.version,
            upgrade_policy={"support_type": args.upgrade_policy.value},
            vpc_id=args.network.vpc_id,
            private_subnet_ids=args.network.private_subnet_ids,
            endpoint_private_access=True,
            endpoint_public_access=bool(args.public_access_cidrs),
            public_access_cidrs=list(args.public_access_cidrs) or None,
            encryption_config_key_arn=self.secrets_key.arn,
            enabled_cluster_log_types=list(CONTROL_PLANE_LOG_TYPES),
            authentication_mode=eks.AuthenticationMode.API,
            access_entries=access_entries or None,
            skip_default_node_group=True,
            skip_default_security_groups=True,
            # Every add-on below is an EKS managed add-on with a pinned version.
            bootstrap_self_managed_addons=False,
            use_default_vpc_cni=True,
            coredns_addon_options={"enabled": False},
            kube_proxy_addon_options={"enabled": False},
            create_oidc_provider=False,
            deletion_protection=args.deletion_protection,
            provider_credential_opts={"role_arn": args.kubeconfig_role_arn} if args.kubeconfig_role_arn else None,
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self, protect=args.protect,
                                        depends_on=[self.control_plane_logs]),
        )
        cluster_name = self.eks_cluster.eks_cluster.name
        self.cluster_security_group_id = self.eks_cluster.cluster_security_group_id

        addon_opts = pulumi.ResourceOptions(parent=self)
        self.addons: dict[str, aws.eks.Addon] = {}
        for addon in ("vpc-cni", "kube-proxy", "eks-pod-identity-agent"):
            self.addons[addon] = self._addon(name, addon, cluster_name, tags, addon_opts,
                                             configuration=ADDON_CONFIGURATION.get(addon))

        self.node_role = aws.iam.Role(
            f"{name}-system-node-role",
            assume_role_policy=json.dumps({"Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}),
            tags=tags, opts=child,
        )
        for policy in NODE_MANAGED_POLICIES:
            aws.iam.RolePolicyAttachment(
                f"{name}-system-node-{policy}", role=self.node_role.name,
                policy_arn=pulumi.Output.concat("arn:", partition, ":iam::aws:policy/", policy),
                opts=pulumi.ResourceOptions(parent=self.node_role),
            )
        self.node_group = self._system_node_group(name, cluster_name, tags)

        for addon in ("coredns", "aws-ebs-csi-driver"):
            depends = pulumi.ResourceOptions(parent=self, depends_on=[self.node_group])
            identity = self._ebs_csi_identity(name, tags) if addon == "aws-ebs-csi-driver" else None
            self.addons[addon] = self._addon(name, addon, cluster_name, tags, depends, identity)

        self.k8s_provider = k8s.Provider(
            f"{name}-k8s", kubeconfig=self.eks_cluster.kubeconfig_json, enable_server_side_apply=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
        apply_object(
            f"{name}-gp3", gp3_storage_class(reclaim_policy="Retain" if args.protect else "Delete"),
            pulumi.ResourceOptions(parent=self, provider=self.k8s_provider,
                                   depends_on=[self.addons["aws-ebs-csi-driver"]]),
        )

        self.cluster_name = cluster_name
        self.endpoint = self.eks_cluster.eks_cluster.endpoint
        self.kubeconfig = pulumi.Output.secret(self.eks_cluster.kubeconfig_json)
        self.oidc_issuer = self.eks_cluster.oidc_issuer
        self.register_outputs({
            "cluster_name": self.cluster_name,
            "endpoint": self.endpoint,
            "node_security_group_id": self.node_security_group.id,
        })

    def _addon(self, name, addon, cluster_name, tags, opts, pod_identity=None, configuration=None) -> aws.eks.Addon:
        return aws.eks.Addon(
            f"{name}-{addon}", cluster_name=cluster_name, addon_name=addon,
            addon_version=self.args.addon_versions[addon],
            configuration_values=json.dumps(configuration) if configuration else None,
            resolve_conflicts_on_create="OVERWRITE", resolve_conflicts_on_update="PRESERVE",
            pod_identity_associations=pod_identity, tags=tags, opts=opts,
        )

    def _ebs_csi_identity(self, name, tags) -> list[dict]:
        role = pod_identity_role(
            f"{name}-ebs-csi", cluster_arn=self.eks_cluster.eks_cluster.arn, namespace="kube-system",
            service_account="ebs-csi-controller-sa", parent=self, tags=tags,
            managed_policy_arns=[pulumi.Output.concat(
                "arn:", self.partition, ":iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy")],
        )
        return [{"role_arn": role.arn, "service_account": "ebs-csi-controller-sa"}]

    def _system_node_group(self, name, cluster_name, tags) -> aws.eks.NodeGroup:
        group = self.args.system_node_group
        launch_template = aws.ec2.LaunchTemplate(
            f"{name}-system-lt",
            description="Static CPU nodes: IMDSv2 only, hop limit 1 (pods cannot reach node credentials)",
            metadata_options={"http_endpoint": "enabled", "http_tokens": "required",
                              "http_put_response_hop_limit": 1, "instance_metadata_tags": "disabled"},
            block_device_mappings=[{"device_name": "/dev/xvda", "ebs": {
                "volume_size": group.disk_size_gib, "volume_type": "gp3", "encrypted": "true",
                "delete_on_termination": "true"}}],
            vpc_security_group_ids=[self.cluster_security_group_id, self.node_security_group.id],
            tag_specifications=[{"resource_type": kind, "tags": {**tags, "Name": f"{name}-system"}}
                                for kind in ("instance", "volume", "network-interface")],
            update_default_version=True, tags=tags, opts=pulumi.ResourceOptions(parent=self),
        )
        return aws.eks.NodeGroup(
            f"{name}-system-nodes", cluster_name=cluster_name, version=self.args.version,
            node_role_arn=self.node_role.arn, subnet_ids=self.args.network.private_subnet_ids,
            ami_type=SYSTEM_NODE_AMI_TYPE, capacity_type=group.capacity_type,
            instance_types=list(group.instance_types),
            scaling_config={"min_size": group.min_size, "max_size": group.max_size, "desired_size": group.desired_size},
            update_config={"max_unavailable": 1},
            launch_template={"id": launch_template.id, "version": launch_template.latest_version.apply(str)},
            labels={SYSTEM_NODE_LABEL_KEY: SYSTEM_NODE_LABEL_VALUE},
            taints=[{"key": SYSTEM_NODE_TAINT["key"], "value": SYSTEM_NODE_TAINT["value"], "effect": "NO_SCHEDULE"}],
            tags=tags,
            # The CNI must exist before nodes join, or they never become Ready.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.addons["vpc-cni"], self.addons["kube-proxy"]],
                                        ignore_changes=["scaling_config.desired_size"]),
        )


def pod_identity_trust_policy(*, cluster_arn: str, namespace: str, service_account: str) -> dict:
    """Trust policy for a role that only one service account of one cluster may assume.

    EKS Pod Identity assumes the role with session tags naming the cluster, namespace and
    service account; conditioning the trust on them keeps every other Pod Identity association
    in the account from using the role. Source: EKS User Guide, "Create IAM role with trust
    policy required by EKS Pod Identity" (pod-id-role) and "List of session tags added by EKS
    Pod Identity" (pod-id-abac).
    """
    return {"Version": "2012-10-17", "Statement": [{
        "Sid": "AllowEksAuthToAssumeRoleForPodIdentity",
        "Effect": "Allow", "Principal": {"Service": "pods.eks.amazonaws.com"},
        "Action": ["sts:AssumeRole", "sts:TagSession"],
        "Condition": {"StringEquals": {
            "aws:RequestTag/eks-cluster-arn": cluster_arn,
            "aws:RequestTag/kubernetes-namespace": namespace,
            "aws:RequestTag/kubernetes-service-account": service_account,
        }},
    }]}


def pod_identity_role(
    name: str,
    *,
    cluster_arn: pulumi.Input[str],
    namespace: str,
    service_account: str,
    parent: pulumi.Resource,
    tags: Mapping[str, str],
    managed_policy_arns: Sequence[pulumi.Input[str]] = (),
) -> aws.iam.Role:
    """An IAM role that only EKS Pod Identity, for one service account of one cluster, can assume."""
    trust = pulumi.Output.from_input(cluster_arn).apply(lambda arn: json.dumps(
        pod_identity_trust_policy(cluster_arn=arn, namespace=namespace, service_account=service_account)))
    role = aws.iam.Role(
        f"{name}-role", assume_role_policy=trust, tags=dict(tags), opts=pulumi.ResourceOptions(parent=parent),
    )
    for index, arn in enumerate(managed_policy_arns):
        aws.iam.RolePolicyAttachment(f"{name}-policy-{index}", role=role.name, policy_arn=arn,
                                     opts=pulumi.ResourceOptions(parent=role))
    return role
