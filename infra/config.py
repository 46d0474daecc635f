"""The whole stack configuration as one typed, validated model.

A stack file (``Pulumi.<stack>.yaml``) holds one key per section under the project's
namespace (``ml-training-platform:network: {...}``). ``load_platform_config`` turns those
raw values into a frozen ``PlatformConfig`` or raises ``ConfigError`` listing every problem
with its path, the bad value and the fix.

Sections are parsed one by one so that a typo in ``network`` does not hide a bad node
group in ``cluster``; cross-section rules (``CHECKS``) run on every section they need that
parsed. Later capabilities add a section by adding a field to ``PlatformConfig`` and, if
they have cross-section rules, a function decorated with ``@check``.
"""
from __future__ import annotations

import difflib
import ipaddress
import re
from enum import Enum
from typing import Annotated, Any, Callable, Iterable, Iterator, Optional, get_args, get_origin

from pydantic import AfterValidator, BaseModel, BeforeValidator, PlainSerializer, ConfigDict, Field, TypeAdapter, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from components.cluster import UpgradePolicy
from components.log_archive import lifecycle_problems
from components.network import NatStrategy, subnet_problems
from components.validation import InvalidInputError, Problem
from components.datasets import DataRepositoryAssociationSpec, DatasetBucket, FsxEvent, FsxLogLevel, association_problems, fsx_capacity_problems
from components.tracking import LoadBalancerScheme, tracking_problems
from components.versions import DEFAULT_EKS_VERSION, EKS_VERSIONS
from components.gpu_enablement import GpuEnablementMode
from workloads.karpenter import CapacityType as KarpenterCapacityType, ConsolidationPolicy
from workloads.scheduling import Priority

PROJECT = "ml-training-platform"

_ACCOUNT_ID = re.compile(r"^\d{12}$")
_ROLE_ARN = re.compile(r"^arn:(aws|aws-us-gov|aws-cn):iam::(\d{12}):role/[\w+=,.@/-]{1,512}$")
_REGION = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d$")
_NAME = re.compile(r"^[a-z][a-z0-9-]{1,22}[a-z0-9]$")
# CloudWatch Logs accepts only these retention periods.
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653)


FIX = " FIX: "  # separates what is wrong from how to fix it in validator messages


def invalid(message: str, fix: str) -> ValueError:
    return ValueError(f"{message}{FIX}{fix}")


class ConfigError(InvalidInputError):
    """Every problem of a stack's configuration, one per line."""


class Environment(str, Enum):
    """What kind of environment a stack is; prod turns on every protection."""

    DEV = "dev"
    PROD = "prod"


class CapacityType(str, Enum):
    ON_DEMAND = "ON_DEMAND"
    SPOT = "SPOT"


class _Model(BaseModel):
    # camelCase in the stack file (Pulumi's convention), snake_case in Python.
    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True, use_enum_values=False
    )


def _ipv4_network(value: Any) -> ipaddress.IPv4Network:
    if isinstance(value, ipaddress.IPv4Network):
        return value
    if not isinstance(value, str):
        raise invalid("must be an IPv4 CIDR string", "write a block such as 10.0.0.0/16")
    try:
        return ipaddress.IPv4Network(value, strict=True)
    except ipaddress.NetmaskValueError as exc:
        raise invalid(f"is not a valid IPv4 CIDR ({exc})", "use a block such as 10.0.0.0/16") from None
    except ValueError as exc:
        if "has host bits set" in str(exc):
            fixed = ipaddress.IPv4Network(value, strict=False)
            raise invalid("has host bits set", f"use the network address {fixed}") from None
        raise invalid("is not a valid IPv4 CIDR", "use a block such as 10.0.0.0/16") from None


Cidr = Annotated[
    ipaddress.IPv4Network,
    BeforeValidator(_ipv4_network),
    PlainSerializer(str, return_type=str),
]


def _check_name(value: str) -> str:
    if not _NAME.match(value):
        raise invalid("is not a valid platform name", "use 3-24 lowercase letters, digits and '-', starting with a letter (e.g. mlp-dev)")
    return value


def _check_region(value: str) -> str:
    if not _REGION.match(value):
        raise invalid("is not an AWS region name", "use a region such as us-west-2")
    return value


def _check_tags(value: dict[str, str]) -> dict[str, str]:
    bad = [k for k in value if k.lower().startswith("aws:") or not 1 <= len(k) <= 128]
    if bad:
        raise invalid(f"tag keys {bad} are reserved or too long", "use 1-128 characters without the 'aws:' prefix")
    long_values = [k for k, v in value.items() if len(v) > 256]
    if long_values:
        raise invalid(f"values of tags {long_values} are too long", "shorten them to at most 256 characters")
    return value


PlatformName = Annotated[str, AfterValidator(_check_name)]
Region = Annotated[str, AfterValidator(_check_region)]
Tags = Annotated[dict[str, str], AfterValidator(_check_tags)]


# -- sections ----------------------------------------------------------------------------
class AccountConfig(_Model):
    """One AWS account and the role Pulumi assumes in it."""

    id: str = Field(description="12-digit AWS account id, quoted in YAML so leading zeros survive.")
    role_arn: str = Field(description="IAM role Pulumi assumes in this account (must be in `id`).")
    external_id: Optional[str] = Field(None, description="sts:ExternalId the role's trust policy requires, if any.")
    session_name: str = Field("ml-training-platform", description="STS session name, visible in CloudTrail.")

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not _ACCOUNT_ID.match(value):
            raise invalid("is not a 12-digit AWS account id", "use the 12-digit id, quoted in YAML (e.g. '012345678901')")
        return value

    @field_validator("role_arn")
    @classmethod
    def _role(cls, value: str) -> str:
        if not _ROLE_ARN.match(value):
            raise invalid("is not an IAM role ARN", "use arn:aws:iam::<account id>:role/<name>")
        return value


