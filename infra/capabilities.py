"""The platform's capabilities, listed once, in deployment order.

``infra.program`` deploys them in this order (each may use components an earlier one left in
``Platform.components``); ``infra.plan`` prints their sections and warnings in the same order
and adds up their idle-cost lines. The policy gate deploys nothing: it checks the recorded graph.
"""
from __future__ import annotations

from infra import ci, datasets_tracking, gitops, gpu_capacity, monitoring, operations, pins, policy_gate, training
from infra.capability import Capability
from infra.foundation import FOUNDATION

CAPABILITIES: tuple[Capability, ...] = (
    FOUNDATION,
    gpu_capacity.CAPABILITY,
    datasets_tracking.CAPABILITY,
    training.CAPABILITY,
    operations.CAPABILITY,
    monitoring.CAPABILITY,
    gitops.CAPABILITY,
    pins.CAPABILITY,
    ci.CAPABILITY,
    policy_gate.CAPABILITY,
)
