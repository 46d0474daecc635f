"""The ``gpuIdleAlarm`` section: alarm when a GPU node holds no GPU work for N minutes; its rules."""
from __future__ import annotations

from typing import Iterator, Optional

from pydantic import Field, field_validator

from components.container_insights import ContainerInsightsArgs
from components.gpu_idle_alarm import MAX_IDLE_MINUTES, malformed_emails
from workloads.problems import Problem
from infra.config.common import _Model, check_log_retention, prod_retention_rule
from infra.config.engine import Rule, invalid
from infra.config.gpu import GpuPoolConfig
from workloads.karpenter import duration_seconds

# After consolidateAfter, Karpenter still drains and terminates the node, and Container
# Insights publishes once a minute: minutes of idleness that are expected, not a leak.
CONSOLIDATION_SLACK_MINUTES = 5


class GpuIdleAlarmConfig(_Model):
    """A CloudWatch alarm, by e-mail, when a GPU node holds no GPU work for `idleMinutes`
    (operations capability; installs CloudWatch Container Insights, its metric source)."""

    idle_minutes: int = Field(60, ge=1, le=MAX_IDLE_MINUTES, description=(
        "Minutes a GPU node may run with no pod holding a GPU before the alarm fires; longer than every "
        "pool's consolidateAfter plus 5."))
    alert_emails: list[str] = Field(min_length=1, description="Who is notified (each confirms the SNS subscription).")

    log_retention_days: int = Field(ContainerInsightsArgs.log_retention_days, description=(
        "Retention of Container Insights' performance log group (the alarm's data); prod: 365 or more."))

    @field_validator("log_retention_days")
    @classmethod
    def _retention(cls, value: int) -> int:
        return check_log_retention(value)

    @field_validator("alert_emails")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        bad = malformed_emails(value)
        if bad:
            raise invalid(f"{bad} are not e-mail addresses", "list addresses such as ml-platform-oncall@example.com")
        return value


def _longer_than_consolidation(alarm: Optional[GpuIdleAlarmConfig], pools: list[GpuPoolConfig]) -> Iterator[Problem]:
    """An empty node waits consolidateAfter before Karpenter removes it; an alarm that fires
    sooner would page on every normal scale-down."""
    if alarm is None:
        return
    for index, pool in enumerate(pools):
        seconds = duration_seconds(pool.consolidate_after)
        if seconds is None:
            continue  # "Never": the plan warns; those nodes stay until removed by hand
        needed = -(-seconds // 60) + CONSOLIDATION_SLACK_MINUTES
        if alarm.idle_minutes < needed:
            yield Problem("gpuIdleAlarm.idleMinutes", alarm.idle_minutes,
                          f"gpuPools[{index}] ({pool.name}) removes an empty node only after consolidateAfter "
                          f"{pool.consolidate_after}, so the alarm would fire on every normal scale-down",
                          f"set gpuIdleAlarm.idleMinutes to at least {needed} (consolidateAfter + "
                          f"{CONSOLIDATION_SLACK_MINUTES} minutes to drain and report), or shorten consolidateAfter")


# Listed in the order the loader runs them (infra.config.platform.RULES).
RULES: tuple[Rule, ...] = (
    Rule(("gpuIdleAlarm", "gpuPools"), _longer_than_consolidation),
    prod_retention_rule("gpuIdleAlarm.logRetentionDays"),
)
