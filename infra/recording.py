"""The recorded resource graph: what a Pulumi program registered, and a small graph API over it.

The program's capabilities read it to write their plan sections and cost lines; the engine that
fills it (``infra.plan.mock_engine``) lives in the offline wing, so nothing `pulumi up` runs
imports the engine.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

# What the plan shows in place of a secret output.
SECRET_PLACEHOLDER = "[secret]"


@dataclass
class RecordedResource:
    """One registered resource, as the engine would have seen it."""

    urn: str
    type: str
    name: str
    custom: bool
    remote: bool
    parent: Optional[str]
    provider: Optional[str]  # URN of the explicit provider (custom resources)
    providers: dict[str, str]  # package -> provider URN (components)
    protect: bool
    retain_on_delete: bool
    dependencies: list[str]
    inputs: dict[str, Any]
    outputs: dict[str, Any] = field(default_factory=dict)
    id: Optional[str] = None
    # input key -> URNs of the resources whose outputs that input was built from
    property_dependencies: dict[str, list[str]] = field(default_factory=dict)
    # URNs this resource declared in `aliases` (renames keep their identity).
    alias_urns: list[str] = field(default_factory=list)
    # The `aliases` as the SDK sent them (alias specs, or whole URNs): the engine resolves them
    # against the old state, parents' aliases included (infra.plan.urns).
    alias_specs: list[dict[str, Any]] = field(default_factory=list)
    # `ignore_changes` as the SDK sent it (property paths of the engine's input names).
    ignore_changes: list[str] = field(default_factory=list)
    # The inputs with secret values in the clear (the mock's fabricated ones, or the stack file's
    # "[secret]" placeholders): only the second-`up` comparison reads them; never in the plan JSON.
    revealed_inputs: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def package(self) -> str:
        return self.type.split(":", 1)[0]

    @property
    def is_provider(self) -> bool:
        return self.type.startswith("pulumi:providers:")

    def provider_for(self, package: str) -> Optional[str]:
        return self.provider or self.providers.get(package)


@dataclass(frozen=True)
class ResourceReference:
    urn: str
    id: str


@dataclass
class Recording:
    """Every registered resource, with a small graph API over ids, ARNs and dependencies."""

    resources: list[RecordedResource]
    stack_outputs: dict[str, Any]
    # URN of a resource only the mock knows (a remote component's child) -> recorded stand-in
    aliases: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._urns: dict[str, RecordedResource] = {r.urn: r for r in self.resources}
        for alias, urn in self.aliases.items():
            if urn in self._urns:
                self._urns.setdefault(alias, self._urns[urn])
        self._keys: dict[str, list[RecordedResource]] = {}
        for resource in self.resources:
            for key in _reference_keys(resource):
                owners = self._keys.setdefault(key, [])
                if resource not in owners:
                    owners.append(resource)

    def by_type(self, resource_type: str) -> list[RecordedResource]:
        return [r for r in self.resources if r.type == resource_type]

    # -- graph --------------------------------------------------------------------------
    def resolve(self, value: str, resource_type: Optional[str] = None) -> RecordedResource:
        """The resource an id, ARN or URN names (``securityGroupId``, ``targetBucket``, a role ARN).

        Raises ``LookupError`` when no resource, or more than one, has that id or ARN.
        """
        found = self.resolve_all(value, resource_type)
        if len(found) != 1:
            names = [f"{r.type} {r.name}" for r in found]
            raise LookupError(f"{value!r} names {len(found)} recorded resources{' of type ' + resource_type if resource_type else ''}: {names}")
        return found[0]

    def resolve_all(self, value: str, resource_type: Optional[str] = None) -> list[RecordedResource]:
        found = [self._urns[value]] if value in self._urns else list(self._keys.get(value, []))
        return [r for r in found if resource_type is None or r.type == resource_type]

    def try_resolve(self, value: Any, resource_type: Optional[str] = None) -> Optional[RecordedResource]:
        found = self.resolve_all(value, resource_type) if isinstance(value, str) else []
        return found[0] if len(found) == 1 else None

    def dependencies_of(self, resource: RecordedResource, *, transitive: bool = False) -> list[RecordedResource]:
        """Resources ``resource`` was registered with as dependencies (explicit ``depends_on``
        and every resource whose output fed one of its inputs); with ``transitive``, theirs too."""
        seen: dict[str, RecordedResource] = {}
        pending = list(resource.dependencies)
        while pending:
            dependency = self._urns.get(pending.pop())
            if dependency is None or dependency.urn in seen or dependency is resource:
                continue
            seen[dependency.urn] = dependency
            if transitive:
                pending.extend(dependency.dependencies)
        return list(seen.values())

    def depends_on(self, resource: RecordedResource, other: RecordedResource, *, transitive: bool = True) -> bool:
        """Whether the engine creates ``other`` before ``resource`` (directly, or through a chain)."""
        return other in self.dependencies_of(resource, transitive=transitive)

    def dependents_of(self, resource: RecordedResource) -> list[RecordedResource]:
        return [r for r in self.resources if resource in self.dependencies_of(r)]

    def property_dependencies_of(self, resource: RecordedResource, input_key: str) -> list[RecordedResource]:
        """Resources whose outputs the input ``input_key`` was built from."""
        return [self._urns[u] for u in resource.property_dependencies.get(input_key, []) if u in self._urns]

    def references(self, resource: RecordedResource) -> list[RecordedResource]:
        """Resources whose id or ARN appears anywhere in ``resource``'s inputs."""
        found: dict[str, RecordedResource] = {}
        for text in _strings(resource.inputs):
            for candidate in (text, *_embedded_arns(text)):
                target = self.try_resolve(candidate)
                if target is not None and target is not resource:
                    found[target.urn] = target
        return list(found.values())

    def one(self, resource_type: str, name: Optional[str] = None) -> RecordedResource:
        found = [r for r in self.by_type(resource_type) if name is None or r.name == name]
        if len(found) != 1:
            names = [r.name for r in self.by_type(resource_type)]
            raise LookupError(f"expected one {resource_type}{' named ' + name if name else ''}, found {names}")
        return found[0]

    def by_urn(self, urn: Optional[str]) -> Optional[RecordedResource]:
        return self._urns.get(urn) if urn else None


def _reference_keys(resource: RecordedResource) -> list[str]:
    """The values other resources use to point at this one: its id, its ARN, and the ids
    and ARNs the mock generated for it (e.g. a remote EKS cluster's ``clusterSecurityGroupId``)."""
    if resource.is_provider:
        return []
    keys = [resource.id] if resource.id else []
    for key, value in resource.outputs.items():
        generated = key not in resource.inputs or key in ("arn", "id")
        if generated and isinstance(value, str) and value and (key == "arn" or key.endswith(("Id", "Arn"))):
            keys.append(value)
        if isinstance(value, ResourceReference):
            keys.append(value.id)
    return keys


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def _embedded_arns(text: str) -> list[str]:
    """ARNs inside a JSON policy document or a wildcard resource (``arn:...:bucket/*``)."""
    if "arn:" not in text:
        return []
    found = []
    for token in re.findall(r"arn:[a-z-]+:[^\s\"',\]]+", text):
        found.append(token)
        for suffix in ("/*", "*", "/"):
            if token.endswith(suffix):
                found.append(token[: -len(suffix)])
    return found
