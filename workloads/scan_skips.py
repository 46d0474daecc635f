"""checkov skips as annotations: each check a manifest fails by design, with its reason.

The security scan (infra/plan/security_scan.py) honours ``checkov.io/skip<N>: CKV_x=reason`` on an
object (a pod template's annotations travel to the Pod it scans) and refuses a skip without a
reason. checkov splits the value on ``=``, so a reason must not contain one.
"""
from __future__ import annotations

from typing import Sequence


def skip_annotations(skips: Sequence[tuple[str, str]]) -> dict[str, str]:
    for check, reason in skips:
        if "=" in reason or not reason.strip():
            raise ValueError(f"checkov skip {check}: a reason without '=' is required, got {reason!r}")
    return {f"checkov.io/skip{i}": f"{check}={reason}" for i, (check, reason) in enumerate(skips, 1)}
