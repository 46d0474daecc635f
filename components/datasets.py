"""Training data: S3 buckets and FSx for Lustre linked to them, mounted in every team namespace.

Storage mode ``fsx`` (prod) is described below. Mode ``s3-mountpoint`` (a dev stack's idle cost:
PERSISTENT_2's 1200 GiB floor is $174/month) keeps the buckets and the two claims but mounts the
datasets bucket read-only through Mountpoint for Amazon S3 and each team's subtree from an
encrypted EFS file system through an access point (``workloads.s3_storage``); nothing is billed
by the hour.

Datasets live in S3 and are lazy-loaded into a PERSISTENT_2 Lustre file system through data
repository associations (DRAs); checkpoints written to the file system are exported back to
S3 by the same mechanism. Pods see the file system through a static PV/PVC per team namespace
(``workloads.fsx``), mounted by the ``aws-fsx-csi-driver`` EKS add-on.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Iterator, Mapping, Optional, Sequence, Union

import pulumi
import pulumi_aws as aws

from catalog.gpus import SPOT_NOTICE_SECONDS  # noqa: F401  (re-exported)
from catalog.limits import (  # noqa: F401  (re-exported)
    FSX_CAPACITY_STEP_GIB as CAPACITY_STEP_GIB,
    FSX_FIRST_CAPACITY_GIB as FIRST_CAPACITY_GIB,
    FSX_MAX_DATA_REPOSITORY_ASSOCIATIONS as MAX_DATA_REPOSITORY_ASSOCIATIONS,
    FSX_THROUGHPUT_TIERS_MB_PER_TIB as THROUGHPUT_TIERS_MB_PER_TIB,
    LUSTRE_PORTS,
    LUSTRE_VERSION,
)
from components.bucket import AccessLogBucket, LifecycleRule, SecureBucket, SecureBucketArgs
from components.cluster import Cluster
from components.k8s import apply_object
from components.kms import create_key, set_key_policy
from components.network import Network
from workloads.problems import Problem, accepts_enum_values, raise_if_any
from components.addons import EFS_CSI_DRIVER, FSX_CSI_DRIVER, MOUNTPOINT_S3_CSI_DRIVER
from catalog.versions import EKS_ADDON_VERSIONS
from trainer.contract.memory import TRAINING_STATE_BYTES_PER_PARAMETER
from workloads.fsx import (
    CHECKPOINTS_DIR, CLAIM_NAME, DATASETS_CLAIM_NAME, fsx_persistent_volume, fsx_persistent_volume_claim, static_claim,
    team_volume_specs,
)
from workloads.s3_storage import (
    NOMINAL_CAPACITY, EfsVolumeSpec, MountpointVolumeSpec, efs_persistent_volume, mountpoint_persistent_volume,
)

# -- FSx for Lustre PERSISTENT_2 (capacity steps, tiers, ports: catalog/limits.py) ----------------
# FSx reaches a linked bucket through this per-file-system service-linked role.
FSX_S3_SLR_PATH = "role/aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/AWSServiceRoleForFSxS3Access_"


class FsxEvent(str, Enum):
    NEW = "NEW"
    CHANGED = "CHANGED"
    DELETED = "DELETED"


class DatasetBucket(str, Enum):
    """Which platform bucket a DRA links to."""

    DATASETS = "datasets"
    CHECKPOINTS = "checkpoints"


class DatasetsStorage(str, Enum):
    """What backs the team claims: FSx for Lustre linked to the buckets, or (no hourly cost) the
    datasets bucket through Mountpoint for Amazon S3 plus EFS for the teams' subtrees."""

    FSX = "fsx"
    S3_MOUNTPOINT = "s3-mountpoint"


class FsxLogLevel(str, Enum):
    WARN_ERROR = "WARN_ERROR"
    ERROR_ONLY = "ERROR_ONLY"
    WARN_ONLY = "WARN_ONLY"


@accepts_enum_values
@dataclass(frozen=True)
class DataRepositoryAssociationSpec:
    """A directory of the file system mirrored to an S3 prefix of one platform bucket."""

    file_system_path: str
    bucket: DatasetBucket
    prefix: str = ""
    import_events: Sequence[FsxEvent] = (FsxEvent.NEW, FsxEvent.CHANGED, FsxEvent.DELETED)
    export_events: Sequence[FsxEvent] = (FsxEvent.NEW, FsxEvent.CHANGED, FsxEvent.DELETED)
    batch_import_metadata_on_create: bool = True
    imported_file_chunk_size_mib: int = 1024


