"""EKS control plane, static CPU node group, managed add-ons and a Kubernetes provider."""
from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Mapping, Optional, Sequence

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks
import pulumi_kubernetes as k8s

from components.addons import CLUSTER_ADDONS, AddonSpec, AddonTiming
from components.k8s import apply_object
from components.kms import create_key
from components.names import IAM_ROLE_NAME_MAX, fitted_name
from components.network import Network
from catalog.versions import EKS_ADDON_VERSIONS, EKS_VERSIONS, SYSTEM_NODE_AMI_TYPE
from workloads.placement import SYSTEM_NODE_LABEL_KEY, SYSTEM_NODE_LABEL_VALUE, SYSTEM_NODE_TAINT
from workloads.storage import gp3_storage_class
from workloads.system_namespaces import unrestricted_policy
from workloads.tenancy import team_group
from workloads.problems import accepts_enum_values

CONTROL_PLANE_LOG_TYPES = ("api", "audit", "authenticator", "controllerManager", "scheduler")
# EKS access policies (arn:<partition>:eks::aws:cluster-access-policy/<name>).
CLUSTER_ADMIN_POLICY = "AmazonEKSClusterAdminPolicy"
NODE_MANAGED_POLICIES = (
    "AmazonEKSWorkerNodePolicy",
    # The VPC CNI runs on the node role: it must assign pod IPs before Pod Identity works.
    "AmazonEKS_CNI_Policy",
    "AmazonEC2ContainerRegistryPullOnly",
    "AmazonSSMManagedInstanceCore",  # shell access without SSH keys or open ports
)


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
    # The EKS AMI release the group runs ("<Kubernetes patch>-<YYYYMMDD>", e.g. 1.27.1-20230703 in
    # awslabs/amazon-eks-ami CHANGELOG "Release versions"); None: the one EKS picks at creation,
    # frozen until the next minor upgrade or a manual `update-nodegroup-version`.
    release_version: Optional[str] = None

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
        version: Kubernetes version, a key of ``catalog.versions.EKS_VERSIONS``.
        upgrade_policy: set explicitly; pulumi-eks would default to EXTENDED ($0.60/h).
        network: the VPC; control plane ENIs and nodes go to its private subnets.
        system_node_group: the static CPU node group.
        public_access_cidrs: empty keeps the API endpoint private.
        admin_role_arns: roles given AmazonEKSClusterAdminPolicy access entries.
        kubeconfig_role_arn: the role Pulumi deploys with (the kubeconfig assumes it). The
            cluster creator gets no hidden bootstrap admin; this role gets a visible access
            entry instead. Required.
        namespace_editors: role ARN -> team namespaces; its access entry carries each one's
            Kubernetes group (``workloads.tenancy.team_group``), bound to the platform's team Role.
        log_retention_days: control-plane log retention.
        log_kms_key: key of the control-plane log group (its policy must admit CloudWatch
            Logs for ``control_plane_log_group_name(cluster_name)``).
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
    namespace_editors: Mapping[str, Sequence[str]] = field(default_factory=dict)
    # Set explicitly (EKS would pick 10.100.0.0/16 or 172.20.0.0/16 by itself) so network
    # policies can name the API server's Service address, which pods dial before kube-proxy
    # translates it to the control plane's ENIs.
    service_ipv4_cidr: str = "172.20.0.0/16"
    log_retention_days: int = 30
    log_kms_key: Optional[aws.kms.Key] = None
    deletion_protection: bool = False
    protect: bool = False
    addon_versions: Mapping[str, str] = field(default_factory=lambda: dict(EKS_ADDON_VERSIONS))
    tags: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.version not in EKS_VERSIONS:
            raise ValueError(f"ClusterArgs.version: {self.version!r} is unknown; use one of {sorted(EKS_VERSIONS)}")
        if any(c.endswith("/0") for c in self.public_access_cidrs):
            raise ValueError("ClusterArgs.public_access_cidrs: 0.0.0.0/0 opens the API to the internet; list your CIDRs")
        service = ipaddress.ip_network(self.service_ipv4_cidr)
        vpc = ipaddress.ip_network(self.network.args.cidr)
        if service.overlaps(vpc):
            raise ValueError(f"ClusterArgs.service_ipv4_cidr: {service} overlaps the VPC {vpc}; "
                             "use 172.20.0.0/16 or 10.100.0.0/16, whichever the VPC does not use")
        if not self.kubeconfig_role_arn:
            raise ValueError("ClusterArgs.kubeconfig_role_arn: required; the cluster creator gets no bootstrap admin, "
                             "so name the role Pulumi deploys with (it gets a visible cluster-admin access entry)")
        principals = [self.kubeconfig_role_arn, *self.admin_role_arns, *self.namespace_editors]
        duplicates = sorted({arn for arn in principals if principals.count(arn) > 1})
        if duplicates:
            raise ValueError(f"ClusterArgs: {duplicates} appear more than once among the deploy role, admin_role_arns "
                             "and namespace_editors; EKS allows one access entry per principal")
        empty = sorted(arn for arn, namespaces in self.namespace_editors.items() if not namespaces)
        if empty:
            raise ValueError(f"ClusterArgs.namespace_editors: {empty} have no namespaces; list at least one")


