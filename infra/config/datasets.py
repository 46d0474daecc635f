"""The ``datasets`` section: datasets and checkpoints buckets and the FSx for Lustre file system; its rules."""
from __future__ import annotations

from typing import Annotated, Iterator, Optional

from pydantic import Field, field_validator

from components.bucket import lifecycle_problems
from components.bucket import LifecycleRule
from components.datasets import (
    DataRepositoryAssociationSpec, DatasetBucket, DatasetsStorage, FsxEvent, FsxLogLevel, association_problems, fsx_capacity_problems,
)
from components.datasets import FsxArgs
from workloads.problems import Problem
from catalog import limits
from infra.config.common import check_log_retention, prod_retention_rule, _Model
from infra.config.syntax import checked, s3_prefix_problem
from infra.config.engine import Rule
from infra.config.common import at_most


class BucketLifecycleConfig(_Model):
    """Lifecycle of one platform bucket; omitted steps are off."""

    transition_to_infrequent_access_days: Optional[int] = Field(None, ge=30, description="S3 requires >= 30.")
    transition_to_glacier_days: Optional[int] = Field(None, ge=1)
    expiration_days: Optional[int] = Field(None, ge=1, description="Current objects are deleted after this.")
    noncurrent_version_expiration_days: int = Field(LifecycleRule.noncurrent_version_expiration_days, ge=1, description="Overwritten/deleted versions kept this long.")

    def rule(self, rule_id: str) -> LifecycleRule:
        return self.copy_into(LifecycleRule, id=rule_id)


class DataRepositoryAssociationConfig(_Model):
    """A file system directory linked to an S3 prefix of the datasets or checkpoints bucket."""

    file_system_path: str = Field(description="Absolute directory, e.g. /datasets; no two may nest.")
    bucket: DatasetBucket = Field(description="datasets | checkpoints")
    prefix: str = Field("", description="S3 prefix inside the bucket ('' = whole bucket).")
    import_events: list[FsxEvent] = Field(default_factory=lambda: list(FsxEvent), description="S3 -> FSx: NEW, CHANGED, DELETED.")
    export_events: list[FsxEvent] = Field(default_factory=lambda: list(FsxEvent), description="FSx -> S3: NEW, CHANGED, DELETED.")
    batch_import_metadata_on_create: bool = Field(True, description="List the S3 objects into the file system at creation.")
    imported_file_chunk_size_mib: Annotated[int, at_most(limits.FSX_IMPORTED_FILE_CHUNK_MIB)] = Field(DataRepositoryAssociationSpec.imported_file_chunk_size_mib, ge=1)

    def spec(self) -> DataRepositoryAssociationSpec:
        return self.copy_into(DataRepositoryAssociationSpec)

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        return checked(s3_prefix_problem(value), "use a prefix such as imagenet/ (no leading '/', no '.' or '..' segments)", value)


class FsxConfig(_Model):
    """FSx for Lustre PERSISTENT_2 file system shared by all team namespaces."""

    storage_capacity_gib: Annotated[int, at_most(limits.FSX_LUSTRE_STORAGE_GIB)] = Field(description="1200, then multiples of 2400.")
    per_unit_storage_throughput_mb_per_tib: int = Field(description="125 | 250 | 500 | 1000 MB/s per TiB.")
    subnet_index: int = Field(FsxArgs.subnet_index, ge=0, description="Index of the private subnet (AZ) that holds the file system.")
    data_repository_associations: list[DataRepositoryAssociationConfig] = Field(default_factory=list, description="At most 8.")
    automatic_backup_retention_days: Annotated[int, at_most(limits.FSX_BACKUP_RETENTION_DAYS)] = Field(FsxArgs.automatic_backup_retention_days, ge=0, description="0 disables daily backups.")
    daily_automatic_backup_start_time: str = Field(FsxArgs.daily_automatic_backup_start_time, pattern=r"^([01]\d|2[0-3]):[0-5]\d$")
    weekly_maintenance_start_time: str = Field(FsxArgs.weekly_maintenance_start_time, pattern=r"^[1-7]:([01]\d|2[0-3]):[0-5]\d$")
    log_level: FsxLogLevel = FsxArgs.log_level
    log_retention_days: int = Field(FsxArgs.log_retention_days, description="CloudWatch retention of FSx event logs; prod: 365 or more.")
    data_compression: bool = FsxArgs.data_compression

    def args(self) -> FsxArgs:
        return self.copy_into(FsxArgs, throughput_mb_per_tib=self.per_unit_storage_throughput_mb_per_tib,
                              associations=[d.spec() for d in self.data_repository_associations])

    @field_validator("log_retention_days")
    @classmethod
    def _retention(cls, value: int) -> int:
        return check_log_retention(value)


