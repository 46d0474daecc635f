"""The platform's security and training-safety rules, as plain functions over resources.

Each rule sees one resource (``type``, ``props`` in the engine's camelCase, ``urn``) or the whole
stack, and yields violation messages. ``policypack/__main__.py`` wraps them as a pulumi-policy
pack for ``pulumi preview --policy-pack policypack``; ``policypack.offline`` runs the same
functions over the offline plan's recorded graph. Only the standard library is imported here: the
pack's own virtual environment needs nothing but pulumi-policy.

The references name the CIS Amazon EKS Benchmark 1.8.0 recommendation and/or the checkov check
that each rule enforces (or "platform" for rules of our own, with the reason). Checked against
kube-bench ``cfg/eks-1.8.0/*.yaml`` (the benchmark's numbering: 4.1 RBAC and service accounts,
5.1 image registry, 5.2 IAM, 5.4.1 restrict access to the endpoint, 5.4.2 private endpoint) and
checkov's check sources (``CKV_AWS_178`` is FSx for ONTAP, not Lustre).
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

MANDATORY = "mandatory"
ADVISORY = "advisory"

# Tags every platform resource carries (infra/config/platform.py adds them to the stack's own tags).
REQUIRED_TAG_KEYS = ("platform", "environment", "managed-by")

# ELB security policies that negotiate TLS 1.2 or newer only. Source: "Security policies for
# your Application Load Balancer", Elastic Load Balancing user guide.
TLS12_POLICY_PREFIXES = ("ELBSecurityPolicy-TLS13-", "ELBSecurityPolicy-TLS-1-2-", "ELBSecurityPolicy-FS-1-2-")

POD_IDENTITY_SESSION_TAGS = (
    "aws:RequestTag/eks-cluster-arn",
    "aws:RequestTag/kubernetes-namespace",
    "aws:RequestTag/kubernetes-service-account",
)

# AWS resource types that support tags and that the platform creates; every one must carry the
# required tags (resources whose props have a `tags` key are checked too).
TAGGABLE_TYPES = frozenset({
    "aws:s3/bucket:Bucket", "aws:ec2/vpc:Vpc", "aws:ec2/subnet:Subnet", "aws:ec2/securityGroup:SecurityGroup",
    "aws:kms/key:Key", "aws:cloudwatch/logGroup:LogGroup", "aws:iam/role:Role", "aws:rds/cluster:Cluster",
    "aws:fsx/lustreFileSystem:LustreFileSystem", "aws:lb/loadBalancer:LoadBalancer", "aws:ecs/cluster:Cluster",
    "aws:ecs/service:Service", "aws:sqs/queue:Queue", "aws:eks/nodeGroup:NodeGroup", "aws:ec2/natGateway:NatGateway",
})


@dataclass(frozen=True)
class Resource:
    """The part of a resource the rules read: what pulumi-policy passes, minus the proxies."""

    type: str
    props: Mapping[str, Any]
    urn: str
    name: str
    dependencies: tuple[str, ...] = ()  # URNs

    @property
    def environment(self) -> Optional[str]:
        tags = self.props.get("tags") or {}
        return tags.get("environment") if isinstance(tags, Mapping) else None


ResourceCheck = Callable[[Resource], Iterable[str]]
StackCheck = Callable[[Sequence[Resource]], Iterable[tuple[str, Optional[str]]]]


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    references: str
    enforcement: str
    check_resource: Optional[ResourceCheck] = None
    check_stack: Optional[StackCheck] = None


def _is_world(cidr: Any) -> bool:
    try:
        return ipaddress.ip_network(str(cidr), strict=False).prefixlen == 0
    except ValueError:
        return False


# -- EKS -------------------------------------------------------------------------------------
def _eks_endpoint(resource: Resource) -> Optional[tuple[bool, list]]:
    """(public access on, public CIDRs) of an EKS cluster, whichever resource declares it."""
    if resource.type == "eks:index:Cluster":  # the pulumi-eks component (offline plan)
        return bool(resource.props.get("endpointPublicAccess")), list(resource.props.get("publicAccessCidrs") or [])
    if resource.type == "aws:eks/cluster:Cluster":  # its child, as a real preview sees it
        vpc = resource.props.get("vpcConfig") or {}
        return bool(vpc.get("endpointPublicAccess", True)), list(vpc.get("publicAccessCidrs") or ["0.0.0.0/0"])
    return None


def eks_public_endpoint_restricted(resource: Resource) -> Iterator[str]:
    endpoint = _eks_endpoint(resource)
    if endpoint and endpoint[0] and (not endpoint[1] or any(_is_world(c) for c in endpoint[1])):
        yield (f"the EKS API endpoint is public to {endpoint[1] or 'everyone'}: list the CIDRs that may reach it "
               "(cluster.publicAccessCidrs) or turn public access off")


def eks_private_endpoint_in_prod(resource: Resource) -> Iterator[str]:
    endpoint = _eks_endpoint(resource)
    if endpoint and endpoint[0] and resource.environment == "prod":
        yield "a prod EKS cluster must have its public API endpoint off: deploy from inside the VPC"


def eks_secrets_encrypted(resource: Resource) -> Iterator[str]:
    if resource.type == "eks:index:Cluster" and not resource.props.get("encryptionConfigKeyArn"):
        yield "Kubernetes secrets are not envelope-encrypted with a KMS key (encryptionConfigKeyArn)"
    if resource.type == "aws:eks/cluster:Cluster":
        configs = resource.props.get("encryptionConfig") or {}
        configs = configs if isinstance(configs, list) else [configs]
        if not any("secrets" in (c.get("resources") or []) for c in configs):
            yield "Kubernetes secrets are not envelope-encrypted with a KMS key (encryptionConfig)"


CONTROL_PLANE_LOG_TYPES = ("api", "audit", "authenticator", "controllerManager", "scheduler")


def eks_control_plane_logs(resource: Resource) -> Iterator[str]:
    if resource.type in ("eks:index:Cluster", "aws:eks/cluster:Cluster"):
        missing = sorted(set(CONTROL_PLANE_LOG_TYPES) - set(resource.props.get("enabledClusterLogTypes") or []))
        if missing:
            yield f"control-plane log types {missing} are not enabled"


# -- compute ---------------------------------------------------------------------------------
def imdsv2_hop_limit_one(resource: Resource) -> Iterator[str]:
    if resource.type == "aws:ec2/launchTemplate:LaunchTemplate":
        options = resource.props.get("metadataOptions") or {}
        tokens, hops = options.get("httpTokens"), options.get("httpPutResponseHopLimit")
    elif resource.type == "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass":
        options = (resource.props.get("spec") or {}).get("metadataOptions") or {}
        tokens, hops = options.get("httpTokens"), options.get("httpPutResponseHopLimit")
    else:
        return
    if tokens != "required":
        yield f"instance metadata allows IMDSv1 (httpTokens={tokens!r}): set httpTokens to required"
    if hops is None or int(hops) != 1:
        yield f"metadata hop limit is {hops!r}: 1 keeps pods from reaching the node role's credentials"


def _gpu_node_pool(resource: Resource) -> bool:
    if resource.type != "kubernetes:karpenter.sh/v1:NodePool":
        return False
    template = ((resource.props.get("spec") or {}).get("template") or {}).get("spec") or {}
    keys = {r.get("key") for r in template.get("requirements") or []}
    return any(k and k.startswith("karpenter.k8s.aws/instance-gpu") for k in keys) or any(
        t.get("key") == "nvidia.com/gpu" for t in template.get("taints") or [])


def gpu_pools_training_safe(resource: Resource) -> Iterator[str]:
    if not _gpu_node_pool(resource):
        return
    spec = resource.props.get("spec") or {}
    template = (spec.get("template") or {}).get("spec") or {}
    policy = (spec.get("disruption") or {}).get("consolidationPolicy")
    if policy != "WhenEmpty":
        yield f"consolidationPolicy is {policy!r}: WhenEmpty, or Karpenter moves running training pods to consolidate"
    if not any(t.get("key") == "nvidia.com/gpu" and t.get("effect") == "NoSchedule" for t in template.get("taints") or []):
        yield "GPU nodes lack the nvidia.com/gpu:NoSchedule taint: CPU pods would land on them and keep them alive"
    if not template.get("terminationGracePeriod"):
        yield "no terminationGracePeriod: a draining node must give the trainer time to checkpoint"
    if any(t.get("key", "").startswith("fsx.csi.aws.com") for t in template.get("taints") or []):
        yield "the FSx CSI agent taint belongs in startupTaints, not taints"


def nodepool_gpu_limits(resource: Resource) -> Iterator[str]:
    if _gpu_node_pool(resource) and not ((resource.props.get("spec") or {}).get("limits") or {}).get("nvidia.com/gpu"):
        yield "the GPU NodePool has no nvidia.com/gpu limit: a runaway job could launch GPUs without bound"


def ecs_no_public_ip(resource: Resource) -> Iterator[str]:
    if resource.type == "aws:ecs/service:Service":
        if (resource.props.get("networkConfiguration") or {}).get("assignPublicIp"):
            yield "the ECS service gives its tasks public IP addresses: run them in private subnets"


# -- network -----------------------------------------------------------------------------------
def no_world_ingress(resource: Resource) -> Iterator[str]:
    cidrs: list[Any] = []
    if resource.type == "aws:ec2/securityGroup:SecurityGroup":
        for rule in resource.props.get("ingress") or []:
            cidrs += list(rule.get("cidrBlocks") or []) + list(rule.get("ipv6CidrBlocks") or [])
    elif resource.type == "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule":
        cidrs += [resource.props.get("cidrIpv4"), resource.props.get("cidrIpv6")]
    elif resource.type == "aws:ec2/securityGroupRule:SecurityGroupRule" and resource.props.get("type") == "ingress":
        cidrs += list(resource.props.get("cidrBlocks") or []) + list(resource.props.get("ipv6CidrBlocks") or [])
    world = sorted({str(c) for c in cidrs if c and _is_world(c)})
    if world:
        yield f"ingress from {world} admits the whole internet: list the client CIDRs instead"


def tls12_listeners(resource: Resource) -> Iterator[str]:
    if resource.type != "aws:lb/listener:Listener":
        return
    protocol = resource.props.get("protocol")
    if protocol in ("HTTPS", "TLS"):
        policy = resource.props.get("sslPolicy") or "ELBSecurityPolicy-2016-08 (the API default)"
        if not str(policy).startswith(TLS12_POLICY_PREFIXES):
            yield f"listener policy {policy} allows TLS below 1.2: use ELBSecurityPolicy-TLS13-1-2-2021-06"
    elif protocol == "HTTP":
        actions = resource.props.get("defaultActions") or []
        if not all(a.get("type") == "redirect" and (a.get("redirect") or {}).get("protocol") == "HTTPS" for a in actions):
            yield "a plain-HTTP listener must only redirect to HTTPS"


# -- data at rest --------------------------------------------------------------------------------
def rds_encrypted(resource: Resource) -> Iterator[str]:
    if resource.type == "aws:rds/cluster:Cluster":
        if not resource.props.get("storageEncrypted"):
            yield "Aurora storage is not encrypted (storageEncrypted)"
        if not resource.props.get("kmsKeyId"):
            yield "Aurora storage uses the AWS-managed key: give it the platform's KMS key (kmsKeyId)"


def fsx_kms(resource: Resource) -> Iterator[str]:
    if resource.type == "aws:fsx/lustreFileSystem:LustreFileSystem" and not resource.props.get("kmsKeyId"):
        yield "FSx for Lustre is encrypted with the AWS-managed key: set kmsKeyId to a customer-managed key"


def log_groups_kms(resource: Resource) -> Iterator[str]:
    if resource.type == "aws:cloudwatch/logGroup:LogGroup" and not resource.props.get("kmsKeyId"):
        yield f"log group {resource.props.get('name') or resource.name} is not encrypted with a KMS key (kmsKeyId)"


def log_retention_prod(resource: Resource) -> Iterator[str]:
    if resource.type == "aws:cloudwatch/logGroup:LogGroup" and resource.environment == "prod":
        days = resource.props.get("retentionInDays")
        if days and int(days) < 365:  # absent means "never expire"
            yield f"prod log group keeps logs {days} days: keep them at least 365"


def deletion_protection_prod(resource: Resource) -> Iterator[str]:
    if resource.environment != "prod":
        return
    if resource.type == "aws:rds/cluster:Cluster" and not resource.props.get("deletionProtection"):
        yield "prod Aurora cluster without deletionProtection"
    if resource.type == "aws:lb/loadBalancer:LoadBalancer" and not resource.props.get("enableDeletionProtection"):
        yield "prod load balancer without enableDeletionProtection"


def _covering(stack: Sequence[Resource], bucket: Resource, kind: str) -> list[Resource]:
    return [r for r in stack if r.type == kind and bucket.urn in r.dependencies]


def s3_public_access_blocked(stack: Sequence[Resource]) -> Iterator[tuple[str, Optional[str]]]:
    flags = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
    for bucket in (r for r in stack if r.type == "aws:s3/bucket:Bucket"):
        blocks = _covering(stack, bucket, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")
        if not any(all(b.props.get(f) is True for f in flags) for b in blocks):
            yield f"bucket {bucket.name} has no public access block with all four settings on", bucket.urn


def s3_encrypted(stack: Sequence[Resource]) -> Iterator[tuple[str, Optional[str]]]:
    kind = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
    for bucket in (r for r in stack if r.type == "aws:s3/bucket:Bucket"):
        if not bucket.props.get("serverSideEncryptionConfiguration") and not _covering(stack, bucket, kind):
            yield f"bucket {bucket.name} has no default encryption configuration", bucket.urn


# -- identity ------------------------------------------------------------------------------------
def _statements(document: Any) -> list[dict]:
    if isinstance(document, str):
        import json

        try:
            document = json.loads(document)
        except ValueError:
            return []
    statements = (document or {}).get("Statement") or []
    return statements if isinstance(statements, list) else [statements]


def pod_identity_trust_scoped(resource: Resource) -> Iterator[str]:
    if resource.type != "aws:iam/role:Role":
        return
    for statement in _statements(resource.props.get("assumeRolePolicy")):
        services = (statement.get("Principal") or {}).get("Service") or []
        services = [services] if isinstance(services, str) else services
        if "pods.eks.amazonaws.com" not in services or statement.get("Effect") != "Allow":
            continue
        conditions = (statement.get("Condition") or {}).get("StringEquals") or {}
        missing = [key for key in POD_IDENTITY_SESSION_TAGS if not conditions.get(key)]
        if missing:
            yield (f"role {resource.name} trusts EKS Pod Identity without conditions on {missing}: any association "
                   "in the account could assume it")


def no_wildcard_admin(resource: Resource) -> Iterator[str]:
    if resource.type not in ("aws:iam/rolePolicy:RolePolicy", "aws:iam/policy:Policy"):
        return
    for statement in _statements(resource.props.get("policy")):
        actions = statement.get("Action") or []
        actions = [actions] if isinstance(actions, str) else actions
        resources = statement.get("Resource") or []
        resources = [resources] if isinstance(resources, str) else resources
        if statement.get("Effect") == "Allow" and any(a == "*" or a.endswith(":*") for a in actions) and "*" in resources:
            yield f"policy {resource.name} allows {actions} on every resource"


# -- tags ------------------------------------------------------------------------------------------
def required_tags(resource: Resource) -> Iterator[str]:
    if not resource.type.startswith("aws:"):
        return
    if "tags" not in resource.props and resource.type not in TAGGABLE_TYPES:
        return
    tags = resource.props.get("tags") or {}
    missing = [key for key in REQUIRED_TAG_KEYS if key not in tags]
    if missing:
        yield f"{resource.type.split(':')[-1]} {resource.name} lacks the tags {missing}"


RULES: tuple[Rule, ...] = (
    Rule("eks-public-endpoint-restricted", "The EKS API is never public to 0.0.0.0/0.",
         "CIS EKS 5.4.1 (restrict access to the control plane endpoint); checkov CKV_AWS_38", MANDATORY,
         eks_public_endpoint_restricted),
    Rule("eks-private-endpoint-in-prod", "Prod clusters have no public API endpoint.",
         "CIS EKS 5.4.2; checkov CKV_AWS_39", MANDATORY, eks_private_endpoint_in_prod),
    Rule("eks-secrets-encrypted", "Kubernetes secrets are envelope-encrypted with KMS.",
         "CIS EKS 5.3.1; checkov CKV_AWS_58", MANDATORY, eks_secrets_encrypted),
    Rule("eks-control-plane-logs", "Every control-plane log type is enabled.",
         "CIS EKS 2.1.1; checkov CKV_AWS_37", MANDATORY, eks_control_plane_logs),
    Rule("imdsv2-hop-limit-1", "Nodes require IMDSv2 with a hop limit of 1.",
         # CIS EKS 1.8.0 has no IMDS recommendation (4.1 is RBAC and service accounts).
         "platform: pods must not reach the node role's credentials; checkov CKV_AWS_79, CKV_AWS_341", MANDATORY,
         imdsv2_hop_limit_one),
    Rule("no-world-ingress", "No security group admits 0.0.0.0/0 or ::/0.",
         "checkov CKV_AWS_24, CKV_AWS_25, CKV_AWS_260, CKV_AWS_277", MANDATORY, no_world_ingress),
    Rule("tls12-listeners", "HTTPS listeners negotiate TLS 1.2+; HTTP only redirects.",
         "checkov CKV_AWS_103, CKV2_AWS_20", MANDATORY, tls12_listeners),
    Rule("ecs-no-public-ip", "Fargate tasks get no public IP.", "checkov CKV_AWS_333", MANDATORY, ecs_no_public_ip),
    Rule("rds-encrypted", "Aurora is encrypted with a customer-managed key.",
         "checkov CKV_AWS_96, CKV_AWS_327", MANDATORY, rds_encrypted),
    Rule("fsx-kms", "FSx for Lustre is encrypted with a customer-managed key.",
         # checkov CKV_AWS_178 is FSx for ONTAP (aws_fsx_ontap_file_system); it has no Lustre CMK check.
         "platform: datasets under the platform's own key, like every other data store", MANDATORY, fsx_kms),
    Rule("log-groups-kms", "CloudWatch log groups are KMS-encrypted.", "checkov CKV_AWS_158", MANDATORY, log_groups_kms),
    Rule("log-retention-prod", "Prod log groups keep logs at least a year.",
         "checkov CKV_AWS_338; CIS EKS 2.1.1 (audit logs)", MANDATORY, log_retention_prod),
    Rule("deletion-protection-prod", "Prod databases and load balancers have deletion protection.",
         "checkov CKV_AWS_139, CKV_AWS_150", MANDATORY, deletion_protection_prod),
    Rule("s3-public-access-blocked", "Every bucket blocks public access (all four settings).",
         "checkov CKV_AWS_53, CKV_AWS_54, CKV_AWS_55, CKV_AWS_56", MANDATORY, check_stack=s3_public_access_blocked),
    Rule("s3-encrypted", "Every bucket has default encryption.", "checkov CKV_AWS_19, CKV_AWS_145", MANDATORY,
         check_stack=s3_encrypted),
    Rule("pod-identity-trust-scoped", "Pod Identity roles trust one cluster, namespace and service account.",
         "EKS Best Practices Guide (IAM: scope the trust policy); CIS EKS 5.2.1 (dedicated EKS service accounts)",
         MANDATORY, pod_identity_trust_scoped),
    Rule("no-wildcard-admin", "No IAM policy allows service:* on every resource.",
         "checkov CKV_AWS_62, CKV_AWS_289", MANDATORY, no_wildcard_admin),
    Rule("gpu-pools-training-safe", "GPU NodePools never disrupt running training.",
         "platform: Karpenter disruption docs (consolidation, terminationGracePeriod)", MANDATORY, gpu_pools_training_safe),
    Rule("nodepool-gpu-limits", "GPU NodePools cap their GPUs.", "platform: Karpenter NodePool limits",
         MANDATORY, nodepool_gpu_limits),
    Rule("required-tags", "AWS resources carry the platform's tags.", "platform: cost allocation, ownership",
         ADVISORY, required_tags),
)
