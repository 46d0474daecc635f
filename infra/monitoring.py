"""Monitoring capability: Prometheus Operator CRDs, kube-prometheus-stack, the platform's scrape
objects, alerts and dashboards; AMP + Managed Grafana when ``monitoring.managed``.

Runs after the operations capability: Alertmanager publishes to the GPU idle alarm's SNS topic.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Iterator

import pulumi

from components.container_logs import ContainerLogArchive, ContainerLogArchiveArgs, ContainerLogs, ContainerLogsArgs
from components.container_logs import log_group_name as container_log_group_name
from components.container_logs import team_log_group_name
from components.gpu_enablement import NAMESPACE as GPU_NAMESPACE, GpuEnablementMode
from components.karpenter import NAMESPACE as KARPENTER_NAMESPACE
from components.monitoring import Monitoring, MonitoringArgs
from components.scheduling import KUEUE_NAMESPACE
from components.training import TRAINING_OPERATOR_NAMESPACE
from catalog.versions import AWS_FOR_FLUENT_BIT, KUBE_PROMETHEUS_STACK, PROMETHEUS_OPERATOR_CRDS, HelmChart
from infra import costs, system_capacity
from infra.capability import Capability
from infra.config import PlatformConfig
from infra.costs import CostLine
from infra.recording import Recording
from infra.platform import Platform
from workloads.monitoring import alerts, stack

ALERT_COUNT_NOTE = "each with a runbook in docs/runbooks/ and a promtool unit test"


def thresholds(config: PlatformConfig) -> alerts.AlertThresholds:
    assert config.monitoring is not None
    return config.monitoring.thresholds()


def stack_spec(config: PlatformConfig) -> stack.StackSpec:
    assert config.monitoring is not None
    return config.monitoring.stack_spec(region=config.region, is_prod=config.is_prod, cluster_name=config.cluster_name)


def deploy(platform: Platform) -> dict[str, Any]:
    config = platform.config
    if config.monitoring is None:
        return {}
    alarm = platform.gpu_idle_alarm
    monitoring = Monitoring(
        f"{config.name}-monitoring",
        MonitoringArgs(cluster=platform.cluster, region=config.region, stack_spec=stack_spec(config),
                       thresholds=thresholds(config),
                       sns_topic=alarm.topic if alarm is not None else None,
                       sns_topic_key=alarm.key if alarm is not None else None,
                       heartbeat_topic=alarm.heartbeat_topic if alarm is not None else None,
                       team_alert_emails=({t.namespace: list(t.alert_emails) for t in config.scheduling.teams
                                           if t.alert_emails} if alarm is not None else {}),
                       managed=config.monitoring.managed,
                       team_namespaces=config.team_namespaces,
                       trainjob_monitors=config.training.trainer_v2,
                       component_namespaces={"gpu": GPU_NAMESPACE, "karpenter": KARPENTER_NAMESPACE,
                                             "kueue": KUEUE_NAMESPACE,
                                             "training_operator": TRAINING_OPERATOR_NAMESPACE},
                       gpu_operator=config.gpu_enablement.mode is GpuEnablementMode.GPU_OPERATOR,
                       # Team namespaces (the trainer scrape policies live there) come from scheduling.
                       depends_on=[platform.scheduling] if platform.scheduling is not None else [],
                       tags=config.resource_tags, charts=platform.charts),
        opts=platform.kubernetes_opts())
    platform.monitoring = monitoring
    outputs: dict[str, Any] = {"monitoringNamespace": stack.NAMESPACE}
    if monitoring.amp_workspace is not None:
        outputs["ampWorkspaceId"] = monitoring.amp_workspace.id
    if monitoring.grafana_workspace is not None:
        outputs["managedGrafanaEndpoint"] = monitoring.grafana_workspace.endpoint
    if config.monitoring.container_logs:
        # The destination lives with the archive (logging account); the filter with the group.
        archive = ContainerLogArchive(
            f"{config.name}-container-log-archive",
            ContainerLogArchiveArgs(bucket=platform.log_archive.bucket, key=platform.log_archive.key,
                                    source_account_id=config.accounts.workload.id, account_id=config.accounts.logging.id,
                                    region=config.region,
                                    tags=config.resource_tags),
            opts=pulumi.ResourceOptions(providers={"aws": platform.providers.logging}))
        logs = ContainerLogs(
            f"{config.name}-container-logs",
            ContainerLogsArgs(cluster=platform.cluster, region=config.region,
                              retention_days=config.monitoring.log_retention_days,
                              log_kms_key=platform.log_group_key.key if platform.log_group_key else None,
                              archive=archive, team_readers=team_log_readers(config),
                              admin_readers=tuple(_in_workload_account(config, config.cluster.admin_role_arns)),
                              tags=config.resource_tags, charts=platform.charts),
            opts=platform.kubernetes_opts())
        outputs["containerLogGroup"] = logs.log_group.name
    return outputs


def _in_workload_account(config: PlatformConfig, role_arns) -> list[str]:
    """The roles that can be given read on the cluster's log groups: CloudWatch Logs has no
    resource policy for reads, so only a role of the groups' own account can hold one."""
    return [arn for arn in role_arns if arn.split(":")[4] == config.accounts.workload.id]


