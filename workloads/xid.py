"""NVIDIA XID codes and what the platform does about each (``workloads/xid_actions.json``).

The table is data, sourced from NVIDIA's Xid catalog (its "Resolution Bucket (Immediate
Action)" column, quoted per code as ``nvidia_immediate_action``) and mapped to one of the
platform's actions: ``none`` (the job's own restart handles it), ``drain``, ``reset`` (on this
platform: replace the node) or ``replace``. The GPU alerts page on every code whose action is not
``none``; docs/runbooks/gpu-health.md says what to do for each action.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Mapping

XID_TABLE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "xid_actions.json")
ACTIONS = ("none", "drain", "reset", "replace")


@dataclass(frozen=True)
class XidAction:
    code: int
    mnemonic: str
    nvidia_immediate_action: str
    action: str


def load_xid_table(path: str = XID_TABLE_FILE) -> Mapping[int, XidAction]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    table: dict[int, XidAction] = {}
    problems = []
    for code, row in data["xids"].items():
        if row["action"] not in ACTIONS:
            problems.append(f"xids.{code}.action: {row['action']!r} is not one of {', '.join(ACTIONS)}")
            continue
        table[int(code)] = XidAction(int(code), row["mnemonic"], row["nvidia_immediate_action"], row["action"])
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    return table


XID_ACTIONS: Mapping[int, XidAction] = load_xid_table()


def actionable_xids(table: Mapping[int, XidAction] = XID_ACTIONS) -> tuple[int, ...]:
    """Codes after which the node must leave service (drain, reset or replace), ascending."""
    return tuple(sorted(code for code, row in table.items() if row.action != "none"))
