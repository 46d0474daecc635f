"""Argo Workflows' resource-template conditions, evaluated the way its executor does (test-only).

argo-workflows v4.1.2 workflow/executor/resource.go:

    successSelector, err := labels.Parse(we.Template.Resource.SuccessCondition)
    ...
    func matchConditions(jsonBytes []byte, successReqs labels.Requirements, failReqs labels.Requirements) (bool, error) {
        ls := gjsonLabels{json: jsonBytes}
        for _, req := range failReqs {
            failed := req.Matches(ls)
            ...
            if failed {
                // We return false here to not retry when failure conditions met.
                return false, errors.Errorf(errors.CodeBadRequest, msg)
        ...
        if numMatched >= len(successReqs) {
            return false, nil
        }
        return true, errors.Errorf(errors.CodeNotFound, "Neither success condition nor the failure condition has been matched. Retrying...")

    func (g gjsonLabels) Has(label string) bool { return gjson.GetBytes(g.json, label).Exists() }
    func (g gjsonLabels) Get(label string) string { return gjson.GetBytes(g.json, label).String() }

The parser is k8s.io/apimachinery/pkg/labels (selector.go): tokens split on whitespace and
``! = ( ) , < >``; operators ``=``, ``==``, ``!=``, ``in``, ``notin``, ``>``, ``<``, bare key
(exists), ``!key``; ``NewRequirement`` validates the key with ``validation.IsQualifiedName``,
the values with ``IsValidLabelValue``, and needs an integer for ``>``/``<``. ``Requirement.Matches``:

    case selection.In, selection.Equals, selection.DoubleEquals:
        if !ls.Has(r.key) { return false }
        return r.hasValue(ls.Get(r.key))
    case selection.NotIn, selection.NotEquals:
        if !ls.Has(r.key) { return true }
        return !r.hasValue(ls.Get(r.key))
    case selection.Exists: return ls.Has(r.key)
    case selection.DoesNotExist: return !ls.Has(r.key)
    case selection.GreaterThan, selection.LessThan:
        if !ls.Has(r.key) { return false }
        lsValue, err := strconv.ParseInt(ls.Get(r.key), 10, 64)
        if err != nil { return false }
        ...

gjson (tidwall/gjson) on a plain dotted path: object keys by name, array elements by index;
``String()`` of a number is its JSON text, of true/false ``"true"``/``"false"``, of an object or
array its raw JSON, of a missing value ``""``.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Optional

_SPECIAL = "!=(),<>"
_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class SelectorError(ValueError):
    pass


def _qualified_name(key: str) -> bool:
    prefix, slash, name = key.rpartition("/")
    if slash and not (prefix and len(prefix) <= 253 and _DNS_SUBDOMAIN.match(prefix)):
        return False
    return bool(name) and len(name) <= 63 and bool(_NAME.match(name))


def _tokens(text: str) -> list[str]:
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch in _SPECIAL:
            two = text[i:i + 2]
            if two in ("==", "!="):
                out.append(two)
                i += 2
            else:
                out.append(ch)
                i += 1
        else:
            j = i
            while j < len(text) and not text[j].isspace() and text[j] not in _SPECIAL:
                j += 1
            out.append(text[i:j])
            i = j
    return out


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...]

    def matches(self, document: Any) -> bool:
        has, value = gjson_get(document, self.key)
        op = self.operator
        if op in ("in", "=", "=="):
            return has and value in self.values
        if op in ("notin", "!="):
            return (not has) or value not in self.values
        if op == "exists":
            return has
        if op == "!":
            return not has
        if not has:
            return False
        try:
            actual = int(value, 10)
        except ValueError:
            return False
        wanted = int(self.values[0])
        return actual > wanted if op == ">" else actual < wanted


def parse(selector: str) -> list[Requirement]:
    """labels.Parse: the requirements, or SelectorError as Argo's executor would report it."""
    tokens = _tokens(selector)
    requirements: list[Requirement] = []
    i = 0

    def take() -> Optional[str]:
        nonlocal i
        token = tokens[i] if i < len(tokens) else None
        i += 1
        return token

    while i < len(tokens):
        token = take()
        if token == "!":
            key, op, values = take(), "!", ()
        else:
            key = token
            nxt = tokens[i] if i < len(tokens) else None
            if nxt in (None, ","):
                op, values = "exists", ()
            elif nxt in ("=", "==", "!=", ">", "<"):
                op = take()
                value = tokens[i] if i < len(tokens) and tokens[i] not in _SPECIAL else ""
                if value:
                    take()
                values = (value,)
            elif nxt in ("in", "notin"):
                op = take()
                if take() != "(":
                    raise SelectorError(f"{selector!r}: expected '(' after {op}")
                vals = []
                while True:
                    t = take()
                    if t is None:
                        raise SelectorError(f"{selector!r}: unterminated set")
                    if t == ")":
                        break
                    if t != ",":
                        vals.append(t)
                values = tuple(vals)
            else:
                raise SelectorError(f"{selector!r}: unexpected {nxt!r} after key {key!r}")
        if key is None or not _qualified_name(key):
            raise SelectorError(f"{selector!r}: key {key!r} is not a qualified name")
        if op in (">", "<"):
            try:
                int(values[0], 10)
            except ValueError:
                raise SelectorError(f"{selector!r}: for '>', '<' operators the value must be an integer") from None
        if op in ("in", "notin") and not values:
            raise SelectorError(f"{selector!r}: values set can't be empty")
        for value in values:
            if len(value) > 63 or not _LABEL_VALUE.match(value):
                raise SelectorError(f"{selector!r}: {value!r} is not a valid label value")
        requirements.append(Requirement(key, op, values))
        sep = take()
        if sep not in (None, ","):
            raise SelectorError(f"{selector!r}: expected ',' got {sep!r}")
    return requirements


def gjson_get(document: Any, path: str) -> tuple[bool, str]:
    """(Exists(), String()) of gjson.Get on a plain dotted path."""
    node = document
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False, ""
    if node is None:
        return True, ""
    if isinstance(node, bool):
        return True, "true" if node else "false"
    if isinstance(node, str):
        return True, node
    if isinstance(node, (int, float)):
        return True, json.dumps(node)
    return True, json.dumps(node, separators=(",", ":"))


def step_outcome(document: Any, *, success: str, failure: str) -> str:
    """'failed', 'succeeded' or 'waiting': one pass of matchConditions over the resource's JSON."""
    if any(r.matches(document) for r in parse(failure)):
        return "failed"
    success_reqs = parse(success)
    if sum(r.matches(document) for r in success_reqs) >= len(success_reqs):
        return "succeeded"
    return "waiting"
