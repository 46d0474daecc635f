"""Operations capability: a monthly AWS Budget per account, alerts by e-mail."""
from __future__ import annotations

from typing import Any, Iterator

import pulumi

from components.budgets import AccountBudget, AccountBudgetArgs
from infra.capability import Capability
from infra.config import PlatformConfig
from infra.mock_engine import Recording
from infra.platform import Platform


def deploy(platform: Platform) -> dict[str, Any]:
    budgets = platform.config.budgets
    if budgets is None:
        return {}
    names = {}
    for key, limit in sorted(budgets.monthly_limit_usd.items()):
        account = key.value
        budget = AccountBudget(
            f"{platform.config.name}-{account}-monthly",
            AccountBudgetArgs(limit_usd=limit, alert_emails=list(budgets.alert_emails),
                              actual_thresholds_percent=list(budgets.actual_thresholds_percent),
                              forecast_threshold_percent=budgets.forecast_threshold_percent,
                              tags=platform.config.resource_tags),
            # A budget sees the costs of the account it is created in.
            opts=pulumi.ResourceOptions(providers={"aws": getattr(platform.providers, account)}),
        )
        names[account] = budget.budget.name
    return {"budgets": names}


def plan_sections(config: PlatformConfig, recording: Recording) -> Iterator[tuple[str, list[str]]]:
    if config.budgets is None:
        yield "Budgets", ["none: set `budgets` to be alerted when an account's monthly spend runs away"]
        return
    lines: list[str] = []
    for key, limit in sorted(config.budgets.monthly_limit_usd.items()):
        account = key.value
        alerts = ", ".join(f"{p:g}%" for p in config.budgets.actual_thresholds_percent)
        forecast = (f", forecast {config.budgets.forecast_threshold_percent:g}%"
                    if config.budgets.forecast_threshold_percent else "")
        lines.append(f"{account}: ${limit:,.0f}/month, alerts at {alerts}{forecast} to {len(config.budgets.alert_emails)} address(es)")
    yield "Budgets", lines


CAPABILITY = Capability("operations", deploy=deploy, plan_sections=plan_sections)
