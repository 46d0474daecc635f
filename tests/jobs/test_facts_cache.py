"""Platform facts cached per stack revision (jobs/facts.py ``plan_facts``).

Every CLI command needs the stack's facts and planning takes 10-25 s. Measured on the dev stack
(2 shared, loaded cores): ``python -m workloads facts --stack dev --offline`` 11.4 s with an empty
cache, 1.5 s on the second run with the same output byte for byte (not a timed test: the figure
is for the docs)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from jobs.facts import ROOT, plan_facts, stack_revision


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project directory with the dev stack's config and one source file of the program."""
    root = tmp_path / "project"
    (root / "infra").mkdir(parents=True)
    for name in ("Pulumi.yaml", "Pulumi.dev.yaml"):
        shutil.copy(ROOT / name, root / name)
    (root / "infra" / "program.py").write_text("POOLS = 1\n")
    return root


class Planner:
    def __init__(self, facts):
        self.facts, self.calls = facts, 0

    def __call__(self, stack, root):
        self.calls += 1
        return self.facts


def as_json(facts) -> dict:
    return json.loads(json.dumps(facts.to_dict()))


def refuse(stack, root):
    raise AssertionError("the planner ran although the stack's revision did not change")


def test_the_second_command_reads_the_cache_without_planning(project, tmp_path, dev_facts):
    cache = tmp_path / "cache"
    planner = Planner(dev_facts)
    first = plan_facts("dev", root=project, cache=cache, planner=planner)
    second = plan_facts("dev", root=project, cache=cache, planner=refuse)
    assert planner.calls == 1
    assert as_json(second) == as_json(first) == as_json(dev_facts)
    [name] = [p.name for p in cache.iterdir()]
    assert name.startswith("dev-") and name.endswith(f"-{stack_revision('dev', project)[:32]}.json")


@pytest.mark.parametrize("edit", ["Pulumi.dev.yaml", "Pulumi.yaml", "infra/program.py"])
def test_a_changed_config_or_program_plans_again(project, tmp_path, dev_facts, edit):
    cache = tmp_path / "cache"
    plan_facts("dev", root=project, cache=cache, planner=Planner(dev_facts))
    with (project / edit).open("a") as out:
        out.write("\n# edited\n")
    planner = Planner(dev_facts)
    plan_facts("dev", root=project, cache=cache, planner=planner)
    assert planner.calls == 1
    assert len(list(cache.iterdir())) == 1  # the old revision's file is gone


def test_a_corrupt_cache_file_is_planned_again(project, tmp_path, dev_facts):
    cache = tmp_path / "cache"
    plan_facts("dev", root=project, cache=cache, planner=Planner(dev_facts))
    next(cache.iterdir()).write_text("{not json")
    planner = Planner(dev_facts)
    assert as_json(plan_facts("dev", root=project, cache=cache, planner=planner)) == as_json(dev_facts)
    assert planner.calls == 1
