"""Operations capability: a monthly AWS Budget per account, and an alarm on idle GPU nodes.

Both alert by e-mail. The alarm reads Container Insights, which this capability installs with it.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Iterator

import pulumi

from components.budgets import AccountBudget, AccountBudgetArgs
from components.container_insights import ContainerInsights, ContainerInsightsArgs, performance_log_group_name
from components.gpu_idle_alarm import METRIC_NAME, GpuIdleAlarm, GpuIdleAlarmArgs
from catalog.versions import CLOUDWATCH_OBSERVABILITY, HelmChart
from infra import costs
from infra.capability import Capability
from infra.config import PlatformConfig
from infra.costs import CostLine
from infra.recording import Recording
from infra.platform import Platform
from workloads.karpenter import duration_seconds


def deploy(platform: Platform) -> dict[str, Any]:
    outputs: dict[str, Any] = {}
    budgets = platform.config.budgets
    if budgets is not None:
        names = {}
        for key, limit in sorted(budgets.monthly_limit_usd.items()):
            account = key.value
            budget = AccountBudget(
                f"{platform.config.name}-{account}-monthly",
                budgets.copy_into(AccountBudgetArgs, limit_usd=limit, tags=platform.config.resource_tags),
                # A budget sees the costs of the account it is created in.
                opts=pulumi.ResourceOptions(providers={"aws": getattr(platform.providers, account)}),
            )
            names[account] = budget.budget.name
        outputs["budgets"] = names
    alarm_config = platform.config.gpu_idle_alarm
    if alarm_config is not None:
        config = platform.config
        insights = ContainerInsights(
            f"{config.name}-container-insights",
            ContainerInsightsArgs(cluster=platform.cluster, region=config.region,
                                  log_retention_days=alarm_config.log_retention_days,
                                  log_kms_key=platform.log_group_key.key if platform.log_group_key else None,
                                  tags=config.resource_tags, charts=platform.charts),
            opts=platform.kubernetes_opts())
        # The metric lives in the cluster's account and region, so the alarm does too.
        alarm = GpuIdleAlarm(
            f"{config.name}-gpu-idle",
            alarm_config.copy_into(GpuIdleAlarmArgs, container_insights=insights, protect=config.protect_stateful,
                                   # The dead man's switch needs its publisher: Alertmanager (monitoring).
                                   heartbeat_minutes=config.monitoring.heartbeat_minutes if config.monitoring else None,
                                   tags=config.resource_tags),
            opts=platform.workload_opts())
        outputs["gpu_idle_alarm"] = alarm.alarm.name
        # The monitoring capability routes Alertmanager to this alarm's topic.
        platform.gpu_idle_alarm = alarm
    return outputs


def log_group_names(config: PlatformConfig) -> list[str]:
    """CloudWatch log groups this capability creates (the platform's log key must admit them)."""
    return [performance_log_group_name(config.cluster_name)] if config.gpu_idle_alarm is not None else []


def plan_sections(config: PlatformConfig, recording: Recording) -> Iterator[tuple[str, list[str]]]:
    if config.budgets is None:
        yield "Budgets", ["none: set `budgets` to be alerted when an account's monthly spend runs away"]
    else:
        lines: list[str] = []
        for key, limit in sorted(config.budgets.monthly_limit_usd.items()):
            account = key.value
            alerts = ", ".join(f"{p:g}%" for p in config.budgets.actual_thresholds_percent)
            forecast = (f", forecast {config.budgets.forecast_threshold_percent:g}%"
                        if config.budgets.forecast_threshold_percent else "")
            lines.append(f"{account}: ${limit:,.0f}/month, alerts at {alerts}{forecast} to "
                         f"{len(config.budgets.alert_emails)} address(es)")
        yield "Budgets", lines
    alarm = config.gpu_idle_alarm
    if alarm is None:
        yield "GPU idle alarm", ["none: set `gpuIdleAlarm` to be told when a GPU node runs with no GPU work"]
        return
    yield "GPU idle alarm", [
        f"fires when a GPU node has had no pod holding a GPU for {alarm.idle_minutes} minutes "
        f"(Container Insights {METRIC_NAME}, cluster minimum, 1-minute periods); "
        f"{len(alarm.alert_emails)} address(es) by e-mail (SNS, KMS-encrypted)",
        "Container Insights (enhanced observability) is billed per observation, tiered "
        "(https://aws.amazon.com/cloudwatch/pricing/): in the idle total below at an assumed idle rate; it grows with pods and nodes",
    ]


def warnings(config: PlatformConfig, recording: Recording) -> Iterator[str]:
    if config.gpu_idle_alarm is None:
        if config.gpu_pools:
            yield ("gpuIdleAlarm is not set: a GPU node that Karpenter does not remove (do-not-disrupt pods, "
                   "consolidateAfter: Never) runs, billed, until someone notices")
        return
    for pool in config.gpu_pools:
        if duration_seconds(pool.consolidate_after) is None:
            yield (f"GPU pool {pool.name}: consolidateAfter Never keeps empty nodes, so the GPU idle alarm fires "
                   f"{config.gpu_idle_alarm.idle_minutes} minutes after each of its nodes empties")


def cost_lines(recording: Recording, today: dt.date) -> Iterator[CostLine]:
    yield from costs.alarms(recording)


def charts(config: PlatformConfig) -> list[HelmChart]:
    """The CloudWatch agent's chart, installed with the GPU idle alarm (its metric's source)."""
    return [CLOUDWATCH_OBSERVABILITY] if config.gpu_idle_alarm is not None else []


CAPABILITY = Capability("operations", deploy=deploy, plan_sections=plan_sections, warnings=warnings,
                        cost_lines=cost_lines, log_group_names=log_group_names, charts=charts)
