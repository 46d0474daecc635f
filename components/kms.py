"""Customer-managed KMS keys with rotation and an explicit key policy."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_aws as aws


def key_policy_document(parent: pulumi.Resource, statements: Sequence[Mapping[str, Any]] = ()) -> pulumi.Output[str]:
    """A key policy: the key's own account administers it (through IAM), plus ``statements``."""
    identity = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(parent=parent))
    partition = aws.get_partition_output(opts=pulumi.InvokeOutputOptions(parent=parent)).partition
    root = pulumi.Output.concat("arn:", partition, ":iam::", identity.account_id, ":root")
    return pulumi.Output.json_dumps({
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "AccountAdministers", "Effect": "Allow", "Principal": {"AWS": root},
             "Action": "kms:*", "Resource": "*"},
            *statements,
        ],
    })


def create_key(
    name: str,
    *,
    description: str,
    parent: pulumi.Resource,
    tags: Mapping[str, str],
    service_statements: Sequence[Mapping[str, Any]] = (),
    deletion_window_days: int = 30,
    protect: bool = False,
    policy_set_later: bool = False,
) -> aws.kms.Key:
    """A symmetric key, rotated yearly, administered by its own account only.

    ``service_statements`` let AWS services (log delivery, CloudTrail, EKS) use the key;
    each carries the ``aws:SourceArn`` / ``aws:SourceAccount`` (or encryption-context)
    conditions the service documents, so no other account or resource can.

    ``policy_set_later``: the key is created with KMS's default policy (the account
    administers it, exactly ``AccountAdministers``) and the caller attaches the real one with
    ``set_key_policy`` once the resources it names exist (an FSx file system's id, say). Never
    combine with ``service_statements``: a key's inline policy and a ``KeyPolicy`` would fight.
    """
    if policy_set_later and service_statements:
        raise ValueError(f"create_key({name!r}): pass service_statements to set_key_policy, not here")
    key = aws.kms.Key(
        f"{name}-key", description=description, enable_key_rotation=True, rotation_period_in_days=365,
        deletion_window_in_days=deletion_window_days,
        policy=None if policy_set_later else key_policy_document(parent, service_statements),
        tags={**tags, "Name": f"{name}-key"},
        opts=pulumi.ResourceOptions(parent=parent, protect=protect),
    )
    aws.kms.Alias(f"{name}-alias", name=f"alias/{name}", target_key_id=key.key_id,
                  opts=pulumi.ResourceOptions(parent=key))
    return key


def set_key_policy(
    name: str,
    key: aws.kms.Key,
    *,
    parent: pulumi.Resource,
    statements: Sequence[Mapping[str, Any]],
    depends_on: Sequence[pulumi.Resource] = (),
) -> aws.kms.KeyPolicy:
    """The whole policy of a key made with ``policy_set_later``: account admin + ``statements``."""
    return aws.kms.KeyPolicy(
        f"{name}-key-policy", key_id=key.key_id, policy=key_policy_document(parent, statements),
        opts=pulumi.ResourceOptions(parent=key, depends_on=list(depends_on)),
    )


# -- CloudWatch Logs --------------------------------------------------------------------------
def log_group_arn(partition: pulumi.Input[str], region: pulumi.Input[str], account_id: pulumi.Input[str],
                  log_group_name: str) -> pulumi.Output[str]:
    return pulumi.Output.concat("arn:", partition, ":logs:", region, ":", account_id, ":log-group:", log_group_name)


@dataclass(frozen=True)
class LogGroupKeyArgs:
    """Inputs of ``LogGroupKey``.

    Attributes:
        log_group_names: every CloudWatch log group the key may encrypt (exact names; a
            trailing ``*`` admits a family, e.g. ``/aws/lambda/mlp-*``).
        deletion_window_days / protect / tags: as for any key.
    """

    log_group_names: Sequence[str]
    deletion_window_days: int = 30
    protect: bool = False
    tags: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = [n for n in self.log_group_names if not n or "*" in n[:-1]]
        if not self.log_group_names or bad:
            raise ValueError(f"LogGroupKeyArgs.log_group_names: need names with at most a trailing '*' (got {bad or 'none'})")


class LogGroupKey(pulumi.ComponentResource):
    """KMS key for CloudWatch Logs groups of one account and region.

    Key policy per the CloudWatch Logs User Guide, "Encrypt log data in CloudWatch Logs
    using AWS Key Management Service": the regional service principal
    ``logs.<region>.amazonaws.com`` may use the key only for the listed log groups, enforced
    by the ``kms:EncryptionContext:aws:logs:arn`` condition (CloudWatch Logs sends the
    group's ARN as encryption context on every call).
    """

    key: aws.kms.Key

    def __init__(self, name: str, args: LogGroupKeyArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:kms:LogGroupKey", name, None, opts)
        invoke = pulumi.InvokeOutputOptions(parent=self)
        partition_info = aws.get_partition_output(opts=invoke)
        partition, dns_suffix = partition_info.partition, partition_info.dns_suffix
        region = aws.get_region_output(opts=invoke).region
        account_id = aws.get_caller_identity_output(opts=invoke).account_id
        arns = [log_group_arn(partition, region, account_id, n) for n in args.log_group_names]
        self.key = create_key(
            name, description="Encrypts the platform's CloudWatch log groups", parent=self, tags=args.tags,
            deletion_window_days=args.deletion_window_days, protect=args.protect,
            service_statements=[{
                "Sid": "CloudWatchLogsEncrypts", "Effect": "Allow",
                "Principal": {"Service": pulumi.Output.concat("logs.", region, ".", dns_suffix)},
                "Action": ["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
                "Resource": "*",
                "Condition": {"ArnLike": {"kms:EncryptionContext:aws:logs:arn": arns}},
            }],
        )
        self.arn = self.key.arn
        self.register_outputs({"arn": self.key.arn})
