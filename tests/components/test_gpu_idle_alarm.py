"""The GPU idle alarm and its metric source (Container Insights), checked on both recorded stacks.

The alarm's behaviour is checked by evaluating the recorded alarm the way CloudWatch does
(statistic over a period's datapoints, M out of N, missing data) on minute-by-minute node
reservations; the delivery path by evaluating the recorded key and topic policies for the
request CloudWatch makes; the agent's install against what the chart and the agent document.
"""
from __future__ import annotations

import json
import statistics
from typing import Optional, Sequence

import pytest

from components.container_insights import AGENT_MANAGED_POLICY, AGENT_SERVICE_ACCOUNT, NAMESPACE, RELEASE
from components.gpu_idle_alarm import GpuIdleAlarmArgs
from workloads.problems import InvalidInputError
from catalog.versions import CLOUDWATCH_OBSERVABILITY_REPO, CLOUDWATCH_OBSERVABILITY_VERSION
from infra.config import ConfigError, load_platform_config
from infra.plan import account_of
from tests.conftest import stack_config
from tests.infra.test_security_aws import allows

ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
TOPIC = "aws:sns/topic:Topic"
TOPIC_POLICY = "aws:sns/topicPolicy:TopicPolicy"
SUBSCRIPTION = "aws:sns/topicSubscription:TopicSubscription"
KEY = "aws:kms/key:Key"
RELEASE_TYPE = "kubernetes:helm.sh/v3:Release"
CLOUDWATCH = ("Service", "cloudwatch.amazonaws.com")


def _alarm(plan, suffix: str = ""):
    """The GPU idle alarm (``suffix`` "-metrics": its source's pulse; "-heartbeat": the dead man's switch)."""
    name = f"{plan.config.name}-gpu-idle{suffix}"
    (alarm,) = [a for a in plan.recording.by_type(ALARM) if a.inputs["name"] == name]
    return alarm


def _topic(plan, suffix: str = ""):
    name = f"{plan.config.name}-gpu-idle{suffix}"
    (topic,) = [t for t in plan.recording.by_type(TOPIC) if t.inputs.get("name") == name]
    return topic


def _chart(plan):
    (release,) = [r for r in plan.recording.by_type(RELEASE_TYPE) if r.inputs.get("chart") == RELEASE]
    return release


# -- CloudWatch's alarm evaluation, as the CloudWatch User Guide describes it ------------------
# ("Evaluating an alarm", "Configuring how CloudWatch alarms treat missing data")
_STATISTICS = {"Minimum": min, "Maximum": max, "Average": statistics.mean, "Sum": sum,
               "SampleCount": len}
_COMPARE = {"LessThanOrEqualToThreshold": lambda v, t: v <= t, "LessThanThreshold": lambda v, t: v < t,
            "GreaterThanOrEqualToThreshold": lambda v, t: v >= t, "GreaterThanThreshold": lambda v, t: v > t}


def alarm_states(alarm: dict, minutes: Sequence[Sequence[float]]) -> list[str]:
    """The alarm's state after each minute, given every node's datapoints of that minute
    (an empty minute is missing data). Periods are one minute, as the recorded alarm says."""
    assert alarm["period"] == 60
    n, m = alarm["evaluationPeriods"], alarm.get("datapointsToAlarm", alarm["evaluationPeriods"])
    stat, compare = _STATISTICS[alarm["statistic"]], _COMPARE[alarm["comparisonOperator"]]
    treat = alarm.get("treatMissingData", "missing")
    breaching: list[Optional[bool]] = []
    states, state = [], "INSUFFICIENT_DATA"
    for values in minutes:
        if values:
            breaching.append(compare(stat(values), alarm["threshold"]))
        else:
            breaching.append({"breaching": True, "notBreaching": False}.get(treat))
        window = breaching[-n:]
        if treat in ("breaching", "notBreaching"):
            state = "ALARM" if sum(bool(b) for b in window) >= m else ("OK" if len(window) >= 1 else state)
        elif any(b is not None for b in window):
            state = "ALARM" if sum(bool(b) for b in window) >= m else "OK"
        states.append(state)
    return states


