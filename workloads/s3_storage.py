"""Static PVs/PVCs for the ``s3-mountpoint`` datasets storage mode (a dev stack without FSx).

The claims keep the FSx mode's names (``workloads.fsx.CLAIM_NAME``, ``DATASETS_CLAIM_NAME``) and
pods keep the same mount paths, so a job renders the same in both modes:

- ``fsx-datasets`` (read-only): the datasets bucket through Mountpoint for Amazon S3, the
  ``aws-mountpoint-s3-csi-driver`` EKS add-on. Mountpoint reads sequentially at S3's throughput
  and lists prefixes as directories; it cannot rename (general purpose buckets), which the
  trainer's checkpoints need, so it only carries the read-only datasets.
- ``fsx-training-data`` (read-write): the team's subtree on Amazon EFS through an access point
  (``aws-efs-csi-driver`` add-on): POSIX renames and fsync, owned by the team's uid, created by
  the access point itself, encrypted in transit (``tls``).

Sources: awslabs/mountpoint-s3-csi-driver ``docs/`` (static provisioning only: ``csi.driver
s3.csi.aws.com``, ``volumeAttributes.bucketName``, Mountpoint options as ``mountOptions`` without
dashes: ``read-only``, ``allow-other``, ``region``, ``prefix``); Mountpoint's SEMANTICS.md (no
rename on general purpose buckets); kubernetes-sigs/aws-efs-csi-driver
``examples/kubernetes/access_points`` (``volumeHandle: <fs-id>``, ``mountOptions: [tls,
accesspoint=<fsap-id>]``; "by default no additional IAM permissions are necessary").

Pure functions: spec in, manifest dict out (no Pulumi imports).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workloads.fsx import CLAIM_NAME, DATASETS_CLAIM_NAME, static_persistent_volume

MOUNTPOINT_CSI_DRIVER = "s3.csi.aws.com"
EFS_CSI_DRIVER = "efs.csi.aws.com"
# Static volumes report a size Kubernetes never enforces; it must only match claim and PV.
NOMINAL_CAPACITY = "1Ti"


@dataclass(frozen=True)
class MountpointVolumeSpec:
    """A team's read-only view of the datasets bucket.

    bucket_name / region: the bucket and its Region (Mountpoint's ``region`` option avoids a
    lookup). prefix: only this prefix is visible ("" is the whole bucket). pv_name_prefix: PVs
    are cluster-scoped."""

    bucket_name: str
    region: str
    namespace: str
    prefix: str = ""
    pv_name_prefix: str = "s3"

    def __post_init__(self) -> None:
        if self.prefix and (self.prefix.startswith("/") or not self.prefix.endswith("/")):
            raise ValueError(f"MountpointVolumeSpec.prefix: {self.prefix!r} must be relative and end with '/'")

    @property
    def pv_name(self) -> str:
        return f"{self.pv_name_prefix}-{self.namespace}-datasets"


@dataclass(frozen=True)
class EfsVolumeSpec:
    """A team's read-write subtree: one EFS access point of the shared file system."""

    file_system_id: str
    access_point_id: str
    namespace: str
    pv_name_prefix: str = "efs"

    def __post_init__(self) -> None:
        if not self.file_system_id.startswith("fs-"):
            raise ValueError(f"EfsVolumeSpec.file_system_id: {self.file_system_id!r} is not an EFS id (fs-...)")
        if not self.access_point_id.startswith("fsap-"):
            raise ValueError(f"EfsVolumeSpec.access_point_id: {self.access_point_id!r} is not an access point id (fsap-...)")

    @property
    def pv_name(self) -> str:
        return f"{self.pv_name_prefix}-{self.namespace}"


def mountpoint_persistent_volume(spec: MountpointVolumeSpec) -> dict[str, Any]:
    options = ["read-only", f"region {spec.region}",
               # Mountpoint serves only the mounting user unless allow-other; training pods run as
               # the team's uid, not the Mountpoint process's. The PV is bound to one team's claim.
               "allow-other"]
    if spec.prefix:
        options.append(f"prefix {spec.prefix}")
    return static_persistent_volume(
        name=spec.pv_name, capacity=NOMINAL_CAPACITY, read_only=True, mount_options=options, volume_mode=None,
        namespace=spec.namespace, claim_name=DATASETS_CLAIM_NAME,
        # volumeHandle unique per PV: the driver identifies a volume by its handle.
        csi={"driver": MOUNTPOINT_CSI_DRIVER, "volumeHandle": spec.pv_name, "readOnly": True,
             "volumeAttributes": {"bucketName": spec.bucket_name}})


def efs_persistent_volume(spec: EfsVolumeSpec) -> dict[str, Any]:
    return static_persistent_volume(
        name=spec.pv_name, capacity=NOMINAL_CAPACITY, read_only=False,
        mount_options=["tls", f"accesspoint={spec.access_point_id}"], namespace=spec.namespace, claim_name=CLAIM_NAME,
        csi={"driver": EFS_CSI_DRIVER, "volumeHandle": spec.file_system_id})
