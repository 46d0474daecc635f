"""What the checks read back out of a rendered pipeline."""
from __future__ import annotations

from typing import Any, Mapping

import yaml


def embedded_job(template: Mapping[str, Any]) -> dict[str, Any]:
    """The PyTorchJob inside a WorkflowTemplate's train step, parsed back (for CRD validation)."""
    step = next(t for t in template["spec"]["templates"] if t["name"] == "train")
    return yaml.safe_load(step["resource"]["manifest"])