def test_the_evaluator_models_m_of_n_and_missing_data():
    alarm = {"period": 60, "evaluationPeriods": 3, "datapointsToAlarm": 2, "statistic": "Average",
             "comparisonOperator": "GreaterThanThreshold", "threshold": 5, "treatMissingData": "breaching"}
    assert alarm_states(alarm, [[10], [1], [10]])[-1] == "ALARM"
    assert alarm_states(alarm, [[10], [1], [1]])[-1] == "OK"
    assert alarm_states(alarm, [[], [], [1]])[-1] == "ALARM"
    assert alarm_states({**alarm, "treatMissingData": "notBreaching"}, [[], [], [1]])[-1] == "OK"


def test_alarm_fires_after_n_minutes_of_an_idle_gpu_node_and_not_before(plan):
    alarm = _alarm(plan).inputs
    n = plan.config.gpu_idle_alarm.idle_minutes
    busy, idle, half = 100.0, 0.0, 50.0
    # One node busy all along, one node whose job ended: idle from minute 0.
    states = alarm_states(alarm, [[busy, idle]] * (n + 2))
    assert states[n - 2] == "OK" and states[n - 1] == "ALARM", "must fire exactly when the node has been idle N minutes"
    # Idle for N-1 minutes, then a job lands on it: no alarm.
    assert "ALARM" not in alarm_states(alarm, [[busy, idle]] * (n - 1) + [[busy, busy]] * (n + 2))
    # Scaled to zero: no GPU node publishes anything; that is the normal state, not an alarm.
    assert "ALARM" not in alarm_states(alarm, [[]] * (2 * n + 5))
    # A node with half its GPUs requested is in use, not idle.
    assert "ALARM" not in alarm_states(alarm, [[busy, half]] * (2 * n))
    # The idle node is removed by Karpenter after a while: back to OK.
    assert alarm_states(alarm, [[busy, idle]] * n + [[busy]])[-1] == "OK"


def test_alarm_watches_this_clusters_gpu_reservation(plan):
    alarm = _alarm(plan)
    (cluster,) = plan.recording.by_type("eks:index:Cluster")
    assert alarm.inputs["namespace"] == "ContainerInsights"
    # Published only by nodes with nvidia.com/gpu capacity, per node and cluster-wide
    # (amazon-cloudwatch-agent awsemf/kubernetes.go, getNodeMetricDeclarations).
    assert alarm.inputs["metricName"] == "node_gpu_reserved_capacity"
    assert alarm.inputs["dimensions"] == {"ClusterName": cluster.inputs["name"]}
    values = _chart(plan).inputs["values"]
    # The agent names the ClusterName dimension after the chart's clusterName.
    assert values["clusterName"] == cluster.inputs["name"]
    assert values["region"] == plan.config.region
    # Same account and region as the cluster: CloudWatch alarms read their own account's metrics.
    assert account_of(alarm, plan.recording, plan.config) == account_of(cluster, plan.recording, plan.config)
    assert alarm.outputs["arn"].split(":")[3] == plan.config.region


