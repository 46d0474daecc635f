"""The platform's capabilities, listed once, in deployment order.

``infra.program`` deploys them in this order (each may use what an earlier one set on the
``Platform``: ``scheduling``, ``datasets``, ...); ``infra.plan`` prints their sections and warnings in the same order
and adds up their idle-cost lines. The policy gate deploys nothing: it checks the recorded graph.
"""
from __future__ import annotations

from infra import ci, datasets, gitops, gpu_capacity, monitoring, operations, pins, policy_gate, tracking, training
from catalog.versions import HelmChart
from infra.capability import Capability
from infra.config import PlatformConfig
from infra.foundation import FOUNDATION

CAPABILITIES: tuple[Capability, ...] = (
    FOUNDATION,
    gpu_capacity.CAPABILITY,
    datasets.CAPABILITY,
    tracking.CAPABILITY,
    training.CAPABILITY,
    operations.CAPABILITY,
    monitoring.CAPABILITY,
    gitops.CAPABILITY,
    pins.CAPABILITY,
    ci.CAPABILITY,
    policy_gate.CAPABILITY,
)


def charts_used(config: PlatformConfig) -> tuple[HelmChart, ...]:
    """Every Helm chart the stack installs, each once, in capability order."""
    found: dict[str, HelmChart] = {}
    for capability in CAPABILITIES:
        for chart in capability.charts(config):
            found.setdefault(chart.name, chart)
    return tuple(found.values())


def log_group_names(config: PlatformConfig) -> list[str]:
    """Every CloudWatch log group of the workload account the platform creates, in capability order."""
    return [name for capability in CAPABILITIES for name in capability.log_group_names(config)]
