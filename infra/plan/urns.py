"""The URNs of every stack's resources, pinned: child names are a contract with deployed stacks.

A resource whose URN changes is, to Pulumi, a new resource: `pulumi up` deletes the old one and
creates another (data included, for a bucket or a database). A rename must carry an `aliases`
entry naming the old URN, and a CHANGELOG entry. `tests/infra/test_urns.py` compares each
stack's URNs with the pinned list in `tests/infra/golden/urns-<stack>.txt`:

    python -m infra.plan.urns --write     # after an intended change: additions, or renames with aliases
    python -m infra.plan.urns --write --accept-removals   # resources deliberately removed
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from infra.recording import RecordedResource, Recording

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "tests" / "infra" / "golden"


def golden_file(stack: str) -> Path:
    return GOLDEN_DIR / f"urns-{stack}.txt"


def stack_urns(recording: Recording) -> list[str]:
    return sorted(r.urn for r in recording.resources)


@dataclass(frozen=True)
class UrnDiff:
    added: list[str]
    renamed: dict[str, str]  # old URN -> new URN that aliases it
    lost: list[str]  # pinned URNs nothing carries: pulumi up would delete these resources
    # What the engine refuses: two resources claiming one old URN (diag 2008, 2016).
    conflicts: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.added or self.renamed or self.lost or self.conflicts)


def _urn_type(urn: str) -> str:
    return urn.split("::")[2]


def _urn_name(urn: str) -> str:
    return urn.split("::", 3)[3]


def create_urn(name: str, type_: str, parent: str, project: str, stack: str) -> str:
    """sdk/go/common/resource/alias.go CreateURN: a parent's URN up to its name, then ``$``."""
    if not parent:
        return f"urn:pulumi:{stack}::{project}::{type_}::{name}"
    return f"{parent[:parent.rindex('::')]}${type_}::{name}"


def new_urn(stack: str, project: str, parent_type: str, type_: str, name: str) -> str:
    """sdk/go/common/resource/urn/urn.go New: the root stack type is not a parent type."""
    if parent_type and parent_type != ROOT_STACK_TYPE:
        type_ = f"{parent_type}${type_}"
    return f"urn:pulumi:{stack}::{project}::{type_}::{name}"


ROOT_STACK_TYPE = "pulumi:pulumi:Stack"


