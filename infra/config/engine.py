"""The per-section error engine: raw stack values in, a model or every problem at once.

Sections are parsed one by one so that a typo in ``network`` does not hide a bad node group in
``cluster``; each ``Rule`` (written beside its section, listed in ``infra.config.platform``)
runs on the values it names as soon as they parsed, whatever else is broken. Messages name the
path, the value (never a secret's) and the fix.
"""
from __future__ import annotations

import difflib
import ipaddress
import re
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Any, Callable, Iterable, Iterator, Optional, Sequence, TypeVar, get_args, get_origin

from pydantic import BaseModel, ConfigDict, SecretStr, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from workloads.problems import InvalidInputError, Problem

PROJECT = "ml-training-platform"
FIX = " FIX: "  # separates what is wrong from how to fix it in validator messages
SECRET_PLACEHOLDER = "[secret]"


def invalid(message: str, fix: str) -> ValueError:
    return ValueError(f"{message}{FIX}{fix}")


class ConfigError(InvalidInputError):
    """Every problem of a stack's configuration, one per line."""


Check = Callable[..., Iterable[Problem]]


@dataclass(frozen=True)
class Rule:
    """A rule over values of one or more sections, by dotted camelCase path ("cluster.systemNodeGroup").

    The rule runs when every value it names parsed, even if siblings did not, so one typo
    never hides another problem.
    """

    paths: tuple[str, ...]
    check: Check


M = TypeVar("M", bound=BaseModel)


def load(model: type[M], rules: Sequence[Rule], raw: dict[str, Any], *, source: str = "stack config",
         secret_paths: Iterable[str] = ()) -> M:
    """Validate the project's config values (keys without namespace, camelCase) into ``model``.

    ``secret_paths`` are the dotted paths (``accounts``, ``accounts.workload.externalId``) the
    stack file stores encrypted (``secure:``): their values never appear in a message, and each
    must lead to a secret field (``SecretStr``) or a section holding one, since any other field
    would carry the value into resources in plain text.

    Raises ``ConfigError`` with every problem found; returns a frozen model otherwise.
    """
    secret_paths = tuple(secret_paths)
    problems = list(_secret_path_problems(model, secret_paths))
    not_secret_fields = tuple(p.path for p in problems)  # their other problems would only repeat this one
    try:
        config = _load(model, rules, raw, source)
    except ConfigError as error:
        problems += [_redacted(p, secret_paths) for p in error.problems if not _under_secret(p.path, not_secret_fields)]
        # A secret field's value (or a section holding one) is never shown, encrypted or not.
        problems = [_redacted(p, [p.path]) if p.value is not None and _secret_capable(model, p.path) else p for p in problems]
    else:
        if not problems:
            return config
    raise ConfigError(f"invalid configuration in {source}", problems)


def _under_secret(path: str, secret_paths: Iterable[str]) -> bool:
    return any(path == s or path.startswith((s + ".", s + "[")) for s in secret_paths)


def _redacted(problem: Problem, secret_paths: Iterable[str]) -> Problem:
    if _under_secret(problem.path, secret_paths):
        return Problem(problem.path, SECRET_PLACEHOLDER, problem.message, problem.fix)
    return problem


def _secret_path_problems(model: type[BaseModel], secret_paths: Iterable[str]) -> Iterator[Problem]:
    for path in secret_paths:
        if not _secret_capable(model, path):
            yield Problem(
                path, SECRET_PLACEHOLDER,
                "is stored encrypted (secure:), but it is not a secret field: the program would pass it to "
                "resources in plain text (and the offline plan cannot decrypt it)",
                "store it in plain text (`pulumi config set` without --secret); only fields documented as secrets "
                "(e.g. accounts.<key>.externalId) may be encrypted",
            )


def _secret_capable(root: type[BaseModel], path: str) -> bool:
    """Whether ``path`` is a SecretStr field or a section that holds one."""
    annotation: Any = root
    for part in re.sub(r"\[\d+\]", "", path).split("."):
        model = _unwrap(annotation)
        if get_origin(model) is list:
            model = _unwrap(get_args(model)[0])
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return False
        field = next((f for n, f in model.model_fields.items() if (f.alias or n) == part or n == part), None)
        if field is None:
            return False
        annotation = field.annotation
    return _holds_secret(annotation)


def _holds_secret(annotation: Any) -> bool:
    target = _unwrap(annotation)
    if get_origin(target) is list:
        target = _unwrap(get_args(target)[0])
    if target is SecretStr:
        return True
    if isinstance(target, type) and issubclass(target, BaseModel):
        return any(_holds_secret(f.annotation) for f in target.model_fields.values())
    return False


