"""Central log archive in the logging account: VPC flow logs and the CloudTrail audit trail.

Every service that writes here is admitted by the bucket policy and the key policy only
on behalf of the resources that write (``aws:SourceArn``) in the accounts that own them
(``aws:SourceAccount``), with the statement shapes each service documents. S3 server access
logs and ALB access logs cannot use an SSE-KMS bucket: they go to SSE-S3 buckets of their
own (``components.bucket.AccessLogBucket``, ``AlbAccessLogs`` below).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_aws as aws

from components.bucket import (
    SELF_ARN,
    SSE_S3,
    AccessLogBucket,
    LifecycleRule,
    ObjectLock,
    SecureBucket,
    SecureBucketArgs,
    lifecycle_problems,
    private_bucket,
)
from components.kms import create_key
from workloads.problems import Problem, raise_if_any

# Key prefixes inside the archive, one per log source.
FLOW_LOGS_PREFIX = "vpc-flow-logs"
CLOUDTRAIL_PREFIX = "cloudtrail"


@dataclass(frozen=True)
class AuditTrailSources:
    """Which CloudTrail trails deliver to the archive.

    Either one trail of the same name in each of ``account_ids`` (account trails), or one
    organization trail: created by the logging account as CloudTrail delegated administrator,
    owned (and its ARN named) by the organization's management account, delivering under
    ``AWSLogs/<organization id>/`` and ``AWSLogs/<management account id>/``.
    """

    trail_name: str
    account_ids: Sequence[str] = ()
    organization_id: Optional[str] = None
    management_account_id: Optional[str] = None

    def __post_init__(self) -> None:
        org = (self.organization_id, self.management_account_id)
        if any(org) and not all(org):
            raise ValueError("AuditTrailSources: an organization trail needs organization_id and management_account_id")
        if all(org) and self.account_ids:
            raise ValueError("AuditTrailSources: give account_ids (account trails) or an organization, not both")
        if not all(org) and not self.account_ids:
            raise ValueError("AuditTrailSources: give account_ids (account trails) or an organization")

    @property
    def is_organization(self) -> bool:
        return self.organization_id is not None

    @property
    def trail_account_ids(self) -> list[str]:
        """Accounts in whose name a trail's ARN is written."""
        return [self.management_account_id] if self.is_organization else sorted(set(self.account_ids))  # type: ignore[list-item]

    @property
    def log_path_ids(self) -> list[str]:
        """The ``AWSLogs/<id>/`` directories CloudTrail writes."""
        return [self.organization_id, self.management_account_id] if self.is_organization else self.trail_account_ids  # type: ignore[list-item]


@dataclass(frozen=True)
class LogArchiveArgs:
    """Inputs of ``LogArchive``.

    Attributes:
        flow_log_account_ids: accounts whose VPC flow logs are delivered here.
        audit_trail: CloudTrail trails that deliver here (None: no trail is admitted).
        transition_to_infrequent_access_days / transition_to_glacier_days / expiration_days:
            lifecycle of every log object (None turns a step off); checked by
            ``components.bucket.lifecycle_problems``.
        noncurrent_version_expiration_days: how long overwritten versions stay.
        object_lock_retention_days: Object Lock default retention; None: off.
        object_lock_mode: COMPLIANCE (nobody, root included, shortens or removes a retention;
            prod) or GOVERNANCE (a principal with s3:BypassGovernanceRetention can).
        break_glass_role_name: the role of the logging account that alone may schedule the
            archive key's deletion or disable it (None: no such restriction).
        access_logs_bucket: this account's ``AccessLogBucket`` for the archive's own
            S3 server access logs (CIS: log access to the CloudTrail bucket).
        kms_key_deletion_window_days: waiting period before a deleted key is gone.
        protect: Pulumi ``protect`` on the bucket and key (prod).
        tags: tags on every taggable child.
    """

    flow_log_account_ids: Sequence[str]
    audit_trail: Optional[AuditTrailSources] = None
    transition_to_infrequent_access_days: Optional[int] = 30
    transition_to_glacier_days: Optional[int] = 90
    expiration_days: Optional[int] = 365
    noncurrent_version_expiration_days: int = 30
    object_lock_retention_days: Optional[int] = None
    object_lock_mode: str = "GOVERNANCE"
    break_glass_role_name: Optional[str] = None
    access_logs_bucket: Optional[AccessLogBucket] = None
    kms_key_deletion_window_days: int = 30
    protect: bool = False
    tags: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        raise_if_any("LogArchiveArgs", archive_problems(
            "LogArchiveArgs", ia_days=self.transition_to_infrequent_access_days,
            glacier_days=self.transition_to_glacier_days, expiration_days=self.expiration_days,
            object_lock_retention_days=self.object_lock_retention_days))


