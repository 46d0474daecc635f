"""A consumer's own stack, built from the platform's components.

What it shows: the components take objects (a ``LogArchive``, a ``Network``) and frozen
``<Name>Args``, never read ``pulumi.Config`` themselves, and create every child through the
provider the caller passes. Here the caller is a team with its own two accounts and its own
names (``research-...``): nothing of the platform's stack files or account roles is used.

Tested offline by ``tests/examples/test_consumer.py`` under ``infra.plan.mock_engine.run_recorded``.
"""
from __future__ import annotations

import pulumi
import pulumi_aws as aws

from components.cluster import Cluster, ClusterArgs, NodeGroupArgs, UpgradePolicy, control_plane_log_group_name
from components.kms import LogGroupKey, LogGroupKeyArgs
from components.log_archive import FLOW_LOGS_PREFIX, LogArchive, LogArchiveArgs
from components.network import NatStrategy, Network, NetworkArgs

config = pulumi.Config()
region = pulumi.Config("aws").require("region")
workload_account = config.require("workloadAccountId")
logging_account = config.require("loggingAccountId")
prefix = config.get("prefix") or "research"
cluster_name = f"{prefix}-eks"
tags = {"team": prefix, "managed-by": "pulumi"}

# The consumer's own providers: one per account, each pinned to its account id so a
# mistaken role can never create resources in the wrong account. Typed args, not dicts:
# provider config is sent JSON-encoded, and dict keys would arrive in snake_case, which the
# provider ignores (it would then run as the caller's own identity).
def account_provider(key: str, account_id: str, role_arn: str) -> aws.Provider:
    return aws.Provider(
        f"{prefix}-{key}",
        region=region,
        allowed_account_ids=[account_id],
        assume_roles=[aws.ProviderAssumeRoleArgs(role_arn=role_arn, session_name=f"{prefix}-deploy")],
        default_tags=aws.ProviderDefaultTagsArgs(tags=tags),
    )


workload = account_provider("workload", workload_account, config.require("workloadRoleArn"))
logging = account_provider("logging", logging_account, config.require("loggingRoleArn"))

archive = LogArchive(
    f"{prefix}-logs",
    LogArchiveArgs(flow_log_account_ids=[workload_account], expiration_days=400, protect=True, tags=tags),
    opts=pulumi.ResourceOptions(providers={"aws": logging}),
)
log_key = LogGroupKey(
    f"{prefix}-log-key",
    LogGroupKeyArgs(log_group_names=[control_plane_log_group_name(cluster_name)], tags=tags),
    opts=pulumi.ResourceOptions(providers={"aws": workload}),
)
network = Network(
    f"{prefix}-net",
    NetworkArgs(
        cidr="10.20.0.0/16",
        availability_zones=[f"{region}a", f"{region}b"],
        private_subnet_cidrs=["10.20.0.0/18", "10.20.64.0/18"],
        public_subnet_cidrs=["10.20.192.0/24", "10.20.193.0/24"],
        cluster_name=cluster_name,
        flow_logs_bucket=archive.bucket,
        flow_logs_prefix=FLOW_LOGS_PREFIX,
        flow_logs_bucket_policy=archive.policy,
        nat=NatStrategy.SINGLE,
        tags=tags,
    ),
    opts=pulumi.ResourceOptions(providers={"aws": workload}),
)
cluster = Cluster(
    f"{prefix}-cluster",
    ClusterArgs(
        cluster_name=cluster_name,
        version="1.32",
        # 1.32 is past standard support (catalog/versions.py): STANDARD would have AWS upgrade
        # the control plane on its own schedule; EXTENDED keeps it until you upgrade (and costs more).
        upgrade_policy=UpgradePolicy.EXTENDED,
        network=network,
        system_node_group=NodeGroupArgs(instance_types=["m7i.large"], min_size=2, max_size=3, desired_size=2),
        kubeconfig_role_arn=config.require("workloadRoleArn"),
        log_kms_key=log_key.key,
        log_retention_days=90,
        tags=tags,
    ),
    opts=pulumi.ResourceOptions(providers={"aws": workload}),
)

pulumi.export("vpcId", network.vpc.id)
pulumi.export("clusterName", cluster_name)
pulumi.export("logArchiveBucket", archive.bucket.bucket)