class DatasetsConfig(_Model):
    """Datasets and checkpoints buckets and the FSx file system linked to them."""

    datasets_bucket: BucketLifecycleConfig = Field(default_factory=BucketLifecycleConfig)
    checkpoints_bucket: BucketLifecycleConfig = Field(default_factory=BucketLifecycleConfig)
    storage: DatasetsStorage = Field(DatasetsStorage.FSX, description=(
        "fsx: FSx for Lustre linked to the buckets (prod). s3-mountpoint (dev only): the datasets bucket "
        "read-only through Mountpoint for Amazon S3 and each team's subtree on EFS; same claims and paths, "
        "no hourly cost (FSx's 1200 GiB floor is $174/month)."))
    fsx: Optional[FsxConfig] = Field(None, description="Required with storage fsx; refused with s3-mountpoint.")
    largest_model_parameters: int = Field(gt=0, description="Parameters of the largest model trained here (spot-save check).")
    spot_notice_margin_seconds: int = Field(30, ge=0, lt=120, description="Part of the 120 s spot notice not available for saving.")


def _storage(environment: str, storage: DatasetsStorage, fsx: Optional[FsxConfig]) -> Iterator[Problem]:
    if storage is DatasetsStorage.FSX and fsx is None:
        yield Problem("datasets.fsx", None, "storage fsx needs the file system", "add datasets.fsx or set datasets.storage: s3-mountpoint (dev)")
    if storage is DatasetsStorage.S3_MOUNTPOINT and fsx is not None:
        yield Problem("datasets.fsx", "set", "storage s3-mountpoint creates no FSx file system", "remove datasets.fsx or set datasets.storage: fsx")
    if storage is DatasetsStorage.S3_MOUNTPOINT and environment == "prod":
        yield Problem("datasets.storage", storage.value,
                      "prod trains on FSx for Lustre (throughput, the checkpoint budget of a spot notice, S3 export)",
                      "use datasets.storage: fsx in prod")


def _mountpoint_needs_cpu_pool(storage: DatasetsStorage, cpu_pool_enabled: bool) -> Iterator[Problem]:
    # The Mountpoint add-on's s3-csi-controller tolerates no taint (chart v2.2.2
    # templates/controller.yaml; the add-on's configuration accepts none, aws/containers-roadmap#2676)
    # and the system nodes are tainted CriticalAddonsOnly: only a general CPU node can run it.
    if storage is DatasetsStorage.S3_MOUNTPOINT and not cpu_pool_enabled:
        yield Problem("karpenter.cpuPool.enabled", cpu_pool_enabled,
                      "storage s3-mountpoint needs the general CPU pool: the Mountpoint CSI controller tolerates no "
                      "taint, so it cannot run on the system nodes and would never start",
                      "set karpenter.cpuPool.enabled: true, or datasets.storage: fsx")


def _fsx_capacity(storage_capacity_gib: int, throughput_mb_per_tib: int) -> Iterator[Problem]:
    yield from fsx_capacity_problems("datasets.fsx", storage_capacity_gib, throughput_mb_per_tib)


def _fsx_associations(associations: list[DataRepositoryAssociationConfig]) -> Iterator[Problem]:
    yield from association_problems("datasets.fsx", [dra_spec(d) for d in associations])


def _datasets_lifecycles(datasets_bucket: BucketLifecycleConfig, checkpoints_bucket: BucketLifecycleConfig) -> Iterator[Problem]:
    yield from bucket_lifecycle_problems("datasets.datasetsBucket", datasets_bucket)
    yield from bucket_lifecycle_problems("datasets.checkpointsBucket", checkpoints_bucket)


def _fsx_subnet(availability_zones, subnet_index: int) -> Iterator[Problem]:
    if subnet_index >= len(availability_zones):
        yield Problem("datasets.fsx.subnetIndex", subnet_index,
                      f"there are {len(availability_zones)} private subnets", f"use 0-{len(availability_zones) - 1}")


def dra_spec(dra: DataRepositoryAssociationConfig) -> DataRepositoryAssociationSpec:
    return dra.spec()


def bucket_lifecycle_problems(path: str, lifecycle: BucketLifecycleConfig) -> Iterator[Problem]:
    """S3's transition rules and minimum storage durations (``components.bucket.lifecycle_problems``)."""
    yield from lifecycle_problems(
        path, ia_days=lifecycle.transition_to_infrequent_access_days,
        glacier_days=lifecycle.transition_to_glacier_days, expiration_days=lifecycle.expiration_days)


# Listed in the order the loader runs them (infra.config.platform.RULES).
RULES: tuple[Rule, ...] = (
    Rule(("environment", "datasets.storage", "datasets.fsx"), _storage),
    Rule(("datasets.storage", "karpenter.cpuPool.enabled"), _mountpoint_needs_cpu_pool),
    prod_retention_rule("datasets.fsx.logRetentionDays"),
    Rule(("datasets.fsx.storageCapacityGib", "datasets.fsx.perUnitStorageThroughputMbPerTib"), _fsx_capacity),
    Rule(("datasets.fsx.dataRepositoryAssociations",), _fsx_associations),
    Rule(("datasets.datasetsBucket", "datasets.checkpointsBucket"), _datasets_lifecycles),
    Rule(("network.availabilityZones", "datasets.fsx.subnetIndex"), _fsx_subnet),
)
