"""The whole stack configuration as one typed, validated model.

A stack file (``Pulumi.<stack>.yaml``) holds one key per section under the project's
namespace (``ml-training-platform:network: {...}``). ``load_platform_config`` turns those
raw values into a frozen ``PlatformConfig`` or raises ``ConfigError`` listing every problem
with its path, the bad value and the fix.

One module per section holds its model and the rules beside it (``accounts``, ``log_archive``,
``network``, ``cluster``, ``charts``, ``datasets``, ``tracking``, ``gpu``, ``scheduling``, ``budgets``,
``alarms``);
``engine`` is the per-section error engine; ``platform`` assembles ``PlatformConfig`` and the
rules. A new section is a new module plus a field and its ``RULES`` in ``platform``. The names
below are re-exported so that ``from infra.config import ...`` keeps working.
"""
from infra.config.accounts import AccountConfig, AccountLayout, AccountsConfig
from infra.config.alarms import GpuIdleAlarmConfig
from infra.config.budgets import BudgetAccount, BudgetsConfig
from infra.config.charts import ChartMirrorConfig
from infra.config.cluster import ClusterConfig, NodeGroupConfig
from infra.config.common import (
    LOG_RETENTION_DAYS,
    PROD_MIN_LOG_RETENTION_DAYS,
    PROD_OBJECT_LOCK_RETENTION_DAYS,
    CapacityType,
    Environment,
)
from infra.config.datasets import (
    BucketLifecycleConfig,
    DataRepositoryAssociationConfig,
    DatasetsConfig,
    FsxConfig,
    bucket_lifecycle_problems,
    dra_spec,
)
from infra.config.engine import FIX, PROJECT, SECRET_PLACEHOLDER, ConfigError, Rule, invalid
from infra.config.gitops import GitopsConfig, SecretSourceConfig, SsoConfig, SyncWindowConfig
from infra.config.gpu import CpuPoolConfig, GpuEnablementConfig, GpuPoolConfig, KarpenterConfig
from infra.config.log_archive import AuditTrailConfig, AuditTrailMode, LogArchiveConfig
from infra.config.network import FlowLogsConfig, NetworkConfig
from infra.config.platform import RULES, PlatformConfig, load_platform_config
from infra.config.scheduling import SchedulingConfig, TeamConfig, TrainingConfig
from infra.config.tracking import TrackingConfig, TrackingDatabaseConfig

__all__ = [
    "AccountConfig", "AccountLayout", "AccountsConfig", "AuditTrailConfig", "AuditTrailMode", "BucketLifecycleConfig",
    "BudgetAccount", "BudgetsConfig", "CapacityType", "ChartMirrorConfig", "ClusterConfig", "ConfigError", "CpuPoolConfig",
    "DataRepositoryAssociationConfig", "DatasetsConfig", "Environment", "FIX", "FlowLogsConfig", "FsxConfig", "GitopsConfig", "SecretSourceConfig", "SsoConfig", "SyncWindowConfig",
    "GpuEnablementConfig", "GpuIdleAlarmConfig", "GpuPoolConfig", "KarpenterConfig", "LOG_RETENTION_DAYS", "LogArchiveConfig",
    "NetworkConfig", "NodeGroupConfig", "PROD_MIN_LOG_RETENTION_DAYS", "PROD_OBJECT_LOCK_RETENTION_DAYS", "PROJECT",
    "PlatformConfig", "RULES", "Rule", "SECRET_PLACEHOLDER", "SchedulingConfig", "TeamConfig", "TrackingConfig",
    "TrackingDatabaseConfig", "TrainingConfig", "bucket_lifecycle_problems", "dra_spec", "invalid", "load_platform_config",
]
