"""The inputs AWS cannot change in place, for the properties the platform's stacks set: a change
makes the ``aws`` stand-in's Diff report a replacement, as pulumi-aws reports one for a Terraform
attribute with ``ForceNew: true`` (pulumi-terraform-bridge pkg/tfbridge/provider.go ``Diff``:
``RequiresNew`` -> ``replaces``, by top-level property).

Kept small on purpose: only properties a stack sets (``tests/engine/test_standin_aws.py`` fails on
an entry no stack sets, or one the pinned SDK does not declare), each with its source. Everything
else a stack sets is reported as an in-place update, which pulumi-aws may in truth turn into a
replacement: that is what this table does not model (docs/testing.md).

Sources are hashicorp/terraform-provider-aws resource schemas (file and the commit read) or, where
AWS simply has no operation that changes the value, the service's API reference.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from tools.engine.standins.wire import UNKNOWN, get_path

_TF = "hashicorp/terraform-provider-aws"


@dataclass(frozen=True)
class Rule:
    path: str                      # wire names, dotted for nested blocks
    source: str
    # A replacement only for some changes (Terraform CustomizeDiff ForceNewIf...): old, new -> bool.
    when: Optional[Callable[[Any, Any], bool]] = None

    def replaces(self, old: Any, new: Any) -> bool:
        if new is UNKNOWN:
            # Terraform plans an unknown ForceNew value as "forces replacement".
            return self.when is None
        if old == new:
            return False
        return self.when(old, new) if self.when is not None else True


def _removed(old: Any, new: Any) -> bool:
    return bool(old) and not new


def _smaller(old: Any, new: Any) -> bool:
    return isinstance(old, (int, float)) and isinstance(new, (int, float)) and new < old


_EKS = f"{_TF} internal/service/eks/cluster.go @00555dc"
_SUBNET = f"{_TF} internal/service/ec2/vpc_subnet.go @00cda12"
_SG = f"{_TF} internal/service/ec2/vpc_security_group.go @0160692"
_FSX = f"{_TF} internal/service/fsx/lustre_file_system.go @06ee53d"
_RDS = f"{_TF} internal/service/rds/cluster.go @0168cf6"

REPLACE_ON_CHANGE: dict[str, tuple[Rule, ...]] = {
    "aws:eks/cluster:Cluster": (
        Rule("name", f"{_EKS}: name ForceNew"),
        Rule("roleArn", f"{_EKS}: role_arn ForceNew"),
        Rule("kubernetesNetworkConfig.serviceIpv4Cidr", f"{_EKS}: kubernetes_network_config.service_ipv4_cidr ForceNew"),
        Rule("kubernetesNetworkConfig.ipFamily", f"{_EKS}: kubernetes_network_config.ip_family ForceNew"),
        Rule("bootstrapSelfManagedAddons", f"{_EKS}: bootstrap_self_managed_addons ForceNew"),
        Rule("accessConfig.bootstrapClusterCreatorAdminPermissions",
             f"{_EKS}: access_config.bootstrap_cluster_creator_admin_permissions ForceNew"),
        Rule("encryptionConfig", f"{_EKS}: CustomizeDiff ForceNewIfChange(encryption_config) when removed "
                                 "(\"You cannot disable envelope encryption after enabling it\")", when=_removed),
    ),
    "aws:ec2/subnet:Subnet": (
        Rule("cidrBlock", f"{_SUBNET}: cidr_block ForceNew"),
        Rule("availabilityZone", f"{_SUBNET}: availability_zone ForceNew"),
        Rule("vpcId", f"{_SUBNET}: vpc_id ForceNew"),
    ),
    "aws:ec2/securityGroup:SecurityGroup": (
        Rule("name", f"{_SG}: name ForceNew"),
        Rule("description", f"{_SG}: description ForceNew"),
        Rule("vpcId", f"{_SG}: vpc_id ForceNew"),
    ),
    "aws:fsx/lustreFileSystem:LustreFileSystem": (
        Rule("deploymentType", f"{_FSX}: deployment_type ForceNew"),
        Rule("storageType", f"{_FSX}: storage_type ForceNew"),
        Rule("subnetIds", f"{_FSX}: subnet_ids ForceNew"),
        Rule("securityGroupIds", f"{_FSX}: security_group_ids ForceNew"),
        Rule("kmsKeyId", f"{_FSX}: kms_key_id ForceNew"),
        Rule("copyTagsToBackups", f"{_FSX}: copy_tags_to_backups ForceNew"),
        Rule("fileSystemTypeVersion", f"{_FSX}: file_system_type_version ForceNew"),
        Rule("storageCapacity", f"{_FSX}: CustomizeDiff ForceNew(storage_capacity) when it shrinks", when=_smaller),
    ),
    "aws:rds/cluster:Cluster": (
        Rule("clusterIdentifier", f"{_RDS}: cluster_identifier ForceNew"),
        Rule("engine", f"{_RDS}: engine ForceNew"),
        Rule("engineMode", f"{_RDS}: engine_mode ForceNew"),
        Rule("databaseName", f"{_RDS}: database_name ForceNew"),
        Rule("masterUsername", f"{_RDS}: master_username ForceNew"),
        Rule("kmsKeyId", f"{_RDS}: kms_key_id ForceNew"),
        Rule("dbSubnetGroupName", f"{_RDS}: db_subnet_group_name ForceNew"),
    ),
    "aws:s3/bucket:Bucket": (
        Rule("bucket", "Amazon S3 API Reference: no operation renames a bucket (CreateBucket names it)"),
    ),
    "aws:iam/role:Role": (
        Rule("name", "IAM API Reference: UpdateRole changes only Description and MaxSessionDuration; "
                     "no operation renames a role"),
    ),
    "aws:sqs/queue:Queue": (
        Rule("name", "Amazon SQS API Reference: the name is part of the queue URL CreateQueue returns; "
                     "SetQueueAttributes cannot rename"),
    ),
    "aws:cloudwatch/logGroup:LogGroup": (
        Rule("name", "CloudWatch Logs API Reference: no operation renames a log group"),
    ),
}


def replacing_paths(type_: str, old: dict, new: dict) -> dict[str, str]:
    """Each rule path of ``type_`` whose change forces a new resource -> its source."""
    found = {}
    for rule in REPLACE_ON_CHANGE.get(type_, ()):
        if rule.replaces(get_path(old, rule.path), get_path(new, rule.path)):
            found[rule.path] = rule.source
    return found