def archive_problems(path: str, *, ia_days: Optional[int], glacier_days: Optional[int], expiration_days: Optional[int],
                     object_lock_retention_days: Optional[int]):
    """Lifecycle rules S3 refuses or bills early, and a lock that outlives the lifecycle."""
    yield from lifecycle_problems(path, ia_days=ia_days, glacier_days=glacier_days, expiration_days=expiration_days)
    if object_lock_retention_days is not None and expiration_days is not None and object_lock_retention_days > expiration_days:
        yield Problem(f"{path}.objectLockRetentionDays", object_lock_retention_days,
                      f"locked logs outlive expirationDays ({expiration_days}): S3 cannot delete a version before its "
                      "retention ends, so the lifecycle and the lock contradict each other",
                      f"set it to {expiration_days} or less, or raise expirationDays")


class LogArchive(pulumi.ComponentResource):
    """Write-only destination for the platform's flow logs and audit trail, in its own account."""

    bucket: aws.s3.Bucket
    key: aws.kms.Key
    policy: aws.s3.BucketPolicy

    def __init__(self, name: str, args: LogArchiveArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:logarchive:LogArchive", name, None, opts)
        invoke = pulumi.InvokeOutputOptions(parent=self)
        partition = aws.get_partition_output(opts=invoke).partition
        region = aws.get_region_output(opts=invoke).region
        account_id = aws.get_caller_identity_output(opts=invoke).account_id
        self.key = create_key(
            f"{name}", description="Encrypts the platform log archive", parent=self, tags=args.tags,
            deletion_window_days=args.kms_key_deletion_window_days, protect=args.protect,
            service_statements=[*_key_statements(args, partition, region),
                                *_break_glass_statements(args, partition, account_id)],
        )
        lifecycle = LifecycleRule(
            id="expire-logs",
            transition_to_infrequent_access_days=args.transition_to_infrequent_access_days,
            transition_to_glacier_days=args.transition_to_glacier_days,
            expiration_days=args.expiration_days,
            noncurrent_version_expiration_days=args.noncurrent_version_expiration_days,
        )
        self.archive = SecureBucket(
            f"{name}-logs",
            SecureBucketArgs(
                kms_key=self.key,
                lifecycle_rules=[lifecycle],
                policy_statements=_bucket_statements(args, partition, region),
                access_logs_bucket=args.access_logs_bucket,
                access_logs_prefix=f"s3-access/{name}-logs/",
                object_lock=(ObjectLock(args.object_lock_retention_days, mode=args.object_lock_mode)
                             if args.object_lock_retention_days else None),
                protect=args.protect,
                tags=args.tags,
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.bucket = self.archive.bucket
        # Deliveries must wait for this: flow-log creation fails, and trails refuse to start,
        # while the policy does not admit them yet.
        self.policy = self.archive.policy
        self.register_outputs({"bucket": self.bucket.bucket, "bucket_arn": self.bucket.arn, "key_arn": self.key.arn})


def trail_arn(partition: pulumi.Input[str], region: pulumi.Input[str], account_id: str, trail_name: str) -> pulumi.Output[str]:
    return pulumi.Output.concat("arn:", partition, ":cloudtrail:", region, ":", account_id, ":trail/", trail_name)


def _logs_source_arns(accounts: Sequence[str], partition, region) -> list[pulumi.Output[str]]:
    return [pulumi.Output.concat("arn:", partition, ":logs:", region, ":", account, ":*") for account in accounts]


def _key_statements(args: LogArchiveArgs, partition, region) -> list[dict[str, Any]]:
    statements: list[dict[str, Any]] = []
    flow_accounts = sorted(set(args.flow_log_account_ids))
    if flow_accounts:
        # CloudWatch Logs User Guide, "Logs sent to Amazon S3" (SSE-KMS key policy).
        statements.append({
            "Sid": "FlowLogDeliveryEncrypts", "Effect": "Allow",
            "Principal": {"Service": "delivery.logs.amazonaws.com"},
            "Action": ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:DescribeKey"],
            "Resource": "*",
            "Condition": {"StringEquals": {"aws:SourceAccount": flow_accounts},
                          "ArnLike": {"aws:SourceArn": _logs_source_arns(flow_accounts, partition, region)}},
        })
    trail = args.audit_trail
    if trail is not None:
        # CloudTrail User Guide, "Configure AWS KMS key policies for CloudTrail".
        arns = [trail_arn(partition, region, a, trail.trail_name) for a in trail.trail_account_ids]
        contexts = [pulumi.Output.concat("arn:", partition, ":cloudtrail:*:", a, ":trail/*") for a in trail.trail_account_ids]
        statements += [
            {"Sid": "CloudTrailEncrypts", "Effect": "Allow", "Principal": {"Service": "cloudtrail.amazonaws.com"},
             "Action": "kms:GenerateDataKey*", "Resource": "*",
             "Condition": {"StringEquals": {"aws:SourceArn": arns},
                           "StringLike": {"kms:EncryptionContext:aws:cloudtrail:arn": contexts}}},
            {"Sid": "CloudTrailDescribesKey", "Effect": "Allow", "Principal": {"Service": "cloudtrail.amazonaws.com"},
             "Action": "kms:DescribeKey", "Resource": "*", "Condition": {"StringEquals": {"aws:SourceArn": arns}}},
        ]
    return statements


KEY_DESTRUCTION_ACTIONS = ["kms:ScheduleKeyDeletion", "kms:DisableKey"]


def _break_glass_statements(args: LogArchiveArgs, partition, account_id) -> list[dict[str, Any]]:
    """Without its key every archived log is unreadable, whatever Object Lock keeps: only the
    break-glass role may schedule the key's deletion or disable it. An explicit Deny in the key
    policy overrides any IAM Allow in the account, AdministratorAccess included (KMS Developer
    Guide, "Key policies": an explicit deny in any policy overrides an allow). PutKeyPolicy stays
    with the deploy role (it manages this policy); a change to the policy is recorded by the
    logging account's own trail."""
    if not args.break_glass_role_name:
        return []
    return [{"Sid": "OnlyBreakGlassDestroysTheKey", "Effect": "Deny", "Principal": {"AWS": "*"},
             "Action": KEY_DESTRUCTION_ACTIONS, "Resource": "*",
             "Condition": {"ArnNotEquals": {"aws:PrincipalArn": pulumi.Output.concat(
                 "arn:", partition, ":iam::", account_id, ":role/", args.break_glass_role_name)}}}]


def _bucket_statements(args: LogArchiveArgs, partition, region) -> list[dict[str, Any]]:
    statements: list[dict[str, Any]] = []
    flow_accounts = sorted(set(args.flow_log_account_ids))
    if flow_accounts:
        # VPC User Guide, "Amazon S3 bucket permissions for flow logs": with Hive-compatible
        # partitions the objects live under AWSLogs/aws-account-id=<id>/.
        source = {"StringEquals": {"aws:SourceAccount": flow_accounts},
                  "ArnLike": {"aws:SourceArn": _logs_source_arns(flow_accounts, partition, region)}}
        statements += [
            {"Sid": "FlowLogDeliveryAclCheck", "Effect": "Allow", "Principal": {"Service": "delivery.logs.amazonaws.com"},
             "Action": ["s3:GetBucketAcl", "s3:ListBucket"], "Resource": SELF_ARN, "Condition": source},
            {"Sid": "FlowLogDeliveryWrite", "Effect": "Allow", "Principal": {"Service": "delivery.logs.amazonaws.com"},
             "Action": "s3:PutObject",
             "Resource": [f"{SELF_ARN}/{FLOW_LOGS_PREFIX}/AWSLogs/aws-account-id={a}/*" for a in flow_accounts],
             "Condition": {"StringEquals": {**source["StringEquals"], "s3:x-amz-acl": "bucket-owner-full-control"},
                           "ArnLike": source["ArnLike"]}},
        ]
    trail = args.audit_trail
    if trail is not None:
        # CloudTrail User Guide, "Amazon S3 bucket policy for CloudTrail" (and its
        # organization-trail variant).
        arns = [trail_arn(partition, region, a, trail.trail_name) for a in trail.trail_account_ids]
        statements += [
            {"Sid": "CloudTrailAclCheck", "Effect": "Allow", "Principal": {"Service": "cloudtrail.amazonaws.com"},
             "Action": "s3:GetBucketAcl", "Resource": SELF_ARN, "Condition": {"StringEquals": {"aws:SourceArn": arns}}},
            {"Sid": "CloudTrailWrite", "Effect": "Allow", "Principal": {"Service": "cloudtrail.amazonaws.com"},
             "Action": "s3:PutObject",
             "Resource": [f"{SELF_ARN}/{CLOUDTRAIL_PREFIX}/AWSLogs/{i}/*" for i in trail.log_path_ids],
             "Condition": {"StringEquals": {"aws:SourceArn": arns, "s3:x-amz-acl": "bucket-owner-full-control"}}},
        ]
    return statements


# -- the audit trail ---------------------------------------------------------------------------
# CloudTrail User Guide, "Logging data events" (advanced event selectors): with advanced
# selectors a trail logs only what they select, management events included.
MANAGEMENT_EVENTS = {"name": "Management events", "field_selectors": [{"field": "eventCategory", "equals": ["Management"]}]}
# What the archive's own deliveries do, left out of its data events: logging them would make
# every delivery an event, delivered again (CloudTrail User Guide, "Logging data events").
DELIVERY_WRITES = ["PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload"]


def s3_object_events(name: str, bucket_arn_prefixes: Sequence[pulumi.Input[str]], *,
                     writes_only_except_delivery: bool = False) -> dict[str, Any]:
    """An advanced event selector for S3 object-level API calls on the objects whose ARN starts
    with one of the prefixes (reads and writes; or, for a log bucket, the writes that are not
    its deliveries: deletes, retention and legal-hold changes, restores)."""
    selectors: list[dict[str, Any]] = [
        {"field": "eventCategory", "equals": ["Data"]},
        {"field": "resources.type", "equals": ["AWS::S3::Object"]},
        {"field": "resources.ARN", "starts_withs": list(bucket_arn_prefixes)},
    ]
    if writes_only_except_delivery:
        selectors += [{"field": "readOnly", "equals": ["false"]}, {"field": "eventName", "not_equals": DELIVERY_WRITES}]
    return {"name": name, "field_selectors": selectors}


@dataclass(frozen=True)
class AuditTrailArgs:
    """Inputs of ``AuditTrail``.

    Attributes:
        archive: the log archive (bucket, key, and the policy the trail must wait for).
        trail_name: must be the name the archive's ``AuditTrailSources`` admits.
        organization: an organization trail (the provider must be the management account or
            a CloudTrail delegated administrator).
        data_event_selectors: advanced event selectors for data events (``s3_object_events``);
            with any, management events get their own selector (CloudTrail logs only what
            advanced selectors select).
        tags: tags on the trail.
    """

    archive: LogArchive
    trail_name: str
    organization: bool = False
    data_event_selectors: Sequence[Mapping[str, Any]] = ()
    tags: Mapping[str, str] = field(default_factory=dict)


class AuditTrail(pulumi.ComponentResource):
    """A multi-region CloudTrail trail (management events, global services) into the archive,
    encrypted with the archive's key, with log file integrity validation (digest files)."""

    trail: aws.cloudtrail.Trail

    def __init__(self, name: str, args: AuditTrailArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:logarchive:AuditTrail", name, None, opts)
        archive = args.archive
        self.trail = aws.cloudtrail.Trail(
            f"{name}-trail", name=args.trail_name,
            s3_bucket_name=archive.bucket.bucket, s3_key_prefix=CLOUDTRAIL_PREFIX,
            kms_key_id=archive.key.arn, enable_log_file_validation=True,
            is_multi_region_trail=True, include_global_service_events=True,
            is_organization_trail=args.organization, enable_logging=True,
            advanced_event_selectors=([MANAGEMENT_EVENTS, *args.data_event_selectors]
                                      if args.data_event_selectors else None),
            tags={**args.tags, "Name": args.trail_name},
            # CreateTrail checks the bucket policy and fails with InsufficientS3BucketPolicyException.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[archive.policy]),
        )
        self.register_outputs({"arn": self.trail.arn})


# -- ALB access logs (logging account) -------------------------------------------------------
# Regions where ELB delivers access logs as a regional ELB account (regions opened before
# August 2022): the keys of terraform-provider-aws's elbAccountIdPerRegionMap, behind
# aws.elb.get_service_account, which fails with "Unknown region" everywhere else. Newer
# regions deliver as the service principal logdelivery.elasticloadbalancing.amazonaws.com
# (https://docs.aws.amazon.com/elasticloadbalancing/latest/application/enable-access-logging.html).
ELB_ACCOUNT_LOG_DELIVERY_REGIONS = frozenset({
    "af-south-1", "ap-east-1", "ap-northeast-1", "ap-northeast-2", "ap-northeast-3", "ap-south-1",
    "ap-southeast-1", "ap-southeast-2", "ca-central-1", "cn-north-1", "cn-northwest-1", "eu-central-1",
    "eu-north-1", "eu-south-1", "eu-west-1", "eu-west-2", "eu-west-3", "me-south-1", "sa-east-1",
    "us-east-1", "us-east-2", "us-gov-east-1", "us-gov-west-1", "us-west-1", "us-west-2",
})
ALB_LOG_PREFIX = "alb"


def alb_log_object_arn_suffix(account_id: str) -> str:
    """Where ELB writes: <bucket>/<prefix>/AWSLogs/<account-id>/elasticloadbalancing/..."""
    return f"/{ALB_LOG_PREFIX}/AWSLogs/{account_id}/*"

class AlbAccessLogs(pulumi.ComponentResource):
    # Type token kept from its first home, components/tracking.py: URNs are a contract
    # (docs/versioning.md).
    """Bucket for load balancer access logs, in the logging account.

    ALB log delivery supports only SSE-S3 buckets, while the log archive uses SSE-KMS: these
    logs get their own bucket with the controls of every platform bucket
    (``components.bucket.private_bucket``: versioning, public access block, owner-enforced
    objects, lifecycle), TLS-only, and deliveries scoped to the writer accounts.
    """

    def __init__(self, name: str, *, writer_account_ids: Sequence[str], expiration_days: int,
                 protect: bool, tags: Mapping[str, str], region: Optional[str] = None,
                 opts: Optional[pulumi.ResourceOptions] = None):
        """``region``: the load balancers' region; it decides who delivers the logs (None: both
        principals, for a region listed in ``ELB_ACCOUNT_LOG_DELIVERY_REGIONS``)."""
        super().__init__("mlplatform:tracking:AlbAccessLogs", name, None, opts)
        tags = dict(tags)
        self.bucket, public, _ = private_bucket(
            name, parent=self, protect=protect, force_destroy=not protect, tags=tags, encryption=SSE_S3,
            lifecycle_rules=[LifecycleRule(id="expire-logs", expiration_days=expiration_days,
                                           noncurrent_version_expiration_days=7)])
        objects = [pulumi.Output.concat(self.bucket.arn, alb_log_object_arn_suffix(account))
                   for account in writer_account_ids]
        statements = [
            {"Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
             "Resource": [self.bucket.arn, pulumi.Output.concat(self.bucket.arn, "/*")],
             "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
            {"Sid": "ElbServiceDelivers", "Effect": "Allow",
             "Principal": {"Service": "logdelivery.elasticloadbalancing.amazonaws.com"},
             "Action": "s3:PutObject", "Resource": objects,
             "Condition": {"StringEquals": {"aws:SourceAccount": list(writer_account_ids)}}},
        ]
        if region is None or region in ELB_ACCOUNT_LOG_DELIVERY_REGIONS:
            # Older regions deliver as the regional ELB account (which cannot carry a SourceAccount
            # condition; the object path limits it to the writer accounts' prefixes).
            elb_account = aws.elb.get_service_account_output(opts=pulumi.InvokeOutputOptions(parent=self))
            statements.insert(1, {"Sid": "ElbAccountDelivers", "Effect": "Allow", "Principal": {"AWS": elb_account.arn},
                                  "Action": "s3:PutObject", "Resource": objects})
        policy = pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": statements})
        # Load balancers that log here depend on this policy: ELB checks its write access when
        # the access-log attribute is set and refuses it before the policy exists.
        self.policy = aws.s3.BucketPolicy(f"{name}-policy", bucket=self.bucket.id, policy=policy,
                                          opts=pulumi.ResourceOptions(parent=self.bucket, depends_on=[public]))
        self.register_outputs({"bucket": self.bucket.bucket})
