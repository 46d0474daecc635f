"""S3 buckets with the settings every platform bucket needs, and grant helpers.

``SecureBucket`` holds data (SSE-KMS). ``AccessLogBucket`` receives S3 server access logs:
S3 delivers those only to a bucket in the *same account* as the source whose default
encryption is SSE-S3 (SSE-KMS targets are not supported) and that has no Object Lock
(S3 User Guide, "Enabling Amazon S3 server access logging"), so every account that logs
gets its own one. Lifecycle rules are checked against S3's transition rules and minimum
storage durations before anything is created (``lifecycle_problems``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Optional, Sequence, Union

import pulumi
import pulumi_aws as aws

from workloads.problems import Problem, raise_if_any

# Stands for this bucket's ARN in ``policy_statements`` written before the bucket exists.
SELF_ARN = "${self.arn}"

# S3 storage classes: STANDARD_IA accepts transitions only from day 30 on and bills at least
# 30 days; GLACIER_IR bills at least 90 days (an object deleted or moved earlier pays the
# rest as an early-deletion charge). Objects must also stay 30 days in STANDARD_IA before a
# lifecycle rule moves them on. Sources: S3 User Guide "Understanding and managing Amazon S3
# storage classes" (minimum storage duration) and "Transitioning objects using Amazon S3
# Lifecycle" (constraints and considerations for transitions).
INFREQUENT_ACCESS_MIN_DAYS = 30
INFREQUENT_ACCESS_MIN_STORAGE_DAYS = 30
GLACIER_IR_MIN_STORAGE_DAYS = 90

# Keys of the three lifecycle steps, as the stack file spells them.
IA_KEY = "transitionToInfrequentAccessDays"
GLACIER_KEY = "transitionToGlacierDays"
EXPIRATION_KEY = "expirationDays"


def lifecycle_problems(
    path: str,
    *,
    ia_days: Optional[int],
    glacier_days: Optional[int],
    expiration_days: Optional[int],
) -> Iterator[Problem]:
    """Every reason S3 would refuse a lifecycle rule, or bill it for early deletion.

    Days count from object creation; ``None`` turns a step off. Shared by the stack config,
    ``LifecycleRule`` and ``LogArchiveArgs`` so that all three refuse the same inputs.
    """
    if ia_days is not None and ia_days < INFREQUENT_ACCESS_MIN_DAYS:
        yield Problem(f"{path}.{IA_KEY}", ia_days,
                      f"S3 moves objects to STANDARD_IA only {INFREQUENT_ACCESS_MIN_DAYS} or more days after creation",
                      f"set it to {INFREQUENT_ACCESS_MIN_DAYS} or more, or remove it")
    if ia_days is not None and glacier_days is not None and glacier_days - ia_days < INFREQUENT_ACCESS_MIN_STORAGE_DAYS:
        yield Problem(f"{path}.{GLACIER_KEY}", glacier_days,
                      f"objects must stay {INFREQUENT_ACCESS_MIN_STORAGE_DAYS} days in STANDARD_IA (moved there on day "
                      f"{ia_days}) before S3 moves them to GLACIER_IR",
                      f"set it to {ia_days + INFREQUENT_ACCESS_MIN_STORAGE_DAYS} or more, or remove {IA_KEY}")
    if expiration_days is None:
        return
    last = [(days, cls, minimum, key) for days, cls, minimum, key in (
        (ia_days, "STANDARD_IA", INFREQUENT_ACCESS_MIN_STORAGE_DAYS, IA_KEY),
        (glacier_days, "GLACIER_IR", GLACIER_IR_MIN_STORAGE_DAYS, GLACIER_KEY)) if days is not None]
    if not last:
        return
    days, storage_class, minimum, key = last[-1]
    if expiration_days <= days:
        yield Problem(f"{path}.{EXPIRATION_KEY}", expiration_days,
                      f"objects expire on day {expiration_days}, before they would move to {storage_class} (day {days})",
                      f"set it to {days + minimum} or more, or remove {key}")
    elif expiration_days - days < minimum:
        yield Problem(f"{path}.{EXPIRATION_KEY}", expiration_days,
                      f"objects would be deleted {expiration_days - days} days after moving to {storage_class} (day "
                      f"{days}), which bills at least {minimum} days (early-deletion charge)",
                      f"set it to {days + minimum} or more, or remove {key}")


@dataclass(frozen=True)
class LifecycleRule:
    """One lifecycle rule. Days are counted from object creation; None disables a step.

    Raises ``InvalidInputError`` for any combination ``lifecycle_problems`` refuses.
    """

    id: str
    prefix: str = ""
    transition_to_infrequent_access_days: Optional[int] = None
    transition_to_glacier_days: Optional[int] = None
    expiration_days: Optional[int] = None
    noncurrent_version_expiration_days: Optional[int] = 30
    abort_incomplete_multipart_upload_days: int = 7

    def __post_init__(self) -> None:
        raise_if_any(f"LifecycleRule {self.id!r}", lifecycle_problems(
            "LifecycleRule", ia_days=self.transition_to_infrequent_access_days,
            glacier_days=self.transition_to_glacier_days, expiration_days=self.expiration_days))


@dataclass(frozen=True)
class ObjectLock:
    """S3 Object Lock default retention (WORM) on a versioned bucket.

    GOVERNANCE mode: nobody can overwrite or delete a locked version before ``retention_days``
    pass unless they hold ``s3:BypassGovernanceRetention`` (break-glass), unlike COMPLIANCE,
    which not even the root user can lift.
    """

    retention_days: int
    mode: str = "GOVERNANCE"

    def __post_init__(self) -> None:
        if self.mode not in ("GOVERNANCE", "COMPLIANCE"):
            raise ValueError(f"ObjectLock.mode: {self.mode!r} is not GOVERNANCE or COMPLIANCE")
        if self.retention_days < 1:
            raise ValueError(f"ObjectLock.retention_days: {self.retention_days} must be 1 or more")


def private_bucket(name: str, *, parent: pulumi.Resource, encryption: Mapping[str, Any],
                   lifecycle_rules: Sequence[LifecycleRule] = (), versioning: bool = True, protect: bool = False,
                   force_destroy: bool = False, tags: Mapping[str, str]) -> tuple[aws.s3.Bucket, aws.s3.BucketPublicAccessBlock, Optional[aws.s3.BucketVersioning]]:
    """A bucket (child of ``parent``) with the controls every platform bucket has (children of the bucket).

    Owner-enforced objects (permissions from the bucket policy, not ACLs), every public access
    block on, default encryption ``encryption`` (an ``apply_server_side_encryption_by_default``
    rule), versioning, lifecycle. Returns the bucket, its public access block (a bucket policy
    must depend on it) and its versioning (Object Lock must depend on it). Shared by
    ``SecureBucket``, ``AccessLogBucket`` and ``components.log_archive.AlbAccessLogs``.
    """
    bucket = aws.s3.Bucket(f"{name}-bucket", force_destroy=force_destroy, tags={**tags, "Name": name},
                           opts=pulumi.ResourceOptions(parent=parent, protect=protect))
    child = pulumi.ResourceOptions(parent=bucket)
    aws.s3.BucketOwnershipControls(
        f"{name}-ownership", bucket=bucket.id, rule={"object_ownership": "BucketOwnerEnforced"}, opts=child)
    public_access = aws.s3.BucketPublicAccessBlock(
        f"{name}-public-access", bucket=bucket.id, block_public_acls=True, block_public_policy=True,
        ignore_public_acls=True, restrict_public_buckets=True, opts=child)
    aws.s3.BucketServerSideEncryptionConfiguration(f"{name}-encryption", bucket=bucket.id, rules=[dict(encryption)], opts=child)
    versioned = None
    if versioning:
        versioned = aws.s3.BucketVersioning(
            f"{name}-versioning", bucket=bucket.id, versioning_configuration={"status": "Enabled"}, opts=child)
    if lifecycle_rules:
        aws.s3.BucketLifecycleConfiguration(
            f"{name}-lifecycle", bucket=bucket.id, rules=[_rule(r) for r in lifecycle_rules], opts=child)
    return bucket, public_access, versioned


# S3 server access logs and ELB access logs: SSE-S3 is the only encryption either delivers to.
SSE_S3 = {"apply_server_side_encryption_by_default": {"sse_algorithm": "AES256"}}


@dataclass(frozen=True)
class SecureBucketArgs:
    """Inputs of ``SecureBucket``.

    Attributes:
        kms_key: customer-managed key for SSE-KMS (bucket keys on, to cut KMS calls).
        lifecycle_rules: lifecycle from config; empty means objects live forever.
        policy_statements: extra bucket-policy statements (service deliveries, grants);
            ``SELF_ARN`` in any string is replaced by the bucket's ARN. A deny of non-TLS
            requests is always added.
        access_logs_bucket / access_logs_prefix: where S3 server access logs go: an
            ``AccessLogBucket`` of the same account (preferred: its policy then admits exactly
            this bucket, and logging starts after that policy exists), or any bucket.
        versioning: keep every version (recovery from overwrites and deletes).
        object_lock: default Object Lock retention (needs versioning).
        protect: Pulumi ``protect`` on the bucket, so a stack change cannot delete it (prod).
        force_destroy: let ``pulumi destroy`` delete a non-empty bucket (dev only).
        tags: tags on every taggable child.
    """

    kms_key: aws.kms.Key
    lifecycle_rules: Sequence[LifecycleRule] = ()
    policy_statements: Sequence[Mapping[str, Any]] = ()
    access_logs_bucket: Optional[Union[aws.s3.Bucket, "AccessLogBucket"]] = None
    access_logs_prefix: str = ""
    versioning: bool = True
    object_lock: Optional[ObjectLock] = None
    protect: bool = False
    force_destroy: bool = False
    tags: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.protect and self.force_destroy:
            raise ValueError("SecureBucketArgs: protect and force_destroy contradict each other; drop force_destroy")
        if self.object_lock is not None and not self.versioning:
            raise ValueError("SecureBucketArgs: Object Lock needs versioning; set versioning=True")


class SecureBucket(pulumi.ComponentResource):
    """KMS-encrypted, versioned, private bucket with owner-enforced objects and TLS-only access."""

    bucket: aws.s3.Bucket
    arn: pulumi.Output[str]
    name: pulumi.Output[str]
    policy: aws.s3.BucketPolicy

    def __init__(self, name: str, args: SecureBucketArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:bucket:SecureBucket", name, None, opts)
        self.args = args
        self.kms_key = args.kms_key
        self.bucket, public_access, versioning = private_bucket(
            name, parent=self, protect=args.protect, force_destroy=args.force_destroy, tags=args.tags,
            versioning=args.versioning, lifecycle_rules=args.lifecycle_rules,
            encryption={"apply_server_side_encryption_by_default": {"sse_algorithm": "aws:kms",
                                                                    "kms_master_key_id": args.kms_key.arn},
                        "bucket_key_enabled": True},
        )
        bucket_child = pulumi.ResourceOptions(parent=self.bucket)
        if args.object_lock is not None:
            # Object Lock used to be possible only at bucket creation (or with a token from AWS
            # Support); PutObjectLockConfiguration now enables it on an existing versioned bucket
            # ("You can enable Object Lock for new or existing buckets", S3 API Reference; S3 User
            # Guide "Configuring S3 Object Lock"). So the bucket is not created with
            # object_lock_enabled, an input that would replace a protected archive already holding
            # logs. Versioning must be on first; once enabled, Object Lock cannot be turned off.
            aws.s3.BucketObjectLockConfiguration(
                f"{name}-object-lock", bucket=self.bucket.id, object_lock_enabled="Enabled",
                rule={"default_retention": {"mode": args.object_lock.mode, "days": args.object_lock.retention_days}},
                opts=pulumi.ResourceOptions(parent=self.bucket, depends_on=[versioning]),
            )
        prefix = args.access_logs_prefix or f"s3-access/{name}/"
        if isinstance(args.access_logs_bucket, AccessLogBucket):
            # Created by the target's ``seal()``, after the policy that admits this bucket.
            args.access_logs_bucket.register_source(name, self.bucket, prefix)
        elif args.access_logs_bucket is not None:
            aws.s3.BucketLogging(
                f"{name}-access-logs", bucket=self.bucket.id, target_bucket=args.access_logs_bucket.id,
                target_prefix=prefix, opts=bucket_child,
            )
        self.policy = aws.s3.BucketPolicy(
            f"{name}-policy", bucket=self.bucket.id,
            policy=pulumi.Output.json_dumps({"Version": "2012-10-17",
                                             "Statement": [deny_insecure_transport(self.bucket.arn),
                                                           *_substitute(list(args.policy_statements), self.bucket.arn)]}),
            # The public access block must exist first or a broad statement could slip through.
            opts=pulumi.ResourceOptions(parent=self.bucket, depends_on=[public_access]),
        )
        self.arn = self.bucket.arn
        self.name = self.bucket.bucket
        self.register_outputs({"arn": self.arn, "name": self.name})

    def objects_arn(self, prefix: str = "") -> pulumi.Output[str]:
        return pulumi.Output.concat(self.bucket.arn, "/", prefix, "*")

    def read_statements(self, prefix: str = "") -> list[dict[str, Any]]:
        """IAM statements that read this bucket (and decrypt with its key)."""
        return [
            {"Effect": "Allow", "Action": ["s3:ListBucket", "s3:GetBucketLocation"], "Resource": [self.bucket.arn]},
            {"Effect": "Allow", "Action": ["s3:GetObject", "s3:GetObjectVersion"], "Resource": [self.objects_arn(prefix)]},
            {"Effect": "Allow", "Action": ["kms:Decrypt", "kms:DescribeKey"], "Resource": [self.args.kms_key.arn]},
        ]

    def read_write_statements(self, prefix: str = "") -> list[dict[str, Any]]:
        """IAM statements that read, write and delete objects (no bucket-level admin)."""
        return [
            {"Effect": "Allow", "Action": ["s3:ListBucket", "s3:GetBucketLocation", "s3:ListBucketMultipartUploads"],
             "Resource": [self.bucket.arn]},
            {"Effect": "Allow",
             "Action": ["s3:GetObject", "s3:GetObjectVersion", "s3:PutObject", "s3:DeleteObject",
                        "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
             "Resource": [self.objects_arn(prefix)]},
            {"Effect": "Allow", "Action": ["kms:Decrypt", "kms:GenerateDataKey", "kms:DescribeKey"],
             "Resource": [self.args.kms_key.arn]},
        ]

    def grant_read(self, role: aws.iam.Role, prefix: str = "") -> aws.iam.RolePolicy:
        """Attach an inline policy to ``role`` that reads this bucket."""
        return self._grant(role, "read", self.read_statements(prefix))

    def grant_read_write(self, role: aws.iam.Role, prefix: str = "") -> aws.iam.RolePolicy:
        """Attach an inline policy to ``role`` that reads and writes this bucket."""
        return self._grant(role, "read-write", self.read_write_statements(prefix))

    def _grant(self, role: aws.iam.Role, access: str, statements: list[dict[str, Any]]) -> aws.iam.RolePolicy:
        return aws.iam.RolePolicy(
            f"{self._name}-{access}-{role._name}", role=role.id,
            policy=pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": statements}),
            opts=pulumi.ResourceOptions(parent=self),
        )


# -- S3 server access log target --------------------------------------------------------------
@dataclass(frozen=True)
class AccessLogBucketArgs:
    """Inputs of ``AccessLogBucket``.

    Attributes:
        expiration_days: access-log objects are deleted this many days after delivery. Logs
            are many small objects, which STANDARD_IA bills as 128 KB each: no transitions.
        noncurrent_version_expiration_days: how long overwritten/deleted versions stay.
        protect: Pulumi ``protect`` on the bucket (prod); otherwise ``pulumi destroy`` empties it.
        tags: tags on every taggable child.
    """

    expiration_days: int = 365
    noncurrent_version_expiration_days: int = 30
    protect: bool = False
    tags: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.expiration_days < 1 or self.noncurrent_version_expiration_days < 1:
            raise ValueError("AccessLogBucketArgs: expiration days must be 1 or more")


class AccessLogBucket(pulumi.ComponentResource):
    """Target of S3 server access logs for the buckets of one account.

    SSE-S3 (S3 refuses SSE-KMS targets), versioned, public access blocked, owner-enforced
    objects (so permissions come from the bucket policy, not ACLs), TLS-only, lifecycle.
    Source buckets register themselves (``SecureBucketArgs.access_logs_bucket``); ``seal()``
    then writes a policy that lets ``logging.s3.amazonaws.com`` write each source's prefix
    only on behalf of that source bucket (``aws:SourceArn``) in this account
    (``aws:SourceAccount``), and turns logging on for every source once that policy exists.
    The objects stay in this account (S3 cannot deliver across accounts); they are not
    replicated to the log archive, whose SSE-KMS key would need cross-account replication
    grants for little gain.
    """

    bucket: aws.s3.Bucket
    policy: Optional[aws.s3.BucketPolicy]

    def __init__(self, name: str, args: AccessLogBucketArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:bucket:AccessLogBucket", name, None, opts)
        self._base_name = name
        self.args = args
        self.bucket, self._public_access, _ = private_bucket(
            name, parent=self, protect=args.protect, force_destroy=not args.protect, tags=args.tags, encryption=SSE_S3,
            lifecycle_rules=[LifecycleRule(id="expire-access-logs", expiration_days=args.expiration_days,
                                           noncurrent_version_expiration_days=args.noncurrent_version_expiration_days)])
        self._sources: list[tuple[str, aws.s3.Bucket, str]] = []
        self.policy = None
        self.arn = self.bucket.arn
        self.register_outputs({"bucket": self.bucket.bucket, "arn": self.bucket.arn})

    def register_source(self, name: str, bucket: aws.s3.Bucket, prefix: str) -> None:
        """Deliver ``bucket``'s access logs under ``prefix`` once ``seal()`` runs.

        ``bucket`` must be in this bucket's account (S3's rule); ``name`` names the
        ``BucketLogging`` resource (``<name>-access-logs``, a child of ``bucket``).
        """
        if self.policy is not None:
            raise RuntimeError(f"AccessLogBucket {self._base_name}: sealed already; register {name} before seal()")
        if not prefix or not prefix.endswith("/"):
            raise ValueError(f"AccessLogBucket: prefix {prefix!r} of {name} must be non-empty and end with '/'")
        if any(prefix.startswith(p) or p.startswith(prefix) for _, _, p in self._sources):
            raise ValueError(f"AccessLogBucket: prefix {prefix!r} of {name} overlaps another source's prefix")
        self._sources.append((name, bucket, prefix))

    def seal(self) -> aws.s3.BucketPolicy:
        """Write the bucket policy for every registered source, then turn their logging on."""
        if self.policy is not None:
            raise RuntimeError(f"AccessLogBucket {self._base_name}: seal() called twice")
        account_id = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(parent=self)).account_id
        # Statement shape from the S3 User Guide, "Enabling Amazon S3 server access logging"
        # (grant permissions to the logging service principal by using a bucket policy).
        statements: list[Any] = [deny_insecure_transport(self.bucket.arn)]
        for index, (_, source, prefix) in enumerate(self._sources):
            statements.append({
                "Sid": f"S3ServerAccessLogs{index}", "Effect": "Allow",
                "Principal": {"Service": "logging.s3.amazonaws.com"},
                "Action": "s3:PutObject", "Resource": pulumi.Output.concat(self.bucket.arn, "/", prefix, "*"),
                "Condition": {"ArnLike": {"aws:SourceArn": source.arn},
                              "StringEquals": {"aws:SourceAccount": account_id}},
            })
        self.policy = aws.s3.BucketPolicy(
            f"{self._base_name}-policy", bucket=self.bucket.id,
            policy=pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": statements}),
            opts=pulumi.ResourceOptions(parent=self.bucket, depends_on=[self._public_access]),
        )
        for name, source, prefix in self._sources:
            aws.s3.BucketLogging(
                f"{name}-access-logs", bucket=source.id, target_bucket=self.bucket.id, target_prefix=prefix,
                target_object_key_format={"partitioned_prefix": {"partition_date_source": "EventTime"}},
                opts=pulumi.ResourceOptions(parent=source, depends_on=[self.policy]),
            )
        return self.policy


def deny_insecure_transport(bucket_arn: pulumi.Input[str]) -> dict[str, Any]:
    return {
        "Sid": "DenyInsecureTransport",
        "Effect": "Deny",
        "Principal": "*",
        "Action": "s3:*",
        "Resource": [bucket_arn, pulumi.Output.concat(bucket_arn, "/*")],
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
    }


def _substitute(value: Any, arn: pulumi.Output[str]) -> Any:
    if isinstance(value, str) and SELF_ARN in value:
        head, tail = value.split(SELF_ARN, 1)
        return pulumi.Output.concat(head, arn, tail)
    if isinstance(value, list):
        return [_substitute(v, arn) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, arn) for k, v in value.items()}
    return value


def _rule(rule: LifecycleRule) -> dict[str, Any]:
    transitions = []
    if rule.transition_to_infrequent_access_days is not None:
        transitions.append({"days": rule.transition_to_infrequent_access_days, "storage_class": "STANDARD_IA"})
    if rule.transition_to_glacier_days is not None:
        transitions.append({"days": rule.transition_to_glacier_days, "storage_class": "GLACIER_IR"})
    spec: dict[str, Any] = {
        "id": rule.id,
        "status": "Enabled",
        "filter": {"prefix": rule.prefix},
        "abort_incomplete_multipart_upload": {"days_after_initiation": rule.abort_incomplete_multipart_upload_days},
    }
    if transitions:
        spec["transitions"] = transitions
    if rule.expiration_days is not None:
        spec["expiration"] = {"days": rule.expiration_days}
    if rule.noncurrent_version_expiration_days is not None:
        spec["noncurrent_version_expiration"] = {"noncurrent_days": rule.noncurrent_version_expiration_days}
    return spec