def test_agent_publishes_the_gpu_metrics_and_nothing_that_bills_or_mutates_unasked(plan):
    release = _chart(plan)
    assert release.inputs["version"] == CLOUDWATCH_OBSERVABILITY_VERSION
    assert release.inputs["repositoryOpts"]["repo"] == CLOUDWATCH_OBSERVABILITY_REPO
    assert release.inputs["namespace"] == NAMESPACE
    values = release.inputs["values"]
    kubernetes = values["agent"]["config"]["logs"]["metrics_collected"]["kubernetes"]
    # node_gpu_* are declared only with both flags on (kubernetes.go).
    assert kubernetes["enhanced_container_insights"] is True and kubernetes["accelerated_compute_metrics"] is True
    # Fluent Bit would auto-create log groups without retention or KMS.
    assert values["containerLogs"]["enabled"] is False
    # Application Signals' auto-monitor instruments every workload of the cluster: the explicit
    # agent config (which replaces the chart's default) collects none of it. The rendered operator
    # flags are checked in tests/infra/test_chart_render.py.
    assert "application_signals" not in json.dumps(values["agent"]["config"]) and "traces" not in values["agent"]["config"]
    # One DCGM host engine per GPU: the platform's exporter or the chart's, never both.
    ours = [r for r in plan.recording.by_type(RELEASE_TYPE)
            if r.inputs.get("chart") in ("dcgm-exporter", "gpu-operator")]
    assert ours, "the platform runs its own DCGM exporter in both stacks"
    assert values["dcgmExporter"]["enabled"] is False
    # The operator must run on the tainted system nodes (its own toleration list defaults to []).
    taints = {t["key"] for t in values["manager"]["tolerations"]}
    assert "CriticalAddonsOnly" in taints and values["manager"]["nodeSelector"]


def test_agent_credentials_are_its_own_and_in_place_before_it_starts(plan):
    release = _chart(plan)
    (association,) = [a for a in plan.recording.by_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
                      if a.inputs["namespace"] == NAMESPACE]
    assert association.inputs["serviceAccount"] == AGENT_SERVICE_ACCOUNT
    assert association.urn in release.dependencies
    role = plan.recording.resolve(association.inputs["roleArn"])
    attachments = [a for a in plan.recording.by_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
                   if a.inputs["role"] == role.outputs.get("name", role.id)]
    assert [a.inputs["policyArn"] for a in attachments] == [f"arn:aws:iam::aws:policy/{AGENT_MANAGED_POLICY}"]
    node_group = plan.recording.one("aws:eks/nodeGroup:NodeGroup")
    coredns = [a for a in plan.recording.by_type("aws:eks/addon:Addon") if a.inputs["addonName"] == "coredns"]
    assert node_group.urn in release.dependencies and coredns[0].urn in release.dependencies
    # The alarm waits for its data source.
    assert release.urn in _alarm(plan).dependencies


def test_agent_writes_into_a_log_group_made_before_it_with_retention_and_key(plan):
    """The agent's awsemf exporter writes /aws/containerinsights/<ClusterName>/performance and
    creates it when missing, with no retention and no key (awsemf_default_kubernetes.yaml)."""
    release = _chart(plan)
    name = f"/aws/containerinsights/{release.inputs['values']['clusterName']}/performance"
    (group,) = [g for g in plan.recording.by_type("aws:cloudwatch/logGroup:LogGroup") if g.inputs["name"] == name]
    assert group.urn in release.dependencies
    assert group.inputs["retentionInDays"] == plan.config.gpu_idle_alarm.log_retention_days
    assert group.inputs.get("kmsKeyId"), "encrypted with the platform's log key (which must admit it)"