# -- pure rules (shared by the stack config and DatasetsArgs) -------------------------------
def valid_capacities_near(capacity_gib: int) -> list[int]:
    below = max(FIRST_CAPACITY_GIB, (capacity_gib // CAPACITY_STEP_GIB) * CAPACITY_STEP_GIB)
    above = FIRST_CAPACITY_GIB if capacity_gib < FIRST_CAPACITY_GIB else (capacity_gib // CAPACITY_STEP_GIB + 1) * CAPACITY_STEP_GIB
    return sorted({below, above})


def is_valid_capacity(capacity_gib: int) -> bool:
    return capacity_gib == FIRST_CAPACITY_GIB or (capacity_gib > 0 and capacity_gib % CAPACITY_STEP_GIB == 0)


def _norm_dir(path: str) -> str:
    return "/" + "/".join(part for part in path.split("/") if part) + ("/" if path.strip("/") else "")


def _nested(a: str, b: str) -> bool:
    return a.startswith(b) or b.startswith(a)


def fsx_problems(
    path: str,
    *,
    storage_capacity_gib: int,
    throughput_mb_per_tib: int,
    associations: Sequence[DataRepositoryAssociationSpec],
    association_key: str = "dataRepositoryAssociations",
) -> Iterator[Problem]:
    """Every reason FSx would refuse this file system, as config problems."""
    yield from fsx_capacity_problems(path, storage_capacity_gib, throughput_mb_per_tib)
    yield from association_problems(path, associations, association_key)


def fsx_capacity_problems(path: str, storage_capacity_gib: int, throughput_mb_per_tib: int) -> Iterator[Problem]:
    if not is_valid_capacity(storage_capacity_gib):
        yield Problem(f"{path}.storageCapacityGib", storage_capacity_gib,
                      f"PERSISTENT_2 capacity is {FIRST_CAPACITY_GIB} GiB or a multiple of {CAPACITY_STEP_GIB} GiB",
                      f"use one of {valid_capacities_near(storage_capacity_gib)}")
    if throughput_mb_per_tib not in THROUGHPUT_TIERS_MB_PER_TIB:
        yield Problem(f"{path}.perUnitStorageThroughputMbPerTib", throughput_mb_per_tib,
                      "is not a PERSISTENT_2 throughput tier", f"use one of {list(THROUGHPUT_TIERS_MB_PER_TIB)} (MB/s per TiB)")


def association_problems(
    path: str, associations: Sequence[DataRepositoryAssociationSpec], association_key: str = "dataRepositoryAssociations",
) -> Iterator[Problem]:
    if len(associations) > MAX_DATA_REPOSITORY_ASSOCIATIONS:
        yield Problem(f"{path}.{association_key}", len(associations),
                      f"a file system has at most {MAX_DATA_REPOSITORY_ASSOCIATIONS} data repository associations",
                      "merge associations under a common directory and S3 prefix, or use a second file system")
    seen_fs: list[tuple[int, str]] = []
    seen_s3: list[tuple[int, str]] = []
    for index, dra in enumerate(associations):
        item = f"{path}.{association_key}[{index}]"
        fs_path = dra.file_system_path
        if not fs_path.startswith("/") or fs_path.strip("/") == "" or "//" in fs_path or ".." in fs_path.split("/"):
            yield Problem(f"{item}.fileSystemPath", fs_path, "must be an absolute directory below the root",
                          "use a path such as /datasets or /checkpoints")
        else:
            norm = _norm_dir(fs_path)
            for other, other_norm in seen_fs:
                if _nested(norm, other_norm):
                    what = "duplicates" if norm == other_norm else "overlaps"
                    yield Problem(f"{item}.fileSystemPath", fs_path,
                                  f"{what} the path of dataRepositoryAssociations[{other}] ({other_norm.rstrip('/')}); "
                                  "FSx refuses nested or repeated association paths",
                                  "give each association its own top-level directory, e.g. /datasets and /checkpoints")
                    break
            seen_fs.append((index, norm))
        s3 = f"{dra.bucket.value}:/{dra.prefix.strip('/')}/" if dra.prefix.strip("/") else f"{dra.bucket.value}:/"
        for other, other_s3 in seen_s3:
            if _nested(s3, other_s3):
                yield Problem(f"{item}.prefix", dra.prefix,
                              f"the S3 location overlaps dataRepositoryAssociations[{other}] in the {dra.bucket.value} bucket",
                              "link non-overlapping prefixes (one association per bucket and prefix)")
                break
        seen_s3.append((index, s3))
        if len(set(dra.import_events)) != len(dra.import_events) or len(set(dra.export_events)) != len(dra.export_events):
            yield Problem(f"{item}", [e.value for e in (*dra.import_events, *dra.export_events)],
                          "an event is listed twice", "list each of NEW, CHANGED, DELETED at most once")
        if not 1 <= dra.imported_file_chunk_size_mib <= 512000:
            yield Problem(f"{item}.importedFileChunkSizeMib", dra.imported_file_chunk_size_mib,
                          "is outside 1-512000 MiB", "use the default 1024")


def write_throughput_mb_per_s(storage_capacity_gib: int, throughput_mb_per_tib: int) -> float:
    return storage_capacity_gib / 1024 * throughput_mb_per_tib


def checkpoint_seconds(num_parameters: int, storage_capacity_gib: int, throughput_mb_per_tib: int) -> float:
    """Time to write a model's full training state at the file system's baseline throughput."""
    state_bytes = num_parameters * TRAINING_STATE_BYTES_PER_PARAMETER
    return state_bytes / (write_throughput_mb_per_s(storage_capacity_gib, throughput_mb_per_tib) * 1_000_000)


# -- component ------------------------------------------------------------------------------
@accepts_enum_values
@dataclass(frozen=True)
class FsxArgs:
    """The Lustre file system.

    Attributes:
        storage_capacity_gib: 1200, then multiples of 2400.
        throughput_mb_per_tib: 125 / 250 / 500 / 1000.
        subnet_index: which private subnet (AZ) holds it; put GPU pools in the same AZ.
        associations: DRAs (at most 8, non-overlapping paths).
        automatic_backup_retention_days: 0 disables daily backups.
        daily_automatic_backup_start_time / weekly_maintenance_start_time: UTC windows.
        log_level / log_retention_days: FSx event logs to CloudWatch.
        data_compression: LZ4 halves storage for text datasets at no throughput cost.
        no_squash_nids: Lustre client NIDs exempt from root squash (``10.0.1.6@tcp``,
            ``10.0.[2-10].[1-255]@tcp``); empty: root is squashed on every client.
    """

    storage_capacity_gib: int
    throughput_mb_per_tib: int
    associations: Sequence[DataRepositoryAssociationSpec]
    subnet_index: int = 0
    automatic_backup_retention_days: int = 0
    daily_automatic_backup_start_time: str = "05:00"
    weekly_maintenance_start_time: str = "7:06:00"
    log_level: FsxLogLevel = FsxLogLevel.WARN_ERROR
    log_retention_days: int = 30
    data_compression: bool = True
    no_squash_nids: Sequence[str] = ()


@accepts_enum_values
@dataclass(frozen=True)
class DatasetsArgs:
    """Inputs of ``Datasets``.

    Attributes:
        network / cluster: the file system lives in a private subnet and admits the cluster's nodes.
        access_logs_bucket: S3 server access log target in this (the workload) account.
        log_kms_key: key of the FSx log group (its policy must admit CloudWatch Logs for it).
        storage: ``fsx`` or ``s3-mountpoint`` (``DatasetsStorage``).
        fsx: the file system (mode ``fsx`` only).
        posix_ids: each namespace's uid/gid (mode ``s3-mountpoint``: the owner of its EFS subtree).
        namespaces: team namespaces that get a PVC (they must exist).
        namespace_resources: those namespaces' Namespace objects; each claim depends on its own.
        datasets_lifecycle / checkpoints_lifecycle: lifecycle rules per bucket.
        general_capacity: what an untolerating Deployment needs to be scheduled (the general CPU
            NodePool): the Mountpoint add-on waits for it, because its ``s3-csi-controller`` has no
            tolerations (chart v2.2.2 templates/controller.yaml) and the add-on's configuration
            accepts none (aws/containers-roadmap#2676), so it can run only on a general node.
        protect: Pulumi ``protect`` on buckets, key and file system; final FSx backup (prod).
        tags: tags on every taggable child.
    """

    network: Network
    cluster: Cluster
    fsx: Optional[FsxArgs]
    namespaces: Sequence[str]
    storage: DatasetsStorage = DatasetsStorage.FSX
    posix_ids: Mapping[str, int] = field(default_factory=dict)
    namespace_resources: Mapping[str, pulumi.Resource] = field(default_factory=dict)
    access_logs_bucket: Optional[Union[AccessLogBucket, aws.s3.Bucket]] = None
    log_kms_key: Optional[aws.kms.Key] = None
    datasets_lifecycle: Sequence[LifecycleRule] = ()
    checkpoints_lifecycle: Sequence[LifecycleRule] = ()
    general_capacity: Sequence[pulumi.Resource] = ()
    addon_version: str = EKS_ADDON_VERSIONS["aws-fsx-csi-driver"]
    mountpoint_addon_version: str = EKS_ADDON_VERSIONS["aws-mountpoint-s3-csi-driver"]
    efs_addon_version: str = EKS_ADDON_VERSIONS["aws-efs-csi-driver"]
    protect: bool = False
    tags: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.storage is DatasetsStorage.S3_MOUNTPOINT:
            missing = [ns for ns in self.namespaces if ns not in self.posix_ids]
            if missing:
                raise ValueError(f"DatasetsArgs.posix_ids: no uid for {missing}; mode s3-mountpoint owns each "
                                 "team's EFS subtree by the team's uid (workloads.tenancy)")
            return
        if self.fsx is None:
            raise ValueError("DatasetsArgs.fsx: required with storage 'fsx'; set it or use storage 's3-mountpoint'")
        raise_if_any("DatasetsArgs.fsx", fsx_problems(
            "fsx", storage_capacity_gib=self.fsx.storage_capacity_gib,
            throughput_mb_per_tib=self.fsx.throughput_mb_per_tib, associations=self.fsx.associations))
        if not 0 <= self.fsx.subnet_index < len(self.network.args.private_subnet_cidrs):
            raise ValueError(f"DatasetsArgs.fsx.subnet_index: {self.fsx.subnet_index} is not a private subnet index")


def bucket_arn_prefix(partition: pulumi.Input[str], component_name: str, kind: "DatasetBucket") -> pulumi.Output[str]:
    """The ARN prefix of one of ``Datasets``' buckets, known before the bucket exists: Pulumi
    auto-names a resource ``<logical name>-<random suffix>`` (Pulumi docs, "Resource names:
    autonaming"), and the bucket's logical name is ``<component>-<kind>-bucket``. The audit
    trail selects the buckets' data events by it (the trail is created before them)."""
    return pulumi.Output.concat("arn:", partition, ":s3:::", f"{component_name}-{kind.value}-bucket-")


@dataclass(frozen=True)
class _FileSystem:
    log_group: aws.cloudwatch.LogGroup
    file_system: aws.fsx.LustreFileSystem
    key_policy: pulumi.Resource
    associations: list[aws.fsx.DataRepositoryAssociation]


class Datasets(pulumi.ComponentResource):
    """Datasets and checkpoints buckets, a PERSISTENT_2 Lustre file system linked to them,
    the FSx CSI add-on and a static PV/PVC per team namespace.

    The constructor reads as its steps: key and buckets, the file system's security group, the
    file system with its associations, the CSI add-on, the team volumes.
    """

    buckets: dict[DatasetBucket, SecureBucket]
    file_system: aws.fsx.LustreFileSystem

    def __init__(self, name: str, args: DatasetsArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:datasets:Datasets", name, None, opts)
        self.args = args
        tags = dict(args.tags)
        self.key, self.buckets = self._buckets(name, tags)
        # One mode's resources exist; the other mode's attributes stay empty (None, [] or {}).
        self.file_system = self.log_group = self.efs = self.mountpoint_role = self.efs_addon = None
        self.security_group_rules, self.associations, self.mount_targets = [], [], []
        self.access_points = {}
        if args.storage is DatasetsStorage.FSX:
            self.security_group, self.security_group_rules = self._security_group(name, tags)
            storage = self._file_system(name, tags)
            self.log_group, self.file_system = storage.log_group, storage.file_system
            self.key_policy, self.associations = storage.key_policy, storage.associations
            # The driver's row says why it needs no IAM role (components/addons.py).
            self.addon = args.cluster.addon(FSX_CSI_DRIVER, name=name, parent=self, version=args.addon_version, tags=tags)
            self.volume_claims = self._team_volumes(name)
            self.file_system_id = self.file_system.id
            mode_outputs = {"dns_name": self.file_system.dns_name,
                            "mount_name": self.file_system.mount_name}
        else:
            # Sets key_policy, mountpoint_role, addon, efs, security_group, mount_targets, efs_addon,
            # access_points and volume_claims.
            self._s3_mountpoint(name, tags)
            self.file_system_id = self.efs.id
            mode_outputs = {"efs_file_system_id": self.efs.id}
        self.register_outputs({
            **mode_outputs,
            "datasets_bucket": self.buckets[DatasetBucket.DATASETS].name,
            "checkpoints_bucket": self.buckets[DatasetBucket.CHECKPOINTS].name,
            # Every public attribute, as pulumi-eks registers its outputs.
            "key": self.key, "buckets": {kind.value: bucket for kind, bucket in self.buckets.items()},
            "security_group": self.security_group, "security_group_rules": self.security_group_rules,
            "log_group": self.log_group, "file_system": self.file_system, "key_policy": self.key_policy,
            "associations": self.associations, "addon": self.addon, "volume_claims": self.volume_claims,
            "file_system_id": self.file_system_id, "efs": self.efs, "mountpoint_role": self.mountpoint_role,
            "mount_targets": self.mount_targets, "efs_addon": self.efs_addon, "access_points": self.access_points,
        })

    def _buckets(self, name: str, tags: dict) -> tuple[aws.kms.Key, dict[DatasetBucket, SecureBucket]]:
        args = self.args
        # The key's policy names the file system's S3 service-linked role, so it is attached
        # once the file system exists (``set_key_policy`` in _file_system), before any association.
        key = create_key(f"{name}-data", description="Encrypts training datasets, checkpoints and the FSx file system",
                         parent=self, tags=tags, protect=args.protect, policy_set_later=True)
        lifecycles = {DatasetBucket.DATASETS: args.datasets_lifecycle, DatasetBucket.CHECKPOINTS: args.checkpoints_lifecycle}
        buckets = {
            kind: SecureBucket(
                f"{name}-{kind.value}",
                SecureBucketArgs(kms_key=key, lifecycle_rules=lifecycles[kind],
                                 access_logs_bucket=args.access_logs_bucket,
                                 access_logs_prefix=f"s3-access/{name}-{kind.value}/",
                                 protect=args.protect, force_destroy=not args.protect, tags=tags),
                opts=pulumi.ResourceOptions(parent=self),
            )
            for kind in DatasetBucket
        }
        return key, buckets

    def _security_group(self, name: str, tags: dict) -> tuple[aws.ec2.SecurityGroup, list[pulumi.CustomResource]]:
        """Rules are standalone resources only (inline rules would make the provider revoke the
        standalone ones on the same group). FSx for Lustre: TCP 988 and 1018-1023 from the
        clients and from the file servers themselves (FSx Lustre User Guide, "File system
        access control with Amazon VPC")."""
        args = self.args
        node_sg = args.cluster.node_security_group
        fsx_sg = aws.ec2.SecurityGroup(
            f"{name}-fsx-sg", vpc_id=args.network.vpc_id,
            description="FSx for Lustre: Lustre ports from the cluster's nodes only",
            tags={**tags, "Name": f"{name}-fsx"}, opts=pulumi.ResourceOptions(parent=self),
        )
        sg_child = pulumi.ResourceOptions(parent=fsx_sg)
        rules: list[pulumi.CustomResource] = []
        for low, high in LUSTRE_PORTS:
            ports = {"ip_protocol": "tcp", "from_port": low, "to_port": high, "tags": tags, "opts": sg_child}
            rules += [
                aws.vpc.SecurityGroupIngressRule(
                    f"{name}-fsx-from-nodes-{low}", security_group_id=fsx_sg.id,
                    referenced_security_group_id=node_sg.id, description=f"Lustre {low}-{high} from the cluster's nodes",
                    **ports),
                aws.vpc.SecurityGroupIngressRule(
                    f"{name}-fsx-from-self-{low}", security_group_id=fsx_sg.id, referenced_security_group_id=fsx_sg.id,
                    description=f"Lustre {low}-{high} between file servers", **ports),
                aws.vpc.SecurityGroupEgressRule(
                    f"{name}-fsx-to-nodes-{low}", security_group_id=fsx_sg.id, referenced_security_group_id=node_sg.id,
                    description=f"Lustre {low}-{high} to the cluster's nodes", **ports),
                aws.vpc.SecurityGroupEgressRule(
                    f"{name}-fsx-to-self-{low}", security_group_id=fsx_sg.id, referenced_security_group_id=fsx_sg.id,
                    description=f"Lustre {low}-{high} between file servers", **ports),
            ]
        # Lustre servers call back to clients: the nodes admit the file system on the same ports.
        for low, high in LUSTRE_PORTS:
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-nodes-from-fsx-{low}", security_group_id=node_sg.id,
                referenced_security_group_id=fsx_sg.id, ip_protocol="tcp", from_port=low, to_port=high,
                description=f"Lustre {low}-{high} from FSx", tags=tags, opts=pulumi.ResourceOptions(parent=self),
            )
        return fsx_sg, rules

    def _file_system(self, name: str, tags: dict) -> _FileSystem:
        """The Lustre file system, its log group, the key policy admitting it, its S3 associations."""
        args, fsx = self.args, self.args.fsx
        # FSx only writes to groups named /aws/fsx/...
        log_group = aws.cloudwatch.LogGroup(
            f"{name}-fsx-logs", name=fsx_log_group_name(name), retention_in_days=fsx.log_retention_days,
            kms_key_id=args.log_kms_key.arn if args.log_kms_key is not None else None, tags=tags,
            opts=pulumi.ResourceOptions(parent=self),
        )
        backups = fsx.automatic_backup_retention_days > 0
        file_system = aws.fsx.LustreFileSystem(
            f"{name}-fsx",
            deployment_type="PERSISTENT_2",
            storage_type="SSD",
            storage_capacity=fsx.storage_capacity_gib,
            per_unit_storage_throughput=fsx.throughput_mb_per_tib,
            file_system_type_version=LUSTRE_VERSION,
            kms_key_id=self.key.arn,
            subnet_ids=args.network.private_subnets[fsx.subnet_index].id,  # one subnet: one AZ
            security_group_ids=[self.security_group.id],
            data_compression_type="LZ4" if fsx.data_compression else "NONE",
            log_configuration={"destination": log_group.arn, "level": fsx.log_level.value},
            automatic_backup_retention_days=fsx.automatic_backup_retention_days,
            daily_automatic_backup_start_time=fsx.daily_automatic_backup_start_time if backups else None,
            copy_tags_to_backups=True,
            # Root on any client acts as nobody (FSx for Lustre User Guide, "Lustre root squash"):
            # a root container (or a node-level escape to root) cannot read or rewrite teams'
            # files, which are owned by each team's uid (workloads.tenancy).
            root_squash_configuration={"root_squash": ROOT_SQUASH, "no_squash_nids": list(fsx.no_squash_nids) or None},
            weekly_maintenance_start_time=fsx.weekly_maintenance_start_time,
            skip_final_backup=not args.protect,
            tags={**tags, "Name": f"{name}-fsx"},
            opts=pulumi.ResourceOptions(parent=self, protect=args.protect),
        )
        linked = sorted({dra.bucket for dra in fsx.associations}, key=lambda b: b.value)
        key_policy = set_key_policy(
            f"{name}-data", self.key, parent=self,
            statements=[fsx_s3_key_statement(file_system.id, [self.buckets[b].arn for b in linked], parent=self)]
            if linked else [],
        )
        # Lazy loads and exports use the key through the service-linked role: it must be admitted first.
        fs_child = pulumi.ResourceOptions(parent=file_system, depends_on=[key_policy])
        associations = []
        for index, dra in enumerate(fsx.associations):
            bucket = self.buckets[dra.bucket]
            prefix = dra.prefix.strip("/")
            associations.append(aws.fsx.DataRepositoryAssociation(
                f"{name}-dra-{index}",
                file_system_id=file_system.id,
                file_system_path=dra.file_system_path,
                data_repository_path=pulumi.Output.concat("s3://", bucket.name, "/", prefix + "/" if prefix else ""),
                batch_import_meta_data_on_create=dra.batch_import_metadata_on_create,
                imported_file_chunk_size=dra.imported_file_chunk_size_mib,
                # Removing an association must not delete the files behind it.
                delete_data_in_filesystem=False,
                s3={"auto_import_policy": {"events": [e.value for e in dra.import_events]},
                    "auto_export_policy": {"events": [e.value for e in dra.export_events]}},
                tags=tags, opts=fs_child,
            ))
        return _FileSystem(log_group, file_system, key_policy, associations)

    def _team_volumes(self, name: str) -> dict[str, pulumi.Resource]:
        """Per team namespace: its own subtree (read-write) and the datasets (read-only); never the root."""
        args, fsx = self.args, self.args.fsx
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=args.cluster.k8s_provider,
                                          depends_on=[self.addon, *self.associations])
        claims = {}
        for namespace in args.namespaces:
            specs = pulumi.Output.all(self.file_system.id, self.file_system.dns_name, self.file_system.mount_name)
            for index in range(2):
                spec = specs.apply(lambda v, ns=namespace, i=index: team_volume_specs(
                    file_system_id=v[0], dns_name=v[1], mount_name=v[2],
                    storage_capacity_gib=fsx.storage_capacity_gib, namespace=ns, pv_name_prefix=name)[i])
                suffix = "" if index == 0 else "-datasets"
                pv = apply_object(f"{name}-pv-{namespace}{suffix}",
                                  _manifest(spec, fsx_persistent_volume, namespace, name, index), k8s_opts)
                claim = apply_object(
                    f"{name}-pvc-{namespace}{suffix}", _manifest(spec, fsx_persistent_volume_claim, namespace, name, index),
                    pulumi.ResourceOptions.merge(k8s_opts, pulumi.ResourceOptions(
                        depends_on=[pv, *_namespace_dependency(args.namespace_resources, namespace)])),
                )
                if index == 0:
                    claims[namespace] = claim
        return claims

    def _s3_mountpoint(self, name: str, tags: dict) -> None:
        """Datasets bucket read-only through Mountpoint for Amazon S3; teams' subtrees on EFS."""
        # The key has no service statement to add here: EFS and S3 use it on behalf of callers
        # the account's IAM policies admit (the account-admin statement delegates to IAM).
        self.key_policy = set_key_policy(f"{name}-data", self.key, parent=self, statements=[])
        self.addon = self._mountpoint_driver(name, tags)
        self._efs_file_system(name, tags)
        region = aws.get_region_output(opts=pulumi.InvokeOutputOptions(parent=self)).region
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=self.args.cluster.k8s_provider,
                                          depends_on=[self.addon, self.efs_addon, *self.mount_targets])
        self.access_points = {}
        self.volume_claims = {}
        for namespace in self.args.namespaces:
            ns_dep = _namespace_dependency(self.args.namespace_resources, namespace)
            self.volume_claims[namespace] = self._team_checkpoint_volume(name, namespace, tags, k8s_opts, ns_dep)
            self._team_datasets_volume(name, namespace, region, k8s_opts, ns_dep)

    def _mountpoint_driver(self, name: str, tags: dict) -> aws.eks.Addon:
        """The Mountpoint for S3 CSI driver add-on with its read-only credentials.

        Driver-level credentials through EKS Pod Identity (driver v2: "EKS Pod Identity support",
        awslabs/mountpoint-s3-csi-driver README; the node plugin's service account is
        s3-csi-driver-sa in kube-system, EKS User Guide "mountpoint-for-s3-add-on"). Read-only: list
        the bucket, get objects, decrypt with the data key (Mountpoint's CONFIGURATION.md "IAM
        permissions": s3:ListBucket, s3:GetObject; kms:Decrypt for SSE-KMS).
        """
        args = self.args
        policy = pulumi.Output.all(self.buckets[DatasetBucket.DATASETS].arn, self.key.arn).apply(
            lambda arns: json.dumps(mountpoint_read_only_policy(bucket_arn=arns[0], key_arn=arns[1])))
        mountpoint = args.cluster.pod_identity(
            f"{name}-mountpoint", namespace="kube-system", service_account=MOUNTPOINT_SERVICE_ACCOUNT, parent=self,
            tags=tags, policies={"read": policy}, association="association", after_agent=False)
        self.mountpoint_role = mountpoint.role
        return args.cluster.addon(MOUNTPOINT_S3_CSI_DRIVER, name=name, parent=self, version=args.mountpoint_addon_version,
                                  tags=tags, depends_on=[mountpoint.association, *args.general_capacity])

    def _efs_file_system(self, name: str, tags: dict) -> None:
        """EFS: elastic throughput (billed per GB moved, nothing while idle), encrypted with the data
        key; a mount target in every private subnet so a node in any AZ resolves the file system's
        DNS name to its own AZ (EFS User Guide, "Mounting EFS file systems"); the EFS CSI driver."""
        args = self.args
        stateful = pulumi.ResourceOptions(parent=self, protect=args.protect)
        self.efs = aws.efs.FileSystem(
            f"{name}-efs", encrypted=True, kms_key_id=self.key.arn, performance_mode="generalPurpose",
            throughput_mode="elastic", tags={**tags, "Name": f"{name}-efs"},
            opts=pulumi.ResourceOptions.merge(stateful, pulumi.ResourceOptions(depends_on=[self.key_policy])))
        self.security_group = aws.ec2.SecurityGroup(
            f"{name}-efs-sg", vpc_id=args.network.vpc_id, description="EFS: NFS from the cluster's nodes only",
            tags={**tags, "Name": f"{name}-efs"}, opts=pulumi.ResourceOptions(parent=self))
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-efs-from-nodes", security_group_id=self.security_group.id,
            referenced_security_group_id=args.cluster.node_security_group.id, ip_protocol="tcp",
            from_port=NFS_PORT, to_port=NFS_PORT, description="NFS from the cluster's nodes", tags=tags,
            opts=pulumi.ResourceOptions(parent=self.security_group))
        self.mount_targets = [
            aws.efs.MountTarget(f"{name}-efs-mount-{index}", file_system_id=self.efs.id, subnet_id=subnet.id,
                                security_groups=[self.security_group.id], opts=pulumi.ResourceOptions(parent=self.efs))
            for index, subnet in enumerate(args.network.private_subnets)
        ]
        # No IAM role: static volumes with access points need none ("by default no additional IAM
        # permissions are necessary", aws-efs-csi-driver examples/kubernetes/access_points).
        self.efs_addon = args.cluster.addon(EFS_CSI_DRIVER, name=name, parent=self, version=args.efs_addon_version,
                                            tags=tags)

    def _team_checkpoint_volume(self, name: str, namespace: str, tags: dict, k8s_opts: pulumi.ResourceOptions,
                                ns_dep: list) -> pulumi.Resource:
        """The team's EFS subtree as a static PV and its claim."""
        uid = self.args.posix_ids[namespace]
        # The access point creates /checkpoints/<ns> owned by the team (mode 0750) on first
        # mount and maps every client to the team's uid/gid: root in a pod is the team too.
        access_point = aws.efs.AccessPoint(
            f"{name}-efs-ap-{namespace}", file_system_id=self.efs.id,
            posix_user={"uid": uid, "gid": uid},
            root_directory={"path": f"/{CHECKPOINTS_DIR}/{namespace}",
                            "creation_info": {"owner_uid": uid, "owner_gid": uid, "permissions": "0750"}},
            tags={**tags, "Name": f"{name}-{namespace}"}, opts=pulumi.ResourceOptions(parent=self.efs))
        self.access_points[namespace] = access_point
        efs_spec = pulumi.Output.all(self.efs.id, access_point.id).apply(
            lambda v, ns=namespace: EfsVolumeSpec(file_system_id=v[0], access_point_id=v[1], namespace=ns,
                                                  pv_name_prefix=name))
        placeholder = EfsVolumeSpec(file_system_id="fs-0", access_point_id="fsap-0", namespace=namespace,
                                    pv_name_prefix=name)
        pv = apply_object(f"{name}-pv-{namespace}", _output_manifest(efs_persistent_volume, placeholder, efs_spec),
                          k8s_opts)
        return apply_object(
            f"{name}-pvc-{namespace}",
            static_claim(namespace=namespace, claim_name=CLAIM_NAME, pv_name=placeholder.pv_name, read_only=False,
                         capacity=NOMINAL_CAPACITY),
            pulumi.ResourceOptions.merge(k8s_opts, pulumi.ResourceOptions(depends_on=[pv, *ns_dep])))

    def _team_datasets_volume(self, name: str, namespace: str, region: pulumi.Output[str],
                              k8s_opts: pulumi.ResourceOptions, ns_dep: list) -> None:
        """The datasets bucket, read-only through Mountpoint, as a static PV and the team's claim."""
        s3_spec = pulumi.Output.all(self.buckets[DatasetBucket.DATASETS].name, region).apply(
            lambda v, ns=namespace: MountpointVolumeSpec(bucket_name=v[0], region=v[1], namespace=ns,
                                                         pv_name_prefix=name))
        s3_placeholder = MountpointVolumeSpec(bucket_name="b", region="r", namespace=namespace, pv_name_prefix=name)
        datasets_pv = apply_object(
            f"{name}-pv-{namespace}-datasets",
            _output_manifest(mountpoint_persistent_volume, s3_placeholder, s3_spec), k8s_opts)
        apply_object(
            f"{name}-pvc-{namespace}-datasets",
            static_claim(namespace=namespace, claim_name=DATASETS_CLAIM_NAME, pv_name=s3_placeholder.pv_name,
                         read_only=True, capacity=NOMINAL_CAPACITY),
            pulumi.ResourceOptions.merge(k8s_opts, pulumi.ResourceOptions(depends_on=[datasets_pv, *ns_dep])))


