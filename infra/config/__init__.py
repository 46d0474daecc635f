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
import unicodedata
from enum import Enum
from typing import Annotated, Any, Callable, Iterable, Iterator, Optional, get_args, get_origin

from pydantic import AfterValidator, BaseModel, BeforeValidator, PlainSerializer, ConfigDict, Field, SecretStr, TypeAdapter, ValidationError, field_validator
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

from components.cluster import UpgradePolicy
from components.bucket import lifecycle_problems
from components.log_archive import archive_problems
from components.network import NatStrategy, subnet_problems
from components.validation import InvalidInputError, Problem
from components.datasets import DataRepositoryAssociationSpec, DatasetBucket, FsxEvent, FsxLogLevel, association_problems, fsx_capacity_problems
from components.tracking import LoadBalancerScheme, tracking_problems
from infra.regions import PARTITION_OF_REGION, partition_of
from infra import limits
from infra.limits import at_most
from components.versions import DEFAULT_EKS_VERSION, EKS_VERSIONS
from components.gpu_enablement import GpuEnablementMode
from workloads.karpenter import CapacityType as KarpenterCapacityType, ConsolidationPolicy
from workloads.scheduling import Priority

PROJECT = "ml-training-platform"

_ACCOUNT_ID = re.compile(r"^\d{12}$")
_ROLE_ARN = re.compile(r"^arn:(aws|aws-us-gov|aws-cn):iam::(\d{12}):role/[\w+=,.@/-]{1,512}$")
_NAME = re.compile(r"^[a-z][a-z0-9-]{1,22}[a-z0-9]$")
PROD_OBJECT_LOCK_RETENTION_DAYS = 365
# Log retention floor in prod (CIS AWS Foundations / EKS Best Practices: keep audit logs a year).
PROD_MIN_LOG_RETENTION_DAYS = 365
# CloudWatch Logs accepts only these retention periods.
RETENTION_SOURCE = "CloudWatch Logs PutRetentionPolicy (https://docs.aws.amazon.com/AmazonCloudWatchLogs/latest/APIReference/API_PutRetentionPolicy.html)"
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653)