@dataclass(frozen=True)
class PodIdentity:
    """What ``Cluster.pod_identity`` made: the role, its inline policies by suffix, the association."""

    role: aws.iam.Role
    policies: Mapping[str, aws.iam.RolePolicy]
    association: aws.eks.PodIdentityAssociation


class Cluster(pulumi.ComponentResource):
    """EKS with a private endpoint, KMS-encrypted secrets, full control-plane logging,
    API authentication with access entries, no default node group, a tainted static CPU
    node group for controllers, pinned managed add-ons and a default gp3 StorageClass.

    ``k8s_provider`` deploys into the cluster; later components take this object. The
    constructor reads as its steps (pulumi-eks' createCluster: core, security groups, node
    group, outputs): secrets key, control-plane log group, node security group, control plane,
    access entries, add-ons before the nodes, system nodes, add-ons after them, provider.
    """

    eks_cluster: eks.Cluster
    k8s_provider: k8s.Provider
    node_role: aws.iam.Role
    node_security_group: aws.ec2.SecurityGroup
    node_group: aws.eks.NodeGroup
    addons: dict[str, aws.eks.Addon]
    vpc_cidr: str
    service_cidr: str

    def __init__(self, name: str, args: ClusterArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:cluster:Cluster", name, None, opts)
        self.args = args
        # What in-cluster network policies name: the VPC (nodes, endpoints) and the Service range.
        self.vpc_cidr: str = args.network.args.cidr
        self.service_cidr: str = args.service_ipv4_cidr
        tags = dict(args.tags)
        self.partition = aws.get_partition_output(opts=pulumi.InvokeOutputOptions(parent=self)).partition

        self.secrets_key = create_key(
            f"{name}-secrets", description=f"Envelope encryption of {args.cluster_name} Kubernetes secrets",
            parent=self, tags=tags, protect=args.protect,
        )
        self.control_plane_logs = self._control_plane_logs(name, tags)
        self.node_security_group, self.node_rules = self._node_security_group(name, tags)
        self.eks_cluster = self._control_plane(name, tags)
        cluster_name = self.eks_cluster.eks_cluster.name
        self.access_entries = self._access_entries(name, cluster_name, tags)
        self.cluster_security_group_id = self.eks_cluster.cluster_security_group_id

        # Add-ons in two phases around the system nodes (components/addons.py says which).
        self.addons: dict[str, aws.eks.Addon] = {}
        for spec in CLUSTER_ADDONS:
            if spec.timing is not AddonTiming.AFTER_NODES:
                self.addons[spec.name] = self.addon(spec, name=name, parent=self)
        self.node_role = self._system_node_role(name, tags)
        self.node_group = self._system_node_group(name, cluster_name, tags)
        self.k8s_provider = self._kubernetes_provider(name)
        # Before any pod of an add-on that runs on the nodes: under the CNI's strict enforcement a
        # pod no policy selects has no network (CoreDNS could not reach the API, and its add-on
        # would never turn ACTIVE). hostNetwork agents (aws-node, kube-proxy, the Pod Identity
        # agent) are exempt and come up before it.
        self.kube_system_network_policy = apply_object(
            f"{name}-kube-system-network-policy", unrestricted_policy("kube-system"),
            pulumi.ResourceOptions(parent=self, provider=self.k8s_provider))
        for spec in CLUSTER_ADDONS:
            if spec.timing is AddonTiming.AFTER_NODES:
                self.addons[spec.name] = self.addon(spec, name=name, parent=self)
        apply_object(
            f"{name}-gp3", gp3_storage_class(reclaim_policy="Retain" if self.args.protect else "Delete"),
            pulumi.ResourceOptions(parent=self, provider=self.k8s_provider, depends_on=[self.addons["aws-ebs-csi-driver"]]),
        )

        self.cluster_name = cluster_name
        self.endpoint = self.eks_cluster.eks_cluster.endpoint
        self.kubeconfig = pulumi.Output.secret(self.eks_cluster.kubeconfig_json)
        self.oidc_issuer = self.eks_cluster.oidc_issuer
        self.register_outputs({
            "cluster_name": self.cluster_name,
            "endpoint": self.endpoint,
            "node_security_group_id": self.node_security_group.id,
            # Every public attribute, as pulumi-eks registers its outputs.
            "cluster_security_group_id": self.cluster_security_group_id, "vpc_cidr": self.vpc_cidr,
            "service_cidr": self.service_cidr, "partition": self.partition, "secrets_key": self.secrets_key,
            "control_plane_logs": self.control_plane_logs, "node_security_group": self.node_security_group,
            "node_rules": self.node_rules, "eks_cluster": self.eks_cluster, "access_entries": self.access_entries,
            "addons": self.addons, "node_role": self.node_role, "node_group": self.node_group,
            "kube_system_network_policy": self.kube_system_network_policy,
            "k8s_provider": self.k8s_provider, "oidc_issuer": self.oidc_issuer, "kubeconfig": self.kubeconfig,
        })

    def _control_plane_logs(self, name: str, tags: dict) -> aws.cloudwatch.LogGroup:
        """EKS creates this group on first log write, unencrypted and kept forever, unless it
        exists already: it is created first and the cluster depends on it."""
        args = self.args
        return aws.cloudwatch.LogGroup(
            f"{name}-control-plane-logs", name=control_plane_log_group_name(args.cluster_name),
            retention_in_days=args.log_retention_days,
            kms_key_id=args.log_kms_key.arn if args.log_kms_key is not None else None, tags=tags,
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _node_security_group(self, name: str, tags: dict) -> tuple[aws.ec2.SecurityGroup, list[pulumi.Resource]]:
        """Rules are standalone resources only: inline ingress/egress on the group would make the
        provider revoke every standalone rule on this group (the FSx rules in datasets too)."""
        args = self.args
        group = aws.ec2.SecurityGroup(
            f"{name}-node-sg", vpc_id=args.network.vpc_id,
            description=f"Nodes of {args.cluster_name}: node-to-node traffic (pods, NCCL, EFA)",
            tags={**tags, "Name": f"{name}-node-sg", "karpenter.sh/discovery": args.cluster_name},
            opts=pulumi.ResourceOptions(parent=self),
        )
        sg_child = pulumi.ResourceOptions(parent=group)
        # EFA: "the security group must allow all inbound and outbound traffic to and from the
        # security group itself" (EC2 User Guide, "Get started with EFA and NCCL", step 1).
        rules = [
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-node-self-ingress", security_group_id=group.id,
                referenced_security_group_id=group.id, ip_protocol="-1",
                description="All traffic between nodes (pods, NCCL; EFA needs every protocol)", tags=tags, opts=sg_child),
            aws.vpc.SecurityGroupEgressRule(
                f"{name}-node-self-egress", security_group_id=group.id,
                referenced_security_group_id=group.id, ip_protocol="-1",
                description="All traffic to other nodes (EFA requires the self-referencing egress rule)", tags=tags,
                opts=sg_child),
            aws.vpc.SecurityGroupEgressRule(
                f"{name}-node-egress", security_group_id=group.id,
                cidr_ipv4="0.0.0.0/0", ip_protocol="-1",
                description="Image pulls, AWS APIs, S3 through endpoints or NAT", tags=tags, opts=sg_child),
        ]
        return group, rules

    def _control_plane(self, name: str, tags: dict) -> eks.Cluster:
        args = self.args
        return eks.Cluster(
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
            kubernetes_service_ip_address_range=args.service_ipv4_cidr,
            skip_default_node_group=True,
            skip_default_security_groups=True,
            # Every add-on is an EKS managed add-on with a pinned version (components/addons.py).
            bootstrap_self_managed_addons=False,
            use_default_vpc_cni=True,
            coredns_addon_options={"enabled": False},
            kube_proxy_addon_options={"enabled": False},
            create_oidc_provider=False,
            deletion_protection=args.deletion_protection,
            provider_credential_opts={"role_arn": args.kubeconfig_role_arn} if args.kubeconfig_role_arn else None,
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self, protect=args.protect,
                                        depends_on=[self.control_plane_logs],
                                        transforms=[disable_bootstrap_cluster_admin]),
        )

    def _system_node_role(self, name: str, tags: dict) -> aws.iam.Role:
        role = aws.iam.Role(
            f"{name}-system-node-role", name=fitted_name(f"{name}-system-node-role", IAM_ROLE_NAME_MAX),
            assume_role_policy=json.dumps({"Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}),
            tags=tags, opts=pulumi.ResourceOptions(parent=self),
        )
        for policy in NODE_MANAGED_POLICIES:
            aws.iam.RolePolicyAttachment(
                f"{name}-system-node-{policy}", role=role.name,
                policy_arn=pulumi.Output.concat("arn:", self.partition, ":iam::aws:policy/", policy),
                opts=pulumi.ResourceOptions(parent=role),
            )
        return role

    def _kubernetes_provider(self, name: str) -> k8s.Provider:
        """Everything deployed into the cluster goes through this provider: it waits until the
        deploy role's access entry and policy association exist. Its objects here: kube-system's
        network policy (before the add-ons that run pods) and the default gp3 StorageClass
        (after the EBS CSI driver)."""
        return k8s.Provider(
            f"{name}-k8s", kubeconfig=self.eks_cluster.kubeconfig_json, enable_server_side_apply=True,
            opts=pulumi.ResourceOptions(parent=self, depends_on=self.access_entries["deploy"]),
        )

    def _access_entries(self, name, cluster_name, tags) -> dict[str, list[pulumi.Resource]]:
        """Every principal with Kubernetes access, as visible access entries and associations.

        The deploy role installs charts that create CRDs, ClusterRoles and webhooks; RBAC only
        lets a principal grant permissions it holds, so it needs cluster-wide admin.
        """
        args = self.args
        grants: list[tuple[str, str, str, dict]] = [
            ("deploy", args.kubeconfig_role_arn, CLUSTER_ADMIN_POLICY, {"type": "cluster"})]
        grants += [(f"admin-{index}", arn, CLUSTER_ADMIN_POLICY, {"type": "cluster"})
                   for index, arn in enumerate(args.admin_role_arns)]
        out: dict[str, list[pulumi.Resource]] = {}
        for key, principal, policy, scope in grants:
            entry = aws.eks.AccessEntry(
                f"{name}-access-{key}", cluster_name=cluster_name, principal_arn=principal, type="STANDARD",
                tags=tags, opts=pulumi.ResourceOptions(parent=self))
            association = aws.eks.AccessPolicyAssociation(
                f"{name}-access-{key}-policy", cluster_name=cluster_name, principal_arn=entry.principal_arn,
                policy_arn=pulumi.Output.concat("arn:", self.partition, ":eks::aws:cluster-access-policy/", policy),
                access_scope=scope,
                opts=pulumi.ResourceOptions(parent=entry))
            out[key] = [entry, association]
        # Teams: no EKS access policy (AmazonEKSEditPolicy grants NetworkPolicies, Services and
        # service-account impersonation, and none of the job CRDs). The entry carries the team's
        # Kubernetes group, which a RoleBinding in its namespace binds to the platform's team
        # Role (workloads.tenancy; EKS User Guide, "Create access entries": kubernetesGroups).
        # Keyed by account and role name, so adding a team role never renames another's entry.
        for arn, namespaces in sorted(args.namespace_editors.items()):
            key = f"team-{arn.split(':')[4]}-{arn.rsplit('/', 1)[-1]}"
            out[key] = [aws.eks.AccessEntry(
                f"{name}-access-{key}", cluster_name=cluster_name, principal_arn=arn, type="STANDARD",
                kubernetes_groups=[team_group(ns) for ns in sorted(set(namespaces))],
                tags=tags, opts=pulumi.ResourceOptions(parent=self))]
        return out

    def addon(self, spec: AddonSpec, *, name: str, parent: pulumi.Resource,
              version: Optional[str] = None, tags: Optional[Mapping[str, str]] = None,
              depends_on: Sequence[pulumi.Resource] = ()) -> aws.eks.Addon:
        """The EKS managed add-on ``spec`` on this cluster, named ``f"{name}-{spec.name}"`` under ``parent``
        (pulumi-eks' ``Addon(cluster=...)``): the cluster's own add-ons and those another
        component owns (the FSx CSI driver in ``Datasets``) are made the same way.

        ``version``: the build; default, the cluster's pin for its Kubernetes minor. An
        ``AFTER_NODES`` add-on waits for the static node group and kube-system's network policy (its
        pods need one under strict enforcement), and for ``depends_on`` (an identity its owner
        made, for example).
        """
        tags = dict(self.args.tags if tags is None else tags)
        identity = None
        if spec.identity is not None:
            role = pod_identity_role(
                f"{name}-{spec.identity.role}", cluster_arn=self.eks_cluster.eks_cluster.arn,
                namespace=spec.identity.namespace, service_account=spec.identity.service_account,
                parent=parent, tags=tags,
                managed_policy_arns=[pulumi.Output.concat("arn:", self.partition, ":iam::aws:policy/", policy)
                                     for policy in spec.identity.managed_policies])
            identity = [{"role_arn": role.arn, "service_account": spec.identity.service_account}]
        waits_for = [self.node_group, self.kube_system_network_policy] if spec.timing is AddonTiming.AFTER_NODES else []
        return aws.eks.Addon(
            f"{name}-{spec.name}", cluster_name=self.eks_cluster.eks_cluster.name, addon_name=spec.name,
            addon_version=version or self.args.addon_versions[spec.name],
            configuration_values=json.dumps(dict(spec.configuration)) if spec.configuration else None,
            resolve_conflicts_on_create="OVERWRITE", resolve_conflicts_on_update="PRESERVE",
            pod_identity_associations=identity, tags=tags,
            opts=pulumi.ResourceOptions(parent=parent, depends_on=[*waits_for, *depends_on]),
        )

    def pod_identity(self, name: str, *, namespace: str, service_account: str, parent: pulumi.Resource,
                     tags: Mapping[str, str], policies: Optional[Mapping[str, pulumi.Input[str]]] = None,
                     managed_policy_arns: Sequence[pulumi.Input[str]] = (), association: str = "identity",
                     after_agent: bool = True) -> PodIdentity:
        """AWS credentials for one service account of this cluster through EKS Pod Identity: a role
        only that account may assume (``f"{name}-role"``), its inline ``policies`` (suffix -> policy
        document, each ``f"{name}-{suffix}"`` under the role) and ``managed_policy_arns``, and the
        association ``f"{name}-{association}"`` under ``parent``.

        ``after_agent``: the association waits for the Pod Identity Agent add-on, and so does whatever
        waits for the association (False: only what uses the role orders it).
        """
        role = pod_identity_role(name, cluster_arn=self.eks_cluster.eks_cluster.arn, namespace=namespace,
                                 service_account=service_account, parent=parent, tags=tags,
                                 managed_policy_arns=managed_policy_arns)
        inline = {suffix: aws.iam.RolePolicy(f"{name}-{suffix}", role=role.id, policy=document,
                                             opts=pulumi.ResourceOptions(parent=role))
                  for suffix, document in (policies or {}).items()}
        waits_for = [self.addons["eks-pod-identity-agent"]] if after_agent else []
        linked = aws.eks.PodIdentityAssociation(
            f"{name}-{association}", cluster_name=self.cluster_name, namespace=namespace,
            service_account=service_account, role_arn=role.arn, tags=dict(tags),
            opts=pulumi.ResourceOptions(parent=parent, depends_on=waits_for))
        return PodIdentity(role=role, policies=inline, association=linked)

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
            release_version=group.release_version,
            instance_types=list(group.instance_types),
            scaling_config={"min_size": group.min_size, "max_size": group.max_size, "desired_size": group.desired_size},
            update_config={"max_unavailable": 1},
            launch_template={"id": launch_template.id, "version": launch_template.latest_version.apply(str)},
            labels={SYSTEM_NODE_LABEL_KEY: SYSTEM_NODE_LABEL_VALUE},
            taints=[{"key": SYSTEM_NODE_TAINT["key"], "value": SYSTEM_NODE_TAINT["value"], "effect": "NO_SCHEDULE"}],
            tags=tags,
            # The CNI must exist before nodes join, or they never become Ready.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.addons["vpc-cni"], self.addons["kube-proxy"]],
                                        # The engine's input names: the SDK translates only whole
                                        # top-level names, and a path naming no input ignores nothing.
                                        ignore_changes=["scalingConfig.desiredSize"]),
        )


