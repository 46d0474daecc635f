"""Operations capability: a monthly AWS Budget per account, alerts by e-mail."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pulumi

from components.budgets import AccountBudget, AccountBudgetArgs
from infra.config import PlatformConfig
from infra.mock_engine import Recording
from infra.plan import plan_section

if TYPE_CHECKING:
    from infra.program import Platform


def deploy(platform: "Platform") -> dict[str, Any]:
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


@plan_section
def _budgets(config: PlatformConfig, recording: Recording) -> Any:
    if config.budgets is None:
        return "Budgets", ["none: set `budgets` to be alerted when an account's monthly spend runs away"]
    lines: list[str] = []
    for key, limit in sorted(config.budgets.monthly_limit_usd.items()):
        account = key.value
        alerts = ", ".join(f"{p:g}%" for p in config.budgets.actual_thresholds_percent)
        forecast = (f", forecast {config.budgets.forecast_threshold_percent:g}%"
                    if config.budgets.forecast_threshold_percent else "")
        lines.append(f"{account}: ${limit:,.0f}/month, alerts at {alerts}{forecast} to {len(config.budgets.alert_emails)} address(es)")
    return "Budgets", lines
