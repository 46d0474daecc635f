"""One explicit AWS provider per account; nothing uses a default provider."""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.config import AccountConfig, PlatformConfig

ACCOUNT_KEYS = ("automation", "workload", "logging")


@dataclass(frozen=True)
class AccountProviders:
    automation: aws.Provider
    workload: aws.Provider
    logging: aws.Provider


def account_provider(key: str, account: AccountConfig, config: PlatformConfig) -> aws.Provider:
    """Provider that assumes ``account.role_arn`` and refuses to touch any other account."""
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


def create_account_providers(config: PlatformConfig) -> AccountProviders:
    return AccountProviders(**{key: account_provider(key, getattr(config.accounts, key), config) for key in ACCOUNT_KEYS})
