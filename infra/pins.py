"""Pins no primary source confirms, as plan warnings with the command that confirms each.

Audit 3 (section 3) could not confirm some builds from AWS documents; rather than claim them, the
offline plan lists each one it deploys with the `aws` (or `docker`) command to run before
`pulumi up` (``catalog.versions.UNCONFIRMED_PINS``).
"""
from __future__ import annotations

from typing import Iterator

from components.versions import UNCONFIRMED_PINS
from infra.capability import Capability
from infra.config import PlatformConfig
from infra.recording import Recording


def warnings(config: PlatformConfig, recording: Recording) -> Iterator[str]:
    for pin in UNCONFIRMED_PINS:
        if pin.kubernetes_version not in (None, config.cluster.version):
            continue
        key, value = pin.match
        if not any(r.inputs.get(key) == value for r in recording.by_type(pin.resource_type)):
            continue
        check = pin.check.format(region=config.region, eks=config.cluster.version, value=pin.value)
        yield f"unconfirmed pin: {pin.what} {pin.value} ({pin.why}); confirm before `pulumi up`: {check}"


CAPABILITY = Capability("pins", warnings=warnings)
