"""Container logs: Fluent Bit on every node (GPU nodes included) to CloudWatch, encrypted with the
account's log key and kept ``retention_days``, then copied to the log-archive account through a
CloudWatch Logs destination there (Firehose into the archive bucket).

One group per team namespace (``team_log_group_name``), one for everything else (the platform's
namespaces): CloudWatch Logs authorises reads per log group (``logs:FilterLogEvents`` has no
per-stream condition), so a team member may read the team's own containers and no other team's.
Each team's read policy is attached to the team's roles (``scheduling.teams[].roleArns``); the
cluster's admin roles get one for every group. Records of team namespaces are re-tagged by a
``rewrite_tag`` filter and leave through a second CloudWatch output whose
``log_group_template`` names the team's group (the chart's own output keeps ``kube.*``: the
platform's namespaces).

Fluent Bit is AWS's build (eks-charts ``aws-for-fluent-bit`` 0.2.0, AWS for Fluent Bit 3.2.1);
its Kubernetes filter adds the pod's namespace, name, container and labels (the PyTorchJob's
job name and replica index) to each record; the trainer prefixes every line with ``[rank N]``.
The chart may not create the group (``autoCreateGroup: false``): the platform creates it first,
with retention and key.

Cross-account: a subscription filter in the workload account sends to a
``aws.cloudwatch.LogDestination`` in the logging account, whose policy admits only the workload
account; the destination's role puts records into a Firehose stream that writes to the archive
bucket under ``container-logs/``. This is the CloudWatch Logs User Guide's layout ("Cross-account
cross-Region subscriptions using Firehose"), with its trust policy for the destination's role
(``destination_role_trust``: log ARNs of both accounts).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import pulumi
import pulumi_aws as aws

from catalog.regions import partition_of
from components.helm_addon import helm_addon
from components.cluster import Cluster
from components.k8s import apply_namespace_objects
from components.charts import ChartSource
from catalog.versions import AWS_FOR_FLUENT_BIT
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


def team_log_group_name(cluster_group: str, namespace: str) -> str:
    """The group of one team namespace's containers, under the cluster's group name:
    ``/aws/eks/<cluster>/containers/<namespace>``. Its ARN names it whole, so a read policy on it
    (``...:log-group:<name>:*``) reaches neither the platform's group nor another team's."""
    return f"{cluster_group}/{namespace}"


# Fluent Bit's tail input tags each record kube.var.log.containers.<pod>_<namespace>_<container>-<id>.log
# (chart input.tag "kube.*"); a team namespace's records are re-emitted as team.<that tag>.
TEAM_TAG_PREFIX = "team."
# The cloudwatch_logs output refuses to start without log_stream_name or log_stream_prefix (fluent-bit
# plugins/out_cloudwatch_logs/cloudwatch_logs.c ``cb_cloudwatch_init``); the template wins whenever it
# resolves, so the prefix only names streams of records without Kubernetes metadata.
TEAM_STREAM_FALLBACK_PREFIX = "unresolved-"
NAMESPACE_ACCESSOR = "$kubernetes['namespace_name']"  # Fluent Bit record accessor
STREAM_TEMPLATE = f"{NAMESPACE_ACCESSOR}.$kubernetes['pod_name'].$kubernetes['container_name']"


def team_routing(*, region: str, cluster_group: str, team_namespaces: list[str]) -> dict[str, str]:
    """The chart's ``additionalFilters`` and ``additionalOutputs`` (raw Fluent Bit configuration,
    aws-for-fluent-bit 0.2.0 templates/configmap.yaml) that send each team namespace's records to
    its own group. ``rewrite_tag`` (Fluent Bit filter: ``Rule $KEY REGEX NEW_TAG KEEP``; KEEP false
    drops the original) runs after the kubernetes filter, which supplies ``namespace_name``; the
    namespaces are listed exactly, so a record lands in a team's group only if it is that team's."""
    if not team_namespaces:
        return {}
    names = "|".join(sorted(team_namespaces))
    filters = (
        "[FILTER]\n"
        "    Name          rewrite_tag\n"
        "    Match         kube.*\n"
        f"    Rule          $kubernetes['namespace_name'] ^({names})$ {TEAM_TAG_PREFIX}$TAG false\n"
        "    Emitter_Name  team_namespaces\n")
    outputs = (
        "[OUTPUT]\n"
        "    Name                  cloudwatch_logs\n"
        f"    Match                 {TEAM_TAG_PREFIX}*\n"
        f"    region                {region}\n"
        f"    log_group_name        {cluster_group}\n"
        f"    log_group_template    {team_log_group_name(cluster_group, NAMESPACE_ACCESSOR)}\n"
        f"    log_stream_prefix     {TEAM_STREAM_FALLBACK_PREFIX}\n"
        f"    log_stream_template   {STREAM_TEMPLATE}\n"
        "    auto_create_group     false\n")
    return {"additionalFilters": filters, "additionalOutputs": outputs}


def logs_read_policy(group_arns: list) -> dict[str, Any]:
    """Read one's own container logs (jobs/past_logs.py: FilterLogEvents by stream prefix)."""
    def streams(arn: Any) -> Any:
        return f"{arn}:*" if isinstance(arn, str) else pulumi.Output.concat(arn, ":*")

    resources = [r for arn in group_arns for r in (arn, streams(arn))]
    return {"Version": "2012-10-17", "Statement": [{
        "Sid": "ReadContainerLogs", "Effect": "Allow",
        "Action": ["logs:FilterLogEvents", "logs:GetLogEvents", "logs:DescribeLogStreams"], "Resource": resources}]}