def test_only_this_alarm_can_notify_through_the_encrypted_topic(plan):
    alarm = _alarm(plan)
    topic = _topic(plan)
    (topic_policy,) = plan.recording.by_type(TOPIC_POLICY)
    alarm_arn, topic_arn = alarm.outputs["arn"], topic.outputs["arn"]
    account = alarm_arn.split(":")[4]
    assert alarm.inputs["alarmActions"] == [topic_arn] and alarm.inputs["okActions"] == [topic_arn]
    assert topic_policy.inputs["arn"] == topic_arn
    ours = {"aws:SourceArn": alarm_arn, "aws:SourceAccount": account}
    # Another alarm of the account, even one whose name starts with ours, may not use the topic.
    other_alarm = {**ours, "aws:SourceArn": alarm_arn + "-copy"}
    other_account = {**ours, "aws:SourceAccount": "999999999999"}

    policy = json.loads(topic_policy.inputs["policy"])
    assert allows(policy, principal=CLOUDWATCH, action="SNS:Publish", resource=topic_arn, context=ours)
    assert not allows(policy, principal=CLOUDWATCH, action="SNS:Publish", resource=topic_arn, context=other_alarm)
    assert not allows(policy, principal=CLOUDWATCH, action="SNS:Publish", resource=topic_arn, context=other_account)

    # SNS encrypts with the topic's key on CloudWatch's behalf: the key must admit CloudWatch
    # for this alarm (SNS Developer Guide, compatibility with AWS services' event sources).
    (key,) = [k for k in plan.recording.by_type(KEY) if k.outputs["arn"] == topic.inputs["kmsMasterKeyId"]]
    key_policy = json.loads(key.inputs["policy"])
    for action in ("kms:GenerateDataKey", "kms:Decrypt"):
        assert allows(key_policy, principal=CLOUDWATCH, action=action, resource=key.outputs["arn"], context=ours)
        assert not allows(key_policy, principal=CLOUDWATCH, action=action, resource=key.outputs["arn"], context=other_alarm)
    assert key.inputs["enableKeyRotation"] is True

    subscriptions = [s for s in plan.recording.by_type(SUBSCRIPTION) if s.inputs["topic"] == topic_arn]
    assert sorted(s.inputs["endpoint"] for s in subscriptions) == sorted(plan.config.gpu_idle_alarm.alert_emails)
    assert all(s.inputs["protocol"] == "email" and s.inputs["topic"] == topic_arn for s in subscriptions)


def _with_alarm(**alarm):
    raw = stack_config("dev")
    raw["gpuIdleAlarm"] = {**raw["gpuIdleAlarm"], **alarm}
    return raw


def test_alarm_shorter_than_a_pools_consolidation_is_refused_with_the_minimum():
    raw = _with_alarm(idleMinutes=5)
    with pytest.raises(ConfigError) as info:
        load_platform_config(raw)
    text = str(info.value)
    pool = raw["gpuPools"][0]
    assert "gpuIdleAlarm.idleMinutes" in text and pool["name"] in text and pool["consolidateAfter"] in text
    # consolidateAfter 5m + 5 minutes to drain and report.
    assert "at least 10" in text
    load_platform_config(_with_alarm(idleMinutes=10))


def test_bad_alarm_settings_are_refused_all_at_once():
    with pytest.raises(ConfigError) as info:
        load_platform_config(_with_alarm(idleMinutes=1441, alertEmails=["not-an-address"], logRetentionDays=13, extra=1))
    text = str(info.value)
    for expected in ("gpuIdleAlarm.idleMinutes", "1441", "gpuIdleAlarm.alertEmails", "not-an-address",
                     "gpuIdleAlarm.logRetentionDays", "extra"):
        assert expected in text, expected
    assert "Traceback" not in text


def test_prod_keeps_the_performance_logs_a_year():
    raw = stack_config("prod")
    raw["gpuIdleAlarm"] = {**raw["gpuIdleAlarm"], "logRetentionDays": 30}
    with pytest.raises(ConfigError, match="gpuIdleAlarm.logRetentionDays"):
        load_platform_config(raw)


def test_never_consolidating_pool_is_warned_about(plan_config):
    raw = stack_config("dev")
    raw["gpuPools"][0]["consolidateAfter"] = "Never"
    warnings = plan_config("dev", raw).warnings
    assert any(raw["gpuPools"][0]["name"] in w and "GPU idle alarm" in w for w in warnings)


def test_args_validate_before_any_resource():
    with pytest.raises(InvalidInputError) as info:
        GpuIdleAlarmArgs(container_insights=object(), idle_minutes=0, alert_emails=[])
    assert "idle_minutes" in str(info.value) and "alert_emails" in str(info.value)


# -- watching the watchers -----------------------------------------------------------------------
def period_states(alarm: dict, periods: Sequence[Sequence[float]]) -> list[str]:
    """``alarm_states`` for any period: each entry is one period's datapoints."""
    return alarm_states({**alarm, "period": 60}, periods)


