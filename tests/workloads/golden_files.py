"""Golden files of rendered manifests: compare, or rewrite with UPDATE_GOLDEN=1 and review the diff."""
from __future__ import annotations

import os
from pathlib import Path

GOLDEN = Path(__file__).parent / "golden"


def assert_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"missing golden file {path.name}; create it with UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text(), f"{path.name} changed; review and regenerate with UPDATE_GOLDEN=1"
