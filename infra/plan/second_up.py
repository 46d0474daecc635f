"""What a second `pulumi up` of the same program and config would change.

The recording engine runs the program twice (two "epochs": invokes that return a fresh random
value on every real run, such as ``aws.secretsmanager.get_random_password``, differ between
them) and compares each custom resource's inputs the way the engine and the bridged providers
do on an update:

* ``ignore_changes``: the engine copies each listed path from the old inputs into the new ones
  before the diff (pkg/resource/deploy/step_generator.go ``processIgnoreChanges``, with
  ``PropertyPath.Reset`` of sdk/go/common/resource/properties_path.go); a path that names no input
  resets nothing, silently (``// Neither value contain this path, so we're done.``).
* write-only inputs (pulumi-aws 7 ``*_wo``, sent as ``*Wo``): "On subsequent previews or updates,
  Pulumi will not detect or show diffs on these fields since they are not tracked in state"
  (pulumi.com/docs/iac/concepts/secrets/write-only-fields); only their ``*WoVersion`` triggers an
  update.

A platform whose second `up` is not empty replaces or rewrites something on every deploy (a
password rotated by accident, a secret value reset).
"""
from __future__ import annotations

import base64
import copy
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from infra.recording import Recording

PathKey = Union[str, int]
_WRITE_ONLY = re.compile(r"Wo$")


@dataclass(frozen=True)
class SecondUp:
    # "<type> <name>: <input keys>": resources the second `up` would update
    changes: list[str]
    # "<type> <name>: <key>": write-only inputs whose value changed but is not sent (version unchanged)
    write_only_held: list[str]
    # "<type> <name>: ignore_changes <path>": paths that name no input (the engine ignores nothing)
    ignores_nothing: list[str]


def parse_path(text: str) -> Optional[list[PathKey]]:
    """sdk/go/common/resource/properties_path.go ParsePropertyPath: ``a.b[0]["c.d"]``, ``*``.
    None when it does not parse (the engine skips it: ``if err != nil { continue }``)."""
    keys: list[PathKey] = []
    for match in re.finditer(r'\["((?:[^"\\]|\\.)*)"\]|\[(\d+|\*)\]|([^.\[\]]+)|(\.)', text):
        quoted, index, plain, _dot = match.groups()
        if quoted is not None:
            keys.append(quoted.replace('\\"', '"'))
        elif index is not None:
            keys.append("*" if index == "*" else int(index))
        elif plain is not None:
            keys.append(plain)
    return keys or None


def _reset(path: list[PathKey], old: Any, new: Any) -> bool:
    """``PropertyPath.reset``: copy the value at ``path`` from ``old`` into ``new`` in place."""
    key, rest = path[0], path[1:]
    if isinstance(key, int):
        if not isinstance(old, list) or not isinstance(new, list):
            return not isinstance(old, list) and not isinstance(new, list)
        if key >= len(old) or key >= len(new):
            return False
        if not rest:
            new[key] = copy.deepcopy(old[key])
            return True
        return _reset(rest, old[key], new[key])
    if key == "*":
        if isinstance(old, dict) and isinstance(new, dict):
            if not rest:
                new.clear()
                new.update(copy.deepcopy(old))
                return True
            return all(k in new and _reset(rest, old[k], new[k]) for k in old)
        if isinstance(old, list) and isinstance(new, list):
            for i in range(min(len(old), len(new))):
                if rest and not _reset(rest, old[i], new[i]):
                    return False
                if not rest:
                    new[i] = copy.deepcopy(old[i])
            return len(old) == len(new)
        return False
    if not rest:
        if isinstance(old, dict) and key in old:
            if not isinstance(new, dict):
                return False
            new[key] = copy.deepcopy(old[key])
        elif isinstance(new, dict):
            new.pop(key, None)
        return True
    if not isinstance(old, dict) or not isinstance(new, dict):
        return not isinstance(old, dict) and not isinstance(new, dict)
    if key in old and key not in new:
        return False
    if key not in old and key not in new:
        return True
    return _reset(rest, old[key], new[key])


