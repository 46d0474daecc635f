"""The ``monitoring`` section: the in-cluster metrics stack (Prometheus Operator CRDs,
kube-prometheus-stack, the platform's alerts and dashboards), container logs to CloudWatch, and
the managed Prometheus/Grafana switch; its rules."""
from __future__ import annotations

from typing import Iterator, Optional

from pydantic import Field, field_validator

from workloads.problems import Problem
from infra.config.common import Environment, _Model, check_log_retention, prod_retention_rule
from infra.config.engine import Rule, invalid
from workloads.monitoring.alerts import AlertThresholds
from workloads.monitoring.stack import StackSpec


class MonitoringConfig(_Model):
    """Metrics, alerts and dashboards for GPU training (monitoring capability).

    Alerts go to the GPU idle alarm's SNS topic (``gpuIdleAlarm``); without it they stay in
    Alertmanager's UI."""

    retention_days: int = Field(15, ge=1, le=3650, description="Days Prometheus keeps samples locally.")
    volume_gib: int = Field(50, ge=10, le=16384, description=(
        "Prometheus' gp3 volume; retentionSize is set to 85% of it so the WAL and compaction fit."))
    prometheus_replicas: Optional[int] = Field(None, ge=1, le=3, description="Default 2 in prod, 1 in dev.")
    grafana: bool = Field(True, description="In-cluster Grafana with the platform's dashboards (sidecar-loaded).")
    managed: bool = Field(False, description=(
        "Also remote-write to Amazon Managed Service for Prometheus and create an Amazon Managed Grafana "
        "workspace (Pod Identity for the writer)."))
    container_logs: bool = Field(True, description="Fluent Bit on every node (GPU nodes too) ships container logs to CloudWatch.")
    log_retention_days: int = Field(30, description="Retention of the container log group; prod: 365 or more.")
    gpu_idle_minutes: int = Field(30, ge=5, le=1440, description="Alert when an allocated GPU is at 0% this long.")
    kueue_wait_minutes: int = Field(240, ge=10, le=10080, description=(
        "Alert when a ClusterQueue has pending workloads and admitted none this long."))
    stall_step_multiple: int = Field(10, ge=2, le=1000, description="Alert when no step for N x the recent step time.")
    checkpoint_age_multiple: int = Field(3, ge=2, le=100, description="Alert when the last checkpoint is K x its interval old.")
    spot_interruptions_per_hour: int = Field(3, ge=1, le=1000, description="Per pool, before alerting.")
    heartbeat_minutes: int = Field(15, description=(
        "The dead man's switch: Alertmanager's always-firing Watchdog goes to a heartbeat topic, and a CloudWatch "
        "alarm pages gpuIdleAlarm.alertEmails when it has not arrived for this long (a multiple of 5, 15-1440)."))

    @field_validator("heartbeat_minutes")
    @classmethod
    def _heartbeat(cls, value: int) -> int:
        if not 15 <= value <= 1440 or value % 5:
            raise invalid(f"{value} is not a multiple of 5 minutes between 15 and 1440 (SNS reports publishes per "
                          "5 minutes; less than three periods would page on one late report)", "use e.g. 15 or 30")
        return value

    @field_validator("log_retention_days")
    @classmethod
    def _retention(cls, value: int) -> int:
        return check_log_retention(value)

    def thresholds(self) -> AlertThresholds:
        """The alerts' thresholds: the five fields the two share by name (the others keep the
        alerts' own defaults)."""
        return self.copy_into(AlertThresholds)

    def stack_spec(self, *, region: str, is_prod: bool, cluster_name: str) -> StackSpec:
        """The metrics stack's spec: retention, volume and Grafana as configured; two Prometheus
        and two Alertmanager replicas in prod, one in dev (prometheusReplicas overrides)."""
        return self.copy_into(StackSpec, region=region,
                              prometheus_replicas=self.prometheus_replicas or (2 if is_prod else 1),
                              alertmanager_replicas=2 if is_prod else 1, extra_labels={"cluster": cluster_name})


def _one_owner_of_the_crds(monitoring: Optional[MonitoringConfig], prometheus_operator_crds: bool,
                           service_monitor: bool) -> Iterator[Problem]:
    """Helm refuses to adopt objects another release owns ("invalid ownership metadata"), so one
    release installs the CRDs; and the stack scrapes DCGM itself, so the chart's own
    ServiceMonitor would scrape every GPU twice."""
    if monitoring is None:
        return
    if prometheus_operator_crds:
        yield Problem("gpuEnablement.prometheusOperatorCrds", True,
                      "the monitoring section installs the prometheus-operator-crds release; a second release of the "
                      "same CRDs fails Helm's ownership check",
                      "remove gpuEnablement.prometheusOperatorCrds (or set it to false)")
    if service_monitor:
        yield Problem("gpuEnablement.serviceMonitor", True,
                      "the monitoring section already scrapes the DCGM exporter; the chart's ServiceMonitor would "
                      "collect every GPU series twice", "remove gpuEnablement.serviceMonitor (or set it to false)")


def _prod_pages_someone(environment: Environment, monitoring: Optional[MonitoringConfig],
                        gpu_idle_alarm: object) -> Iterator[Problem]:
    if environment is Environment.PROD and monitoring is not None and gpu_idle_alarm is None:
        yield Problem("monitoring", "set", "prod alerts must reach someone; Alertmanager sends them to the SNS topic "
                      "of gpuIdleAlarm, which is not set", "set gpuIdleAlarm (its alertEmails receive the alerts)")


def _monitoring_retention(environment: Environment, monitoring: Optional[MonitoringConfig]) -> Iterator[Problem]:
    if monitoring is not None and monitoring.container_logs:
        yield from prod_retention_rule("monitoring.logRetentionDays").check(environment, monitoring.log_retention_days)


RULES: tuple[Rule, ...] = (
    Rule(("monitoring", "gpuEnablement.prometheusOperatorCrds", "gpuEnablement.serviceMonitor"), _one_owner_of_the_crds),
    Rule(("environment", "monitoring", "gpuIdleAlarm"), _prod_pages_someone),
    Rule(("environment", "monitoring"), _monitoring_retention),
)
