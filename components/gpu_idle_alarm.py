"""A CloudWatch alarm for GPU nodes that hold no GPU work for longer than N minutes, by e-mail.

"Idle" is a GPU node on which no pod holds a GPU: every training pod on it finished, failed or
was never scheduled, yet the node is still there (a pod with ``karpenter.sh/do-not-disrupt``, a
pool with ``consolidateAfter: Never``, a stuck drain). Karpenter removes an empty GPU node after
its pool's ``consolidateAfter``; the alarm catches the ones it does not, before they cost a day.

The metric is Container Insights' ``node_gpu_reserved_capacity``: the percentage of a node's
``nvidia.com/gpu`` capacity that its non-terminated pods request, computed by the CloudWatch
agent from the Kubernetes API and published once a minute per GPU node (nodes without GPU
capacity publish none). Each node's value also lands in the cluster-wide series (dimension
``ClusterName`` only; amazon-cloudwatch-agent ``awsemf/kubernetes.go``), so that series'
``Minimum`` over a minute is the least-reserved GPU node of the cluster: 0 means some GPU node
had nothing on its GPUs. The alarm fires when that holds for N consecutive minutes; with no GPU
node there is no data, which counts as fine (scale-to-zero is the normal state).

Missing data has two causes CloudWatch cannot tell apart on that series: no GPU node (fine), or
no agent (Container Insights stopped publishing: the idle alarm would be blind). So the agent's own
pulse has an alarm that breaches on missing data: ``cluster_node_count`` (dimension ClusterName),
which the agent publishes every minute for as long as it runs and the cluster has nodes (the
system node group always does), ``treat_missing_data=breaching`` (CloudWatch User Guide,
"Configuring how CloudWatch alarms treat missing data": missing datapoints are treated as
breaching the threshold).

The platform's dead man's switch lives here too (``heartbeat_minutes``): Alertmanager sends its
always-firing ``Watchdog`` alert to a heartbeat topic every few minutes
(workloads/monitoring/stack.py), and an alarm on that topic's ``AWS/SNS NumberOfMessagesPublished``
breaches when the publishes stop. SNS pushes its metrics every five minutes and only for a topic
with activity (SNS Developer Guide, "Monitoring Amazon SNS topics using CloudWatch"), so no
publishes is no data, which breaches: a dead Prometheus, Alertmanager, or their path to SNS pages
the same people the alerts would have.

Notifications go through an SNS topic encrypted with its own key. CloudWatch needs the key and
the topic to admit ``cloudwatch.amazonaws.com``; both are scoped to this alarm's ARN and
account (SNS Developer Guide, "Enable compatibility between event sources from AWS services and
encrypted topics"; CloudWatch User Guide, confused deputy prevention).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Optional, Sequence

import pulumi
import pulumi_aws as aws

from components.container_insights import ContainerInsights
from components.kms import create_key
from workloads.problems import Problem, raise_if_any

METRIC_NAMESPACE = "ContainerInsights"
METRIC_NAME = "node_gpu_reserved_capacity"
PERIOD_SECONDS = 60
# The agent's pulse (amazon-cloudwatch-agent awsemf/kubernetes.go, cluster metrics): published
# every minute while it runs; ten silent minutes page (a restart or a missed minute does not).
SOURCE_METRIC_NAME = "cluster_node_count"
SOURCE_SILENT_MINUTES = 10
# The heartbeat: SNS's metrics period (five minutes).
SNS_METRIC_NAMESPACE = "AWS/SNS"
SNS_PUBLISHED = "NumberOfMessagesPublished"
SNS_PERIOD_SECONDS = 300
MIN_HEARTBEAT_MINUTES, MAX_HEARTBEAT_MINUTES = 15, 1440
# botocore's CloudWatch model, PutMetricAlarm ``Period``: with a period under an hour,
# Period x EvaluationPeriods cannot exceed one day (86,400 s).
MAX_IDLE_MINUTES = 86_400 // PERIOD_SECONDS
CLOUDWATCH_SERVICE = "cloudwatch.amazonaws.com"


def idle_alarm_problems(*, minutes_path: str, idle_minutes: int, emails_path: str,
                        alert_emails: Sequence[str]) -> Iterator[Problem]:
    if not 1 <= idle_minutes <= MAX_IDLE_MINUTES:
        yield Problem(minutes_path, idle_minutes,
                      f"a one-minute alarm can evaluate at most {MAX_IDLE_MINUTES} minutes (one day, CloudWatch's limit)",
                      f"use 1 to {MAX_IDLE_MINUTES} minutes, e.g. 60")
    bad = malformed_emails(alert_emails)
    if not alert_emails or bad:
        yield Problem(emails_path, list(alert_emails) if not bad else bad,
                      "the alarm needs at least one e-mail address to notify",
                      "list addresses such as ml-platform-oncall@example.com")


def malformed_emails(emails: Sequence[str]) -> list[str]:
    return [e for e in emails if e.count("@") != 1 or e.startswith("@") or e.endswith("@") or " " in e]


@dataclass(frozen=True)
class GpuIdleAlarmArgs:
    """Args of ``GpuIdleAlarm``.

    container_insights: the Container Insights install whose metric the alarm watches (its
        cluster name is the metric's ``ClusterName``).
    idle_minutes: how long a GPU node may hold no GPU work before the alarm fires.
    alert_emails: who is told (each confirms the SNS subscription once).
    protect: keep the topic's key from being deleted by a stack change (prod).
    heartbeat_minutes: the dead man's switch: alert when the heartbeat topic has had no publish
        (Alertmanager's Watchdog) for this long; None: no heartbeat topic.
    """

    container_insights: ContainerInsights
    idle_minutes: int
    alert_emails: Sequence[str]
    protect: bool = False
    heartbeat_minutes: Optional[int] = None
    tags: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = list(idle_alarm_problems(
            minutes_path="GpuIdleAlarmArgs.idle_minutes", idle_minutes=self.idle_minutes,
            emails_path="GpuIdleAlarmArgs.alert_emails", alert_emails=self.alert_emails))
        if self.heartbeat_minutes is not None and not (
                MIN_HEARTBEAT_MINUTES <= self.heartbeat_minutes <= MAX_HEARTBEAT_MINUTES
                and self.heartbeat_minutes % (SNS_PERIOD_SECONDS // 60) == 0):
            problems.append(Problem("GpuIdleAlarmArgs.heartbeat_minutes", self.heartbeat_minutes,
                                    f"is not a multiple of SNS's {SNS_PERIOD_SECONDS // 60}-minute metric period in "
                                    f"{MIN_HEARTBEAT_MINUTES}..{MAX_HEARTBEAT_MINUTES}", "use e.g. 15"))
        raise_if_any("GpuIdleAlarmArgs", problems)


def email_suffix(email: str) -> str:
    # Stable per address, so reordering the list does not replace (and unconfirm) subscriptions.
    return hashlib.sha256(email.lower().encode()).hexdigest()[:8]


class GpuIdleAlarm(pulumi.ComponentResource):
    """Alarm + encrypted SNS topic + e-mail subscriptions."""

    def __init__(self, name: str, args: GpuIdleAlarmArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:gpu_idle_alarm:GpuIdleAlarm", name, None, opts)
        tags = dict(args.tags)
        invoke = pulumi.InvokeOutputOptions(parent=self)
        partition = aws.get_partition_output(opts=invoke).partition
        region = aws.get_region_output(opts=invoke).region
        account_id = aws.get_caller_identity_output(opts=invoke).account_id
        alarm_name = name
        alarm_names = [alarm_name, f"{name}-metrics", *([f"{name}-heartbeat"] if args.heartbeat_minutes else [])]
        alarm_arns = [pulumi.Output.concat("arn:", partition, ":cloudwatch:", region, ":", account_id, ":alarm:", n)
                      for n in alarm_names]
        # CloudWatch publishes for this component's alarms only (confused deputy prevention).
        from_this_alarm = {"StringEquals": {"aws:SourceAccount": account_id},
                           "ArnLike": {"aws:SourceArn": alarm_arns[0] if len(alarm_arns) == 1 else alarm_arns}}

        self.key = create_key(
            f"{name}-topic", description=f"SNS topic of the {alarm_name} alarm", parent=self, tags=tags,
            protect=args.protect,
            service_statements=[{
                "Sid": "CloudWatchAlarmPublishes", "Effect": "Allow", "Principal": {"Service": CLOUDWATCH_SERVICE},
                "Action": ["kms:Decrypt", "kms:GenerateDataKey*"], "Resource": "*", "Condition": from_this_alarm,
            }],
        )
        self.topic = aws.sns.Topic(f"{name}-topic", name=alarm_name, kms_master_key_id=self.key.arn, tags=tags,
                                   opts=pulumi.ResourceOptions(parent=self))
        root = pulumi.Output.concat("arn:", partition, ":iam::", account_id, ":root")
        self.topic_policy = aws.sns.TopicPolicy(
            f"{name}-topic-policy", arn=self.topic.arn,
            policy=pulumi.Output.json_dumps(topic_policy(self.topic.arn, root, from_this_alarm)),
            opts=pulumi.ResourceOptions(parent=self.topic),
        )
        self.subscriptions = [
            aws.sns.TopicSubscription(f"{name}-email-{email_suffix(email)}", topic=self.topic.arn,
                                      protocol="email", endpoint=email, opts=pulumi.ResourceOptions(parent=self.topic))
            for email in args.alert_emails
        ]
        self.alarm = aws.cloudwatch.MetricAlarm(
            f"{name}-alarm", name=alarm_name,
            alarm_description=(f"A GPU node of this cluster has had no pod holding a GPU for {args.idle_minutes} minutes "
                               "and is still running (billed). Runbook: docs/runbooks/gpu-node-idle.md"),
            **alarm_settings(args.idle_minutes),
            dimensions={"ClusterName": args.container_insights.cluster_name},
            alarm_actions=[self.topic.arn], ok_actions=[self.topic.arn], tags=tags,
            # A notification needs the topic's policy and key; data needs the agent.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[
                self.topic_policy, self.key, args.container_insights.release]),
        )
        after_topic = pulumi.ResourceOptions(parent=self, depends_on=[self.topic_policy, self.key,
                                                                     args.container_insights.release])
        self.source_alarm = aws.cloudwatch.MetricAlarm(
            f"{name}-metrics-alarm", name=alarm_names[1],
            alarm_description=(f"Container Insights has published no {SOURCE_METRIC_NAME} for {SOURCE_SILENT_MINUTES} "
                               "minutes: the CloudWatch agent is down, and the GPU idle alarm sees nothing. "
                               "Runbook: docs/runbooks/alerting.md"),
            **source_alarm_settings(), dimensions={"ClusterName": args.container_insights.cluster_name},
            alarm_actions=[self.topic.arn], ok_actions=[self.topic.arn], tags=tags, opts=after_topic)
        self.heartbeat_topic: Optional[aws.sns.Topic] = None
        self.heartbeat_alarm: Optional[aws.cloudwatch.MetricAlarm] = None
        if args.heartbeat_minutes:
            # Alertmanager publishes here (its Pod Identity role: sns:Publish, and the key through IAM).
            self.heartbeat_topic = aws.sns.Topic(f"{name}-heartbeat-topic", name=f"{name}-heartbeat",
                                                 kms_master_key_id=self.key.arn, tags=tags,
                                                 opts=pulumi.ResourceOptions(parent=self))
            self.heartbeat_alarm = aws.cloudwatch.MetricAlarm(
                f"{name}-heartbeat-alarm", name=alarm_names[2],
                alarm_description=(f"The platform's alerting is silent: Alertmanager's Watchdog has not reached SNS "
                                   f"for {args.heartbeat_minutes} minutes (Prometheus, Alertmanager or their "
                                   "publish path is down: no other alert would reach you). "
                                   "Runbook: docs/runbooks/alerting.md"),
                **heartbeat_alarm_settings(args.heartbeat_minutes),
                dimensions={"TopicName": self.heartbeat_topic.name},
                alarm_actions=[self.topic.arn], ok_actions=[self.topic.arn], tags=tags, opts=after_topic)
        self.register_outputs({"alarm_arn": self.alarm.arn, "topic_arn": self.topic.arn,
                               "heartbeat_topic_arn": self.heartbeat_topic.arn if self.heartbeat_topic else None})


def alarm_settings(idle_minutes: int) -> dict[str, Any]:
    """The metric and evaluation of the alarm (``aws.cloudwatch.MetricAlarm`` keyword args)."""
    return {
        "namespace": METRIC_NAMESPACE, "metric_name": METRIC_NAME, "statistic": "Minimum",
        "period": PERIOD_SECONDS, "evaluation_periods": idle_minutes, "datapoints_to_alarm": idle_minutes,
        "comparison_operator": "LessThanOrEqualToThreshold", "threshold": 0.0,
        "treat_missing_data": "notBreaching",
    }


def source_alarm_settings() -> dict[str, Any]:
    """The agent's pulse: missing data is the failure this alarm exists for."""
    return {
        "namespace": METRIC_NAMESPACE, "metric_name": SOURCE_METRIC_NAME, "statistic": "SampleCount",
        "period": PERIOD_SECONDS, "evaluation_periods": SOURCE_SILENT_MINUTES, "datapoints_to_alarm": SOURCE_SILENT_MINUTES,
        "comparison_operator": "LessThanThreshold", "threshold": 1.0, "treat_missing_data": "breaching",
    }


def heartbeat_alarm_settings(minutes: int) -> dict[str, Any]:
    """No publish to the heartbeat topic for ``minutes``: missing data breaches (the switch)."""
    periods = minutes // (SNS_PERIOD_SECONDS // 60)
    return {
        "namespace": SNS_METRIC_NAMESPACE, "metric_name": SNS_PUBLISHED, "statistic": "Sum",
        "period": SNS_PERIOD_SECONDS, "evaluation_periods": periods, "datapoints_to_alarm": periods,
        "comparison_operator": "LessThanThreshold", "threshold": 1.0, "treat_missing_data": "breaching",
    }


def topic_policy(topic_arn: pulumi.Input[str], account_root: pulumi.Input[str],
                 from_this_alarm: Mapping[str, Any]) -> dict[str, Any]:
    """The account administers the topic; CloudWatch may publish for this alarm only."""
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "AccountAdministers", "Effect": "Allow", "Principal": {"AWS": account_root},
         "Action": ["SNS:GetTopicAttributes", "SNS:SetTopicAttributes", "SNS:AddPermission", "SNS:RemovePermission",
                    "SNS:DeleteTopic", "SNS:Subscribe", "SNS:ListSubscriptionsByTopic", "SNS:Publish"],
         "Resource": topic_arn},
        {"Sid": "CloudWatchAlarmPublishes", "Effect": "Allow", "Principal": {"Service": CLOUDWATCH_SERVICE},
         "Action": "SNS:Publish", "Resource": topic_arn, "Condition": dict(from_this_alarm)},
    ]}
