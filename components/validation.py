"""Problems found in user input, reported all at once.

Validation is pure Python that runs before any resource exists, so every check returns
``Problem`` objects instead of raising at the first one: a platform engineer fixing a
stack file wants the whole list, each with the path, the bad value and the fix.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable


@dataclass(frozen=True)
class Problem:
    path: str
    value: Any
    message: str
    fix: str

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