def log_stream_name(namespace: str, pod: str, container: str) -> str:
    """The stream of one container of one pod: ``logStreamTemplate`` below, filled in."""
    return f"{namespace}.{pod}.{container}"


def helm_values(*, region: str, group: pulumi.Input[str], cluster_group: str = "",
                team_namespaces: tuple[str, ...] = ()) -> dict[str, Any]:
    """Values of aws-for-fluent-bit 0.2.0 (keys as in its values.yaml). ``cluster_group``: the
    platform group's name as plain text (the team output's fallback and its groups' prefix)."""
    values: dict[str, Any] = {
        "cloudWatchLogs": {
            "enabled": True, "region": region, "logGroupName": group, "autoCreateGroup": False,
            # The platform's namespaces; team namespaces' records were re-tagged team.* (team_routing).
            "match": "kube.*",
            # Fluent Bit refuses to start without log_stream_name or log_stream_prefix, template or
            # not (out_cloudwatch_logs cb_cloudwatch_init), and the chart writes the prefix only when
            # non-empty (templates/configmap.yaml). The template names each stream; a record it
            # cannot resolve (no Kubernetes metadata) goes to "unresolved-<tag>" instead.
            "logStreamPrefix": "unresolved-",
            # log_stream_name(): the job client reads past attempts by this name (jobs/past_logs.py).
            "logStreamTemplate": STREAM_TEMPLATE,
        },
        # A pod's fluentbit.io/exclude annotation would take its lines out of CloudWatch and the
        # archive, and fluentbit.io/parser would choose how they are read: the chart honours both by
        # default (values.yaml filter.k8sLoggingExclude/k8sLoggingParser "On"). Tenants annotate
        # their own pods, so neither is honoured.
        "filter": {"k8sLoggingExclude": "Off", "k8sLoggingParser": "Off"},
        "serviceAccount": {"create": True, "name": SERVICE_ACCOUNT},
        # Every node, the tainted GPU nodes (GPU, FSx startup) and system nodes included.
        "tolerations": [{"operator": "Exists"}],
    }
    values.update(team_routing(region=region, cluster_group=cluster_group, team_namespaces=list(team_namespaces)))
    return values


def destination_role_trust(*, partition: str, region: str, source_account_id: str, recipient_account_id: str) -> dict[str, Any]:
    """Trust of the destination's role: CloudWatch Logs, for log ARNs of the two accounts only.

    CloudWatch Logs User Guide, "Cross-account cross-Region subscriptions using Firehose", step 1:
    "When the destination is created, CloudWatch Logs sends a test message to the destination on
    the recipient account's behalf. When the subscription filter is active later, CloudWatch Logs
    sends log events to the destination on the source account's behalf." The guide's trust policy
    therefore lists both accounts' ``arn:<partition>:logs:<region>:<account>:*`` under
    ``aws:SourceArn`` ("Confused deputy prevention": it "must limit the permissions to only the
    accounts that are writing and receiving data"). Trusting the sender alone would refuse the
    creation-time test, and ``PutDestination`` with it."""
    return {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"Service": "logs.amazonaws.com"}, "Action": "sts:AssumeRole",
        "Condition": {"StringLike": {"aws:SourceArn": [
            f"arn:{partition}:logs:{region}:{source_account_id}:*",
            f"arn:{partition}:logs:{region}:{recipient_account_id}:*"]}}}]}


