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
