"""Capabilities hand each other typed objects; the team-namespace rule is spelt once; the foundation's
log key learns every log group from the capabilities, without importing them."""
from __future__ import annotations

from infra.config import load_platform_config
from tests.conftest import problems_of, stack_config
from tests.infra.test_layout import graph, import_closure


def test_the_foundation_imports_no_capability_deployed_after_it():
    """The log key is made first and must name every log group made later: the names come in
    through ``Capability.log_group_names``, so the foundation depends on no later capability."""
    edges = graph()
    later = {m for m in edges["infra.capabilities"] if m not in ("infra.foundation", "infra.capability")
             and not m.startswith("infra.config")}
    assert {"infra.datasets", "infra.tracking", "infra.operations", "infra.monitoring", "infra.ci"} <= later
    assert import_closure(edges, "infra.foundation") & later == set()


def test_the_log_key_names_each_capabilitys_log_groups_in_the_recorded_plan(plan):
    import json

    from infra.capabilities import CAPABILITIES

    key = plan.recording.one("aws:kms/key:Key", f"{plan.config.name}-logs-key")
    admitted = [arn.split(":log-group:")[1] for statement in json.loads(key.inputs["policy"])["Statement"]
                for arn in statement.get("Condition", {}).get("ArnLike", {}).get("kms:EncryptionContext:aws:logs:arn", [])]
    declared = {c.name: list(c.log_group_names(plan.config)) for c in CAPABILITIES}
    assert admitted == [name for names in declared.values() for name in names]
    assert declared["foundation"] and declared["tracking"]
    # FSx writes its own log group; dev's Mountpoint + EFS storage writes none.
    assert bool(declared["datasets"]) == (plan.config.datasets.storage.value == "fsx")


def test_one_team_namespace_rule_for_config_job_specs_and_the_plan(dev_plan):
    from workloads.jobspec import JobSpec
    from workloads.scheduling import team_namespace

    config = dev_plan.config
    team = config.scheduling.teams[0]
    assert team.namespace == team_namespace(team.name) == f"team-{team.name}"
    spec = JobSpec.model_construct(team=team.name)  # the namespace is derived from the team alone
    assert spec.namespace == team.namespace
    created = sorted(r.inputs["metadata"]["name"] for r in dev_plan.recording.by_type("kubernetes:core/v1:Namespace")
                     if r.inputs["metadata"]["name"].startswith("team-"))
    assert created == sorted(config.team_namespaces)


def test_fsx_namespaces_is_gone_and_a_stack_file_still_setting_it_is_told_so():
    """It was read only when scheduling.teams was empty; both stacks set it and nothing read it."""
    raw = stack_config("prod")  # dev's datasets have no fsx section (storage s3-mountpoint)
    load_platform_config(raw)  # the stack files no longer carry it
    raw["datasets"]["fsx"]["namespaces"] = ["team-research"]
    (problem,) = problems_of(raw)["datasets.fsx.namespaces"]
    assert problem.message == "unknown key"