@dataclass(frozen=True)
class ContainerLogArchiveArgs:
    """In the logging account: the destination the workload account's filter sends to.

    bucket / key: the log archive's bucket and its KMS key. source_account_id: the workload
    account (the only one the destination admits). region: the log group's region.
    account_id: the logging account itself.
    """

    bucket: aws.s3.Bucket
    key: aws.kms.Key
    source_account_id: str
    region: str
    # The logging account (where the destination lives): CloudWatch Logs tests a new destination
    # on its behalf.
    account_id: str
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
        logs_role = aws.iam.Role(f"{name}-logs-role", name=fitted_name(f"{name}-logs-role", IAM_ROLE_NAME_MAX), tags=tags, opts=child,
                                 assume_role_policy=json.dumps(destination_role_trust(
                                     partition=partition_of(args.region), region=args.region,
                                     source_account_id=args.source_account_id, recipient_account_id=args.account_id)))
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
    retention_days: the log groups' retention. log_kms_key: the account's log key (must admit
    ``log_group_name(cluster name)`` and each ``team_log_group_name``). archive: the logging
    account's destination, or None. team_readers / admin_readers: who reads which group.
    charts: where the charts come from (upstream by default, or the stack's verified chart mirror).
    """

    cluster: Cluster
    region: str
    retention_days: int
    log_kms_key: Optional[aws.kms.Key] = None
    archive: Optional[ContainerLogArchive] = None
    # Team namespace -> the roles of that team's members (attached to its read policy; roles in
    # another account than the cluster's cannot read it and are left out by the caller).
    team_readers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # The cluster's admin roles (same account): one policy reads every container group.
    admin_readers: tuple[str, ...] = ()
    tags: Mapping[str, str] = field(default_factory=dict)
    charts: ChartSource = ChartSource()


class ContainerLogs(pulumi.ComponentResource):
    def __init__(self, name: str, args: ContainerLogsArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:container_logs:ContainerLogs", name, None, opts)
        cluster = args.cluster
        tags = dict(args.tags)
        cluster_group = log_group_name(cluster.args.cluster_name)
        key_id = args.log_kms_key.arn if args.log_kms_key is not None else None
        self.log_group = aws.cloudwatch.LogGroup(
            f"{name}-group", name=cluster_group, retention_in_days=args.retention_days,
            kms_key_id=key_id, tags=tags, opts=pulumi.ResourceOptions(parent=self))
        # Created before Fluent Bit writes (autoCreateGroup false): with retention and the key.
        self.team_groups: dict[str, aws.cloudwatch.LogGroup] = {
            namespace: aws.cloudwatch.LogGroup(
                f"{name}-{namespace}-group", name=team_log_group_name(cluster_group, namespace),
                retention_in_days=args.retention_days, kms_key_id=key_id, tags=tags,
                opts=pulumi.ResourceOptions(parent=self))
            for namespace in sorted(args.team_readers)}
        groups = [self.log_group, *self.team_groups.values()]
        write = pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": [{
            "Effect": "Allow",
            "Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
            "Resource": [arn for g in groups for arn in (g.arn, pulumi.Output.concat(g.arn, ":*"))]}]})
        identity = cluster.pod_identity(f"{name}-fluent-bit", namespace=NAMESPACE, service_account=SERVICE_ACCOUNT,
                                        parent=self, tags=tags, policies={"write": write}).association
        # Who reads what: each team its own group, the cluster's admins every group.
        self.read_policies: dict[str, aws.iam.Policy] = {}
        for namespace, group in self.team_groups.items():
            self.read_policies[namespace] = self._read_policy(f"{name}-{namespace}-read", [group], args.team_readers[namespace], tags)
        if args.admin_readers:
            self.read_policies["*"] = self._read_policy(f"{name}-all-read", groups, args.admin_readers, tags)
        spec = SystemNamespaceSpec(
            name=NAMESPACE, pod_security=PodSecurityLevel.PRIVILEGED, pod_security_reason=POD_SECURITY_REASON,
            vpc_cidr=cluster.vpc_cidr, service_cidr=cluster.service_cidr,
            metrics_ports=(FLUENT_BIT_METRICS_PORT,), uses_aws=True)
        self.namespace, self.network_policies = apply_namespace_objects(name, namespace_objects(spec), self)
        self.release = helm_addon(
            f"{name}-fluent-bit", parent=self, cluster=cluster, release=RELEASE, chart=AWS_FOR_FLUENT_BIT,
            source=args.charts, namespace=NAMESPACE,
            values=helm_values(region=args.region, group=self.log_group.name, cluster_group=cluster_group,
                               team_namespaces=tuple(sorted(self.team_groups))),
            depends_on=[self.namespace, *self.network_policies, identity, *groups])
        self.subscription: Optional[aws.cloudwatch.LogSubscriptionFilter] = None
        if args.archive is not None:
            self.subscription = aws.cloudwatch.LogSubscriptionFilter(
                f"{name}-to-archive", log_group=self.log_group.name, filter_pattern="",
                destination_arn=args.archive.destination.arn,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[args.archive.destination_policy]))
            for namespace, group in self.team_groups.items():
                aws.cloudwatch.LogSubscriptionFilter(
                    f"{name}-{namespace}-to-archive", log_group=group.name, filter_pattern="",
                    destination_arn=args.archive.destination.arn,
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[args.archive.destination_policy]))
        self.register_outputs({"log_group": self.log_group.name,
                               "team_log_groups": {ns: g.name for ns, g in self.team_groups.items()}})

    def _read_policy(self, name: str, groups: list[aws.cloudwatch.LogGroup], role_arns: tuple[str, ...],
                     tags: Mapping[str, str]) -> aws.iam.Policy:
        policy = aws.iam.Policy(name, description="Read container logs (python -m jobs logs --attempt)",
                                policy=pulumi.Output.json_dumps(logs_read_policy([g.arn for g in groups])),
                                tags=dict(tags), opts=pulumi.ResourceOptions(parent=self))
        for arn in sorted(set(role_arns)):
            role_name = arn.rsplit("/", 1)[-1]
            aws.iam.RolePolicyAttachment(f"{name}-{role_name}", role=role_name, policy_arn=policy.arn,
                                         opts=pulumi.ResourceOptions(parent=policy))
        return policy