def team_log_readers(config: PlatformConfig) -> dict[str, tuple[str, ...]]:
    """Team namespace -> its members' roles (each gets read on that team's log group only)."""
    teams = config.scheduling.teams if config.scheduling is not None else []
    return {team.namespace: tuple(_in_workload_account(config, team.role_arns)) for team in teams}


def log_group_names(config: PlatformConfig) -> list[str]:
    """CloudWatch log groups this capability creates (the platform's log key must admit them)."""
    m = config.monitoring
    if m is None or not m.container_logs:
        return []
    group = container_log_group_name(config.cluster_name)
    return [group, *(team_log_group_name(group, namespace) for namespace in sorted(team_log_readers(config)))]


def plan_sections(config: PlatformConfig, recording: Recording) -> Iterator[tuple[str, list[str]]]:
    m = config.monitoring
    if m is None:
        yield "Monitoring", ["none: set `monitoring` for Prometheus, GPU/job alerts and dashboards"]
        return
    spec = stack_spec(config)
    receiver = ("the GPU idle alarm's SNS topic (e-mail)" if config.gpu_idle_alarm is not None
                else "nobody: alerts stay in Alertmanager's UI (set gpuIdleAlarm)")
    routed = [t for t in config.scheduling.teams if t.alert_emails]
    if config.gpu_idle_alarm is not None:
        receiver += ("; " + ", ".join(f"{t.namespace}'s to {len(t.alert_emails)} address(es) of its own" for t in routed)
                     if routed else "; no team has alertEmails: every team's job alerts reach the platform's list")
        receiver += (f"; Watchdog to the heartbeat topic every {stack.HEARTBEAT_REPEAT}, a CloudWatch alarm pages after "
                     f"{m.heartbeat_minutes} min without it")
    yield "Monitoring", [
        f"kube-prometheus-stack on the system nodes: Prometheus x{spec.prometheus_replicas}, {m.retention_days}d "
        f"or {stack.retention_size_gib(m.volume_gib)} GiB (of a {m.volume_gib} GiB gp3 volume), whichever first",
        f"{len(alerts.all_alerts(thresholds(config)))} alerts ({ALERT_COUNT_NOTE}); Alertmanager -> {receiver}",
        "scraped: DCGM exporter, node-exporter, kube-state-metrics (+ PyTorchJob/TrainJob state), Kueue, Karpenter, "
        "training operator, EKS scheduler/controller-manager, trainer rank 0 in each team namespace",
        "managed: AMP remote write (Pod Identity) + Managed Grafana" if m.managed else "managed: off (in-cluster only)",
        (f"container logs: Fluent Bit on every node -> {container_log_group_name(config.cluster_name)} (platform "
         f"namespaces) and {container_log_group_name(config.cluster_name)}/<team namespace> (one per team, read by its "
         f"roles only) ({m.log_retention_days}d, log key) -> log-archive account (Firehose to the archive bucket)"
         if m.container_logs else "container logs: off"),
    ]
    capacity = system_capacity.system_capacity(recording)
    if capacity is not None:
        yield "System node capacity (monitoring included)", list(system_capacity.plan_lines(capacity))


def warnings(config: PlatformConfig, recording: Recording) -> Iterator[str]:
    m = config.monitoring
    if m is not None and config.gpu_idle_alarm is None:
        yield "monitoring: no gpuIdleAlarm, so Alertmanager has no SNS topic and alerts page nobody"
    if m is not None and m.container_logs and config.scheduling is not None:
        for index, team in enumerate(config.scheduling.teams):
            for arn in set(team.role_arns) - set(_in_workload_account(config, team.role_arns)):
                yield (f"scheduling.teams[{index}].roleArns: {arn} is outside the workload account "
                       f"{config.accounts.workload.id}: it cannot read its team's container logs (CloudWatch Logs reads "
                       "are same-account); use a role of the workload account for `python -m jobs logs --attempt`")
    yield from system_capacity.warnings(system_capacity.system_capacity(recording))


def cost_lines(recording: Recording, today: dt.date) -> Iterator[CostLine]:
    yield from costs.monitoring(recording)


def charts(config: PlatformConfig) -> list[HelmChart]:
    """The Prometheus operator CRDs and kube-prometheus-stack, and Fluent Bit with container logs."""
    m = config.monitoring
    if m is None:
        return []
    return [PROMETHEUS_OPERATOR_CRDS, KUBE_PROMETHEUS_STACK, *([AWS_FOR_FLUENT_BIT] if m.container_logs else [])]


CAPABILITY = Capability("monitoring", deploy=deploy, plan_sections=plan_sections, warnings=warnings,
                        cost_lines=cost_lines, log_group_names=log_group_names, charts=charts)
