"""Cluster-wide storage objects."""
from __future__ import annotations

from typing import Any


def gp3_storage_class(*, name: str = "gp3", reclaim_policy: str = "Delete", default: bool = True) -> dict[str, Any]:
    """Encrypted gp3 volumes through the EBS CSI driver, bound where the pod lands."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": name,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true" if default else "false"},
        },
        "provisioner": "ebs.csi.aws.com",
        "parameters": {"type": "gp3", "encrypted": "true", "fsType": "ext4"},
        # A volume created before scheduling could land in an AZ the pod cannot reach.
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowVolumeExpansion": True,
        "reclaimPolicy": reclaim_policy,
    }