MOUNTPOINT_SERVICE_ACCOUNT = "s3-csi-driver-sa"
NFS_PORT = 2049


def mountpoint_read_only_policy(*, bucket_arn: str, key_arn: str) -> dict:
    """What Mountpoint needs to serve a bucket read-only (Mountpoint CONFIGURATION.md, "IAM
    permissions": ListBucket on the bucket, GetObject on its objects; SSE-KMS objects need
    kms:Decrypt on their key). No write, no delete."""
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "ListDatasets", "Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [bucket_arn]},
        {"Sid": "ReadDatasets", "Effect": "Allow", "Action": ["s3:GetObject"], "Resource": [f"{bucket_arn}/*"]},
        {"Sid": "DecryptDatasets", "Effect": "Allow", "Action": ["kms:Decrypt"], "Resource": [key_arn]},
    ]}


def _output_manifest(render, placeholder, spec: pulumi.Output) -> dict:
    """Structure (names, kind) from a placeholder spec; the spec's leaves from the real one."""
    full = render(placeholder)
    return {"apiVersion": full["apiVersion"], "kind": full["kind"], "metadata": full["metadata"],
            "spec": spec.apply(lambda v: render(v)["spec"])}


# nobody:nogroup; the team uids lie below it (workloads.tenancy.POSIX_ID_MAX).
ROOT_SQUASH = "65534:65534"