class _AliasResolver:
    """pkg/resource/deploy/step_generator.go: ``generateAliases``, ``collapseAliasToUrn``,
    ``inheritedChildAlias`` and ``getOldResource``, over resources in registration order (a
    parent registers before its children, so its matched alias is known when they come)."""

    def __init__(self, olds: set[str], stack: str, project: str):
        self.olds = olds
        self.stack, self.project = stack, project
        self.aliases: dict[str, str] = {}  # sg.aliases: URN -> the old URN it was found under
        self.aliased: dict[str, str] = {}  # sg.aliased: old URN -> the URN that claimed it
        self.urns: set[str] = set()  # sg.urns
        self.conflicts: list[str] = []

    def collapse(self, name: str, type_: str, parent: str, alias: dict) -> str:
        if alias.get("urn"):
            return alias["urn"]
        parent_urn = alias.get("parent") or ""
        if not parent_urn:
            parent_urn = parent
        else:
            # "If the parent used an alias then use it's old URN here"
            parent_urn = self.aliases.get(parent_urn, parent_urn)
        if alias.get("noParent") or (parent_urn and _urn_type(parent_urn) == ROOT_STACK_TYPE):
            parent_urn = ""
        return create_urn(alias.get("name") or name, alias.get("type") or type_, parent_urn,
                          alias.get("project") or self.project, alias.get("stack") or self.stack)

    def inherited_child_alias(self, child_type: str, child_name: str, parent_name: str, parent_alias: str) -> str:
        alias_name = child_name
        if child_name.startswith(parent_name):
            alias_name = _urn_name(parent_alias) + child_name[len(parent_name):]
        return new_urn(self.stack, self.project, _urn_type(parent_alias), child_type, alias_name)

    def generate(self, name: str, type_: str, parent: str, specs: list[dict]) -> list[str]:
        result: list[str] = []

        def add(urn: str) -> None:
            if urn not in result:
                result.append(urn)

        for spec in specs:
            add(self.collapse(name, type_, parent, spec))
        if parent and parent in self.aliases:
            parent_alias = self.aliases[parent]
            add(self.inherited_child_alias(type_, name, _urn_name(parent), parent_alias))
            for spec in specs:
                child = self.collapse(name, type_, parent, spec)
                add(self.inherited_child_alias(_urn_type(child).split("$")[-1], _urn_name(child), _urn_name(parent),
                                               parent_alias))
        return result

    def old_of(self, resource: RecordedResource) -> Optional[str]:
        """The old URN the engine matches ``resource`` to, or None (a create)."""
        urn = resource.urn
        aliases = self.generate(resource.name, resource.type, resource.parent or "", resource.alias_specs)
        if urn in self.aliased:
            self.conflicts.append(f"Duplicate resource URN '{urn}' conflicting with alias on resource with URN "
                                  f"'{self.aliased[urn]}'")
        found = None
        for candidate in [urn, *aliases]:
            if candidate not in self.olds:
                continue
            if candidate != urn:
                if candidate in self.urns:
                    self.conflicts.append(f"Duplicate resource alias '{candidate}' applied to resource with URN "
                                          f"'{urn}' conflicting with resource with URN '{urn}'")
                if candidate in self.aliased:
                    self.conflicts.append(f"Duplicate resource alias '{candidate}' applied to resource with URN "
                                          f"'{urn}' conflicting with resource with URN '{self.aliased[candidate]}'")
                self.aliased[candidate] = urn
                self.aliases[urn] = candidate
            found = candidate
            break
        self.urns.add(urn)
        return found


def diff(pinned: list[str], recording: Recording) -> UrnDiff:
    """The pinned URNs (the deployed stack) against this run, matched as the engine matches
    old resources to new ones: by URN first, then by each alias, parents' aliases included."""
    current = stack_urns(recording)
    if not recording.resources:
        return UrnDiff(added=[], renamed={}, lost=sorted(pinned))
    stack, project = recording.resources[0].urn.split("::")[0].split(":")[-1], recording.resources[0].urn.split("::")[1]
    resolver = _AliasResolver(set(pinned), stack, project)
    matched: dict[str, str] = {}  # old URN -> new URN
    for resource in recording.resources:
        old = resolver.old_of(resource)
        if old is not None:
            matched[old] = resource.urn
    return UrnDiff(
        added=sorted(set(current) - set(pinned) - set(matched.values())),
        renamed={old: new for old, new in matched.items() if old != new},
        lost=[urn for urn in pinned if urn not in matched],
        conflicts=resolver.conflicts,
    )


def main(argv: Optional[list[str]] = None) -> int:
    from infra.plan import available_stacks, build_plan, default_project_dir

    parser = argparse.ArgumentParser(prog="python -m infra.plan.urns", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="pin the current URNs of every stack")
    parser.add_argument("--accept-removals", action="store_true",
                        help="with --write: the LOST resources are meant to be deleted (say so in the CHANGELOG)")
    args = parser.parse_args(argv)
    status = 0
    for stack in available_stacks(default_project_dir()):
        recording = build_plan(stack, default_project_dir()).recording
        path = golden_file(stack)
        pinned = path.read_text().split() if path.exists() else []
        change = diff(pinned, recording)
        for conflict in change.conflicts:
            print(f"{stack}: {conflict}", file=sys.stderr)
            status = 1
        for urn in change.lost:
            print(f"{stack}: LOST {urn}: pulumi up would delete it; add `aliases` to the renamed resource", file=sys.stderr)
            status = 1
        for old, new in change.renamed.items():
            print(f"{stack}: renamed {old} -> {new} (aliased)")
        print(f"{stack}: {len(change.added)} added, {len(change.renamed)} renamed, {len(change.lost)} lost")
        if args.write and (args.accept_removals or not change.lost):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join(stack_urns(recording)) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
