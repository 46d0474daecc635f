"""What a provider's ``Check`` refuses in a resource's inputs: names the pinned SDK's input type
does not declare, and required inputs left out. One home for the offline plan
(``infra.plan.mock_engine``) and the stand-in provider plugins (``tools/engine/standins``).

The rules are read from the installed, pinned Python SDKs (pulumi-aws 7.51.1, pulumi-eks 4.4.0;
``catalog/versions.py``), never from a list of our own: a resource token names a class through the
SDK's own registration table (``_utilities.register``: ``aws:eks/cluster:Cluster`` ->
``pulumi_aws.eks.Cluster``), its inputs are the properties of ``<Class>Args`` (each
``@pulumi.getter(name=...)`` is the wire name), a property is required when its getter's type does
not admit ``None`` (the SDK's own rule, ``pulumi._types._required_property_names``), and a property
typed as another ``@pulumi.input_type`` (``ClusterVpcConfigArgs``), a list or a map of one, is
checked inside, to any depth.

What the real providers do with the same inputs: the Terraform bridge behind pulumi-aws turns a key
the resource's schema lacks into "Invalid or unknown key" and a required attribute left out into
"Missing required property" (pulumi-terraform-bridge pkg/tfbridge/provider.go ``Check`` ->
``ValidateResource``); pulumi-eks's component would pass an unknown key through and ignore it. The
Python SDK already refuses an unknown keyword argument on a resource's constructor, so what reaches
here is what the constructor cannot see: nested dictionaries, transforms, and children a component
registers.

Not checked: value types (a number where a string goes), enum values, conflicts between inputs,
and anything a service validates on its side.
"""
from __future__ import annotations

import collections.abc
import difflib
import functools
import importlib
import json
import typing
from dataclasses import dataclass
from typing import Any, Mapping, Optional

# The packages whose input types are checked, and their Python SDK modules.
SDK_MODULES: dict[str, str] = {"aws": "pulumi_aws", "eks": "pulumi_eks"}

# Keys the engine or the bridge add to a resource's or provider's inputs (pulumi/pulumi
# pkg/resource/deploy/providers/reference.go and registry.go: "version", "pluginDownloadURL",
# "pluginChecksums"; pulumi-terraform-bridge unstable/reservedkeys: "__defaults", "__meta").
RESERVED_KEYS = frozenset({"__defaults", "__meta", "__internal"})
PROVIDER_RESERVED_KEYS = frozenset({"version", "pluginDownloadURL", "pluginChecksums"})


