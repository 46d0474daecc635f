"""Central log archive in the logging account: VPC flow logs, ALB logs, CloudTrail."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_aws as aws

from components.bucket import SELF_ARN, LifecycleRule, SecureBucket, SecureBucketArgs
from components.kms import create_key

# Services that write into the archive, each only on behalf of the writer accounts.
LOG_DELIVERY_SERVICES = (
    "delivery.logs.amazonaws.com",  # VPC flow logs
    "cloudtrail.amazonaws.com",
    "logdelivery.elasticloadbalancing.amazonaws.com",  # ALB access logs
    "logging.s3.amazonaws.com",  # S3 server access logs
)


@dataclass(frozen=True)
class LogArchiveArgs:
    """Inputs of ``LogArchive``.

    Attributes:
        writer_account_ids: accounts whose services may deliver logs here.
        transition_to_infrequent_access_days / transition_to_glacier_days / expiration_days:
            lifecycle of every log object.
        noncurrent_version_expiration_days: how long overwritten versions stay.
        kms_key_deletion_window_days: waiting period before a deleted key is gone.
        protect: Pulumi ``protect`` on the bucket and key (prod).
        tags: tags on every taggable child.
    """

    writer_account_ids: Sequence[str]
    transition_to_infrequent_access_days: int = 30
    transition_to_glacier_days: int = 90
    expiration_days: int = 365
    noncurrent_version_expiration_days: int = 30
    kms_key_deletion_window_days: int = 30
    protect: bool = False
    tags: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        days = (self.transition_to_infrequent_access_days, self.transition_to_glacier_days, self.expiration_days)
        if not days[0] < days[1] < days[2]:
            raise ValueError(
                f"LogArchiveArgs: lifecycle days must increase (infrequent access {days[0]} < glacier {days[1]} "
                f"< expiration {days[2]}); reorder them"
            )


def lifecycle_problems(path: str, ia_days: int, glacier_days: int, expiration_days: int):
    """Config-side twin of ``LogArchiveArgs.__post_init__``: all problems as ``Problem``s."""
    from components.validation import Problem

    if not ia_days < glacier_days:
        yield Problem(f"{path}.transitionToGlacierDays", glacier_days,
                      f"must come after the infrequent-access transition ({ia_days} days)",
                      f"set it above {ia_days}")
    if not glacier_days < expiration_days:
        yield Problem(f"{path}.expirationDays", expiration_days,
                      f"logs would expire before or when they reach Glacier ({glacier_days} days)",
                      f"set it above {glacier_days}")


class LogArchive(pulumi.ComponentResource):
    """Write-only destination for every log of the platform, in its own account."""

    bucket: aws.s3.Bucket
    key: aws.kms.Key

    def __init__(self, name: str, args: LogArchiveArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:logarchive:LogArchive", name, None, opts)
        writers = list(args.writer_account_ids)
        source_accounts = {"StringEquals": {"aws:SourceAccount": writers}}
        self.key = create_key(
            f"{name}", description="Encrypts the platform log archive", parent=self, tags=args.tags,
            deletion_window_days=args.kms_key_deletion_window_days, protect=args.protect,
            service_statements=[{
                "Sid": "LogDeliveryEncrypts", "Effect": "Allow",
                "Principal": {"Service": list(LOG_DELIVERY_SERVICES)},
                "Action": ["kms:GenerateDataKey*", "kms:Decrypt", "kms:DescribeKey"], "Resource": "*",
                "Condition": source_accounts,
            }],
        )
        statements = _delivery_statements(writers)
        self.archive = SecureBucket(
            f"{name}-logs",
            SecureBucketArgs(
                kms_key=self.key,
                lifecycle_rules=[LifecycleRule(
                    id="expire-logs",
                    transition_to_infrequent_access_days=args.transition_to_infrequent_access_days,
                    transition_to_glacier_days=args.transition_to_glacier_days,
                    expiration_days=args.expiration_days,
                    noncurrent_version_expiration_days=args.noncurrent_version_expiration_days,
                )],
                policy_statements=statements,
                protect=args.protect,
                tags=args.tags,
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.bucket = self.archive.bucket
        self.register_outputs({"bucket": self.bucket.bucket, "bucket_arn": self.bucket.arn, "key_arn": self.key.arn})


def _delivery_statements(writers: list[str]) -> list[dict[str, Any]]:
    source = {"StringEquals": {"aws:SourceAccount": writers}}
    objects = [f"{SELF_ARN}/{prefix}/AWSLogs/{account}/*" for prefix in ("vpc-flow-logs", "cloudtrail", "alb")
               for account in writers]
    objects.append(f"{SELF_ARN}/s3-access/*")
    return [
        {"Sid": "LogDeliveryAclCheck", "Effect": "Allow",
         "Principal": {"Service": list(LOG_DELIVERY_SERVICES)},
         "Action": ["s3:GetBucketAcl", "s3:ListBucket"], "Resource": SELF_ARN, "Condition": source},
        {"Sid": "LogDeliveryWrite", "Effect": "Allow",
         "Principal": {"Service": list(LOG_DELIVERY_SERVICES)},
         "Action": "s3:PutObject", "Resource": objects, "Condition": source},
    ]

