"""Pins no primary source confirms, as plan warnings with the command that confirms each.

Audit 3 (section 3) could not confirm some builds from AWS documents; rather than claim them, the
offline plan lists each one it deploys with the `aws` (or `docker`) command to run before
`pulumi up` (``catalog.versions.UNCONFIRMED_PINS``).
"""
from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any, Iterator

from catalog.versions import UNCONFIRMED_PINS
from infra.capability import Capability
from infra.config import PlatformConfig
from infra.recording import Recording


def warnings(config: PlatformConfig, recording: Recording) -> Iterator[str]:
    for pin in UNCONFIRMED_PINS:
        if pin.kubernetes_version not in (None, config.cluster.version):
            continue
        key, value = pin.match
        if not any(_matches(r.inputs.get(key), value) for r in recording.by_type(pin.resource_type)):
            continue
        check = pin.check.format(region=config.region, eks=config.cluster.version, value=pin.value)
        yield f"unconfirmed pin: {pin.what} {pin.value} ({pin.why}); confirm before `pulumi up`: {check}"


def _matches(actual: Any, pinned: str) -> bool:
    """Equal, or the same project-relative path reached from the program's working directory
    (the Training Operator overlay: ``../build/kustomize/...`` under ``main: infra/``)."""
    if actual == pinned:
        return True
    if not isinstance(actual, str) or "/" not in pinned:
        return False
    parts = PurePosixPath(pinned).parts
    return PurePosixPath(actual).parts[-len(parts):] == parts


CAPABILITY = Capability("pins", warnings=warnings)
