"""What a capability is: one object with its deploy step and its part of the offline plan.

A capability reads its config sections, adds components to the ``Platform`` the foundation
built (``deploy``, whose return value becomes stack outputs), and contributes to the offline
plan what only it knows: sections to print, warnings, and the idle-cost lines of the resources
it creates. ``infra.capabilities.CAPABILITIES`` lists them once, in deployment order; the
program deploys them in that order and the plan iterates the same tuple. Nothing registers
itself at import time.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from catalog.versions import HelmChart
from infra.config import PlatformConfig
from infra.costs import CostLine
from infra.recording import Recording
from infra.platform import Platform

Section = tuple[str, list[str]]
Deploy = Callable[[Platform], Mapping[str, Any]]
Sections = Callable[[PlatformConfig, Recording], Iterable[Section]]
Warnings = Callable[[PlatformConfig, Recording], Iterable[str]]
CostLines = Callable[[Recording, dt.date], Iterable[CostLine]]
LogGroupNames = Callable[[PlatformConfig], Iterable[str]]
Charts = Callable[[PlatformConfig], Iterable[HelmChart]]


def _no_outputs(platform: Platform) -> Mapping[str, Any]:
    return {}


def _nothing(*args: Any) -> Iterable[Any]:
    return ()


@dataclass(frozen=True)
class Capability:
    """name: shown in errors and docs. deploy: adds the components, returns stack outputs.
    plan_sections / warnings: what the offline plan prints for it (from the config and the
    recorded graph). cost_lines: idle monthly cost of what it creates, from the recorded graph.
    log_group_names: the CloudWatch log groups it will create; the foundation's log key, made
    before any capability runs, must name them all (``infra.capabilities.log_group_names``).
    charts: the Helm charts its releases install; with a chart mirror, the program downloads and
    verifies each before any resource is registered (``infra.capabilities.charts_used``).
    """

    name: str
    deploy: Deploy = _no_outputs
    plan_sections: Sections = _nothing
    warnings: Warnings = _nothing
    cost_lines: CostLines = _nothing
    log_group_names: LogGroupNames = _nothing
    charts: Charts = _nothing
