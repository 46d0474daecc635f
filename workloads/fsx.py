"""Static PersistentVolume + PersistentVolumeClaim for the shared FSx for Lustre file system.

Dynamic provisioning cannot link a file system to S3, so the file system is created by
Pulumi (with its data repository associations) and exposed statically: one PV per team
namespace (a PV binds to exactly one claim), all pointing at the same file system, each
pre-bound to that namespace's claim so no other claim can take it.

Pure functions: spec in, manifest dict out (no Pulumi imports).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FSX_CSI_DRIVER = "fsx.csi.aws.com"
# Training pods mount this claim name in their own namespace.
CLAIM_NAME = "fsx-training-data"
# The PV's size is informational for static volumes; it must not exceed the file system.
MOUNT_OPTIONS = ("flock",)  # POSIX locks across nodes (checkpoint writers, dataset caches)


@dataclass(frozen=True)
class FsxVolumeSpec:
    """One team's view of the shared file system.

    Attributes:
        file_system_id: ``fs-...``; the CSI volume handle.
        dns_name / mount_name: from the file system (``dnsName``, ``mountName``).
        storage_capacity_gib: the file system's capacity (reported on the PV and claim).
        namespace: the team namespace that gets the claim.
        pv_name_prefix: PVs are cluster-scoped: ``<prefix>-<namespace>`` keeps them unique.
        read_only: mount read-only (e.g. an evaluation-only namespace).
    """

    file_system_id: str
    dns_name: str
    mount_name: str
    storage_capacity_gib: int
    namespace: str
    pv_name_prefix: str = "fsx"
    read_only: bool = False

    def __post_init__(self) -> None:
        if not self.file_system_id.startswith("fs-"):
            raise ValueError(f"FsxVolumeSpec.file_system_id: {self.file_system_id!r} is not an FSx id (fs-...)")
        if self.storage_capacity_gib <= 0:
            raise ValueError(f"FsxVolumeSpec.storage_capacity_gib: {self.storage_capacity_gib} must be positive")

    @property
    def pv_name(self) -> str:
        return f"{self.pv_name_prefix}-{self.namespace}"


def fsx_persistent_volume(spec: FsxVolumeSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": spec.pv_name, "labels": {"app.kubernetes.io/managed-by": "pulumi"}},
        "spec": {
            "capacity": {"storage": f"{spec.storage_capacity_gib}Gi"},
            "volumeMode": "Filesystem",
            "accessModes": ["ReadWriteMany"],
            "mountOptions": list(MOUNT_OPTIONS),
            # Deleting the PV must never touch the file system (Pulumi owns it).
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "claimRef": {"namespace": spec.namespace, "name": CLAIM_NAME},
            "csi": {
                "driver": FSX_CSI_DRIVER,
                "volumeHandle": spec.file_system_id,
                "readOnly": spec.read_only,
                "volumeAttributes": {"dnsname": spec.dns_name, "mountname": spec.mount_name},
            },
        },
    }


def fsx_persistent_volume_claim(spec: FsxVolumeSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": CLAIM_NAME, "namespace": spec.namespace,
                     "labels": {"app.kubernetes.io/managed-by": "pulumi"}},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            # Empty class: bind to the pre-created PV, never provision dynamically.
            "storageClassName": "",
            "volumeName": spec.pv_name,
            "resources": {"requests": {"storage": f"{spec.storage_capacity_gib}Gi"}},
        },
    }