class AccountsConfig(_Model):
    """The three accounts of the platform: CI/images, workloads, and the log archive."""

    automation: AccountConfig = Field(description="CI and shared artifacts (ECR images).")
    workload: AccountConfig = Field(description="VPC, cluster, GPU nodes, storage, MLflow.")
    logging: AccountConfig = Field(description="Central, write-once log archive.")


class LogArchiveConfig(_Model):
    """Central log bucket in the logging account."""

    transition_to_infrequent_access_days: int = Field(30, ge=30, description="S3 requires >= 30 for STANDARD_IA.")
    transition_to_glacier_days: int = Field(90, ge=1)
    expiration_days: int = Field(365, ge=1, description="Logs are deleted this many days after creation.")
    noncurrent_version_expiration_days: int = Field(30, ge=1)
    kms_key_deletion_window_days: int = Field(30, ge=7, le=30)


class FlowLogsConfig(_Model):
    traffic_type: str = Field("ALL", pattern="^(ALL|ACCEPT|REJECT)$")
    max_aggregation_interval_seconds: int = Field(600, description="60 or 600.")

    @field_validator("max_aggregation_interval_seconds")
    @classmethod
    def _interval(cls, value: int) -> int:
        if value not in (60, 600):
            raise invalid("is not an aggregation interval VPC Flow Logs accepts", "use 60 or 600")
        return value


class NetworkConfig(_Model):
    """Multi-AZ VPC. Subnet CIDRs are listed one per AZ, in the order of the AZs."""

    cidr: Cidr = Field(description="VPC CIDR, /16 to /24.")
    availability_zones: list[str] = Field(description="At least 2 AZ names of the region (e.g. us-west-2a).")
    private_subnet_cidrs: list[Cidr] = Field(description="One per AZ; nodes and pods live here, size them for GPU pods.")
    public_subnet_cidrs: list[Cidr] = Field(description="One per AZ; NAT gateways and internet-facing load balancers.")
    nat: NatStrategy = Field(NatStrategy.SINGLE, description="none | single | one_per_az.")
    interface_endpoints: bool = Field(True, description="ECR api+dkr, STS, CloudWatch Logs, SQS, EC2 endpoints.")
    flow_logs: FlowLogsConfig = Field(default_factory=FlowLogsConfig)


class NodeGroupConfig(_Model):
    """Static CPU managed node group that runs the cluster's controllers."""

    instance_types: list[str] = Field(min_length=1, description="e.g. [m7i.xlarge]")
    capacity_type: CapacityType = CapacityType.ON_DEMAND
    min_size: int = Field(ge=0)
    max_size: int = Field(ge=1)
    desired_size: int = Field(ge=0)
    disk_size_gib: int = Field(50, ge=20, le=16384)

    @field_validator("instance_types")
    @classmethod
    def _types(cls, value: list[str]) -> list[str]:
        bad = [t for t in value if not re.match(r"^[a-z][a-z0-9-]*\.[a-z0-9]+$", t)]
        if bad:
            raise invalid(f"{bad} are not EC2 instance types", "use names such as m7i.xlarge")
        return value


