"""The rules as pulumi-policy policies (what `pulumi preview --policy-pack policypack` loads)."""
from __future__ import annotations

from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    ResourceValidationPolicy,
    StackValidationPolicy,
)

from policypack.rules import RULES, Resource, Rule


def _resource(args: Any) -> Resource:
    dependencies = tuple(getattr(d, "urn", d) for d in getattr(args, "dependencies", None) or ())
    return Resource(type=args.resource_type, props=args.props, urn=args.urn, name=args.name,
                    dependencies=dependencies)


def _policy(rule: Rule):
    level = EnforcementLevel(rule.enforcement)
    description = f"{rule.description} ({rule.references})"
    if rule.check_resource is not None:
        check = rule.check_resource

        def validate(args, report_violation):
            for message in check(_resource(args)):
                report_violation(message, None)

        return ResourceValidationPolicy(name=rule.name, description=description, validate=validate,
                                        enforcement_level=level)

    check_stack = rule.check_stack

    def validate_stack(args, report_violation):
        for message, urn in check_stack([_resource(r) for r in args.resources]):
            report_violation(message, urn)

    return StackValidationPolicy(name=rule.name, description=description, validate=validate_stack,
                                 enforcement_level=level)


def policies() -> list:
    return [_policy(rule) for rule in RULES]
