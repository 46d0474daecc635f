"""Child resource names are a contract: both stacks' URNs are pinned; a rename needs an alias."""
from __future__ import annotations

import pulumi

from infra.plan.mock_engine import run_recorded
from infra.plan.urns import diff, golden_file, stack_urns


def test_the_urns_of_each_stack_are_the_pinned_ones(plan):
    pinned = golden_file(plan.stack).read_text().split()
    change = diff(pinned, plan.recording)
    assert change.lost == [], (
        "these resources would be deleted by `pulumi up` (renamed without an alias): "
        f"{change.lost}; add `aliases=[pulumi.Alias(name=...)]` and a CHANGELOG entry")
    assert change.clean, (f"URNs changed: added {change.added}, renamed {change.renamed}; if intended, "
                          "run `python -m infra.plan.urns --write` and add a CHANGELOG entry")


def _program(child_name: str, aliases=()):
    def program():
        parent = pulumi.ComponentResource("mlplatform:test:Parent", "parent")
        pulumi.ComponentResource("mlplatform:test:Child", child_name, None,
                                 pulumi.ResourceOptions(parent=parent, aliases=list(aliases)))
    return program


def test_a_rename_without_an_alias_is_lost_and_with_one_is_carried():
    before = stack_urns(run_recorded(_program("parent-data"), project="p", stack="s"))
    renamed = run_recorded(_program("parent-datasets"), project="p", stack="s")
    assert diff(before, renamed).lost == [u for u in before if u.endswith("::parent-data")]
    aliased = run_recorded(_program("parent-datasets", [pulumi.Alias(name="parent-data")]), project="p", stack="s")
    change = diff(before, aliased)
    assert change.lost == [] and list(change.renamed.values()) == [u for u in stack_urns(aliased) if u.endswith("::parent-datasets")]