def _load(model: type[M], rules: Sequence[Rule], raw: dict[str, Any], source: str) -> M:
    problems: list[Problem] = []
    fields = model.model_fields
    by_alias = {(f.alias or name): name for name, f in fields.items()}
    sections: dict[str, Any] = {}
    # Every value that parsed, by dotted alias path ("cluster.systemNodeGroup.minSize"),
    # so a rule runs whenever the fields it reads are valid, whatever else is broken.
    values: dict[str, Any] = {}

    for key in raw:
        if key not in by_alias and key not in fields:
            problems.append(_unknown_key(key, key, list(by_alias)))

    for name, field in fields.items():
        alias = field.alias or name
        if alias not in raw and name not in raw:
            if field.is_required():
                problems.append(
                    Problem(alias, None, "required section is missing", f"add `{PROJECT}:{alias}` to the stack file")
                )
                continue
            sections[name] = field.get_default(call_default_factory=True)
            _collect(alias, field.annotation, None, sections[name], values)
            continue
        value = raw.get(alias, raw.get(name))
        try:
            sections[name] = _adapter(field).validate_python(value)
        except ValidationError as exc:
            problems.extend(_from_pydantic(exc, alias, field.annotation, model))
            _collect(alias, field.annotation, value, _FAILED, values)
        else:
            _collect(alias, field.annotation, value, sections[name], values)

    for rule in rules:
        if all(p in values for p in rule.paths):
            problems.extend(rule.check(*(values[p] for p in rule.paths)))

    reported = {p.path for p in problems}
    for name, section in sections.items():
        alias = fields[name].alias or name
        problems.extend(p for p in _list_problems(alias, section)
                        if p.path not in reported and p.path.rsplit("[", 1)[0] not in reported)

    if problems:
        raise ConfigError(f"invalid configuration in {source}", problems)
    try:
        return model.model_validate(sections)
    except ValidationError as exc:  # a model-level rule not in the per-section pass: still no traceback
        raise ConfigError(f"invalid configuration in {source}", _from_pydantic(exc, "", model, model)) from None


def _list_problems(path: str, value: Any) -> Iterator[Problem]:
    """Every list of plain values holds each value once; a CIDR list holds no block inside another."""
    if isinstance(value, BaseModel):
        for name, field in type(value).model_fields.items():
            yield from _list_problems(f"{path}.{field.alias or name}", getattr(value, name))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _list_problems(f"{path}.{key}", item)
    elif isinstance(value, (list, tuple)):
        seen: dict[Any, int] = {}
        for index, item in enumerate(value):
            if isinstance(item, (BaseModel, dict, list)):
                yield from _list_problems(f"{path}[{index}]", item)
                continue
            shown = item.value if isinstance(item, Enum) else str(item) if isinstance(item, ipaddress.IPv4Network) else item
            if item in seen:
                yield Problem(f"{path}[{index}]", shown, f"repeats {path}[{seen[item]}]", "list each value once")
                continue
            seen[item] = index
            if isinstance(item, ipaddress.IPv4Network):
                outer = next((i for i, other in enumerate(value) if i != index and other != item
                              and isinstance(other, ipaddress.IPv4Network) and item.subnet_of(other)), None)
                if outer is not None:
                    yield Problem(f"{path}[{index}]", shown, f"lies inside {path}[{outer}] ({value[outer]})",
                                  "remove it (the larger block already covers it)")


_FAILED = object()  # marks a value that did not parse
_ADAPTERS: dict[int, TypeAdapter] = {}


def _adapter(field: FieldInfo) -> TypeAdapter:
    """Validates one field as the model would: its type *and* its constraints and validators.

    ``field.annotation`` alone drops what ``Annotated[...]`` and ``Field(...)`` attach (name,
    region and tag validators, ``max_length``, ``ge``/``le``): those live in ``field.metadata``.
    """
    adapter = _ADAPTERS.get(id(field))
    if adapter is None:
        annotation = Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
        adapter = _ADAPTERS[id(field)] = TypeAdapter(annotation, config=None if _is_model(field.annotation) else _FIELD_CONFIG)
    return adapter


_FIELD_CONFIG = ConfigDict(allow_inf_nan=False)


def _is_model(annotation: Any) -> bool:
    model = _unwrap(annotation)
    return isinstance(model, type) and issubclass(model, BaseModel)


