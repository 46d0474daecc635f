"""One explicit AWS provider per account; nothing uses a default provider."""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from catalog.regions import partition_of
from components.ci_access import reader_role_name
from infra.config import AccountConfig, PlatformConfig

ACCOUNT_KEYS = ("automation", "workload", "logging")


def reader_role_arn(config: PlatformConfig, account_id: str) -> str:
    """The stack's read-only role in an account, the only one CI's preview role may assume."""
    return f"arn:{partition_of(config.region)}:iam::{account_id}:role/{reader_role_name(config.name, account_id)}"


@dataclass(frozen=True)
class AccountProviders:
    automation: aws.Provider
    workload: aws.Provider
    logging: aws.Provider


def account_provider(key: str, account: AccountConfig, config: PlatformConfig, *, read_only: bool = False) -> aws.Provider:
    """Provider that assumes ``account.role_arn`` and refuses to touch any other account.

    ``read_only``: a pull-request preview; assume the stack's ``<name>-ci-reader`` role in the account
    instead (the only role CI's preview role may assume, components/ci_access.py).
    """
    if read_only:
        return aws.Provider(
            f"{key}-account", region=config.region,
            assume_roles=[aws.ProviderAssumeRoleArgs(role_arn=reader_role_arn(config, account.id),
                                                     session_name=f"{account.session_name}-{config.name}-preview")],
            allowed_account_ids=[account.id], default_tags=aws.ProviderDefaultTagsArgs(tags=config.resource_tags))
    # Typed args, not dicts: provider config is sent JSON-encoded and plain dict keys
    # would reach the provider in snake_case, which it ignores.
    assume_role = aws.ProviderAssumeRoleArgs(
        role_arn=account.role_arn,
        session_name=f"{account.session_name}-{config.name}",
        # A secret Output: never in plain text in the state or the plan.
        external_id=pulumi.Output.secret(account.external_id.get_secret_value()) if account.external_id else None,
    )
    return aws.Provider(
        f"{key}-account",
        region=config.region,
        assume_roles=[assume_role],
        allowed_account_ids=[account.id],
        default_tags=aws.ProviderDefaultTagsArgs(tags=config.resource_tags),
    )


def create_account_providers(config: PlatformConfig, *, read_only: bool = False) -> AccountProviders:
    return AccountProviders(**{key: account_provider(key, getattr(config.accounts, key), config, read_only=read_only)
                               for key in ACCOUNT_KEYS})