def _exists(path: list[PathKey], value: Any) -> bool:
    if not path:
        return True
    key, rest = path[0], path[1:]
    if key == "*":
        items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
        return any(_exists(rest, item) for item in items)
    if isinstance(key, int):
        return isinstance(value, list) and key < len(value) and _exists(rest, value[key])
    return isinstance(value, dict) and key in value and _exists(rest, value[key])


def apply_ignore_changes(new: dict[str, Any], old: dict[str, Any], ignore_changes: list[str]) -> dict[str, Any]:
    """step_generator.go processIgnoreChanges: the inputs the engine diffs on an update."""
    ignored = copy.deepcopy(new)
    for text in ignore_changes:
        path = parse_path(text)
        if path is not None:
            _reset(path, old, ignored)
    return ignored


SECRET_TYPE = "kubernetes:core/v1:Secret"


def checked_inputs(type_: str, inputs: dict[str, Any]) -> dict[str, Any]:
    """The inputs as the provider's Check returns them, which is what the engine stores and applies
    ``ignore_changes`` to: pulumi-kubernetes's Check normalizes a Secret (provider/pkg/provider/
    provider.go ``normalizeInputs`` -> pkg/clients/unstructured.go ``normalizeSecretStringData``:
    each ``stringData`` value base64-encoded into ``data``, "StringData overwrites Data", then
    ``stringData`` removed), so ``ignore_changes`` must name ``data`` there."""
    if type_ != SECRET_TYPE or not isinstance(inputs.get("stringData"), dict):
        return inputs
    checked = {k: v for k, v in inputs.items() if k != "stringData"}
    data = dict(checked.get("data") or {})
    for key, value in inputs["stringData"].items():
        data[key] = base64.b64encode(str(value).encode()).decode()
    checked["data"] = data
    return checked


def compare(first: Recording, second: Recording) -> SecondUp:
    """``second`` as an update of ``first`` (its state), per custom resource present in both."""
    olds = {r.urn: r for r in first.resources}
    changes, held, nothing = [], [], []
    for resource in second.resources:
        old = olds.get(resource.urn)
        label = f"{resource.type} {resource.name}"
        # The engine resets the ignored paths of the program's new inputs to the old *checked*
        # inputs (its state), then Checks the result (step_generator.go: processIgnoreChanges
        # before the provider's Check), and diffs checked against checked.
        inputs = resource.revealed_inputs
        old_inputs = checked_inputs(old.type, old.revealed_inputs) if old is not None else None
        for text in resource.ignore_changes:
            path = parse_path(text)
            if path is None or not (_exists(path, inputs) or _exists(path, checked_inputs(resource.type, inputs))
                                    or (old_inputs is not None and _exists(path, old_inputs))):
                nothing.append(f"{label}: ignore_changes {text!r} names no input (inputs: "
                               f"{', '.join(sorted(inputs)) or 'none'}); the engine ignores nothing")
        if old is None or not resource.custom or resource.is_provider:
            continue
        new_inputs = checked_inputs(resource.type, apply_ignore_changes(inputs, old_inputs, resource.ignore_changes))
        keys = sorted(k for k in set(new_inputs) | set(old_inputs)
                      if new_inputs.get(k) != old_inputs.get(k))
        for key in [k for k in keys if _WRITE_ONLY.search(k)]:
            keys.remove(key)
            if new_inputs.get(f"{key}Version") == old_inputs.get(f"{key}Version"):
                held.append(f"{label}: {key} (write-only; {key}Version unchanged, so not sent)")
        if keys:
            changes.append(f"{label}: {', '.join(keys)}")
    # Sorted: the SDK registers resources from a thread pool, in no fixed order.
    return SecondUp(sorted(changes), sorted(held), sorted(nothing))


def second_up(run: Callable[[int], Recording]) -> SecondUp:
    """``run(epoch)`` records the program once; the second `up` is run 2 over run 1."""
    return compare(run(1), run(2))
