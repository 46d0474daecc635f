"""Container logs: Fluent Bit on every node (GPU nodes included) to one CloudWatch log group,
encrypted with the account's log key and kept ``retention_days``, then copied to the log-archive
account through a CloudWatch Logs destination there (Firehose into the archive bucket).

Fluent Bit is AWS's build (eks-charts ``aws-for-fluent-bit`` 0.2.0, AWS for Fluent Bit 3.2.1);
its Kubernetes filter adds the pod's namespace, name, container and labels (the PyTorchJob's
job name and replica index) to each record; the trainer prefixes every line with ``[rank N]``.
The chart may not create the group (``autoCreateGroup: false``): the platform creates it first,
with retention and key.

Cross-account: a subscription filter in the workload account sends to a
``aws.cloudwatch.LogDestination`` in the logging account, whose policy admits only the workload
account; the destination's role puts records into a Firehose stream that writes to the archive
bucket under ``container-logs/`` (CloudWatch Logs User Guide, "Cross-account cross-Region
subscriptions using Firehose").
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import pulumi
import pulumi_aws as aws

from components.helm_addon import helm_addon
from components.cluster import Cluster, pod_identity_role
from components.k8s import apply_namespace_objects
from components.charts import ChartSource
from components.versions import AWS_FOR_FLUENT_BIT
from components.names import IAM_ROLE_NAME_MAX, fitted_name
from workloads.system_namespaces import PodSecurityLevel, SystemNamespaceSpec, namespace_objects

NAMESPACE = "logging"
RELEASE = "aws-for-fluent-bit"
SERVICE_ACCOUNT = "aws-for-fluent-bit"
FLUENT_BIT_METRICS_PORT = 2020
ARCHIVE_PREFIX = "container-logs/"
POD_SECURITY_REASON = ("node agent: Fluent Bit reads every container's log files from the node "
                       "(hostPath /var/log and /var/lib/docker/containers); baseline forbids hostPath")


def log_group_name(cluster_name: str) -> str:
    return f"/aws/eks/{cluster_name}/containers"


def log_stream_name(namespace: str, pod: str, container: str) -> str:
    """The stream of one container of one pod: ``logStreamTemplate`` below, filled in."""
    return f"{namespace}.{pod}.{container}"


def helm_values(*, region: str, group: pulumi.Input[str]) -> dict[str, Any]:
    """Values of aws-for-fluent-bit 0.2.0 (keys as in its values.yaml)."""
    return {
        "cloudWatchLogs": {
            "enabled": True, "region": region, "logGroupName": group, "autoCreateGroup": False,
            # Fluent Bit refuses to start without log_stream_name or log_stream_prefix, template or
            # not (out_cloudwatch_logs cb_cloudwatch_init), and the chart writes the prefix only when
            # non-empty (templates/configmap.yaml). The template names each stream; a record it
            # cannot resolve (no Kubernetes metadata) goes to "unresolved-<tag>" instead.
            "logStreamPrefix": "unresolved-",
            # log_stream_name(): the job client reads past attempts by this name (jobs/past_logs.py).
            "logStreamTemplate": "$kubernetes['namespace_name'].$kubernetes['pod_name'].$kubernetes['container_name']",
        },
        "serviceAccount": {"create": True, "name": SERVICE_ACCOUNT},
        # Every node, the tainted GPU nodes (GPU, FSx startup) and system nodes included.
        "tolerations": [{"operator": "Exists"}],
    }


@dataclass(frozen=True)
class ContainerLogArchiveArgs:
    """In the logging account: the destination the workload account's filter sends to.

    bucket / key: the log archive's bucket and its KMS key. source_account_id: the workload
    account (the only one the destination admits). region: the log group's region.
    """

    bucket: aws.s3.Bucket
    key: aws.kms.Key
    source_account_id: str
    region: str
    tags: Mapping[str, str] = field(default_factory=dict)


class ContainerLogArchive(pulumi.ComponentResource):
    def __init__(self, name: str, args: ContainerLogArchiveArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:container_logs:ContainerLogArchive", name, None, opts)
        tags = dict(args.tags)
        child = pulumi.ResourceOptions(parent=self)
        firehose_role = aws.iam.Role(f"{name}-firehose-role", name=fitted_name(f"{name}-firehose-role", IAM_ROLE_NAME_MAX), tags=tags, opts=child, assume_role_policy=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": "firehose.amazonaws.com"},
                                                    "Action": "sts:AssumeRole"}]}))
        aws.iam.RolePolicy(f"{name}-firehose-write", role=firehose_role.id, opts=pulumi.ResourceOptions(parent=firehose_role),
                           policy=pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": [
                               {"Effect": "Allow", "Action": ["s3:PutObject", "s3:AbortMultipartUpload"],
                                "Resource": pulumi.Output.concat(args.bucket.arn, "/", ARCHIVE_PREFIX, "*")},
                               {"Effect": "Allow", "Action": ["s3:GetBucketLocation", "s3:ListBucket"],
                                "Resource": args.bucket.arn},
                               {"Effect": "Allow", "Action": ["kms:GenerateDataKey", "kms:Decrypt"],
                                "Resource": args.key.arn}]}))
        self.stream = aws.kinesis.FirehoseDeliveryStream(
            f"{name}-stream", destination="extended_s3", tags=tags, opts=child,
            extended_s3_configuration={"role_arn": firehose_role.arn, "bucket_arn": args.bucket.arn,
                                       "prefix": ARCHIVE_PREFIX, "error_output_prefix": f"{ARCHIVE_PREFIX}errors/",
                                       "kms_key_arn": args.key.arn, "compression_format": "UNCOMPRESSED",
                                       "buffering_interval": 300, "buffering_size": 5})
        logs_role = aws.iam.Role(f"{name}-logs-role", name=fitted_name(f"{name}-logs-role", IAM_ROLE_NAME_MAX), tags=tags, opts=child, assume_role_policy=json.dumps({
            "Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Principal": {"Service": "logs.amazonaws.com"}, "Action": "sts:AssumeRole",
                # Confused deputy: only subscriptions of the workload account's log groups.
                "Condition": {"StringEquals": {"aws:SourceAccount": args.source_account_id}}}]}))
        aws.iam.RolePolicy(f"{name}-logs-put", role=logs_role.id, opts=pulumi.ResourceOptions(parent=logs_role),
                           policy=pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": [{
                               "Effect": "Allow", "Action": ["firehose:PutRecord", "firehose:PutRecordBatch"],
                               "Resource": self.stream.arn}]}))
        self.destination = aws.cloudwatch.LogDestination(
            f"{name}-destination", name=f"{name}-containers", role_arn=logs_role.arn, target_arn=self.stream.arn,
            tags=tags, opts=child)
        self.destination_policy = aws.cloudwatch.LogDestinationPolicy(
            f"{name}-destination-policy", destination_name=self.destination.name, opts=child,
            access_policy=pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Principal": {"AWS": args.source_account_id},
                "Action": "logs:PutSubscriptionFilter", "Resource": self.destination.arn}]}))
        self.register_outputs({"destination_arn": self.destination.arn})


@dataclass(frozen=True)
class ContainerLogsArgs:
    """cluster: the platform cluster. region: Fluent Bit's CloudWatch region.
    retention_days: the log group's retention. log_kms_key: the account's log key (must admit
    ``log_group_name(cluster name)``). archive: the logging account's destination, or None.
    charts: where the charts come from (upstream by default, or the stack's verified chart mirror).
    """

    cluster: Cluster
    region: str
    retention_days: int
    log_kms_key: Optional[aws.kms.Key] = None
    archive: Optional[ContainerLogArchive] = None
    tags: Mapping[str, str] = field(default_factory=dict)
    charts: ChartSource = ChartSource()


class ContainerLogs(pulumi.ComponentResource):
    def __init__(self, name: str, args: ContainerLogsArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:container_logs:ContainerLogs", name, None, opts)
        cluster = args.cluster
        tags = dict(args.tags)
        self.log_group = aws.cloudwatch.LogGroup(
            f"{name}-group", name=log_group_name(cluster.args.cluster_name), retention_in_days=args.retention_days,
            kms_key_id=args.log_kms_key.arn if args.log_kms_key is not None else None, tags=tags,
            opts=pulumi.ResourceOptions(parent=self))
        role = pod_identity_role(f"{name}-fluent-bit", cluster_arn=cluster.eks_cluster.eks_cluster.arn,
                                 namespace=NAMESPACE, service_account=SERVICE_ACCOUNT, parent=self, tags=tags)
        aws.iam.RolePolicy(f"{name}-fluent-bit-write", role=role.id, opts=pulumi.ResourceOptions(parent=role),
                           policy=pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": [{
                               "Effect": "Allow",
                               "Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                               "Resource": [self.log_group.arn, pulumi.Output.concat(self.log_group.arn, ":*")]}]}))
        identity = aws.eks.PodIdentityAssociation(
            f"{name}-fluent-bit-identity", cluster_name=cluster.cluster_name, namespace=NAMESPACE,
            service_account=SERVICE_ACCOUNT, role_arn=role.arn, tags=tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[cluster.addons["eks-pod-identity-agent"]]))
        spec = SystemNamespaceSpec(
            name=NAMESPACE, pod_security=PodSecurityLevel.PRIVILEGED, pod_security_reason=POD_SECURITY_REASON,
            vpc_cidr=cluster.vpc_cidr, service_cidr=cluster.service_cidr,
            metrics_ports=(FLUENT_BIT_METRICS_PORT,), uses_aws=True)
        self.namespace, self.network_policies = apply_namespace_objects(name, namespace_objects(spec), self)
        self.release = helm_addon(
            f"{name}-fluent-bit", parent=self, cluster=cluster, release=RELEASE, chart=AWS_FOR_FLUENT_BIT,
            source=args.charts, namespace=NAMESPACE,
            values=helm_values(region=args.region, group=self.log_group.name),
            depends_on=[self.namespace, *self.network_policies, identity, self.log_group])
        self.subscription: Optional[aws.cloudwatch.LogSubscriptionFilter] = None
        if args.archive is not None:
            self.subscription = aws.cloudwatch.LogSubscriptionFilter(
                f"{name}-to-archive", log_group=self.log_group.name, filter_pattern="",
                destination_arn=args.archive.destination.arn,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[args.archive.destination_policy]))
        self.register_outputs({"log_group": self.log_group.name})
