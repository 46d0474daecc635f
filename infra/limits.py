"""The config's bound check for the service limits of catalog/limits.py (re-exported here under
the names the config sections import)."""
from __future__ import annotations

from typing import Any

from pydantic import AfterValidator

from catalog.limits import (  # noqa: F401  (re-exported)
    AURORA_SERVERLESS_V2_MAX_ACU, EBS_GP3_VOLUME_GIB, EKS_NODES_PER_MANAGED_NODE_GROUP, FSX_BACKUP_RETENTION_DAYS,
    FSX_IMPORTED_FILE_CHUNK_MIB, FSX_LUSTRE_STORAGE_GIB, KARPENTER_NODEPOOL_WEIGHT, KMS_PENDING_WINDOW_DAYS,
    KUBERNETES_NODES_PER_CLUSTER, RDS_BACKUP_RETENTION_DAYS, Limit,
)
from infra.config.engine import invalid


def at_most(limit: Limit) -> AfterValidator:
    """A field validator refusing values above ``limit``, naming it and its source."""

    def check(value: Any) -> Any:
        if value is not None and value > limit.maximum:
            maximum = int(limit.maximum) if float(limit.maximum).is_integer() else limit.maximum
            raise invalid(f"exceeds {limit.what}: at most {maximum} (source: {limit.source})",
                          f"use a value <= {maximum}")
        return value

    return AfterValidator(check)
