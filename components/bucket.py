"""An S3 bucket with the settings every platform bucket needs, and grant helpers."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_aws as aws


# Stands for this bucket's ARN in ``policy_statements`` written before the bucket exists.
SELF_ARN = "${self.arn}"


@dataclass(frozen=True)
class LifecycleRule:
    """One lifecycle rule. Days are counted from object creation; None disables a step."""

    id: str
    prefix: str = ""
    transition_to_infrequent_access_days: Optional[int] = None
    transition_to_glacier_days: Optional[int] = None
    expiration_days: Optional[int] = None
    noncurrent_version_expiration_days: Optional[int] = 30
    abort_incomplete_multipart_upload_days: int = 7


@dataclass(frozen=True)
class SecureBucketArgs:
    """Inputs of ``SecureBucket``.

    Attributes:
        kms_key: customer-managed key for SSE-KMS (bucket keys on, to cut KMS calls).
        lifecycle_rules: lifecycle from config; empty means objects live forever.
        policy_statements: extra bucket-policy statements (service deliveries, grants);
            ``SELF_ARN`` in any string is replaced by the bucket's ARN. A deny of non-TLS
            requests is always added.
        access_logs_bucket / access_logs_prefix: where S3 server access logs go (the log archive).
        versioning: keep every version (recovery from overwrites and deletes).
        protect: Pulumi ``protect`` on the bucket, so a stack change cannot delete it (prod).
        force_destroy: let ``pulumi destroy`` delete a non-empty bucket (dev only).
        tags: tags on every taggable child.
    """

    kms_key: aws.kms.Key
    lifecycle_rules: Sequence[LifecycleRule] = ()
    policy_statements: Sequence[Mapping[str, Any]] = ()
    access_logs_bucket: Optional[aws.s3.Bucket] = None
    access_logs_prefix: str = ""
    versioning: bool = True
    protect: bool = False
    force_destroy: bool = False
    tags: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.protect and self.force_destroy:
            raise ValueError("SecureBucketArgs: protect and force_destroy contradict each other; drop force_destroy")


class SecureBucket(pulumi.ComponentResource):
    """KMS-encrypted, versioned, private bucket with owner-enforced objects and TLS-only access."""

    bucket: aws.s3.Bucket
    arn: pulumi.Output[str]
    name: pulumi.Output[str]

    def __init__(self, name: str, args: SecureBucketArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:bucket:SecureBucket", name, None, opts)
        self.args = args
        child = pulumi.ResourceOptions(parent=self)
        self.bucket = aws.s3.Bucket(
            f"{name}-bucket", force_destroy=args.force_destroy, tags={**args.tags, "Name": name},
            opts=pulumi.ResourceOptions(parent=self, protect=args.protect),
        )
        bucket_child = pulumi.ResourceOptions(parent=self.bucket)
        aws.s3.BucketOwnershipControls(
            f"{name}-ownership", bucket=self.bucket.id, rule={"object_ownership": "BucketOwnerEnforced"}, opts=bucket_child,
        )
        public_access = aws.s3.BucketPublicAccessBlock(
            f"{name}-public-access", bucket=self.bucket.id, block_public_acls=True, block_public_policy=True,
            ignore_public_acls=True, restrict_public_buckets=True, opts=bucket_child,
        )
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-encryption", bucket=self.bucket.id,
            rules=[{"apply_server_side_encryption_by_default": {"sse_algorithm": "aws:kms",
                                                                 "kms_master_key_id": args.kms_key.arn},
                    "bucket_key_enabled": True}],
            opts=bucket_child,
        )
        if args.versioning:
            aws.s3.BucketVersioning(
                f"{name}-versioning", bucket=self.bucket.id, versioning_configuration={"status": "Enabled"}, opts=bucket_child,
            )
        if args.lifecycle_rules:
            aws.s3.BucketLifecycleConfiguration(
                f"{name}-lifecycle", bucket=self.bucket.id, rules=[_rule(r) for r in args.lifecycle_rules], opts=bucket_child,
            )
        if args.access_logs_bucket is not None:
            aws.s3.BucketLogging(
                f"{name}-access-logs", bucket=self.bucket.id, target_bucket=args.access_logs_bucket.id,
                target_prefix=args.access_logs_prefix or f"s3-access/{name}/", opts=bucket_child,
            )
        deny_insecure = {
            "Sid": "DenyInsecureTransport",
            "Effect": "Deny",
            "Principal": "*",
            "Action": "s3:*",
            "Resource": [self.bucket.arn, pulumi.Output.concat(self.bucket.arn, "/*")],
            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        }
        self.policy = aws.s3.BucketPolicy(
            f"{name}-policy", bucket=self.bucket.id,
            policy=pulumi.Output.json_dumps({"Version": "2012-10-17",
                                             "Statement": [deny_insecure, *_substitute(list(args.policy_statements), self.bucket.arn)]}),
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
