"""The ``logArchive`` section: the central log bucket, the audit trail, S3 access-log buckets; its rules."""
from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Iterator, Optional

from pydantic import Field

from components.bucket import AccessLogBucketArgs
from components.log_archive import archive_problems
from components.log_archive import LogArchiveArgs as _ARCHIVE
from workloads.problems import Problem
from catalog import limits
from infra.config.common import PROD_OBJECT_LOCK_RETENTION_DAYS, AccountId, Environment, _Model
from infra.config.engine import Rule
from infra.config.common import at_most


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
    management_account_id: Optional[AccountId] = Field(None, description="12-digit id of the organization's management account; organization mode only.")


class LogArchiveConfig(_Model):
    """Central log bucket in the logging account, the audit trail, and S3 access-log buckets."""

    transition_to_infrequent_access_days: Optional[int] = Field(_ARCHIVE.transition_to_infrequent_access_days, ge=30, description="S3 requires >= 30 for STANDARD_IA; null: no transition.")
    transition_to_glacier_days: Optional[int] = Field(_ARCHIVE.transition_to_glacier_days, ge=1, description="GLACIER_IR bills >= 90 days: expirationDays must be >= this + 90; null: none.")
    expiration_days: Optional[int] = Field(_ARCHIVE.expiration_days, ge=1, description="Logs are deleted this many days after creation; null: never.")
    noncurrent_version_expiration_days: int = Field(_ARCHIVE.noncurrent_version_expiration_days, ge=1)
    object_lock_retention_days: Optional[int] = Field(None, ge=1, le=36500, description=(
        "Object Lock retention of every archived object (COMPLIANCE in prod, GOVERNANCE elsewhere). Default: 365 "
        "in prod, off in dev."))
    break_glass_role_name: str = Field("mlp-break-glass", pattern=r"^[\w+=,.@-]{1,64}$", description=(
        "The logging account's role that alone may schedule the archive key's deletion or disable it."))
    access_log_expiration_days: int = Field(AccessLogBucketArgs.expiration_days, ge=1, le=36500, description="S3 server access logs (one SSE-S3 bucket per account) are deleted after this.")
    audit_trail: AuditTrailConfig = Field(default_factory=AuditTrailConfig)
    kms_key_deletion_window_days: Annotated[int, at_most(limits.KMS_PENDING_WINDOW_DAYS)] = Field(_ARCHIVE.kms_key_deletion_window_days, ge=7)

    def args(self, *, object_lock_retention_days: Optional[int], **wiring: Any) -> _ARCHIVE:
        """``object_lock_retention_days``: the stack's resolved value (PlatformConfig.object_lock_retention_days:
        unset here means 365 in prod), required so the prod default cannot be skipped."""
        return self.copy_into(_ARCHIVE, object_lock_retention_days=object_lock_retention_days, **wiring)


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


# Listed in the order the loader runs them (infra.config.platform.RULES).
RULES: tuple[Rule, ...] = (
    Rule(("environment", "logArchive"), _log_archive_rules),
)
