"""Static PersistentVolumes + PersistentVolumeClaims for the shared FSx for Lustre file system.

Dynamic provisioning cannot link a file system to S3, so the file system is created by
Pulumi (with its data repository associations) and exposed statically. A team never mounts
the file system's root: each team namespace gets two claims, each pre-bound to its own PV (a
PV binds to exactly one claim, so no other claim can take it):

- ``fsx-training-data``: the team's own subtree ``/checkpoints/<namespace>`` (read-write),
  mounted at ``/fsx/checkpoints/<namespace>``; its checkpoints and its pipelines' work
  directories live there, and the /checkpoints association exports it to the team's prefix.
- ``fsx-datasets``: ``/datasets`` read-only, mounted at ``/fsx/datasets``.

A subtree is a Lustre subdirectory mount: the FSx CSI driver (v1.7.0, pkg/driver/node.go
``NodePublishVolume``) reads only ``dnsname`` and ``mountname`` from ``volumeAttributes`` and
mounts ``<dnsname>@tcp:/<mountname>``, so ``mountname: <mountName>/checkpoints/<ns>`` mounts that
directory (FSx for Lustre User Guide, "Mounting specific filesets":
``mount -t lustre <dns>@tcp:/<mountname>/<path> /mnt``). The driver's ``subpath`` attribute exists
only after v1.7.0 and is not relied on. Paths inside pods are the same as with a root mount.

Pure functions: spec in, manifest dict out (no Pulumi imports).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FSX_CSI_DRIVER = "fsx.csi.aws.com"
# Training pods mount these claims in their own namespace.
CLAIM_NAME = "fsx-training-data"  # the team's subtree, read-write
DATASETS_CLAIM_NAME = "fsx-datasets"  # /datasets, read-only
FSX_MOUNT_PATH = "/fsx"
CHECKPOINTS_DIR = "checkpoints"
DATASETS_DIR = "datasets"
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
        read_only: mount read-only (datasets; an evaluation-only namespace).
        sub_path: the directory of the file system this volume mounts ("" is the root).
        claim_name: the claim pre-bound to this PV in ``namespace``.
        pv_suffix: appended to the PV name (one namespace has several PVs).
    """

    file_system_id: str
    dns_name: str
    mount_name: str
    storage_capacity_gib: int
    namespace: str
    pv_name_prefix: str = "fsx"
    read_only: bool = False
    sub_path: str = ""
    claim_name: str = CLAIM_NAME
    pv_suffix: str = ""

    def __post_init__(self) -> None:
        if self.sub_path != self.sub_path.strip("/") or ".." in self.sub_path.split("/"):
            raise ValueError(f"FsxVolumeSpec.sub_path: {self.sub_path!r} must be relative, without '..' or slashes at the ends")
        if not self.file_system_id.startswith("fs-"):
            raise ValueError(f"FsxVolumeSpec.file_system_id: {self.file_system_id!r} is not an FSx id (fs-...)")
        if self.storage_capacity_gib <= 0:
            raise ValueError(f"FsxVolumeSpec.storage_capacity_gib: {self.storage_capacity_gib} must be positive")

    @property
    def pv_name(self) -> str:
        return f"{self.pv_name_prefix}-{self.namespace}{'-' + self.pv_suffix if self.pv_suffix else ''}"

    @property
    def mount_source(self) -> str:
        """``volumeAttributes.mountname``: the file system's mount name, then the subtree."""
        return f"{self.mount_name}/{self.sub_path}" if self.sub_path else self.mount_name


LABELS = {"app.kubernetes.io/managed-by": "pulumi"}


def static_persistent_volume(*, name: str, capacity: str, read_only: bool, mount_options: list[str],
                             namespace: str, claim_name: str, csi: dict[str, Any],
                             volume_mode: str | None = "Filesystem") -> dict[str, Any]:
    """A pre-created PV bound to one team's claim (FSx, EFS and Mountpoint volumes alike)."""
    spec: dict[str, Any] = {"capacity": {"storage": capacity}}
    if volume_mode:
        spec["volumeMode"] = volume_mode
    spec.update({
        "accessModes": ["ReadOnlyMany" if read_only else "ReadWriteMany"],
        "mountOptions": mount_options,
        # Deleting the PV must never touch the file system or bucket (Pulumi owns it).
        "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": "",
        "claimRef": {"namespace": namespace, "name": claim_name},
        "csi": csi,
    })
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name, "labels": dict(LABELS)}, "spec": spec}


def static_claim(*, namespace: str, claim_name: str, pv_name: str, read_only: bool, capacity: str) -> dict[str, Any]:
    """A claim pre-bound to one PV (empty class: never provisioned dynamically)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim_name, "namespace": namespace, "labels": dict(LABELS)},
        "spec": {
            "accessModes": ["ReadOnlyMany" if read_only else "ReadWriteMany"],
            "storageClassName": "",
            "volumeName": pv_name,
            "resources": {"requests": {"storage": capacity}},
        },
    }


def fsx_persistent_volume(spec: FsxVolumeSpec) -> dict[str, Any]:
    return static_persistent_volume(
        name=spec.pv_name, capacity=f"{spec.storage_capacity_gib}Gi", read_only=spec.read_only,
        mount_options=list(MOUNT_OPTIONS), namespace=spec.namespace, claim_name=spec.claim_name,
        csi={"driver": FSX_CSI_DRIVER, "volumeHandle": spec.file_system_id, "readOnly": spec.read_only,
             "volumeAttributes": {"dnsname": spec.dns_name, "mountname": spec.mount_source}})


def fsx_persistent_volume_claim(spec: FsxVolumeSpec) -> dict[str, Any]:
    return static_claim(namespace=spec.namespace, claim_name=spec.claim_name, pv_name=spec.pv_name,
                        read_only=spec.read_only, capacity=f"{spec.storage_capacity_gib}Gi")


def team_volume_specs(*, file_system_id: str, dns_name: str, mount_name: str, storage_capacity_gib: int,
                      namespace: str, pv_name_prefix: str = "fsx") -> list[FsxVolumeSpec]:
    """A team's two volumes: its own subtree read-write, the datasets read-only."""
    common = dict(file_system_id=file_system_id, dns_name=dns_name, mount_name=mount_name,
                  storage_capacity_gib=storage_capacity_gib, namespace=namespace, pv_name_prefix=pv_name_prefix)
    return [FsxVolumeSpec(**common, sub_path=f"{CHECKPOINTS_DIR}/{namespace}", claim_name=CLAIM_NAME),
            FsxVolumeSpec(**common, sub_path=DATASETS_DIR, claim_name=DATASETS_CLAIM_NAME, read_only=True,
                          pv_suffix=DATASETS_DIR)]


def team_subtree_path(namespace: str) -> str:
    """Where the team's subtree appears inside its pods (the same path as on the file system)."""
    return f"{FSX_MOUNT_PATH}/{CHECKPOINTS_DIR}/{namespace}"


def team_pod_volumes(*, claim_name: str = CLAIM_NAME) -> list[dict[str, Any]]:
    return [{"name": "fsx", "persistentVolumeClaim": {"claimName": claim_name}},
            {"name": "fsx-datasets", "persistentVolumeClaim": {"claimName": DATASETS_CLAIM_NAME, "readOnly": True}}]


def team_volume_mounts(namespace: str) -> list[dict[str, Any]]:
    return [{"name": "fsx", "mountPath": team_subtree_path(namespace)},
            {"name": "fsx-datasets", "mountPath": f"{FSX_MOUNT_PATH}/{DATASETS_DIR}", "readOnly": True}]
