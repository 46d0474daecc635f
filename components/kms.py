"""Customer-managed KMS keys with rotation and an explicit key policy."""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_aws as aws


def create_key(
    name: str,
    *,
    description: str,
    parent: pulumi.Resource,
    tags: Mapping[str, str],
    service_statements: Sequence[Mapping[str, Any]] = (),
    deletion_window_days: int = 30,
    protect: bool = False,
) -> aws.kms.Key:
    """A symmetric key, rotated yearly, administered by its own account only.

    ``service_statements`` let AWS services (log delivery, CloudTrail, EKS) use the key;
    each should carry an ``aws:SourceAccount`` condition so no other account can.
    """
    identity = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(parent=parent))
    partition = aws.get_partition_output(opts=pulumi.InvokeOutputOptions(parent=parent)).partition
    root = pulumi.Output.concat("arn:", partition, ":iam::", identity.account_id, ":root")
    policy = pulumi.Output.json_dumps({
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "AccountAdministers", "Effect": "Allow", "Principal": {"AWS": root},
             "Action": "kms:*", "Resource": "*"},
            *service_statements,
        ],
    })
    key = aws.kms.Key(
        f"{name}-key", description=description, enable_key_rotation=True, rotation_period_in_days=365,
        deletion_window_in_days=deletion_window_days, policy=policy, tags={**tags, "Name": f"{name}-key"},
        opts=pulumi.ResourceOptions(parent=parent, protect=protect),
    )
    aws.kms.Alias(f"{name}-alias", name=f"alias/{name}", target_key_id=key.key_id,
                  opts=pulumi.ResourceOptions(parent=key))
    return key