from infra.config.engine import FIX, invalid  # noqa: E402


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
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True, use_enum_values=False,
        # .inf and .nan are valid YAML floats that no AWS size or period accepts.
        allow_inf_nan=False,
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
    if partition_of(value) is None:
        close = difflib.get_close_matches(value, sorted(PARTITION_OF_REGION), n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise invalid(
            "is not a region of the aws, aws-cn or aws-us-gov partitions (table: infra/regions.py, from botocore's endpoints.json)",
            f"{hint}use a region name such as us-west-2",
        )
    return value


# AWS tag rules (the pattern AWS APIs enforce, e.g. EFS API_Tag:
# ^(?![aA][wW][sS]:)([\p{L}\p{Z}\p{N}_.:/=+\-@]+)$, and "Tag naming limits and requirements",
# https://docs.aws.amazon.com/tag-editor/latest/userguide/best-practices-and-strats.html):
# key 1-128 characters, value 0-256, letters, digits, spaces and _ . : / = + - @,
# no aws: prefix on keys or values, at most 50 user tags per resource.
MAX_TAGS_PER_RESOURCE = 50
# The platform adds its own tags (platform, environment, managed-by, Name, kubernetes.io/cluster/...,
# karpenter.sh/discovery ...): leave them room under AWS's 50.
NUM_PLATFORM_TAGS_RESERVED = 10
_TAG_SPECIALS = set("_.:/=+-@")


def _tag_text_problem(text: str, kind: str, max_length: int, min_length: int) -> Optional[str]:
    if not min_length <= len(text) <= max_length:
        return f"{kind} is {len(text)} characters (AWS allows {min_length}-{max_length})"
    if text[:4].lower() == "aws:":
        return f"{kind} starts with the reserved 'aws:' prefix"
    bad = sorted({c for c in text if not (c in _TAG_SPECIALS or unicodedata.category(c)[0] in "LNZ")})
    if bad:
        return f"{kind} has characters AWS tags refuse: {bad}"
    return None


def _check_tags(value: dict[str, str]) -> dict[str, str]:
    limit = MAX_TAGS_PER_RESOURCE - NUM_PLATFORM_TAGS_RESERVED
    if len(value) > limit:
        raise invalid(
            f"{len(value)} tags: AWS allows {MAX_TAGS_PER_RESOURCE} per resource and the platform adds up to "
            f"{NUM_PLATFORM_TAGS_RESERVED} of its own", f"keep at most {limit} tags")
    found = []
    for key, tag_value in value.items():
        reason = _tag_text_problem(key, f"key {key!r}", 128, 1) or _tag_text_problem(tag_value, f"value of {key!r}", 256, 0)
        if reason:
            found.append(reason)
    if found:
        raise invalid("; ".join(found), "AWS tag rules: keys 1-128 and values 0-256 characters of letters, digits, "
                      "spaces and _ . : / = + - @, no 'aws:' prefix")
    return value


PlatformName = Annotated[str, AfterValidator(_check_name)]
Region = Annotated[str, AfterValidator(_check_region)]
Tags = Annotated[dict[str, str], AfterValidator(_check_tags)]


# -- sections ----------------------------------------------------------------------------
class AccountConfig(_Model):
    """One AWS account and the role Pulumi assumes in it."""

    id: str = Field(description="12-digit AWS account id, quoted in YAML so leading zeros survive.")
    role_arn: str = Field(description="IAM role Pulumi assumes in this account (must be in `id`).")
    external_id: Optional[SecretStr] = Field(None, description=(
        "sts:ExternalId the role's trust policy requires, if any; may be stored with `pulumi config set --secret`."))
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


class AccountLayout(str, Enum):
    """Whether the three roles live in three accounts (the isolation the layout exists for)."""

    SEPARATE = "separate"  # automation, workload and logging are three different accounts
    SINGLE_ACCOUNT = "single-account"  # explicit opt-out: some or all roles share one account


class AccountsConfig(_Model):
    """The three accounts of the platform: CI/images, workloads, and the log archive."""

    automation: AccountConfig = Field(description="CI and shared artifacts (ECR images).")
    workload: AccountConfig = Field(description="VPC, cluster, GPU nodes, storage, MLflow. No externalId (see README).")
    logging: AccountConfig = Field(description="Central, write-once log archive.")
    layout: AccountLayout = Field(AccountLayout.SEPARATE, description=(
        "separate | single-account. Two roles in one account are refused unless single-account is set."))


class AuditTrailMode(str, Enum):
    """Where the CloudTrail trails that deliver to the log archive live."""

    ACCOUNT = "account"  # one trail in the workload and one in the automation account
    ORGANIZATION = "organization"  # one organization trail, created by the logging account


class AuditTrailConfig(_Model):
    """CloudTrail audit trail delivered to the log archive (multi-region, KMS, log file validation)."""

    mode: AuditTrailMode = Field(AuditTrailMode.ACCOUNT, description=(
        "account | organization. organization: the logging account must be a CloudTrail delegated "
        "administrator of the organization, which owns the trail in its management account."))
    organization_id: Optional[str] = Field(None, pattern=r"^o-[a-z0-9]{10,32}$", description="o-...; organization mode only.")
    management_account_id: Optional[str] = Field(None, description="12-digit id of the organization's management account; organization mode only.")

    @field_validator("management_account_id")
    @classmethod
    def _management(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not _ACCOUNT_ID.match(value):
            raise invalid("is not a 12-digit AWS account id", "use the 12-digit id, quoted in YAML")
        return value


class LogArchiveConfig(_Model):
    """Central log bucket in the logging account, the audit trail, and S3 access-log buckets."""

    transition_to_infrequent_access_days: Optional[int] = Field(30, ge=30, description="S3 requires >= 30 for STANDARD_IA; null: no transition.")
    transition_to_glacier_days: Optional[int] = Field(90, ge=1, description="GLACIER_IR bills >= 90 days: expirationDays must be >= this + 90; null: none.")
    expiration_days: Optional[int] = Field(365, ge=1, description="Logs are deleted this many days after creation; null: never.")
    noncurrent_version_expiration_days: int = Field(30, ge=1)
    object_lock_retention_days: Optional[int] = Field(None, ge=1, le=36500, description=(
        "Object Lock (GOVERNANCE) retention of every archived object. Default: 365 in prod, off in dev."))
    access_log_expiration_days: int = Field(365, ge=1, le=36500, description="S3 server access logs (one SSE-S3 bucket per account) are deleted after this.")
    audit_trail: AuditTrailConfig = Field(default_factory=AuditTrailConfig)
    kms_key_deletion_window_days: Annotated[int, at_most(limits.KMS_PENDING_WINDOW_DAYS)] = Field(30, ge=7)


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
    interface_endpoints: Optional[bool] = Field(None, description=(
        "ECR api+dkr, STS, CloudWatch Logs, SQS, EC2 endpoints (about $88/month with 2 AZs). Default: on in prod, "
        "off in dev (traffic goes through the NAT gateway)."))
    flow_logs: FlowLogsConfig = Field(default_factory=FlowLogsConfig)


class NodeGroupConfig(_Model):
    """Static CPU managed node group that runs the cluster's controllers."""

    instance_types: list[str] = Field(min_length=1, description="e.g. [m7i.xlarge]")
    capacity_type: CapacityType = CapacityType.ON_DEMAND
    min_size: Annotated[int, at_most(limits.EKS_NODES_PER_MANAGED_NODE_GROUP)] = Field(ge=0)
    max_size: Annotated[int, at_most(limits.EKS_NODES_PER_MANAGED_NODE_GROUP)] = Field(ge=1)
    desired_size: Annotated[int, at_most(limits.EKS_NODES_PER_MANAGED_NODE_GROUP)] = Field(ge=0)
    disk_size_gib: Annotated[int, at_most(limits.EBS_GP3_VOLUME_GIB)] = Field(50, ge=20)

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
    log_retention_days: int = Field(30, description="Control-plane log retention in CloudWatch; prod: 365 or more.")
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
            raise invalid(f"is not a retention period {RETENTION_SOURCE} accepts", f"use one of {LOG_RETENTION_DAYS}")
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
    imported_file_chunk_size_mib: Annotated[int, at_most(limits.FSX_IMPORTED_FILE_CHUNK_MIB)] = Field(1024, ge=1)


class FsxConfig(_Model):
    """FSx for Lustre PERSISTENT_2 file system shared by all team namespaces."""

    storage_capacity_gib: Annotated[int, at_most(limits.FSX_LUSTRE_STORAGE_GIB)] = Field(description="1200, then multiples of 2400.")
    per_unit_storage_throughput_mb_per_tib: int = Field(description="125 | 250 | 500 | 1000 MB/s per TiB.")
    subnet_index: int = Field(0, ge=0, description="Index of the private subnet (AZ) that holds the file system.")
    data_repository_associations: list[DataRepositoryAssociationConfig] = Field(default_factory=list, description="At most 8.")
    automatic_backup_retention_days: Annotated[int, at_most(limits.FSX_BACKUP_RETENTION_DAYS)] = Field(0, ge=0, description="0 disables daily backups.")
    daily_automatic_backup_start_time: str = Field("05:00", pattern=r"^([01]\d|2[0-3]):[0-5]\d$")
    weekly_maintenance_start_time: str = Field("7:06:00", pattern=r"^[1-7]:([01]\d|2[0-3]):[0-5]\d$")
    log_level: FsxLogLevel = FsxLogLevel.WARN_ERROR
    log_retention_days: int = Field(30, description="CloudWatch retention of FSx event logs; prod: 365 or more.")
    data_compression: bool = True
    namespaces: list[str] = Field(default_factory=list, description=(
        "Team namespaces that get the PVC (and the MLflow Secret). Stand-in until the scheduling "
        "capability owns team namespaces; they must exist."))

    @field_validator("log_retention_days")
    @classmethod
    def _retention(cls, value: int) -> int:
        if value not in LOG_RETENTION_DAYS:
            raise invalid(f"is not a retention period {RETENTION_SOURCE} accepts", f"use one of {LOG_RETENTION_DAYS}")
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

    min_capacity_acu: Annotated[float, at_most(limits.AURORA_SERVERLESS_V2_MAX_ACU)] = Field(0, description="0 lets the cluster pause when idle.")
    max_capacity_acu: Annotated[float, at_most(limits.AURORA_SERVERLESS_V2_MAX_ACU)] = Field(4, description="At most 256.")
    seconds_until_auto_pause: Optional[int] = Field(600, description="300-86400; only with minCapacityAcu 0.")
    backup_retention_days: Annotated[int, at_most(limits.RDS_BACKUP_RETENTION_DAYS)] = Field(7, ge=1)
    password_rotation_days: int = Field(30, description="Rotation period of the MLflow server's own database password (1-1000).")


class TrackingConfig(_Model):
    """MLflow on ECS Fargate with Aurora, behind HTTPS load balancers."""

    image: Optional[str] = Field(None, description="MLflow server image built from docker/mlflow; repo@sha256:... in prod. "
                                 "Unset on a first deploy (no ECS service until the image is pushed; README First deploy order).")
    domain_name: str = Field(description="Tracking host name, e.g. mlflow.dev.example.com.")
    route53_zone_id: Optional[str] = Field(None, description="Public hosted zone for certificate validation (and the public record).")
    load_balancer_scheme: LoadBalancerScheme = Field(LoadBalancerScheme.INTERNAL, description="internal | internet-facing.")
    ingress_cidrs: list[Cidr] = Field(default_factory=list, description="Clients outside the VPC (VPN, office).")
    allow_internet_ingress: bool = Field(False, description=(
        "Named opt-in: lets a prod internet-facing load balancer admit the whole internet (ingressCidrs covering "
        "0.0.0.0/0 together). Refused otherwise."))
    num_workers: int = Field(2, ge=1, le=16)
    cpu_units: int = 1024
    memory_mib: int = 2048
    desired_count: int = Field(1, ge=1, le=10)
    admin_username: str = Field("admin", pattern=r"^[a-zA-Z][a-zA-Z0-9_.-]{2,63}$")
    log_retention_days: int = Field(30, description="CloudWatch retention of the MLflow task logs; prod: 365 or more.")
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
            raise invalid(f"is not a retention period {RETENTION_SOURCE} accepts", f"use one of {LOG_RETENTION_DAYS}")
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
    root_volume_gib: Annotated[int, at_most(limits.EBS_GP3_VOLUME_GIB)] = Field(100, ge=20)


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
    root_volume_gib: Annotated[int, at_most(limits.EBS_GP3_VOLUME_GIB)] = Field(200, ge=50, description="Encrypted gp3 root volume.")
    consolidation_policy: ConsolidationPolicy = Field(ConsolidationPolicy.WHEN_EMPTY, description="WhenEmpty keeps running training safe.")
    consolidate_after: str = Field("10m", pattern=_DURATION, description="Idle time before an empty node goes away.")
    expire_after: str = Field("720h", pattern=_DURATION, description="Node lifetime; an expiring node is drained like a spot notice.")
    checkpoint_seconds: int = Field(60, ge=1, description="Measured time to save a checkpoint on this hardware.")
    termination_grace_period_seconds: int = Field(110, ge=10, le=3600, description="Drain budget; > checkpointSeconds, < 120 with spot.")
    ami_alias: Optional[str] = Field(None, pattern=r"^(al2023|bottlerocket)@(latest|v[0-9][0-9.]*)$", description="Overrides karpenter.amiAlias.")
    # NodePool CRD (karpenter 1.14.1, spec.weight): integer, minimum 1, maximum 100.
    weight: Annotated[Optional[int], at_most(limits.KARPENTER_NODEPOOL_WEIGHT)] = Field(
        None, ge=1, description="Karpenter NodePool weight 1-100 (higher is tried first).")

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
    service_monitor: bool = Field(False, description="ServiceMonitor for DCGM; needs prometheusOperatorCrds.")
    prometheus_operator_crds: bool = Field(
        False, description="Install the pinned prometheus-operator-crds chart (ServiceMonitor CRDs); serviceMonitor needs it.")


class TeamConfig(_Model):
    """A team: its namespace, GPU quota per pool and default priority."""

    name: str = Field(pattern=r"^[a-z]([a-z0-9-]{0,40}[a-z0-9])?$", description="Namespace is team-<name>.")
    gpu_quota: dict[str, int] = Field(default_factory=dict, description="Pool name -> GPUs guaranteed to this team.")
    priority: Priority = Field(Priority.DEFAULT, description="production | research | default, for jobs that name none.")
    fair_sharing_weight: int = Field(1, ge=1, le=100)
    borrowing: bool = Field(True, description="May use other teams' idle GPUs (reclaimed by preemption).")
    role_arns: list[str] = Field(default_factory=list, description="IAM roles given namespace-scoped edit access (EKS access entries) to team-<name>.")

    @property
    def namespace(self) -> str:
        return f"team-{self.name}"

    @field_validator("role_arns")
    @classmethod
    def _roles(cls, value: list[str]) -> list[str]:
        bad = [arn for arn in value if not _ROLE_ARN.match(arn)]
        if bad:
            raise invalid(f"{bad} are not IAM role ARNs", "use arn:aws:iam::<account id>:role/<name>")
        return value


class SchedulingConfig(_Model):
    """Priority classes, team namespaces with quotas, Kueue queues."""

    teams: list[TeamConfig] = Field(default_factory=list)
    wait_for_pods_ready_timeout: str = Field("10m", pattern=_DURATION, description="All-or-nothing admission timeout.")


class TrainingConfig(_Model):
    """Training jobs: Training Operator 1.9 (PyTorchJob) always; Trainer 2.3 (TrainJob) on request."""

    trainer_v2: bool = Field(False, description="Also install Kubeflow Trainer 2.3 (TrainJob, torch-distributed runtime).")


class BudgetAccount(str, Enum):
    AUTOMATION = "automation"
    WORKLOAD = "workload"
    LOGGING = "logging"


class BudgetsConfig(_Model):
    """A monthly AWS Budget per account, with e-mail alerts (operations capability)."""

    # AWS Budgets quotas: 10 e-mail subscribers per notification, 5 notifications per budget.
    alert_emails: list[str] = Field(min_length=1, max_length=10, description="Who gets the alerts (1-10 addresses).")
    monthly_limit_usd: dict[BudgetAccount, Annotated[float, Field(gt=0)]] = Field(min_length=1, description=(
        "Monthly budget in USD per account (automation, workload, logging); accounts left out get no budget."))
    actual_thresholds_percent: list[Annotated[float, Field(gt=0)]] = Field(
        default_factory=lambda: [80.0, 100.0], max_length=5,
        description="Alert when actual spend passes these percentages of the limit.")
    forecast_threshold_percent: Optional[Annotated[float, Field(gt=0)]] = Field(100.0, description=(
        "Alert when the month's forecast passes this percentage; null: no forecast alert."))


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
    budgets: Optional[BudgetsConfig] = Field(None, description="AWS Budgets per account (operations capability).")

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


@check("accounts")
def _account_isolation(accounts: AccountsConfig) -> Iterator[Problem]:
    if accounts.layout is AccountLayout.SINGLE_ACCOUNT:
        return
    keys = ("automation", "workload", "logging")
    for index, first in enumerate(keys):
        for second in keys[index + 1:]:
            account_id = getattr(accounts, first).id
            if account_id == getattr(accounts, second).id:
                yield Problem(
                    f"accounts.{second}.id", account_id,
                    f"is also the {first} account: the {first} and {second} roles would share one account, losing "
                    "the isolation the three-account layout exists for (a compromised workload could rewrite its own audit logs)",
                    f"use a separate account for {second}, or set accounts.layout: single-account to accept one account",
                )


@check("accounts.workload")
def _kubeconfig_role(workload: AccountConfig) -> Iterator[Problem]:
    # pulumi-eks writes the kubeconfig Pulumi's Kubernetes provider uses as
    # `aws --region R eks get-token --cluster-name N --output json --role <roleArn>`
    # (pulumi/pulumi-eks nodejs/eks/cluster/cluster.ts, generateKubeconfig): the AWS CLI's
    # `eks get-token` has no option for an external id, so such a role cannot be assumed there.
    if workload.external_id is not None:
        yield Problem(
            "accounts.workload.externalId", "[redacted]",
            "the workload role is also assumed by the cluster's kubeconfig (`aws eks get-token --role`), "
            "which cannot pass an sts:ExternalId: every Kubernetes resource would fail with AccessDenied",
            "remove externalId and restrict the workload role's trust policy by principal (and aws:PrincipalOrgID or "
            "source identity) instead; automation and logging roles may keep theirs",
        )


def _arn_partition(arn: str) -> str:
    return arn.split(":", 2)[1]


@check("region", "accounts", "cluster.adminRoleArns", "cluster.deployRoleArn")
def _arn_partitions(region: str, accounts: AccountsConfig, admin_role_arns, deploy_role_arn) -> Iterator[Problem]:
    partition = partition_of(region)
    arns = [(f"accounts.{key}.roleArn", getattr(accounts, key).role_arn) for key in ("automation", "workload", "logging")]
    arns += [(f"cluster.adminRoleArns[{i}]", arn) for i, arn in enumerate(admin_role_arns)]
    arns += [("cluster.deployRoleArn", deploy_role_arn)] if deploy_role_arn else []
    for path, arn in arns:
        if _arn_partition(arn) != partition:
            yield Problem(path, arn, f"is in partition {_arn_partition(arn)}, but region {region} is in partition {partition}",
                          f"use arn:{partition}:iam::<account id>:role/<name> (a role of the region's partition)")


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


@check("environment", "network.nat", "network.interfaceEndpoints")
def _private_egress(environment: Environment, nat: NatStrategy, interface_endpoints: Optional[bool]) -> Iterator[Problem]:
    endpoints = environment is Environment.PROD if interface_endpoints is None else interface_endpoints
    if nat is NatStrategy.NONE and not endpoints:
        why = "is off" if interface_endpoints is False else f"defaults to off in {environment.value}"
        yield Problem("network.interfaceEndpoints", interface_endpoints,
                      f"with nat: none and no interface endpoints nodes reach neither ECR, STS nor EC2 (it {why})",
                      "set network.interfaceEndpoints: true, or choose nat: single")


@check("environment", "logArchive")
def _log_archive_rules(environment: Environment, log_archive: LogArchiveConfig) -> Iterator[Problem]:
    lock = log_archive.object_lock_retention_days
    if lock is None and environment is Environment.PROD:
        lock = PROD_OBJECT_LOCK_RETENTION_DAYS
    problems = list(archive_problems(
        "logArchive", ia_days=log_archive.transition_to_infrequent_access_days,
        glacier_days=log_archive.transition_to_glacier_days, expiration_days=log_archive.expiration_days,
        object_lock_retention_days=lock))
    if log_archive.object_lock_retention_days is None:
        # The lock came from the prod default: say so rather than blame a key that is not in the file.
        problems = [Problem(p.path, p.value, p.message + f" (prod default {PROD_OBJECT_LOCK_RETENTION_DAYS} days)", p.fix)
                    if p.path.endswith("objectLockRetentionDays") else p for p in problems]
    yield from problems
    trail = log_archive.audit_trail
    org = {"organizationId": trail.organization_id, "managementAccountId": trail.management_account_id}
    if trail.mode is AuditTrailMode.ORGANIZATION:
        for key, value in org.items():
            if value is None:
                yield Problem(f"logArchive.auditTrail.{key}", None, "an organization trail needs it",
                              f"set logArchive.auditTrail.{key}, or use mode: account")
    else:
        for key, value in org.items():
            if value is not None:
                yield Problem(f"logArchive.auditTrail.{key}", value, "is only used by mode: organization",
                              "remove it, or set mode: organization")


def _prod_retention_rule(path: str) -> None:
    @check("environment", path)
    def rule(environment: Environment, retention_days: int) -> Iterator[Problem]:
        if environment is Environment.PROD and retention_days < PROD_MIN_LOG_RETENTION_DAYS:
            allowed = [d for d in LOG_RETENTION_DAYS if d >= PROD_MIN_LOG_RETENTION_DAYS]
            yield Problem(path, retention_days,
                          f"prod keeps CloudWatch logs at least {PROD_MIN_LOG_RETENTION_DAYS} days (audit and incident response)",
                          f"use one of {allowed}")


for _path in ("cluster.logRetentionDays", "datasets.fsx.logRetentionDays", "tracking.logRetentionDays"):
    _prod_retention_rule(_path)


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


# Judged by what a list covers together: 0.0.0.0/1 + 128.0.0.0/1 is the whole internet too.
# No office or VPN egress needs more than a /8 of public addresses.
MAX_OPEN_ADDRESSES = 2 ** 24


def _exposure(path: str, cidrs: list[ipaddress.IPv4Network]) -> Optional[tuple[str, Any, str]]:
    """(path, value, description) when ``cidrs`` together are (nearly) the whole internet."""
    union = list(ipaddress.collapse_addresses(cidrs))
    num_addresses = sum(n.num_addresses for n in union)
    everything = ipaddress.IPv4Network("0.0.0.0/0")
    if num_addresses <= MAX_OPEN_ADDRESSES:
        return None
    single = next((i for i, c in enumerate(cidrs) if c.num_addresses == num_addresses), None)
    at, value = (f"{path}[{single}]", str(cidrs[single])) if single is not None else (path, [str(c) for c in cidrs])
    if union == [everything]:
        return at, value, "the whole internet"
    return at, value, f"{num_addresses:,} addresses ({num_addresses / everything.num_addresses:.0%} of IPv4), more than a /8"


@check("environment", "cluster.publicAccessCidrs", "cluster.deletionProtection")
def _endpoint_and_protection(environment: Environment, public_access_cidrs, deletion_protection) -> Iterator[Problem]:
    exposed = _exposure("cluster.publicAccessCidrs", list(public_access_cidrs))
    if exposed:
        at, value, what = exposed
        yield Problem(
            at, value, f"opens the Kubernetes API to {what}",
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


@check("accounts.workload", "cluster.adminRoleArns", "cluster.deployRoleArn", "scheduling.teams")
def _access_entries(workload: AccountConfig, admin_role_arns, deploy_role_arn, teams) -> Iterator[Problem]:
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
            "the workload deploy role (accounts.workload.roleArn) gets its own access entry; a second one fails",
            "remove it from adminRoleArns/deployRoleArn",
        )
    for index, team in enumerate(teams):
        for arn in team.role_arns:
            if arn in seen or arn == workload.role_arn:
                yield Problem(
                    f"scheduling.teams[{index}].roleArns", arn,
                    "the role already has cluster-wide access (admin or deploy role); EKS allows one access entry per role",
                    "give teams their own roles",
                )


@check("gpuEnablement.serviceMonitor", "gpuEnablement.prometheusOperatorCrds")
def _service_monitor_needs_crds(service_monitor: bool, prometheus_operator_crds: bool) -> Iterator[Problem]:
    if service_monitor and not prometheus_operator_crds:
        yield Problem(
            "gpuEnablement.serviceMonitor", True,
            "a ServiceMonitor needs the Prometheus operator CRDs; without them Helm refuses the chart and rolls it back",
            "set gpuEnablement.prometheusOperatorCrds: true (installs the pinned prometheus-operator-crds chart) "
            "or serviceMonitor: false",
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
def _tracking_rules(environment: Environment, image: Optional[str], db: TrackingDatabaseConfig, scheme, ingress_cidrs,
                    cpu_units: int, memory_mib: int) -> Iterator[Problem]:
    yield from tracking_problems(
        "tracking", is_prod=environment is Environment.PROD, image=image,
        min_capacity_acu=db.min_capacity_acu, max_capacity_acu=db.max_capacity_acu,
        seconds_until_auto_pause=db.seconds_until_auto_pause, scheme=scheme,
        num_ingress_cidrs=len(ingress_cidrs), cpu_units=cpu_units, memory_mib=memory_mib,
        password_rotation_days=db.password_rotation_days,
    )


@check("environment", "tracking.loadBalancerScheme", "tracking.ingressCidrs", "tracking.allowInternetIngress")
def _tracking_exposure(environment: Environment, scheme: LoadBalancerScheme, ingress_cidrs, allow_internet_ingress: bool) -> Iterator[Problem]:
    exposed = _exposure("tracking.ingressCidrs", list(ingress_cidrs))
    if not exposed or scheme is not LoadBalancerScheme.INTERNET_FACING:
        return
    at, value, what = exposed
    if environment is Environment.PROD and not allow_internet_ingress:
        yield Problem(at, value, f"admits {what} to the prod internet-facing MLflow load balancer",
                      "list your VPN or office egress CIDRs, use loadBalancerScheme: internal, or set "
                      "tracking.allowInternetIngress: true to accept a public tracking server")


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
    """S3's transition rules and minimum storage durations (``components.bucket.lifecycle_problems``)."""
    yield from lifecycle_problems(
        path, ia_days=lifecycle.transition_to_infrequent_access_days,
        glacier_days=lifecycle.transition_to_glacier_days, expiration_days=lifecycle.expiration_days)


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


@check("budgets")
def _budget_rules(budgets: Optional[BudgetsConfig]) -> Iterator[Problem]:
    from components.budgets import alert_problems

    if budgets is not None:
        yield from alert_problems("budgets", actual_thresholds_percent=budgets.actual_thresholds_percent,
                                  forecast_threshold_percent=budgets.forecast_threshold_percent,
                                  alert_emails=budgets.alert_emails)


# -- loading -----------------------------------------------------------------------------
SECRET_PLACEHOLDER = "[secret]"


def load_platform_config(raw: dict[str, Any], *, source: str = "stack config",
                         secret_paths: Iterable[str] = ()) -> PlatformConfig:
    """Validate the project's config values (keys without namespace, camelCase).

    ``secret_paths`` are the dotted paths (``accounts``, ``accounts.workload.externalId``) the
    stack file stores encrypted (``secure:``): their values never appear in a message, and each
    must lead to a secret field (``SecretStr``) or a section holding one, since any other field
    would carry the value into resources in plain text.

    Raises ``ConfigError`` with every problem found; returns a frozen model otherwise.
    """
    secret_paths = tuple(secret_paths)
    problems = list(_secret_path_problems(secret_paths))
    not_secret_fields = tuple(p.path for p in problems)  # their other problems would only repeat this one
    try:
        config = _load(raw, source)
    except ConfigError as error:
        problems += [_redacted(p, secret_paths) for p in error.problems if not _under_secret(p.path, not_secret_fields)]
        # A secret field's value (or a section holding one) is never shown, encrypted or not.
        problems = [_redacted(p, [p.path]) if p.value is not None and _secret_capable(p.path) else p for p in problems]
    else:
        if not problems:
            return config
    raise ConfigError(f"invalid configuration in {source}", problems)


def _under_secret(path: str, secret_paths: Iterable[str]) -> bool:
    return any(path == s or path.startswith((s + ".", s + "[")) for s in secret_paths)


def _redacted(problem: Problem, secret_paths: Iterable[str]) -> Problem:
    if _under_secret(problem.path, secret_paths):
        return Problem(problem.path, SECRET_PLACEHOLDER, problem.message, problem.fix)
    return problem


def _secret_path_problems(secret_paths: Iterable[str]) -> Iterator[Problem]:
    for path in secret_paths:
        if not _secret_capable(path):
            yield Problem(
                path, SECRET_PLACEHOLDER,
                "is stored encrypted (secure:), but it is not a secret field: the program would pass it to "
                "resources in plain text (and the offline plan cannot decrypt it)",
                "store it in plain text (`pulumi config set` without --secret); only fields documented as secrets "
                "(e.g. accounts.<key>.externalId) may be encrypted",
            )


def _secret_capable(path: str) -> bool:
    """Whether ``path`` is a SecretStr field or a section that holds one."""
    annotation: Any = PlatformConfig
    for part in re.sub(r"\[\d+\]", "", path).split("."):
        model = _unwrap(annotation)
        if get_origin(model) is list:
            model = _unwrap(get_args(model)[0])
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return False
        field = next((f for n, f in model.model_fields.items() if (f.alias or n) == part or n == part), None)
        if field is None:
            return False
        annotation = field.annotation
    return _holds_secret(annotation)


def _holds_secret(annotation: Any) -> bool:
    target = _unwrap(annotation)
    if get_origin(target) is list:
        target = _unwrap(get_args(target)[0])
    if target is SecretStr:
        return True
    if isinstance(target, type) and issubclass(target, BaseModel):
        return any(_holds_secret(f.annotation) for f in target.model_fields.values())
    return False


def _load(raw: dict[str, Any], source: str) -> PlatformConfig:
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
            sections[name] = _adapter(field).validate_python(value)
        except ValidationError as exc:
            problems.extend(_from_pydantic(exc, alias, field.annotation))
            _collect(alias, field.annotation, value, _FAILED, values)
        else:
            _collect(alias, field.annotation, value, sections[name], values)

    for paths, rule in CHECKS:
        if all(p in values for p in paths):
            problems.extend(rule(*(values[p] for p in paths)))

    reported = {p.path for p in problems}
    for name, section in sections.items():
        alias = fields[name].alias or name
        problems.extend(p for p in _list_problems(alias, section)
                        if p.path not in reported and p.path.rsplit("[", 1)[0] not in reported)

    if problems:
        raise ConfigError(f"invalid configuration in {source}", problems)
    try:
        return PlatformConfig.model_validate(sections)
    except ValidationError as exc:  # a model-level rule not in the per-section pass: still no traceback
        raise ConfigError(f"invalid configuration in {source}", _from_pydantic(exc, "", PlatformConfig)) from None


def _list_problems(path: str, value: Any) -> Iterator[Problem]:
    """Every list of plain values holds each value once; a CIDR list holds no block inside another."""
    if isinstance(value, BaseModel):
        for name, field in type(value).model_fields.items():
            yield from _list_problems(f"{path}.{field.alias or name}", getattr(value, name))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _list_problems(f"{path}.{key}", item)
    elif isinstance(value, (list, tuple)):
        seen: dict[Any, int] = {}
        for index, item in enumerate(value):
            if isinstance(item, (BaseModel, dict, list)):
                yield from _list_problems(f"{path}[{index}]", item)
                continue
            shown = item.value if isinstance(item, Enum) else str(item) if isinstance(item, ipaddress.IPv4Network) else item
            if item in seen:
                yield Problem(f"{path}[{index}]", shown, f"repeats {path}[{seen[item]}]", "list each value once")
                continue
            seen[item] = index
            if isinstance(item, ipaddress.IPv4Network):
                outer = next((i for i, other in enumerate(value) if i != index and other != item
                              and isinstance(other, ipaddress.IPv4Network) and item.subnet_of(other)), None)
                if outer is not None:
                    yield Problem(f"{path}[{index}]", shown, f"lies inside {path}[{outer}] ({value[outer]})",
                                  "remove it (the larger block already covers it)")


_FAILED = object()  # marks a value that did not parse
_ADAPTERS: dict[int, TypeAdapter] = {}


def _adapter(field: FieldInfo) -> TypeAdapter:
    """Validates one field as the model would: its type *and* its constraints and validators.

    ``field.annotation`` alone drops what ``Annotated[...]`` and ``Field(...)`` attach (name,
    region and tag validators, ``max_length``, ``ge``/``le``): those live in ``field.metadata``.
    """
    adapter = _ADAPTERS.get(id(field))
    if adapter is None:
        annotation = Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
        adapter = _ADAPTERS[id(field)] = TypeAdapter(annotation, config=None if _is_model(field.annotation) else _FIELD_CONFIG)
    return adapter


_FIELD_CONFIG = ConfigDict(allow_inf_nan=False)


def _is_model(annotation: Any) -> bool:
    model = _unwrap(annotation)
    return isinstance(model, type) and issubclass(model, BaseModel)


def _collect(path: str, annotation: Any, raw: Any, parsed: Any, values: dict[str, Any]) -> None:
    """Record ``parsed`` at ``path`` and below; when it is ``_FAILED``, whatever of its fields parses."""
    model = _unwrap(annotation)
    is_model = isinstance(model, type) and issubclass(model, BaseModel)
    if parsed is not _FAILED:
        values[path] = parsed
    if not is_model or (parsed is not _FAILED and not isinstance(parsed, BaseModel)):
        return
    failed_fields: set[Any] = set()
    if parsed is _FAILED and isinstance(raw, dict):
        try:
            model.model_validate(raw)
        except ValidationError as exc:
            failed_fields = {error["loc"][0] for error in exc.errors() if error["loc"]}
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
        if alias in failed_fields or name in failed_fields:
            # Refused by the model itself (a @field_validator that the field's type alone lacks).
            child = _FAILED
        else:
            try:
                child = _adapter(field).validate_python(child_raw)
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
        if kind == "string_type" and isinstance(value, int) and not isinstance(value, bool):
            quoted = f"{value:012d}" if path.endswith(".id") and re.match(r"^\d{1,12}$", str(value)) else str(value)
            fix = "quote it in YAML" if _secret_capable(path) else f"quote it in YAML: '{quoted}'"
            problems.append(Problem(path, value, "must be a string", fix))
            continue
        if kind == "finite_number":
            problems.append(Problem(path, value, "must be a finite number", "write a number (.inf and .nan are not sizes)"))
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
    if kind == "too_long":
        return f"list at most {ctx.get('max_length')} item(s)"
    if kind == "string_pattern_mismatch":
        return f"match the pattern {ctx.get('pattern')}"
    return "see the config reference in README.md"


def _path(root: str, loc: list[Any]) -> str:
    path = root
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path.lstrip(".")


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


@check("gpuPools")
def _pool_node_limits(gpu_pools: list[GpuPoolConfig]) -> Iterator[Problem]:
    limit = limits.KUBERNETES_NODES_PER_CLUSTER
    for index, pool in enumerate(gpu_pools):
        num_nodes = pool.max_gpus // pool.gpus_per_node
        if num_nodes > limit.maximum:
            yield Problem(f"gpuPools[{index}].maxGpus", pool.max_gpus,
                          f"allows {num_nodes} nodes, above {limit.what} (source: {limit.source})",
                          f"use at most {int(limit.maximum) * pool.gpus_per_node} GPUs")


@check("gpuPools", "cluster.systemNodeGroup.maxSize")
def _cluster_node_limit(gpu_pools: list[GpuPoolConfig], system_max_size: int) -> Iterator[Problem]:
    limit = limits.KUBERNETES_NODES_PER_CLUSTER
    num_nodes = [pool.max_gpus // pool.gpus_per_node for pool in gpu_pools]
    total = system_max_size + sum(num_nodes)
    if total > limit.maximum and all(n <= limit.maximum for n in num_nodes):
        yield Problem("gpuPools", [p.name for p in gpu_pools],
                      f"the GPU pools and the system node group together allow {total} nodes, above {limit.what} "
                      f"(source: {limit.source})", "lower the pools' maxGpus")
