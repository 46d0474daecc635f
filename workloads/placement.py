"""Where platform pods run: the static CPU nodes carry this label and taint."""
from __future__ import annotations

from typing import Any

SYSTEM_NODE_LABEL_KEY = "node.mlplatform.io/role"
SYSTEM_NODE_LABEL_VALUE = "system"
# CriticalAddonsOnly is tolerated by CoreDNS, the EBS/FSx CSI controllers and Karpenter out
# of the box, so managed add-ons land on these nodes with no extra configuration.
SYSTEM_NODE_TAINT = {"key": "CriticalAddonsOnly", "value": "true", "effect": "NoSchedule"}


def system_node_selector() -> dict[str, str]:
    return {SYSTEM_NODE_LABEL_KEY: SYSTEM_NODE_LABEL_VALUE}


def system_tolerations() -> list[dict[str, Any]]:
    """Tolerations for controllers that must run on the static CPU nodes."""
    return [{"key": SYSTEM_NODE_TAINT["key"], "operator": "Exists", "effect": SYSTEM_NODE_TAINT["effect"]}]


def system_pod_placement() -> dict[str, Any]:
    """``nodeSelector`` + ``tolerations``, the shape most Helm charts take at top level."""
    return {"nodeSelector": system_node_selector(), "tolerations": system_tolerations()}
