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
    """

    container_insights: ContainerInsights
    idle_minutes: int
    alert_emails: Sequence[str]
    protect: bool = False
    tags: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        raise_if_any("GpuIdleAlarmArgs", list(idle_alarm_problems(
            minutes_path="GpuIdleAlarmArgs.idle_minutes", idle_minutes=self.idle_minutes,
            emails_path="GpuIdleAlarmArgs.alert_emails", alert_emails=self.alert_emails)))


def _email_suffix(email: str) -> str:
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
        alarm_arn = pulumi.Output.concat("arn:", partition, ":cloudwatch:", region, ":", account_id, ":alarm:", alarm_name)
        from_this_alarm = {"StringEquals": {"aws:SourceAccount": account_id}, "ArnLike": {"aws:SourceArn": alarm_arn}}

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
            aws.sns.TopicSubscription(f"{name}-email-{_email_suffix(email)}", topic=self.topic.arn,
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
        self.register_outputs({"alarm_arn": self.alarm.arn, "topic_arn": self.topic.arn})


def alarm_settings(idle_minutes: int) -> dict[str, Any]:
    """The metric and evaluation of the alarm (``aws.cloudwatch.MetricAlarm`` keyword args)."""
    return {
        "namespace": METRIC_NAMESPACE, "metric_name": METRIC_NAME, "statistic": "Minimum",
        "period": PERIOD_SECONDS, "evaluation_periods": idle_minutes, "datapoints_to_alarm": idle_minutes,
        "comparison_operator": "LessThanOrEqualToThreshold", "threshold": 0.0,
        "treat_missing_data": "notBreaching",
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
