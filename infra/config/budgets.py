"""The ``budgets`` section: a monthly AWS Budget per account with e-mail alerts; its rules."""
from __future__ import annotations

from enum import Enum
from typing import Annotated, Iterator, Optional

from pydantic import Field

from components.budgets import alert_problems
from workloads.problems import Problem
from infra.config.common import _Model
from infra.config.engine import Rule


class BudgetAccount(str, Enum):
    AUTOMATION = "automation"
    WORKLOAD = "workload"
    LOGGING = "logging"


class BudgetsConfig(_Model):
    """A monthly AWS Budget per account, with e-mail alerts (operations capability)."""

    # AWS Budgets quotas: 10 e-mail subscribers per notification, 5 notifications per budget.
    alert_emails: list[str] = Field(min_length=1, max_length=10, description="Who gets the alerts (1-10 addresses).")
    monthly_limit_usd: dict[BudgetAccount, Annotated[float, Field(gt=0)]] = Field(min_length=1, description=(
        "Monthly budget in USD per account (automation, workload, logging); accounts left out get no budget."))
    actual_thresholds_percent: list[Annotated[float, Field(gt=0)]] = Field(
        default_factory=lambda: [80.0, 100.0], max_length=5,
        description="Alert when actual spend passes these percentages of the limit.")
    forecast_threshold_percent: Optional[Annotated[float, Field(gt=0)]] = Field(100.0, description=(
        "Alert when the month's forecast passes this percentage; null: no forecast alert."))


def _budget_rules(budgets: Optional[BudgetsConfig]) -> Iterator[Problem]:
    if budgets is not None:
        yield from alert_problems("budgets", actual_thresholds_percent=budgets.actual_thresholds_percent,
                                  forecast_threshold_percent=budgets.forecast_threshold_percent,
                                  alert_emails=budgets.alert_emails)


# Listed in the order the loader runs them (infra.config.platform.RULES).
RULES: tuple[Rule, ...] = (
    Rule(("budgets",), _budget_rules),
)
