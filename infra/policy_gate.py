"""The policy pack's rules over the offline plan's recorded graph.

`python -m infra.plan` lists every violation; a mandatory one is an ERROR, and the plan exits 1,
the same verdict `pulumi preview --policy-pack policypack` gives on a real preview.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional

from infra.capability import Capability
from infra.config import PlatformConfig
from infra.recording import Recording
from policypack.rules import MANDATORY, RULES, Resource


@dataclass(frozen=True)
class Violation:
    policy: str
    enforcement: str
    references: str
    message: str
    urn: Optional[str]


def graph_resources(recording: Recording) -> list[Resource]:
    return [Resource(type=r.type, props=r.inputs, urn=r.urn, name=r.name, dependencies=tuple(r.dependencies))
            for r in recording.resources if not r.is_provider]


def evaluate(resources: list[Resource]) -> list[Violation]:
    found = []
    for rule in RULES:
        if rule.check_resource is not None:
            for resource in resources:
                found += [Violation(rule.name, rule.enforcement, rule.references, message, resource.urn)
                          for message in rule.check_resource(resource)]
        if rule.check_stack is not None:
            found += [Violation(rule.name, rule.enforcement, rule.references, message, urn)
                      for message, urn in rule.check_stack(resources)]
    return found


def warnings(config: PlatformConfig, recording: Recording) -> Iterator[str]:
    for violation in evaluate(graph_resources(recording)):
        prefix = "ERROR" if violation.enforcement == MANDATORY else "advisory"
        yield f"{prefix} policy {violation.policy} ({violation.references}): {violation.message}"


def plan_sections(config: PlatformConfig, recording: Recording) -> Iterator[tuple[str, list[str]]]:
    violations = evaluate(graph_resources(recording))
    mandatory = sum(v.enforcement == MANDATORY for v in violations)
    lines = [f"{len(RULES)} rules of policypack/ evaluated: {mandatory} mandatory and "
             f"{len(violations) - mandatory} advisory violations"]
    lines += [f"{rule.name:32} {rule.enforcement:9} {rule.references}" for rule in RULES]
    yield "Policies", lines


# Deploys nothing: the same rules run in `pulumi preview --policy-pack policypack`.
CAPABILITY = Capability("policies", plan_sections=plan_sections, warnings=warnings)
