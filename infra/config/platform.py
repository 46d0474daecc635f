"""The whole stack configuration: ``PlatformConfig`` assembled from the section models, the rules
of every section in the order they run, and ``load_platform_config``.
"""
from __future__ import annotations

import functools
from typing import Any, Iterable, Optional

from pydantic import Field

from infra.config import accounts, alarms, budgets, ci, cluster, datasets, gitops, gpu, log_archive, monitoring, network, scheduling, tracking
from infra.config.accounts import AccountsConfig
from infra.config.alarms import GpuIdleAlarmConfig
from infra.config.monitoring import MonitoringConfig
from infra.config.budgets import BudgetsConfig
from infra.config.charts import ChartMirrorConfig
from infra.config.ci import CiConfig
from infra.config.cluster import ClusterConfig
from infra.config.common import PROD_OBJECT_LOCK_RETENTION_DAYS, Environment, PlatformName, Region, Tags, _Model
from infra.config.datasets import DatasetsConfig
from infra.config.engine import PROJECT, Rule, load
from infra.config.gitops import GitopsConfig
from infra.config.gpu import GpuEnablementConfig, GpuPoolConfig, KarpenterConfig
from infra.config.log_archive import LogArchiveConfig
from infra.config.network import NetworkConfig
from infra.config.scheduling import SchedulingConfig, TrainingConfig
from infra.config.tracking import TrackingConfig
from workloads.karpenter import CpuPoolSpec, GpuPoolSpec


class PlatformConfig(_Model):
    """The platform of one stack. Field order is the order of the stack file."""

    name: PlatformName = Field(description="Short DNS-safe prefix of every resource name (3-24 chars).")
    environment: Environment = Field(description="dev | prod; prod turns on deletion protection and `protect`.")
    region: Region = Field(description="AWS region of every account's provider, e.g. us-west-2.")
    tags: Tags = Field(default_factory=dict, description="Tags on every taggable resource.")
    accounts: AccountsConfig
    log_archive: LogArchiveConfig = Field(default_factory=LogArchiveConfig)
    network: NetworkConfig
    cluster: ClusterConfig
    chart_mirror: Optional[ChartMirrorConfig] = Field(None, description=(
        "Every Helm chart from this OCI registry or Helm repository (air-gapped clusters; ECR in production), "
        "each archive checked against its pinned SHA-256; default: each chart's upstream repository."))
    datasets: Optional[DatasetsConfig] = Field(None, description="S3 buckets + FSx for Lustre (datasets capability).")
    tracking: Optional[TrackingConfig] = Field(None, description="MLflow on Fargate + Aurora (tracking capability).")
    karpenter: KarpenterConfig = Field(default_factory=KarpenterConfig, description="Karpenter controller and CPU pool.")
    gpu_pools: list[GpuPoolConfig] = Field(default_factory=list, max_length=32, description="GPU NodePools, at most 32 (gpu capacity capability).")
    gpu_enablement: GpuEnablementConfig = Field(default_factory=GpuEnablementConfig)
    scheduling: SchedulingConfig = Field(default_factory=SchedulingConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig, description="Training operators (training capability).")
    budgets: Optional[BudgetsConfig] = Field(None, description="AWS Budgets per account (operations capability).")
    gpu_idle_alarm: Optional[GpuIdleAlarmConfig] = Field(None, description=(
        "Alarm on GPU nodes idle longer than N minutes (operations capability)."))
    gitops: Optional[GitopsConfig] = Field(None, description="Argo CD + Argo Workflows (gitops capability).")
    ci: Optional[CiConfig] = Field(None, description="CI roles, state key and in-VPC runner (ci capability).")
    monitoring: Optional[MonitoringConfig] = Field(None, description=(
        "Prometheus, alerts, dashboards and container logs (monitoring capability)."))

    # -- derived values: one place decides what "prod" means ------------------------------
    @property
    def is_prod(self) -> bool:
        return self.environment is Environment.PROD

    @property
    def protect_stateful(self) -> bool:
        """`protect` and deletion protection on buckets, file systems, databases, keys."""
        return self.is_prod

    @property
    def interface_endpoints(self) -> bool:
        """Interface endpoints: as configured, else on in prod only."""
        configured = self.network.interface_endpoints
        return self.is_prod if configured is None else configured

    @property
    def object_lock_retention_days(self) -> Optional[int]:
        """Object Lock on the log archive: as configured, else 365 days in prod, off in dev."""
        configured = self.log_archive.object_lock_retention_days
        return configured if configured is not None else (PROD_OBJECT_LOCK_RETENTION_DAYS if self.is_prod else None)

    @property
    def cluster_name(self) -> str:
        return f"{self.name}-eks"

    @property
    def team_namespaces(self) -> list[str]:
        """Every team's namespace, in ``scheduling.teams`` order (FSx claim, MLflow Secret, pipelines)."""
        return [team.namespace for team in self.scheduling.teams]

    @property
    def resource_tags(self) -> dict[str, str]:
        base = {"platform": PROJECT, "environment": self.environment.value, "managed-by": "pulumi"}
        return {**base, **self.tags}

    # -- the pools as the manifests see them, built once per config -----------------------
    @functools.cached_property
    def gpu_pool_specs(self) -> tuple[GpuPoolSpec, ...]:
        """Every GPU pool's NodePool spec, in ``gpuPools`` order, with ``karpenter.amiAlias`` where
        the pool names no AMI."""
        return tuple(pool.spec(self.karpenter.ami_alias) for pool in self.gpu_pools)

    @functools.cached_property
    def cpu_pool_spec(self) -> Optional[CpuPoolSpec]:
        """The general CPU pool's NodePool spec; None when ``karpenter.cpuPool.enabled`` is false."""
        return self.karpenter.cpu_pool.spec(self.karpenter.ami_alias)

    def model_copy(self, *, update: Optional[dict[str, Any]] = None, deep: bool = False) -> "PlatformConfig":
        """Pydantic's copy, without the specs cached from the original: an update to the pools or
        the AMI alias must show in the copy's specs."""
        copied = super().model_copy(update=update, deep=deep)
        for name in ("gpu_pool_specs", "cpu_pool_spec"):
            copied.__dict__.pop(name, None)
        return copied


RULES: tuple[Rule, ...] = (
    *accounts.RULES, *network.RULES, *log_archive.RULES, *cluster.RULES, *datasets.RULES, *tracking.RULES,
    *gpu.RULES, *scheduling.RULES, *budgets.RULES, *alarms.RULES, *gitops.RULES, *ci.RULES, *monitoring.RULES,
)


def load_platform_config(raw: dict[str, Any], *, source: str = "stack config",
                         secret_paths: Iterable[str] = ()) -> PlatformConfig:
    """The stack's ``PlatformConfig``, or ``ConfigError`` listing every problem (``engine.load``)."""
    return load(PlatformConfig, RULES, raw, source=source, secret_paths=secret_paths)
