"""Tenant tooling with the platform's admin credentials (security review 4, N6), from the
attacker's seat, here an honest engineer following the documentation: the documented way to
reach the cluster must be the team's own role (an EKS access entry bound to the team's Role in
its namespace), never the stack output ``kubeconfig`` (the deploy role: cluster admin) nor the
Pulumi state (every team's secrets). What refuses the old path: the documentation names the
team role, and prod refuses a team that has no role, whose members would otherwise be handed an
admin's kubeconfig."""
from __future__ import annotations

from pathlib import Path

import pytest

from infra.config import ConfigError, load_platform_config
from tests.conftest import stack_config

ROOT = Path(__file__).resolve().parents[2]
TENANT_DOCS = [ROOT / "docs" / "jobs-client.md", ROOT / "README.md"]


@pytest.mark.parametrize("doc", TENANT_DOCS, ids=lambda p: p.name)
def test_tenant_docs_never_hand_out_the_admin_kubeconfig(doc):
    text = doc.read_text()
    assert "stack output kubeconfig --show-secrets" not in text
    assert "update-kubeconfig" in text and "--role-arn" in text


def test_prod_refuses_a_team_without_its_own_role():
    raw = stack_config("prod")
    raw["scheduling"]["teams"][0].pop("roleArns", None)
    with pytest.raises(ConfigError) as err:
        load_platform_config(raw)
    assert "scheduling.teams[0].roleArns" in str(err.value) and "update-kubeconfig" in str(err.value)


def test_every_prod_team_gets_an_access_entry(prod_plan):
    config = prod_plan.config
    entries = prod_plan.recording.by_type("aws:eks/accessEntry:AccessEntry")
    principals = {e.inputs.get("principalArn") for e in entries}
    for team in config.scheduling.teams:
        assert team.role_arns and set(team.role_arns) <= principals, team.name


def _must_exist_section(runbook: str) -> str:
    marker = "**Every role the stack file names must exist before the first `up`.**"
    assert marker in runbook, "first-deploy.md step 1 has no list of the roles to create before the first up"
    return runbook.split(marker, 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_access_entry_principal_is_created_by_the_stack_or_by_the_runbook(stack, request):
    """EKS CreateAccessEntry refuses a principal that does not exist ("InvalidParameterException:
    The specified principalArn is invalid: invalid principal"), which the offline plan cannot see.
    Each access entry of the plan must name a role the stack creates, a deploy role of step 1
    (``accounts.*.roleArn``), or a role from a stack-file key that first-deploy.md step 1 tells
    the operator to create first; and an admin entry nobody uses is not shipped."""
    plan = request.getfixturevalue(f"{stack}_plan")
    config = plan.config
    created = {r.outputs.get("arn") for r in plan.recording.by_type("aws:iam/role:Role")}
    deploy_roles = {config.accounts.automation.role_arn, config.accounts.workload.role_arn, config.accounts.logging.role_arn}
    section = _must_exist_section((ROOT / "docs" / "runbooks" / "first-deploy.md").read_text())
    from_keys = {
        "cluster.adminRoleArns": set(config.cluster.admin_role_arns),
        "cluster.deployRoleArn": {config.cluster.deploy_role_arn} - {None},
        "scheduling.teams[].roleArns": {arn for team in (config.scheduling.teams if config.scheduling else [])
                                        for arn in (team.role_arns or [])},
    }
    unaccounted = []
    for entry in plan.recording.by_type("aws:eks/accessEntry:AccessEntry"):
        arn = entry.inputs["principalArn"]
        if arn in created or arn in deploy_roles:
            continue
        keys = [key for key, arns in from_keys.items() if arn in arns]
        if not keys or not all(f"`{key}`" in section for key in keys):
            unaccounted.append((entry.name, arn, keys))
    assert not unaccounted, f"access entries whose role nobody is told to create: {unaccounted}"
    assert config.cluster.deploy_role_arn is None, "the shipped stack file gives an unused role cluster-admin"
