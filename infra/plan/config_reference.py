"""Generate the stack file reference (docs/configuration.md) from ``PlatformConfig`` (one source of truth).

    python -m infra.plan.config_reference                                  # print it
    python -m infra.plan.config_reference --write docs/configuration.md    # replace the marked block (make docs)
"""
from __future__ import annotations

import argparse
import sys
import typing
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from infra.config import PROJECT, PlatformConfig

START = "<!-- config-reference:start -->"
END = "<!-- config-reference:end -->"
DEFAULT_PAGE = Path("docs/configuration.md")


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (list, tuple):
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"map of {_type_name(args[-1])}"
    if origin is typing.Union:
        return " or ".join(_type_name(a) for a in args)
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " \\| ".join(f"`{m.value}`" for m in annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "object"
    if getattr(annotation, "__name__", "") == "IPv4Network":
        return "CIDR"
    if getattr(annotation, "__name__", "") == "SecretStr":
        return "secret str"
    return getattr(annotation, "__name__", str(annotation))


def _model_of(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
        nested = [a for a in typing.get_args(candidate) if isinstance(a, type) and issubclass(a, BaseModel)]
        if nested:
            return nested[0]
    return None


def _default(field: Any) -> str:
    if field.is_required():
        return "**required**"
    if field.default_factory is not None:
        value = field.default_factory()
        if isinstance(value, BaseModel):
            return "see below"
        return f"`{value!r}`" if value not in ({}, []) else "empty"
    value = field.default
    if value is PydanticUndefined or value is None:
        return "unset"
    return f"`{value.value if isinstance(value, Enum) else value!r}`"


def render() -> str:
    lines = [START, "", f"Keys live under the `{PROJECT}:` namespace of `Pulumi.<stack>.yaml`. "
             "Unknown keys are errors. Generated from the config model by `make docs`: edit the model, not this table.", ""]
    queue: list[tuple[str, type[BaseModel]]] = [("", PlatformConfig)]
    while queue:
        prefix, model = queue.pop(0)
        title = f"`{prefix}`" if prefix else "top level"
        lines += [f"### {title}", "", "| key | type | default | description |", "|---|---|---|---|"]
        for name, field in model.model_fields.items():
            key = field.alias or name
            path = f"{prefix}.{key}" if prefix else key
            description = (field.description or "").replace("|", "\\|")
            lines.append(f"| `{key}` | {_type_name(field.annotation)} | {_default(field)} | {description} |")
            nested = _model_of(field.annotation)
            if nested is not None:
                queue.append((path, nested))
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    if START not in text or END not in text:
        raise ValueError(f"markers {START} / {END} not found")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return head + block + tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.plan.config_reference", description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, nargs="?", const=DEFAULT_PAGE, metavar="FILE",
                        help=f"replace the marked block of FILE (default {DEFAULT_PAGE})")
    args = parser.parse_args(argv)
    block = render()
    if args.write:
        args.write.write_text(replace_block(args.write.read_text(), block))
    else:
        print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
