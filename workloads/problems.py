"""Problems found in user input, reported all at once.

Validation is pure Python that runs before any resource exists, so every check returns
``Problem`` objects instead of raising at the first one: a platform engineer fixing a
stack file wants the whole list, each with the path, the bad value and the fix.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import functools
import sys
import types
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable, Optional


# What a problem is, for the exit code a command returns (jobs/__main__.py): the input is
# wrong (a field, a name, a file: exit 2), or the input is well-formed but the job does not fit
# the platform (memory, quota, time budget, instance size: exit 3).
BAD_INPUT = "bad input"
DOES_NOT_FIT = "does not fit"


@dataclass(frozen=True)
class Problem:
    path: str
    value: Any
    message: str
    fix: str
    kind: str = BAD_INPUT

    def does_not_fit(self) -> "Problem":
        return dataclasses.replace(self, kind=DOES_NOT_FIT)

    def render(self) -> str:
        value = _short(self.value)
        return f"{self.path}: {self.message} (got {value}). Fix: {self.fix}"


class InvalidInputError(ValueError):
    """Raised with every problem of one input; ``str()`` lists them one per line."""

    def __init__(self, subject: str, problems: Iterable[Problem]):
        self.subject = subject
        self.problems = tuple(problems)
        lines = "\n".join(f"  - {p.render()}" for p in self.problems)
        count = len(self.problems)
        super().__init__(f"{subject}: {count} problem{'s' if count != 1 else ''}\n{lines}")


def raise_if_any(subject: str, problems: Iterable[Problem]) -> None:
    found = list(problems)
    if found:
        raise InvalidInputError(subject, found)


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def coerce_enums(args: Any) -> None:
    """Give a frozen dataclass's enum-typed fields their enum, from the enum or its string value.

    ``NetworkArgs(nat="none")`` must mean ``NatStrategy.NONE``: compared with ``is`` or used as a
    dict key, the plain string would silently take the default branch. Accepts the value
    (``"one_per_az"``) or the member name (``"ONE_PER_AZ"``), for single fields, ``Optional``
    ones and sequences; anything else raises ``InvalidInputError`` naming the field, the value
    and the allowed values. Call it first in ``__post_init__``.
    """
    problems: list[Problem] = []
    owner = type(args).__name__
    hints = _type_hints(type(args))
    for item in dataclasses.fields(args):
        enum_type, is_sequence = _enum_in(hints.get(item.name))
        value = getattr(args, item.name)
        if enum_type is None or value is None:
            continue
        items = list(value) if is_sequence and not isinstance(value, (str, bytes)) else None
        if is_sequence and items is None:
            items = [value]  # a lone value where a sequence belongs
        coerced = []
        for index, element in enumerate(items if items is not None else [value]):
            member = _member(enum_type, element)
            if member is None:
                at = f"{owner}.{item.name}" + (f"[{index}]" if items is not None else "")
                problems.append(Problem(at, element, f"is not a {enum_type.__name__}",
                                        f"use one of {[m.value for m in enum_type]} (or the {enum_type.__name__} member)"))
            coerced.append(member)
        if not problems:
            object.__setattr__(args, item.name, tuple(coerced) if items is not None else coerced[0])
    raise_if_any(owner, problems)


def _member(enum_type: type[Enum], value: Any) -> Optional[Enum]:
    if isinstance(value, enum_type):
        return value
    if isinstance(value, str):
        for member in enum_type:
            if value == member.value or value == member.name:
                return member
    return None


def _enum_in(hint: Any) -> tuple[Optional[type[Enum]], bool]:
    """(enum type, whether it is a sequence of it) for ``E``, ``Optional[E]``, ``Sequence[E]``..."""
    if hint is None:
        return None, False
    if isinstance(hint, type) and issubclass(hint, Enum):
        return hint, False
    origin = typing.get_origin(hint)
    args = [a for a in typing.get_args(hint) if a is not type(None) and a is not Ellipsis]
    if origin is typing.Union or origin is types.UnionType:
        enums = [a for a in args if isinstance(a, type) and issubclass(a, Enum)]
        return (enums[0], False) if len(enums) == 1 else (None, False)
    if origin in (list, tuple, set, frozenset, collections.abc.Sequence) and len(args) == 1:
        inner, nested = _enum_in(args[0])
        return (inner, True) if inner is not None and not nested else (None, False)
    return None, False


@functools.lru_cache(maxsize=None)
def _type_hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # an annotation that only resolves under TYPE_CHECKING: resolve field by field
        module = sys.modules.get(cls.__module__)
        namespace = dict(vars(module)) if module else {}
        hints = {}
        for item in dataclasses.fields(cls):
            try:
                hints[item.name] = eval(item.type, namespace) if isinstance(item.type, str) else item.type  # noqa: S307
            except Exception:
                continue
        return hints


def accepts_enum_values(cls: type) -> type:
    """Class decorator (above ``@dataclass``): enum fields accept their string values.

    Runs ``coerce_enums`` before the class's own ``__post_init__`` validation, so that
    validation already sees enum members.
    """
    post_init = getattr(cls, "__post_init__", None)
    if post_init is not None:
        @functools.wraps(post_init)
        def __post_init__(self: Any, *args: Any) -> None:
            coerce_enums(self)
            post_init(self, *args)

        cls.__post_init__ = __post_init__  # the generated __init__ looks it up at call time
    else:
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            coerce_enums(self)

        cls.__init__ = __init__
    return cls