def _collect(path: str, annotation: Any, raw: Any, parsed: Any, values: dict[str, Any]) -> None:
    """Record ``parsed`` at ``path`` and below; when it is ``_FAILED``, whatever of its fields parses."""
    model = _unwrap(annotation)
    is_model = isinstance(model, type) and issubclass(model, BaseModel)
    if parsed is not _FAILED:
        values[path] = parsed
    if not is_model or (parsed is not _FAILED and not isinstance(parsed, BaseModel)):
        return
    failed_fields: set[Any] = set()
    if parsed is _FAILED and isinstance(raw, dict):
        try:
            model.model_validate(raw)
        except ValidationError as exc:
            failed_fields = {error["loc"][0] for error in exc.errors() if error["loc"]}
    for name, field in model.model_fields.items():
        alias = field.alias or name
        child_path = f"{path}.{alias}"
        if parsed is not _FAILED:
            _collect(child_path, field.annotation, None, getattr(parsed, name), values)
            continue
        if not isinstance(raw, dict):
            return
        if alias not in raw and name not in raw:
            if not field.is_required():
                values[child_path] = field.get_default(call_default_factory=True)
            continue
        child_raw = raw.get(alias, raw.get(name))
        if alias in failed_fields or name in failed_fields:
            # Refused by the model itself (a @field_validator that the field's type alone lacks).
            child = _FAILED
        else:
            try:
                child = _adapter(field).validate_python(child_raw)
            except ValidationError:
                child = _FAILED
        _collect(child_path, field.annotation, child_raw, child, values)


def _from_pydantic(exc: ValidationError, root: str, annotation: Any, model: Optional[type[BaseModel]] = None) -> list[Problem]:
    problems = []
    for error in exc.errors(include_url=False):
        loc = [part for part in error["loc"] if not (isinstance(part, str) and part.startswith("function-"))]
        path = _path(root, loc)
        kind = error["type"]
        message = error["msg"].removeprefix("Value error, ")
        value = error.get("input")
        if kind == "extra_forbidden":
            model = _model_at(annotation, loc[:-1])
            allowed = [f.alias or n for n, f in model.model_fields.items()] if model else []
            problems.append(_unknown_key(path, str(loc[-1]), allowed))
            continue
        if kind == "missing":
            problems.append(Problem(path, None, "required key is missing", f"add `{loc[-1]}` (see the config reference in README.md)"))
            continue
        if kind == "string_type" and isinstance(value, int) and not isinstance(value, bool):
            quoted = f"{value:012d}" if path.endswith(".id") and re.match(r"^\d{1,12}$", str(value)) else str(value)
            fix = "quote it in YAML" if model is not None and _secret_capable(model, path) else f"quote it in YAML: '{quoted}'"
            problems.append(Problem(path, value, "must be a string", fix))
            continue
        if kind == "finite_number":
            problems.append(Problem(path, value, "must be a finite number", "write a number (.inf and .nan are not sizes)"))
            continue
        if kind == "enum":
            expected = error.get("ctx", {}).get("expected", "")
            problems.append(Problem(path, value, "is not an allowed value", f"use one of {expected}"))
            continue
        if FIX in message:
            message, fix = message.split(FIX, 1)
        else:
            fix = _generic_fix(kind, error.get("ctx") or {})
        problems.append(Problem(path, value, message, fix))
    return problems


def _generic_fix(kind: str, ctx: dict[str, Any]) -> str:
    if kind in ("greater_than_equal", "greater_than"):
        return f"use a value >= {ctx.get('ge', ctx.get('gt'))}"
    if kind in ("less_than_equal", "less_than"):
        return f"use a value <= {ctx.get('le', ctx.get('lt'))}"
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return f"write a {kind.split('_')[0]} here"
    if kind == "too_short":
        return f"list at least {ctx.get('min_length')} item(s)"
    if kind == "too_long":
        return f"list at most {ctx.get('max_length')} item(s)"
    if kind == "string_pattern_mismatch":
        return f"match the pattern {ctx.get('pattern')}"
    return "see the config reference in README.md"


def _path(root: str, loc: list[Any]) -> str:
    path = root
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path.lstrip(".")


def _model_at(annotation: Any, loc: list[Any]) -> Optional[type[BaseModel]]:
    current: Any = annotation
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = next((f for n, f in current.model_fields.items() if (f.alias or n) == part or n == part), None)
            if field is None:
                return None
            current = field.annotation
        else:  # list/dict element
            args = [a for a in get_args(current) if a is not type(None)]
            current = args[-1] if args else None
    current = _unwrap(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    while get_origin(annotation) is not None and get_origin(annotation) is not list and get_origin(annotation) is not dict:
        args = [a for a in get_args(annotation) if a is not type(None)]
        if not args:
            break
        annotation = args[0]
    return annotation


def _unknown_key(path: str, key: str, allowed: list[str]) -> Problem:
    close = difflib.get_close_matches(key, allowed, n=1)
    fix = f"did you mean `{close[0]}`?" if close else f"remove it; allowed keys here: {', '.join(sorted(allowed))}"
    return Problem(path, key, "unknown key", fix)