@dataclass(frozen=True)
class InputProblem:
    """One input a provider's Check refuses: ``path`` in wire names (``vpcConfig.subnetIds``)."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"`{self.path}`: {self.reason}"


@dataclass(frozen=True)
class _Shape:
    """What a property's type asks of its value: an input type (``cls``), a list or map of a shape
    (``items``), or anything (no further check)."""

    kind: str  # "object", "list", "map", "any"
    cls: Optional[type] = None
    items: Optional["_Shape"] = None


_ANY = _Shape("any")


@functools.lru_cache(maxsize=None)
def args_class(token: str) -> Optional[type]:
    """The SDK's ``<Class>Args`` for a resource or provider token, or None for a package or
    type the pinned SDKs do not have (the caller decides whether that is an error)."""
    from pulumi.runtime import rpc

    if token.startswith("pulumi:providers:"):
        package = token.split(":", 2)[2]
        if package not in SDK_MODULES:
            return None
        module = importlib.import_module(SDK_MODULES[package])
        return getattr(module, "ProviderArgs", None)
    parts = token.split(":")
    if len(parts) != 3 or parts[0] not in SDK_MODULES:
        return None
    package, module_name, _ = parts
    importlib.import_module(SDK_MODULES[package])  # registers the package's resource modules
    registered = rpc.get_resource_module(package, module_name, "")
    if registered is None:
        return None
    info = getattr(registered, "mod_info", {})
    class_name = info.get("classes", {}).get(token)
    if class_name is None:
        return None
    resource_class = getattr(importlib.import_module(info["fqn"]), class_name, None)
    if resource_class is None:
        return None
    return _defined_args(resource_class)


def _defined_args(resource_class: type) -> Optional[type]:
    """The input type the resource's own module defines: ``<Class>Args``, or ``<Class>InitArgs``
    where the codegen renamed it because a nested type took the name (pulumi_aws.s3's
    ``BucketVersioningArgs`` is the legacy Bucket's `versioning` block)."""
    from pulumi import _types

    module = importlib.import_module(resource_class.__module__)
    found = [value for name, value in vars(module).items()
             if isinstance(value, type) and value.__module__ == module.__name__ and not name.startswith("_")
             and _types.is_input_type(value)]
    return found[0] if len(found) == 1 else None


def _shape(hint: Any) -> _Shape:
    """Reduce a getter's type (``Optional[Input[Sequence[Input[XArgs]]]]`` and the like) to the
    shape its value must have."""
    from pulumi import _types

    candidates = []
    for arg in (typing.get_args(hint) if _types._is_union_type(hint) else (hint,)):
        origin = typing.get_origin(arg)
        if arg is type(None) or origin in (collections.abc.Awaitable, typing.Awaitable):
            continue
        if origin is not None and getattr(origin, "__name__", "") == "Output":
            continue
        candidates.append(arg)
    if len(candidates) != 1:
        return _ANY
    (arg,) = candidates
    origin = typing.get_origin(arg)
    if isinstance(arg, type) and _types.is_input_type(arg):
        return _Shape("object", cls=arg)
    if origin in (collections.abc.Sequence, list, typing.List, collections.abc.MutableSequence):
        (item,) = typing.get_args(arg) or (Any,)
        return _Shape("list", items=_shape(item))
    if origin in (collections.abc.Mapping, dict, typing.Dict, collections.abc.MutableMapping):
        args = typing.get_args(arg)
        return _Shape("map", items=_shape(args[1]) if len(args) == 2 else _ANY)
    return _ANY


@functools.lru_cache(maxsize=None)
def _properties(cls: type) -> tuple[dict[str, _Shape], frozenset[str]]:
    """An input type's wire names with their shapes, and the required ones."""
    from pulumi import _types

    hints = _types._raw_return_hints(cls)
    shapes = {name: _shape(hint) for name, hint in hints.items()}
    return shapes, frozenset(_types._required_property_names(cls))


def input_names(token: str) -> Optional[frozenset[str]]:
    """The wire names of a type's inputs, or None for a type the SDKs do not know."""
    cls = args_class(token)
    return None if cls is None else frozenset(_properties(cls)[0])


def required_inputs(token: str) -> frozenset[str]:
    cls = args_class(token)
    return frozenset() if cls is None else _properties(cls)[1]


def write_only_inputs(token: str) -> frozenset[str]:
    """Write-only inputs (``secretStringWo``): the provider never stores them and never diffs
    them; their ``...Version`` input decides when the value is sent again (Terraform "Write-only
    arguments"; pulumi-aws names them with a ``Wo`` suffix and a ``WoVersion`` companion)."""
    names = input_names(token) or frozenset()
    return frozenset(name for name in names if name.endswith("Wo") and f"{name}Version" in names)


def _is_unknown(value: Any, unknown: Any) -> bool:
    return unknown is not None and value is unknown


def check_inputs(token: str, inputs: Mapping[str, Any], *, unknown: Any = None) -> list[InputProblem]:
    """Every input of ``token`` the pinned SDK's input type refuses: unknown names (with the
    closest declared name) and missing required ones, nested types included.

    ``inputs`` are wire values (camelCase keys); ``unknown`` is the caller's marker for a value
    not known yet (a preview), which counts as present and is not looked into. A provider's
    inputs may carry nested values JSON-encoded (the SDK sends provider inputs that way).
    Types the pinned SDKs do not declare give no problems here.
    """
    cls = args_class(token)
    if cls is None:
        return []
    reserved = RESERVED_KEYS | (PROVIDER_RESERVED_KEYS if token.startswith("pulumi:providers:") else frozenset())
    problems: list[InputProblem] = []
    _check_object(cls, inputs, "", problems, reserved, unknown, json_strings=token.startswith("pulumi:providers:"))
    return problems


def _decode_json(value: Any, json_strings: bool) -> Any:
    if json_strings and isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _check_object(cls: type, value: Mapping[str, Any], path: str, problems: list[InputProblem],
                  reserved: frozenset[str], unknown: Any, json_strings: bool = False) -> None:
    shapes, required = _properties(cls)
    for key, item in value.items():
        if key in reserved:
            continue
        here = f"{path}.{key}" if path else key
        shape = shapes.get(key)
        if shape is None:
            close = difflib.get_close_matches(key, sorted(shapes), n=1, cutoff=0.6)
            hint = f"; did you mean `{close[0]}`?" if close else ""
            problems.append(InputProblem(
                here, f"not an input of {cls.__name__} ({cls.__module__.split('.')[0]}){hint} "
                      f"Declared: {', '.join(sorted(shapes)) or 'none'}"))
            continue
        _check_value(shape, _decode_json(item, json_strings), here, problems, unknown)
    for key in sorted(required):
        item = value.get(key)
        if item is None and not _is_unknown(item, unknown):
            here = f"{path}.{key}" if path else key
            problems.append(InputProblem(here, f"required by {cls.__name__} and missing"))


def _check_value(shape: _Shape, value: Any, path: str, problems: list[InputProblem], unknown: Any) -> None:
    if value is None or _is_unknown(value, unknown) or shape.kind == "any":
        return
    if shape.kind == "object" and isinstance(value, Mapping):
        _check_object(shape.cls, value, path, problems, RESERVED_KEYS, unknown)
    elif shape.kind == "list" and isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_value(shape.items, item, f"{path}[{index}]", problems, unknown)
    elif shape.kind == "map" and isinstance(value, Mapping):
        for key, item in value.items():
            _check_value(shape.items, item, f"{path}.{key}", problems, unknown)
