"""CI capability: GitHub OIDC roles, the state's KMS key and the in-VPC runner of this stack (components/ci_access.py).

Read-only previews: ``python -m infra.plan.deploy preview --read-only`` runs the program with
``ML_PLATFORM_READ_ONLY=1``; the account providers then assume this stack's ``<name>-ci-reader``
roles instead of ``accounts.*.roleArn`` (``infra.accounts``), which is all the preview role may assume.
"""
from __future__ import annotations

import datetime as dt
import os
from typing import Any, Iterator

from catalog.regions import partition_of
from components.ci_access import (
    DEPLOY_SESSION_SECONDS,
    CiAccess,
    CiAccessArgs,
    CiRunnerArgs,
    deploy_subject,
    preview_subject,
    role_name,
    runner_log_group_name,
)
from infra.accounts import ACCOUNT_KEYS
from infra.capability import Capability
from infra.config import PlatformConfig
from infra.config.ci import OidcProviderMode
from infra.costs import CostLine
from infra.recording import Recording
from infra.platform import Platform

READ_ONLY_ENV = "ML_PLATFORM_READ_ONLY"


def log_group_names(config: PlatformConfig) -> list[str]:
    return [runner_log_group_name(config.name)] if config.ci is not None and config.ci.code_connection_arn else []


def read_only_requested() -> bool:
    return os.environ.get(READ_ONLY_ENV) == "1"


def _reader_accounts(config: PlatformConfig) -> dict[str, str]:
    """account key -> id, one key per distinct account (single-account layouts share one role)."""
    seen: dict[str, str] = {}
    for key in ACCOUNT_KEYS:
        account_id = getattr(config.accounts, key).id
        if account_id not in seen.values():
            seen[key] = account_id
    return seen


def ci_args(config: PlatformConfig) -> CiAccessArgs:
    ci = config.ci
    assert ci is not None
    return CiAccessArgs(
        name=config.name, partition=partition_of(config.region), region=config.region,
        environment=config.environment.value, repository=ci.repository, workflow_path=ci.workflow_path,
        automation_account_id=config.accounts.automation.id,
        account_role_arns=[getattr(config.accounts, key).role_arn for key in ACCOUNT_KEYS],
        reader_account_ids=list(_reader_accounts(config).values()), state_bucket=ci.state_bucket,
        administrator_role_arn=config.accounts.automation.role_arn,
        create_oidc_provider=ci.oidc_provider is OidcProviderMode.CREATE,
        # Dev's state holds no production data; prod's is decrypted only behind the environment.
        preview_decrypts_state=not config.is_prod, protect=config.protect_stateful, tags=config.resource_tags)


def deploy(platform: Platform) -> dict[str, Any]:
    config = platform.config
    if config.ci is None:
        return {}
    args = ci_args(config)
    runner = None
    if config.ci.code_connection_arn:
        runner = CiRunnerArgs(vpc_id=platform.network.vpc_id, subnet_ids=platform.network.private_subnet_ids,
                              cluster_security_group_id=platform.cluster.cluster_security_group_id,
                              code_connection_arn=config.ci.code_connection_arn,
                              log_retention_days=config.cluster.log_retention_days,
                              log_kms_key=platform.log_group_key.key if platform.log_group_key else None)
    access = CiAccess(
        f"{config.name}-ci", args, automation=platform.providers.automation,
        reader_providers={key: (account_id, getattr(platform.providers, key))
                          for key, account_id in _reader_accounts(config).items()},
        runner=runner, runner_provider=platform.providers.workload)
    return {"ciPreviewRoleArn": access.roles["preview"].arn, "ciDeployRoleArn": access.roles["deploy"].arn,
            "ciSecretsProvider": args.secrets_provider,
            "ciRunnerProject": access.runner_project.name if access.runner_project else None}


def plan_sections(config: PlatformConfig, recording: Recording) -> Iterator[tuple[str, list[str]]]:
    if config.ci is None:
        return
    args = ci_args(config)
    yield ("CI access (automation account)", [
        f"{role_name(config.name, 'preview')}: trusts sub {preview_subject(args.repository, args.workflow_path)}; "
        f"assumes only {role_name(config.name, 'reader')}-<account> (ReadOnlyAccess minus data reads) in "
        f"{len(args.reader_account_ids)} account(s); state read{', state key decrypt' if args.preview_decrypts_state else ''}",
        f"{role_name(config.name, 'deploy')}: trusts sub {deploy_subject(args.repository, args.workflow_path, args.environment)}; "
        f"assumes only accounts.*.roleArn; sessions up to {DEPLOY_SESSION_SECONDS // 3600} h",
        f"secrets provider {args.secrets_provider} (only the deploy role above and the administrator's "
        f"{args.administrator_role_arn.rsplit('/', 1)[-1]} may use the key"
        f"{'; the preview role decrypts' if args.preview_decrypts_state else ''})",
        f"runner: {role_name(config.name, 'runner')} (CodeBuild in the private subnets)" if config.ci.code_connection_arn
        else "runner: none (ci.codeConnectionArn unset)",
    ])


def warnings(config: PlatformConfig, recording: Recording) -> Iterator[str]:
    if config.ci is None:
        yield ("no `ci` section: this stack creates no CI roles, state key or runner; CI cannot deploy it "
               "(docs/runbooks/ci-roles.md)")
    elif not config.ci.code_connection_arn and (config.is_prod or not config.cluster.public_access_cidrs):
        yield ("ci.codeConnectionArn is unset and the cluster endpoint is private: CI jobs cannot reach the "
               "Kubernetes API without the in-VPC runner")


def cost_lines(recording: Recording, today: dt.date) -> Iterator[CostLine]:
    return iter(())  # the state key is counted with every KMS key; CodeBuild bills per build minute only


CAPABILITY = Capability(name="ci", deploy=deploy, plan_sections=plan_sections, warnings=warnings, cost_lines=cost_lines,
                        log_group_names=log_group_names)