class ClusterConfig(_Model):
    """EKS control plane, access and the static CPU node group."""

    version: str = Field(DEFAULT_EKS_VERSION, description=f"One of {sorted(EKS_VERSIONS)}.")
    upgrade_policy: UpgradePolicy = Field(description="Required: pulumi-eks would silently default to EXTENDED.")
    public_access_cidrs: list[Cidr] = Field(
        default_factory=list, description="Empty = private endpoint only. Never allowed in prod."
    )
    admin_role_arns: list[str] = Field(default_factory=list, description="Roles given cluster-admin access entries.")
    deploy_role_arn: Optional[str] = Field(None, description="CI role given a cluster-admin access entry.")
    log_retention_days: int = Field(30, description="Control-plane log retention in CloudWatch.")
    deletion_protection: Optional[bool] = Field(None, description="Defaults to true in prod.")
    system_node_group: NodeGroupConfig

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        if value not in EKS_VERSIONS:
            raise invalid("is not a known EKS version", f"use one of {sorted(EKS_VERSIONS)}")
        return value

    @field_validator("admin_role_arns")
    @classmethod
    def _admins(cls, value: list[str]) -> list[str]:
        bad = [arn for arn in value if not _ROLE_ARN.match(arn)]
        if bad:
            raise invalid(f"{bad} are not IAM role ARNs", "use arn:aws:iam::<account id>:role/<name>")
        return value

    @field_validator("deploy_role_arn")
    @classmethod
    def _deploy(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not _ROLE_ARN.match(value):
            raise invalid("is not an IAM role ARN", "use arn:aws:iam::<account id>:role/<name>")
        return value

    @field_validator("log_retention_days")
    @classmethod
    def _retention(cls, value: int) -> int:
        if value not in LOG_RETENTION_DAYS:
            raise invalid("is not a CloudWatch Logs retention period", f"use one of {LOG_RETENTION_DAYS}")
        return value


# -- datasets and tracking (issue 5) -------------------------------------------------------
class BucketLifecycleConfig(_Model):
    """Lifecycle of one platform bucket; omitted steps are off."""

    transition_to_infrequent_access_days: Optional[int] = Field(None, ge=30, description="S3 requires >= 30.")
    transition_to_glacier_days: Optional[int] = Field(None, ge=1)
    expiration_days: Optional[int] = Field(None, ge=1, description="Current objects are deleted after this.")
    noncurrent_version_expiration_days: int = Field(30, ge=1, description="Overwritten/deleted versions kept this long.")


class DataRepositoryAssociationConfig(_Model):
    """A file system directory linked to an S3 prefix of the datasets or checkpoints bucket."""

    file_system_path: str = Field(description="Absolute directory, e.g. /datasets; no two may nest.")
    bucket: DatasetBucket = Field(description="datasets | checkpoints")
    prefix: str = Field("", description="S3 prefix inside the bucket ('' = whole bucket).")
    import_events: list[FsxEvent] = Field(default_factory=lambda: list(FsxEvent), description="S3 -> FSx: NEW, CHANGED, DELETED.")
    export_events: list[FsxEvent] = Field(default_factory=lambda: list(FsxEvent), description="FSx -> S3: NEW, CHANGED, DELETED.")
    batch_import_metadata_on_create: bool = Field(True, description="List the S3 objects into the file system at creation.")
    imported_file_chunk_size_mib: int = 1024


class FsxConfig(_Model):
    """FSx for Lustre PERSISTENT_2 file system shared by all team namespaces."""

    storage_capacity_gib: int = Field(description="1200, then multiples of 2400.")
    per_unit_storage_throughput_mb_per_tib: int = Field(description="125 | 250 | 500 | 1000 MB/s per TiB.")
    subnet_index: int = Field(0, ge=0, description="Index of the private subnet (AZ) that holds the file system.")
    data_repository_associations: list[DataRepositoryAssociationConfig] = Field(default_factory=list, description="At most 8.")
    automatic_backup_retention_days: int = Field(0, ge=0, le=90, description="0 disables daily backups.")
    daily_automatic_backup_start_time: str = Field("05:00", pattern=r"^([01]\d|2[0-3]):[0-5]\d$")
    weekly_maintenance_start_time: str = Field("7:06:00", pattern=r"^[1-7]:([01]\d|2[0-3]):[0-5]\d$")
    log_level: FsxLogLevel = FsxLogLevel.WARN_ERROR
    log_retention_days: int = Field(30, description="CloudWatch retention of FSx event logs.")
    data_compression: bool = True
    namespaces: list[str] = Field(default_factory=list, description=(
        "Team namespaces that get the PVC (and the MLflow Secret). Stand-in until the scheduling "
        "capability owns team namespaces; they must exist."))

    @field_validator("log_retention_days")
    @classmethod
    def _retention(cls, value: int) -> int:
        if value not in LOG_RETENTION_DAYS:
            raise ValueError(f"is not a CloudWatch retention period; use one of {LOG_RETENTION_DAYS}")
        return value

    @field_validator("namespaces")
    @classmethod
    def _namespaces(cls, value: list[str]) -> list[str]:
        bad = [n for n in value if not re.match(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", n)]
        if bad:
            raise ValueError(f"{bad} are not Kubernetes namespace names; use lowercase letters, digits and '-'")
        return value


class DatasetsConfig(_Model):
    """Datasets and checkpoints buckets and the FSx file system linked to them."""

    datasets_bucket: BucketLifecycleConfig = Field(default_factory=BucketLifecycleConfig)
    checkpoints_bucket: BucketLifecycleConfig = Field(default_factory=BucketLifecycleConfig)
    fsx: FsxConfig
    largest_model_parameters: int = Field(gt=0, description="Parameters of the largest model trained here (spot-save check).")
    spot_notice_margin_seconds: int = Field(30, ge=0, lt=120, description="Part of the 120 s spot notice not available for saving.")


class TrackingDatabaseConfig(_Model):
    """Aurora PostgreSQL Serverless v2 behind MLflow."""

    min_capacity_acu: float = Field(0, description="0 lets the cluster pause when idle.")
    max_capacity_acu: float = Field(4)
    seconds_until_auto_pause: Optional[int] = Field(600, description="300-86400; only with minCapacityAcu 0.")
    backup_retention_days: int = Field(7, ge=1, le=35)


class TrackingConfig(_Model):
    """MLflow on ECS Fargate with Aurora, behind HTTPS load balancers."""

    image: str = Field(description="MLflow server image built from docker/mlflow; repo@sha256:... in prod.")
    domain_name: str = Field(description="Tracking host name, e.g. mlflow.dev.example.com.")
    route53_zone_id: Optional[str] = Field(None, description="Public hosted zone for certificate validation (and the public record).")
    load_balancer_scheme: LoadBalancerScheme = Field(LoadBalancerScheme.INTERNAL, description="internal | internet-facing.")
    ingress_cidrs: list[Cidr] = Field(default_factory=list, description="Clients outside the VPC (VPN, office).")
    num_workers: int = Field(2, ge=1, le=16)
    cpu_units: int = 1024
    memory_mib: int = 2048
    desired_count: int = Field(1, ge=1, le=10)
    admin_username: str = Field("admin", pattern=r"^[a-zA-Z][a-zA-Z0-9_.-]{2,63}$")
    log_retention_days: int = 30
    alb_log_expiration_days: int = Field(90, ge=1)
    ecr_untagged_expiration_days: int = Field(14, ge=1)
    artifacts_bucket: BucketLifecycleConfig = Field(default_factory=BucketLifecycleConfig)
    database: TrackingDatabaseConfig = Field(default_factory=TrackingDatabaseConfig)

    @field_validator("domain_name")
    @classmethod
    def _domain(cls, value: str) -> str:
        if not re.match(r"^(?=.{4,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$", value):
            raise ValueError("is not a lowercase DNS name; use one such as mlflow.dev.example.com")
        return value

    @field_validator("log_retention_days")
    @classmethod
    def _retention(cls, value: int) -> int:
        if value not in LOG_RETENTION_DAYS:
            raise ValueError(f"is not a CloudWatch retention period; use one of {LOG_RETENTION_DAYS}")
        return value


# -- GPU capacity and scheduling (issue 4) -------------------------------------------------
_DURATION = r"^(([0-9]+(s|m|h))+|Never)$"


class CpuPoolConfig(_Model):
    """Karpenter's general CPU pool for non-GPU work (spot + on-demand, consolidation on)."""

    enabled: bool = True
    capacity_types: list[KarpenterCapacityType] = Field(
        default_factory=lambda: [KarpenterCapacityType.SPOT, KarpenterCapacityType.ON_DEMAND], min_length=1)
    max_cpu: int = Field(256, ge=1, description="NodePool limit on vCPUs.")
    max_memory_gib: int = Field(1024, ge=1)
    root_volume_gib: int = Field(100, ge=20, le=16384)


class KarpenterConfig(_Model):
    """Karpenter controller (Helm) and defaults shared by every pool."""

    ami_alias: str = Field("al2023@latest", pattern=r"^(al2023|bottlerocket)@(latest|v[0-9][0-9.]*)$",
                           description="EKS AMI alias, e.g. al2023@v20251023; prod must pin a version.")
    replicas: Optional[int] = Field(None, ge=1, le=5, description="Controller replicas; default 2 in prod (with a PDB), 1 in dev.")
    log_level: str = Field("info", pattern="^(debug|info|error)$")
    cpu_pool: CpuPoolConfig = Field(default_factory=CpuPoolConfig)


class GpuPoolConfig(_Model):
    """One GPU pool: what an ML engineer means (GPU type, GPUs per node, capacity, EFA)."""

    name: str = Field(pattern=r"^[a-z]([a-z0-9-]{0,30}[a-z0-9])?$", description="Pool name; nodes get label mlplatform.io/pool=<name>.")
    gpu_type: str = Field(description="a100 | a100-80gb | h100 | h200 | l4 | a10g | l40s")
    gpus_per_node: int = Field(ge=1, description="GPUs per node; the type must offer it (e.g. h100: 1 or 8).")
    capacity_types: list[KarpenterCapacityType] = Field(min_length=1, description="spot | on-demand | reserved, in preference order.")
    capacity_reservation_ids: list[str] = Field(default_factory=list, description="cr-... ids; required with `reserved`.")
    max_gpus: int = Field(ge=1, description="NodePool limit on nvidia.com/gpu; at least one node's GPUs.")
    efa: bool = Field(False, description="Attach EFA interfaces (multi-node NCCL); the type must support EFA.")
    zones: list[str] = Field(default_factory=list, description="Restrict to these AZs (default: every AZ of the network).")
    root_volume_gib: int = Field(200, ge=50, le=16384, description="Encrypted gp3 root volume.")
    consolidation_policy: ConsolidationPolicy = Field(ConsolidationPolicy.WHEN_EMPTY, description="WhenEmpty keeps running training safe.")
    consolidate_after: str = Field("10m", pattern=_DURATION, description="Idle time before an empty node goes away.")
    expire_after: str = Field("720h", pattern=_DURATION, description="Node lifetime; an expiring node is drained like a spot notice.")
    checkpoint_seconds: int = Field(60, ge=1, description="Measured time to save a checkpoint on this hardware.")
    termination_grace_period_seconds: int = Field(110, ge=10, le=3600, description="Drain budget; > checkpointSeconds, < 120 with spot.")
    ami_alias: Optional[str] = Field(None, pattern=r"^(al2023|bottlerocket)@(latest|v[0-9][0-9.]*)$", description="Overrides karpenter.amiAlias.")
    weight: Optional[int] = Field(None, ge=0, le=100, description="Karpenter NodePool weight (higher is tried first).")

    @field_validator("capacity_reservation_ids")
    @classmethod
    def _reservations(cls, value: list[str]) -> list[str]:
        bad = [v for v in value if not re.match(r"^cr-[0-9a-z]+$", v)]
        if bad:
            raise invalid(f"{bad} are not capacity reservation ids", "use ids such as cr-0123456789abcdef0")
        return value


class GpuEnablementConfig(_Model):
    """How GPUs become schedulable: NVIDIA device plugin or GPU Operator, plus DCGM and EFA plugins."""

    mode: GpuEnablementMode = Field(GpuEnablementMode.DEVICE_PLUGIN, description="device-plugin | gpu-operator (driver and toolkit off).")
    dcgm_exporter: bool = Field(True, description="GPU metrics (DCGM exporter) on GPU nodes.")
    service_monitor: bool = Field(True, description="ServiceMonitor for DCGM (needs the Prometheus operator CRDs).")


class TeamConfig(_Model):
    """A team: its namespace, GPU quota per pool and default priority."""

    name: str = Field(pattern=r"^[a-z]([a-z0-9-]{0,40}[a-z0-9])?$", description="Namespace is team-<name>.")
    gpu_quota: dict[str, int] = Field(default_factory=dict, description="Pool name -> GPUs guaranteed to this team.")
    priority: Priority = Field(Priority.DEFAULT, description="production | research | default, for jobs that name none.")
    fair_sharing_weight: int = Field(1, ge=1, le=100)
    borrowing: bool = Field(True, description="May use other teams' idle GPUs (reclaimed by preemption).")


class SchedulingConfig(_Model):
    """Priority classes, team namespaces with quotas, Kueue queues."""

    teams: list[TeamConfig] = Field(default_factory=list)
    wait_for_pods_ready_timeout: str = Field("10m", pattern=_DURATION, description="All-or-nothing admission timeout.")


class TrainingConfig(_Model):
    """Training jobs: Training Operator 1.9 (PyTorchJob) always; Trainer 2.3 (TrainJob) on request."""

    trainer_v2: bool = Field(False, description="Also install Kubeflow Trainer 2.3 (TrainJob, torch-distributed runtime).")


# -- gitops (Argo CD + Argo Workflows) -------------------------------------------------------
_GIT_URL = r"^(https://[\w.-]+(:\d+)?/[\w./~-]+|ssh://[\w.@-]+(:\d+)?/[\w./~-]+|git@[\w.-]+:[\w./~-]+)$"
_CRON = r"^(\S+\s+){4}\S+$"


class SecretSourceConfig(_Model):
    """A credential that never appears in the stack file: a Secrets Manager secret (JSON) in the
    workload account, copied into a Kubernetes Secret, or a Secret that already exists in the
    `argocd` namespace. Exactly one of the two."""

    secrets_manager_secret_id: Optional[str] = Field(None, description="Name or ARN of a Secrets Manager secret holding JSON.")
    existing_secret: Optional[str] = Field(None, pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$",
                                           description="A Secret already in the argocd namespace.")

    @field_validator("existing_secret")
    @classmethod
    def _one_source(cls, value, info):  # runs after secretsManagerSecretId (field order)
        if value and info.data.get("secrets_manager_secret_id"):
            raise invalid("set together with secretsManagerSecretId", "keep exactly one of the two")
        return value


class SsoConfig(_Model):
    """OIDC single sign-on for Argo CD; the local admin user is disabled when this is set."""

    issuer: str = Field(pattern=r"^https://", description="OIDC issuer URL.")
    client_id: str = Field(min_length=1)
    client_secret: SecretSourceConfig = Field(description="JSON key `clientSecret` (Secrets Manager) or the Secret's key `clientSecret`.")
    admin_groups: list[str] = Field(default_factory=list, description="IdP groups given role:admin.")
    readonly_groups: list[str] = Field(default_factory=list, description="IdP groups given role:readonly.")
    scopes: list[str] = Field(default_factory=lambda: ["openid", "profile", "email", "groups"])


class SyncWindowConfig(_Model):
    kind: str = Field("allow", pattern="^(allow|deny)$", description="allow | deny.")
    schedule: str = Field(pattern=_CRON, description="Cron expression of when the window opens.")
    duration: str = Field(pattern=r"^\d+[mh]$", description="How long it stays open, e.g. 4h.")
    time_zone: str = Field("UTC")
    manual_sync: bool = Field(False, description="Allow manual syncs while the window blocks syncs.")


class GitopsConfig(_Model):
    """Argo CD (app of apps over the rendered manifests) and Argo Workflows (pipelines)."""

    repo_url: str = Field(pattern=_GIT_URL, description="This repository; the only source Argo CD accepts.")
    target_revision: str = Field("main", description="Branch or tag Argo CD follows.")
    rendered_path: Optional[str] = Field(None, pattern=r"^[\w./-]+$", description="Default workloads/rendered/<stack>.")
    domain: str = Field(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", description="Argo CD host name (SSO callback).")
    repo_credentials: Optional[SecretSourceConfig] = Field(None, description="Git credentials (JSON keys username/password or sshPrivateKey).")
    sso: Optional[SsoConfig] = None
    sync_mode: Optional[str] = Field(None, pattern="^(automated|manual)$", description="Default automated in dev, manual in prod.")
    sync_windows: list[SyncWindowConfig] = Field(default_factory=list, description="When syncs may happen (prod).")
    ha: Optional[bool] = Field(None, description="Redis HA and 2 replicas of each server; default true in prod.")
    argo_workflows: bool = Field(True, description="Install Argo Workflows for the training pipelines.")


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
    datasets: Optional[DatasetsConfig] = Field(None, description="S3 buckets + FSx for Lustre (datasets capability).")
    tracking: Optional[TrackingConfig] = Field(None, description="MLflow on Fargate + Aurora (tracking capability).")
    karpenter: KarpenterConfig = Field(default_factory=KarpenterConfig, description="Karpenter controller and CPU pool.")
    gpu_pools: list[GpuPoolConfig] = Field(default_factory=list, max_length=32, description="GPU NodePools, at most 32 (gpu capacity capability).")
    gpu_enablement: GpuEnablementConfig = Field(default_factory=GpuEnablementConfig)
    scheduling: SchedulingConfig = Field(default_factory=SchedulingConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig, description="Training operators (training capability).")
    gitops: Optional[GitopsConfig] = Field(None, description="Argo CD + Argo Workflows (gitops capability).")

    # -- derived values: one place decides what "prod" means ------------------------------
    @property
    def is_prod(self) -> bool:
        return self.environment is Environment.PROD

    @property
    def protect_stateful(self) -> bool:
        """`protect` and deletion protection on buckets, file systems, databases, keys."""
        return self.is_prod

    @property
    def cluster_name(self) -> str:
        return f"{self.name}-eks"

    @property
    def resource_tags(self) -> dict[str, str]:
        base = {"platform": PROJECT, "environment": self.environment.value, "managed-by": "pulumi"}
        return {**base, **self.tags}


# -- cross-field rules -------------------------------------------------------------------
Check = Callable[..., Iterable[Problem]]
CHECKS: list[tuple[tuple[str, ...], Check]] = []


def check(*paths: str) -> Callable[[Check], Check]:
    """Register a rule over these values, by dotted camelCase path ("cluster.systemNodeGroup").

    The rule runs when every value it names parsed, even if siblings did not, so one
    typo never hides another problem.
    """

    def register(fn: Check) -> Check:
        CHECKS.append((paths, fn))
        return fn

    return register


def _account_role_rule(key: str) -> None:
    @check(f"accounts.{key}")
    def rule(account: AccountConfig) -> Iterator[Problem]:
        arn_account = _ROLE_ARN.match(account.role_arn).group(2)  # type: ignore[union-attr]
        if arn_account != account.id:
            yield Problem(
                f"accounts.{key}.roleArn",
                account.role_arn,
                f"the role is in account {arn_account}, not in the {key} account {account.id}",
                f"use the role Pulumi assumes inside account {account.id} "
                f"(arn:aws:iam::{account.id}:role/...) or correct accounts.{key}.id",
            )


for _key in ("automation", "workload", "logging"):
    _account_role_rule(_key)


@check("region", "network.cidr", "network.availabilityZones", "network.privateSubnetCidrs",
       "network.publicSubnetCidrs", "network.nat")
def _network_rules(region, cidr, availability_zones, private_subnet_cidrs, public_subnet_cidrs, nat) -> Iterator[Problem]:
    yield from subnet_problems(
        "network",
        vpc_cidr=cidr,
        availability_zones=availability_zones,
        private_subnet_cidrs=private_subnet_cidrs,
        public_subnet_cidrs=public_subnet_cidrs,
        nat=nat,
        region=region,
    )


@check("logArchive")
def _log_lifecycle(log_archive: LogArchiveConfig) -> Iterator[Problem]:
    yield from lifecycle_problems(
        "logArchive", log_archive.transition_to_infrequent_access_days,
        log_archive.transition_to_glacier_days, log_archive.expiration_days,
    )


@check("cluster.systemNodeGroup.minSize", "cluster.systemNodeGroup.maxSize", "cluster.systemNodeGroup.desiredSize")
def _node_group_sizes(min_size: int, max_size: int, desired_size: int) -> Iterator[Problem]:
    path = "cluster.systemNodeGroup"
    if min_size > max_size:
        yield Problem(f"{path}.minSize", min_size, f"minSize is greater than maxSize ({max_size})",
                      "set minSize <= desiredSize <= maxSize")
    elif not min_size <= desired_size <= max_size:
        yield Problem(f"{path}.desiredSize", desired_size,
                      f"desiredSize is outside [minSize={min_size}, maxSize={max_size}]",
                      "set minSize <= desiredSize <= maxSize")
    if min_size < 2:
        # Karpenter, CoreDNS and the other controllers run only here.
        yield Problem(f"{path}.minSize", min_size, "controllers need 2 nodes to survive the loss of one",
                      "set minSize to 2 or more")


@check("environment", "cluster.publicAccessCidrs", "cluster.deletionProtection")
def _endpoint_and_protection(environment: Environment, public_access_cidrs, deletion_protection) -> Iterator[Problem]:
    for index, cidr in enumerate(public_access_cidrs):
        if cidr.prefixlen == 0:
            yield Problem(
                f"cluster.publicAccessCidrs[{index}]", str(cidr), "opens the Kubernetes API to the whole internet",
                "list your VPN or office egress CIDRs, or leave publicAccessCidrs empty for a private endpoint",
            )
    if environment is not Environment.PROD:
        return
    if public_access_cidrs:
        yield Problem(
            "cluster.publicAccessCidrs", [str(c) for c in public_access_cidrs],
            "prod clusters have a private API endpoint only",
            "remove cluster.publicAccessCidrs and reach the API from inside the VPC (CI runner, VPN, SSM)",
        )
    if deletion_protection is False:
        yield Problem(
            "cluster.deletionProtection", False, "prod clusters must be protected from deletion",
            "remove cluster.deletionProtection (it defaults to true in prod)",
        )


@check("accounts.workload", "cluster.adminRoleArns", "cluster.deployRoleArn")
def _access_entries(workload: AccountConfig, admin_role_arns, deploy_role_arn) -> Iterator[Problem]:
    arns = list(admin_role_arns) + ([deploy_role_arn] if deploy_role_arn else [])
    seen: set[str] = set()
    for arn in arns:
        if arn in seen:
            yield Problem(
                "cluster.adminRoleArns", arn, "the same role is listed twice (EKS rejects duplicate access entries)",
                "list each role once, in adminRoleArns or deployRoleArn",
            )
        seen.add(arn)
    if workload.role_arn in seen:
        yield Problem(
            "cluster.adminRoleArns", workload.role_arn,
            "the workload deploy role creates the cluster and is its admin already; a second access entry fails",
            "remove it from adminRoleArns/deployRoleArn",
        )


@check("datasets.fsx.storageCapacityGib", "datasets.fsx.perUnitStorageThroughputMbPerTib")
def _fsx_capacity(storage_capacity_gib: int, throughput_mb_per_tib: int) -> Iterator[Problem]:
    yield from fsx_capacity_problems("datasets.fsx", storage_capacity_gib, throughput_mb_per_tib)


@check("datasets.fsx.dataRepositoryAssociations")
def _fsx_associations(associations: list[DataRepositoryAssociationConfig]) -> Iterator[Problem]:
    yield from association_problems("datasets.fsx", [dra_spec(d) for d in associations])


@check("datasets.datasetsBucket", "datasets.checkpointsBucket")
def _datasets_lifecycles(datasets_bucket: BucketLifecycleConfig, checkpoints_bucket: BucketLifecycleConfig) -> Iterator[Problem]:
    yield from bucket_lifecycle_problems("datasets.datasetsBucket", datasets_bucket)
    yield from bucket_lifecycle_problems("datasets.checkpointsBucket", checkpoints_bucket)


@check("network.availabilityZones", "datasets.fsx.subnetIndex")
def _fsx_subnet(availability_zones, subnet_index: int) -> Iterator[Problem]:
    if subnet_index >= len(availability_zones):
        yield Problem("datasets.fsx.subnetIndex", subnet_index,
                      f"there are {len(availability_zones)} private subnets", f"use 0-{len(availability_zones) - 1}")


@check("environment", "tracking.image", "tracking.database", "tracking.loadBalancerScheme", "tracking.ingressCidrs",
       "tracking.cpuUnits", "tracking.memoryMib")
def _tracking_rules(environment: Environment, image: str, db: TrackingDatabaseConfig, scheme, ingress_cidrs,
                    cpu_units: int, memory_mib: int) -> Iterator[Problem]:
    yield from tracking_problems(
        "tracking", is_prod=environment is Environment.PROD, image=image,
        min_capacity_acu=db.min_capacity_acu, max_capacity_acu=db.max_capacity_acu,
        seconds_until_auto_pause=db.seconds_until_auto_pause, scheme=scheme,
        num_ingress_cidrs=len(ingress_cidrs), cpu_units=cpu_units, memory_mib=memory_mib,
    )


@check("tracking.artifactsBucket")
def _artifacts_lifecycle(artifacts_bucket: BucketLifecycleConfig) -> Iterator[Problem]:
    yield from bucket_lifecycle_problems("tracking.artifactsBucket", artifacts_bucket)


def dra_spec(dra: DataRepositoryAssociationConfig) -> DataRepositoryAssociationSpec:
    return DataRepositoryAssociationSpec(
        file_system_path=dra.file_system_path, bucket=dra.bucket, prefix=dra.prefix,
        import_events=tuple(dra.import_events), export_events=tuple(dra.export_events),
        batch_import_metadata_on_create=dra.batch_import_metadata_on_create,
        imported_file_chunk_size_mib=dra.imported_file_chunk_size_mib,
    )


def bucket_lifecycle_problems(path: str, lifecycle: BucketLifecycleConfig) -> Iterator[Problem]:
    steps = [("transitionToInfrequentAccessDays", lifecycle.transition_to_infrequent_access_days),
             ("transitionToGlacierDays", lifecycle.transition_to_glacier_days),
             ("expirationDays", lifecycle.expiration_days)]
    present = [(key, days) for key, days in steps if days is not None]
    for (first, first_days), (second, second_days) in zip(present, present[1:]):
        if not first_days < second_days:
            yield Problem(f"{path}.{second}", second_days, f"must come after {first} ({first_days} days)",
                          f"set it above {first_days} or remove {first}")


@check("environment", "karpenter.amiAlias", "gpuPools")
def _gpu_pool_rules(environment: Environment, ami_alias: str, gpu_pools: list[GpuPoolConfig]) -> Iterator[Problem]:
    from workloads.gpu_catalog import gpu_pool_problems

    yield from gpu_pool_problems(
        "gpuPools", gpu_pools, is_prod=environment is Environment.PROD, default_ami_alias=ami_alias)
    if environment is Environment.PROD and ami_alias.endswith("@latest"):
        yield Problem("karpenter.amiAlias", ami_alias, "prod nodes must not follow @latest (every AMI release drifts every node)",
                      "pin a release, e.g. al2023@v20251023")


@check("network.availabilityZones", "gpuPools")
def _gpu_pool_zones(availability_zones: list[str], gpu_pools: list[GpuPoolConfig]) -> Iterator[Problem]:
    for index, pool in enumerate(gpu_pools):
        for zone in pool.zones:
            if zone not in availability_zones:
                yield Problem(f"gpuPools[{index}].zones", zone, "is not an AZ of the network (no subnet there)",
                              f"use one of {availability_zones}")


@check("gpuPools", "scheduling.teams")
def _team_rules(gpu_pools: list[GpuPoolConfig], teams: list[TeamConfig]) -> Iterator[Problem]:
    from workloads.gpu_catalog import team_quota_problems

    yield from team_quota_problems("scheduling.teams", teams, gpu_pools)


@check("environment", "gitops")
def _gitops_rules(environment: Environment, gitops: Optional[GitopsConfig]) -> Iterator[Problem]:
    if gitops is None:
        return
    sources = [("gitops.repoCredentials", gitops.repo_credentials)] + (
        [("gitops.sso.clientSecret", gitops.sso.client_secret)] if gitops.sso else [])
    for path, source in sources:
        if source is not None and not (source.secrets_manager_secret_id or source.existing_secret):
            yield Problem(path, {}, "names no secret", "set secretsManagerSecretId or existingSecret")
    if environment is not Environment.PROD:
        return
    if gitops.sync_mode == "automated":
        yield Problem("gitops.syncMode", gitops.sync_mode, "prod applies merged changes by hand, inside sync windows",
                      "remove gitops.syncMode (manual in prod) and add gitops.syncWindows")
    if gitops.sso is None:
        yield Problem("gitops.sso", None, "prod Argo CD must use single sign-on (the shared admin user is disabled)",
                      "add gitops.sso with your OIDC issuer, clientId and clientSecret source")
    if gitops.ha is False:
        yield Problem("gitops.ha", False, "prod Argo CD runs highly available", "remove gitops.ha (true in prod)")


# -- loading -----------------------------------------------------------------------------
def load_platform_config(raw: dict[str, Any], *, source: str = "stack config") -> PlatformConfig:
    """Validate the project's config values (keys without namespace, camelCase).

    Raises ``ConfigError`` with every problem found; returns a frozen model otherwise.
    """
    problems: list[Problem] = []
    fields = PlatformConfig.model_fields
    by_alias = {(f.alias or name): name for name, f in fields.items()}
    sections: dict[str, Any] = {}
    # Every value that parsed, by dotted alias path ("cluster.systemNodeGroup.minSize"),
    # so a rule runs whenever the fields it reads are valid, whatever else is broken.
    values: dict[str, Any] = {}

    for key in raw:
        if key not in by_alias and key not in fields:
            problems.append(_unknown_key(key, key, list(by_alias)))

    for name, field in fields.items():
        alias = field.alias or name
        if alias not in raw and name not in raw:
            if field.is_required():
                problems.append(
                    Problem(alias, None, "required section is missing", f"add `{PROJECT}:{alias}` to the stack file")
                )
                continue
            sections[name] = field.get_default(call_default_factory=True)
            _collect(alias, field.annotation, None, sections[name], values)
            continue
        value = raw.get(alias, raw.get(name))
        try:
            sections[name] = TypeAdapter(field.annotation).validate_python(value)
        except ValidationError as exc:
            problems.extend(_from_pydantic(exc, alias, field.annotation))
            _collect(alias, field.annotation, value, _FAILED, values)
        else:
            _collect(alias, field.annotation, value, sections[name], values)

    for paths, rule in CHECKS:
        if all(p in values for p in paths):
            problems.extend(rule(*(values[p] for p in paths)))

    if problems:
        raise ConfigError(f"invalid configuration in {source}", problems)
    return PlatformConfig.model_validate(sections)


_FAILED = object()  # marks a value that did not parse


def _collect(path: str, annotation: Any, raw: Any, parsed: Any, values: dict[str, Any]) -> None:
    """Record ``parsed`` at ``path`` and below; when it is ``_FAILED``, whatever of its fields parses."""
    model = _unwrap(annotation)
    is_model = isinstance(model, type) and issubclass(model, BaseModel)
    if parsed is not _FAILED:
        values[path] = parsed
    if not is_model or (parsed is not _FAILED and not isinstance(parsed, BaseModel)):
        return
    for name, field in model.model_fields.items():
        alias = field.alias or name
        child_path = f"{path}.{alias}"
        if parsed is not _FAILED:
            _collect(child_path, field.annotation, None, getattr(parsed, name), values)
            continue
        if not isinstance(raw, dict):
            return
        if alias not in raw and name not in raw:
            if not field.is_required():
                values[child_path] = field.get_default(call_default_factory=True)
            continue
        child_raw = raw.get(alias, raw.get(name))
        try:
            child = TypeAdapter(field.annotation).validate_python(child_raw)
        except ValidationError:
            child = _FAILED
        _collect(child_path, field.annotation, child_raw, child, values)


def _from_pydantic(exc: ValidationError, root: str, annotation: Any) -> list[Problem]:
    problems = []
    for error in exc.errors(include_url=False):
        loc = [part for part in error["loc"] if not (isinstance(part, str) and part.startswith("function-"))]
        path = _path(root, loc)
        kind = error["type"]
        message = error["msg"].removeprefix("Value error, ")
        value = error.get("input")
        if kind == "extra_forbidden":
            model = _model_at(annotation, loc[:-1])
            allowed = [f.alias or n for n, f in model.model_fields.items()] if model else []
            problems.append(_unknown_key(path, str(loc[-1]), allowed))
            continue
        if kind == "missing":
            problems.append(Problem(path, None, "required key is missing", f"add `{loc[-1]}` (see the config reference in README.md)"))
            continue
        if kind == "string_type" and isinstance(value, int) and re.match(r"^\d{1,12}$", str(value)):
            problems.append(Problem(path, value, "must be a string", f"quote it in YAML: '{value:012d}'"))
            continue
        if kind == "enum":
            expected = error.get("ctx", {}).get("expected", "")
            problems.append(Problem(path, value, "is not an allowed value", f"use one of {expected}"))
            continue
        if FIX in message:
            message, fix = message.split(FIX, 1)
        else:
            fix = _generic_fix(kind, error.get("ctx") or {})
        problems.append(Problem(path, value, message, fix))
    return problems


def _generic_fix(kind: str, ctx: dict[str, Any]) -> str:
    if kind in ("greater_than_equal", "greater_than"):
        return f"use a value >= {ctx.get('ge', ctx.get('gt'))}"
    if kind in ("less_than_equal", "less_than"):
        return f"use a value <= {ctx.get('le', ctx.get('lt'))}"
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return f"write a {kind.split('_')[0]} here"
    if kind == "too_short":
        return f"list at least {ctx.get('min_length')} item(s)"
    if kind == "string_pattern_mismatch":
        return f"match the pattern {ctx.get('pattern')}"
    return "see the config reference in README.md"


def _path(root: str, loc: list[Any]) -> str:
    path = root
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _model_at(annotation: Any, loc: list[Any]) -> Optional[type[BaseModel]]:
    current: Any = annotation
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = next((f for n, f in current.model_fields.items() if (f.alias or n) == part or n == part), None)
            if field is None:
                return None
            current = field.annotation
        else:  # list/dict element
            args = [a for a in get_args(current) if a is not type(None)]
            current = args[-1] if args else None
    current = _unwrap(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    while get_origin(annotation) is not None and get_origin(annotation) is not list and get_origin(annotation) is not dict:
        args = [a for a in get_args(annotation) if a is not type(None)]
        if not args:
            break
        annotation = args[0]
    return annotation


def _unknown_key(path: str, key: str, allowed: list[str]) -> Problem:
    close = difflib.get_close_matches(key, allowed, n=1)
    fix = f"did you mean `{close[0]}`?" if close else f"remove it; allowed keys here: {', '.join(sorted(allowed))}"
    return Problem(path, key, "unknown key", fix)