def test_a_dead_agent_pages_though_the_idle_alarm_counts_missing_data_as_fine(plan):
    """The idle series is missing both when no GPU node runs (fine) and when the agent is dead
    (blind). The agent's own pulse, cluster_node_count, is published every minute while it runs
    (the system node group always has nodes): its alarm breaches on missing data."""
    source, idle = _alarm(plan, "-metrics").inputs, _alarm(plan).inputs
    assert (source["namespace"], source["metricName"]) == ("ContainerInsights", "cluster_node_count")
    assert source["dimensions"] == idle["dimensions"] and source["treatMissingData"] == "breaching"
    nodes = 2.0
    assert "ALARM" not in alarm_states(source, [[nodes]] * 60), "a healthy agent pages"
    # The agent dies: no datapoint at all, for the idle series and the pulse alike.
    dead = alarm_states(source, [[nodes]] * 5 + [[]] * 12)
    assert dead[5 + source["evaluationPeriods"] - 2] == "OK" and dead[5 + source["evaluationPeriods"] - 1] == "ALARM"
    assert "ALARM" not in alarm_states(idle, [[]] * 30), "the idle alarm alone would stay silent"
    topic_arn = _topic(plan).outputs["arn"]
    assert source["alarmActions"] == [topic_arn] and source["okActions"] == [topic_arn]


def test_the_heartbeat_pages_when_watchdog_stops_reaching_sns(plan):
    heartbeat = _alarm(plan, "-heartbeat")
    topic = _topic(plan, "-heartbeat")
    settings = heartbeat.inputs
    assert (settings["namespace"], settings["metricName"], settings["statistic"]) == (
        "AWS/SNS", "NumberOfMessagesPublished", "Sum")
    assert settings["dimensions"] == {"TopicName": topic.outputs["name"]}
    assert settings["period"] == 300  # SNS pushes its metrics every five minutes
    assert settings["evaluationPeriods"] * 5 == plan.config.monitoring.heartbeat_minutes
    # Watchdog every 2 minutes: 2-3 publishes per period. Then Prometheus or Alertmanager dies.
    states = period_states(settings, [[3.0]] * 6 + [[]] * 4)
    assert states[5] == "OK" and states[6 + settings["evaluationPeriods"] - 1] == "ALARM"
    assert states[6 + settings["evaluationPeriods"] - 2] == "OK"
    assert settings["alarmActions"] == [_topic(plan).outputs["arn"]], "it pages the platform's on-call list"
    # The switch's topic is the key's too; Alertmanager (and only it) publishes there.
    assert topic.inputs["kmsMasterKeyId"] == _topic(plan).inputs["kmsMasterKeyId"]


def test_the_platforms_alarms_and_no_other_publish_to_the_alert_topic(plan):
    topic = _topic(plan)
    (topic_policy,) = plan.recording.by_type(TOPIC_POLICY)
    policy = json.loads(topic_policy.inputs["policy"])
    account = topic.outputs["arn"].split(":")[4]
    for suffix in ("", "-metrics", "-heartbeat"):
        arn = _alarm(plan, suffix).outputs["arn"]
        assert allows(policy, principal=CLOUDWATCH, action="SNS:Publish", resource=topic.outputs["arn"],
                      context={"aws:SourceArn": arn, "aws:SourceAccount": account}), suffix
    stranger = _alarm(plan).outputs["arn"].rsplit(":", 1)[0] + ":someone-elses-alarm"
    assert not allows(policy, principal=CLOUDWATCH, action="SNS:Publish", resource=topic.outputs["arn"],
                      context={"aws:SourceArn": stranger, "aws:SourceAccount": account})


def test_heartbeat_minutes_out_of_range_is_one_line_with_the_fix():
    raw = stack_config("dev")
    raw["monitoring"] = {**raw["monitoring"], "heartbeatMinutes": 7}
    with pytest.raises(ConfigError) as info:
        load_platform_config(raw)
    (line,) = [l for l in str(info.value).splitlines() if "heartbeatMinutes" in l]
    assert "monitoring.heartbeatMinutes" in line and "7" in line and "use e.g. 15" in line