def control_plane_log_group_name(cluster_name: str) -> str:
    """The log group EKS writes control-plane logs to (EKS User Guide, control plane logs)."""
    return f"/aws/eks/{cluster_name}/cluster"


def disable_bootstrap_cluster_admin(args: pulumi.ResourceTransformArgs) -> Optional[pulumi.ResourceTransformResult]:
    """Transform for ``eks.Cluster``: its ``aws:eks/cluster:Cluster`` child is created with
    ``accessConfig.bootstrapClusterCreatorAdminPermissions = false``.

    pulumi-eks hard-codes ``true`` there (nodejs/eks/cluster/cluster.ts) and exposes no input for
    it (eks:index:Cluster has no accessConfig in its schema), so the creator would be a cluster
    admin that no access entry shows. Transforms run in the engine for a resource and all its
    children, packaged (remote) components' children included (pulumi.com/docs/iac/concepts/
    options/transforms and .../options/transformations: "Transforms support modifying child
    resources of packaged components"); the offline plan emulates this for the eksCluster
    child (infra/plan/mock_engine.py). The setting only matters at
    creation; pulumi-eks ignores later changes to it, so an existing cluster is not replaced.
    """
    if args.type_ != "aws:eks/cluster:Cluster":
        return None
    props = dict(args.props)
    access = dict(props.get("accessConfig") or {})
    access["bootstrapClusterCreatorAdminPermissions"] = False
    props["accessConfig"] = access
    return pulumi.ResourceTransformResult(props=props, opts=args.opts)


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
        f"{name}-role", name=fitted_name(f"{name}-role", IAM_ROLE_NAME_MAX), assume_role_policy=trust, tags=dict(tags),
        opts=pulumi.ResourceOptions(parent=parent),
    )
    for index, arn in enumerate(managed_policy_arns):
        aws.iam.RolePolicyAttachment(f"{name}-policy-{index}", role=role.name, policy_arn=arn,
                                     opts=pulumi.ResourceOptions(parent=role))
    return role