def fsx_log_group_name(name: str) -> str:
    """FSx delivers only to log groups whose name starts with /aws/fsx/."""
    return f"/aws/fsx/{name}"


def fsx_s3_key_statement(file_system_id: pulumi.Input[str], bucket_arns: Sequence[pulumi.Input[str]], *,
                         parent: pulumi.Resource) -> dict:
    """Key-policy statement that lets one file system's FSx S3 service-linked role use the key on
    the linked buckets' objects.

    FSx for Lustre User Guide, "Working with server-side encrypted Amazon S3 buckets": the
    statement for a specific file system and bucket, with the encryption context set to the
    bucket ARN because the buckets use S3 Bucket Keys (object ARNs kept for objects written
    without one). The role (``AWSServiceRoleForFSxS3Access_<fs-id>``) is named through
    ``aws:PrincipalArn`` rather than as the principal: FSx creates it when the file system is
    linked to S3, after this policy is written, and KMS refuses policies naming principals
    that do not exist yet. ``kms:CallerAccount`` keeps it to this account, ``kms:ViaService``
    to calls S3 makes.
    """
    invoke = pulumi.InvokeOutputOptions(parent=parent)
    account = aws.get_caller_identity_output(opts=invoke).account_id
    region = aws.get_region_output(opts=invoke).region
    partition = aws.get_partition_output(opts=invoke)
    role_arn = pulumi.Output.concat("arn:", partition.partition, ":iam::", account, ":", FSX_S3_SLR_PATH, file_system_id)
    contexts = [c for arn in bucket_arns for c in (arn, pulumi.Output.concat(arn, "/*"))]
    return {
        "Sid": "FsxS3ServiceLinkedRoleUsesKeyOnLinkedBuckets", "Effect": "Allow",
        "Principal": {"AWS": "*"},
        "Action": ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:DescribeKey"],
        "Resource": "*",
        "Condition": {
            "StringEquals": {"aws:PrincipalArn": role_arn, "kms:CallerAccount": account,
                             "kms:ViaService": pulumi.Output.concat("s3.", region, ".", partition.dns_suffix)},
            "StringLike": {"kms:EncryptionContext:aws:s3:arn": contexts},
        },
    }


def _manifest(spec: pulumi.Output, render, namespace: str, pv_prefix: str, index: int = 0) -> dict:
    """The rendered manifest with Output leaves; structure (names, kind) stays plain."""
    full = render(team_volume_specs(file_system_id="fs-placeholder", dns_name="", mount_name="",
                                    storage_capacity_gib=1, namespace=namespace, pv_name_prefix=pv_prefix)[index])
    rendered = spec.apply(render)
    return {"apiVersion": full["apiVersion"], "kind": full["kind"], "metadata": full["metadata"],
            "spec": rendered.apply(lambda m: m["spec"])}


def _namespace_dependency(resources: Mapping[str, pulumi.Resource], namespace: str) -> list[pulumi.Resource]:
    return [resources[namespace]] if namespace in resources else []
