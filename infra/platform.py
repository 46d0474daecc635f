"""The foundation every capability builds on: accounts, log archive, network, cluster."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import pulumi

from components.bucket import AccessLogBucket, AccessLogBucketArgs
from components.charts import ChartSource
from components.cluster import Cluster
from components.datasets import Datasets
from components.gpu_idle_alarm import GpuIdleAlarm
from components.gpu_pools import GpuPools
from components.kms import LogGroupKey
from components.log_archive import AuditTrail, LogArchive
from components.monitoring import Monitoring
from components.network import Network
from components.scheduling import Scheduling
from infra.accounts import AccountProviders
from infra.config import PlatformConfig


@dataclass
class Platform:
    """The foundation every capability builds on."""

    config: PlatformConfig
    providers: AccountProviders
    log_archive: LogArchive
    network: Network
    cluster: Cluster
    # Where every Helm release's chart comes from (upstream, or the verified chart mirror).
    charts: ChartSource = field(default_factory=ChartSource)
    # What a capability built that a later one uses, set by the capability that builds it (None
    # while that capability has not run, or when its config section is off).
    scheduling: Optional[Scheduling] = None  # gpu capacity: team namespaces, Kueue
    node_pools: Optional[GpuPools] = None  # gpu capacity: Karpenter NodePools (the general CPU pool too)
    datasets: Optional[Datasets] = None  # datasets: buckets, FSx
    gpu_idle_alarm: Optional[GpuIdleAlarm] = None  # operations: its topic routes Alertmanager
    monitoring: Optional[Monitoring] = None
    log_group_key: Optional[LogGroupKey] = None
    audit_trails: list[AuditTrail] = field(default_factory=list)
    # S3 server access log targets by account key; see ``access_log_bucket``.
    access_log_buckets: dict[str, AccessLogBucket] = field(default_factory=dict)

    def access_log_bucket(self, account: str) -> AccessLogBucket:
        """The S3 server access log bucket of ``account`` (automation / workload / logging).

        S3 delivers access logs only to a bucket in the source bucket's own account, so each
        account that has buckets gets one, created on first use.
        """
        if account not in self.access_log_buckets:
            self.access_log_buckets[account] = access_log_bucket(self.config, self.providers, account)
        return self.access_log_buckets[account]

    def seal_access_logs(self) -> None:
        """Write each access-log bucket's policy for the buckets registered with it and turn
        their logging on; call once every capability has created its buckets."""
        for bucket in self.access_log_buckets.values():
            bucket.seal()

    def team_namespace_resources(self) -> dict[str, pulumi.Resource]:
        """The team Namespace objects by namespace name (empty before the scheduling capability
        created them, or without teams): every namespaced object depends on its namespace."""
        by_team = self.scheduling.namespaces if self.scheduling is not None else {}
        return {team.namespace: by_team[team.name] for team in self.config.scheduling.teams if team.name in by_team}

    def workload_opts(self, **kwargs: Any) -> pulumi.ResourceOptions:
        """Options for an AWS component in the workload account."""
        return pulumi.ResourceOptions(providers={"aws": self.providers.workload}, **kwargs)

    def kubernetes_opts(self, **kwargs: Any) -> pulumi.ResourceOptions:
        """Options for a component that deploys into the cluster (and may touch AWS)."""
        return pulumi.ResourceOptions(
            providers={"aws": self.providers.workload, "kubernetes": self.cluster.k8s_provider}, **kwargs
        )


def datasets_name(config: PlatformConfig) -> str:
    """The datasets component's name: the foundation's audit trail names its buckets before the
    datasets capability creates them."""
    return f"{config.name}-datasets"


def access_log_bucket(config: PlatformConfig, providers: AccountProviders, account: str) -> AccessLogBucket:
    return AccessLogBucket(
        f"{config.name}-{account}-access-logs",
        AccessLogBucketArgs(expiration_days=config.log_archive.access_log_expiration_days,
                            protect=config.protect_stateful, tags=config.resource_tags),
        opts=pulumi.ResourceOptions(providers={"aws": getattr(providers, account)}),
    )
