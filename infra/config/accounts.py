"""The ``accounts`` section: the three accounts and the roles Pulumi assumes, with their rules."""
from __future__ import annotations

from enum import Enum
from typing import Iterator, Optional

from pydantic import Field, SecretStr

from catalog.regions import partition_of
from workloads.problems import Problem
from infra.config.common import AccountId, RoleArn, _Model
from infra.config.engine import Rule
from infra.config.syntax import role_arn_account


class AccountConfig(_Model):
    """One AWS account and the role Pulumi assumes in it."""

    id: AccountId = Field(description="12-digit AWS account id, quoted in YAML so leading zeros survive.")
    role_arn: RoleArn = Field(description="IAM role Pulumi assumes in this account (must be in `id`).")
    external_id: Optional[SecretStr] = Field(None, description=(
        "sts:ExternalId the role's trust policy requires, if any; may be stored with `pulumi config set --secret`."))
    session_name: str = Field("ml-training-platform", description="STS session name, visible in CloudTrail.")


class AccountLayout(str, Enum):
    """Whether the three roles live in three accounts (the isolation the layout exists for)."""

    SEPARATE = "separate"  # automation, workload and logging are three different accounts
    SINGLE_ACCOUNT = "single-account"  # explicit opt-out: some or all roles share one account


class AccountsConfig(_Model):
    """The three accounts of the platform: CI/images, workloads, and the log archive."""

    automation: AccountConfig = Field(description="CI and shared artifacts (ECR images).")
    workload: AccountConfig = Field(description="VPC, cluster, GPU nodes, storage, MLflow. No externalId (see README).")
    logging: AccountConfig = Field(description="Central, write-once log archive.")
    layout: AccountLayout = Field(AccountLayout.SEPARATE, description=(
        "separate | single-account. Two roles in one account are refused unless single-account is set."))


def _account_role_rule(key: str) -> Rule:
    def rule(account: AccountConfig) -> Iterator[Problem]:
        arn_account = role_arn_account(account.role_arn)
        if arn_account != account.id:
            yield Problem(
                f"accounts.{key}.roleArn",
                account.role_arn,
                f"the role is in account {arn_account}, not in the {key} account {account.id}",
                f"use the role Pulumi assumes inside account {account.id} "
                f"(arn:aws:iam::{account.id}:role/...) or correct accounts.{key}.id",
            )
    return Rule((f"accounts.{key}",), rule)


def _account_isolation(accounts: AccountsConfig) -> Iterator[Problem]:
    if accounts.layout is AccountLayout.SINGLE_ACCOUNT:
        return
    keys = ("automation", "workload", "logging")
    for index, first in enumerate(keys):
        for second in keys[index + 1:]:
            account_id = getattr(accounts, first).id
            if account_id == getattr(accounts, second).id:
                yield Problem(
                    f"accounts.{second}.id", account_id,
                    f"is also the {first} account: the {first} and {second} roles would share one account, losing "
                    "the isolation the three-account layout exists for (a compromised workload could rewrite its own audit logs)",
                    f"use a separate account for {second}, or set accounts.layout: single-account to accept one account",
                )


def _kubeconfig_role(workload: AccountConfig) -> Iterator[Problem]:
    # pulumi-eks writes the kubeconfig Pulumi's Kubernetes provider uses as
    # `aws --region R eks get-token --cluster-name N --output json --role <roleArn>`
    # (pulumi/pulumi-eks nodejs/eks/cluster/cluster.ts, generateKubeconfig): the AWS CLI's
    # `eks get-token` has no option for an external id, so such a role cannot be assumed there.
    if workload.external_id is not None:
        yield Problem(
            "accounts.workload.externalId", "[redacted]",
            "the workload role is also assumed by the cluster's kubeconfig (`aws eks get-token --role`), "
            "which cannot pass an sts:ExternalId: every Kubernetes resource would fail with AccessDenied",
            "remove externalId and restrict the workload role's trust policy by principal (and aws:PrincipalOrgID or "
            "source identity) instead; automation and logging roles may keep theirs",
        )


def _arn_partition(arn: str) -> str:
    return arn.split(":", 2)[1]


def _arn_partitions(region: str, accounts: AccountsConfig, admin_role_arns, deploy_role_arn) -> Iterator[Problem]:
    partition = partition_of(region)
    arns = [(f"accounts.{key}.roleArn", getattr(accounts, key).role_arn) for key in ("automation", "workload", "logging")]
    arns += [(f"cluster.adminRoleArns[{i}]", arn) for i, arn in enumerate(admin_role_arns)]
    arns += [("cluster.deployRoleArn", deploy_role_arn)] if deploy_role_arn else []
    for path, arn in arns:
        if _arn_partition(arn) != partition:
            yield Problem(path, arn, f"is in partition {_arn_partition(arn)}, but region {region} is in partition {partition}",
                          f"use arn:{partition}:iam::<account id>:role/<name> (a role of the region's partition)")


# Listed in the order the loader runs them (infra.config.platform.RULES).
RULES: tuple[Rule, ...] = (
    *(_account_role_rule(key) for key in ("automation", "workload", "logging")),
    Rule(("accounts",), _account_isolation),
    Rule(("accounts.workload",), _kubeconfig_role),
    Rule(("region", "accounts", "cluster.adminRoleArns", "cluster.deployRoleArn"), _arn_partitions),
)
