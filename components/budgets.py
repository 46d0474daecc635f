"""A monthly AWS Budget for one account, with e-mail alerts on actual and forecast spend.

One per account (automation, workload, logging): a budget only sees the costs of the account
it lives in (unless it is the organization's management account), and each account's owner
wants to know when its own bill runs away, the GPU account's above all.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Optional, Sequence

import pulumi
import pulumi_aws as aws

from workloads.problems import Problem, raise_if_any

# AWS Budgets quotas ("Quotas and restrictions", AWS Cost Management user guide): at most five
# notifications per budget, at most ten e-mail subscribers per notification.
MAX_NOTIFICATIONS_PER_BUDGET = 5
MAX_EMAILS_PER_NOTIFICATION = 10


def limit_problems(path: str, limit_usd: float) -> Iterator[Problem]:
    if not math.isfinite(limit_usd) or limit_usd <= 0:
        yield Problem(path, limit_usd, "a budget needs a positive, finite monthly limit",
                      "set the account's expected monthly spend in USD, e.g. 1500")


def alert_problems(path: str, *, actual_thresholds_percent: Sequence[float],
                   forecast_threshold_percent: Optional[float], alert_emails: Sequence[str]) -> Iterator[Problem]:
    thresholds = [*actual_thresholds_percent, *([forecast_threshold_percent] if forecast_threshold_percent else [])]
    bad = [t for t in thresholds if not math.isfinite(t) or t <= 0]
    if bad:
        yield Problem(f"{path}.actualThresholdsPercent", bad, "thresholds are percentages of the limit above 0",
                      "use values such as 80 and 100")
    if len(thresholds) > MAX_NOTIFICATIONS_PER_BUDGET:
        yield Problem(f"{path}.actualThresholdsPercent", list(actual_thresholds_percent),
                      f"AWS Budgets allows {MAX_NOTIFICATIONS_PER_BUDGET} notifications per budget "
                      f"(these thresholds and the forecast make {len(thresholds)})", "drop some thresholds")
    if len(set(actual_thresholds_percent)) != len(actual_thresholds_percent):
        yield Problem(f"{path}.actualThresholdsPercent", list(actual_thresholds_percent), "duplicate thresholds",
                      "list each percentage once")
    if not alert_emails or len(alert_emails) > MAX_EMAILS_PER_NOTIFICATION:
        yield Problem(f"{path}.alertEmails", list(alert_emails),
                      f"a notification needs 1 to {MAX_EMAILS_PER_NOTIFICATION} e-mail subscribers (AWS Budgets quota)",
                      "list the addresses of the account's owners, or a distribution list")


@dataclass(frozen=True)
class AccountBudgetArgs:
    """Args of ``AccountBudget``.

    Attributes:
        limit_usd: monthly cost budget of the account.
        actual_thresholds_percent: alert when actual spend passes these percentages of the limit.
        forecast_threshold_percent: alert when AWS forecasts the month's spend to pass this
            percentage (None: no forecast alert).
        alert_emails: who receives the alerts.
    """

    limit_usd: float
    alert_emails: Sequence[str]
    actual_thresholds_percent: Sequence[float] = (80.0, 100.0)
    forecast_threshold_percent: Optional[float] = 100.0
    tags: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        raise_if_any("AccountBudgetArgs", [
            *limit_problems("AccountBudgetArgs.limit_usd", self.limit_usd),
            *alert_problems("AccountBudgetArgs", actual_thresholds_percent=self.actual_thresholds_percent,
                            forecast_threshold_percent=self.forecast_threshold_percent, alert_emails=self.alert_emails),
        ])


class AccountBudget(pulumi.ComponentResource):
    """A monthly cost budget of the account its provider points at."""

    def __init__(self, name: str, args: AccountBudgetArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:budgets:AccountBudget", name, None, opts)
        notifications = [
            aws.budgets.BudgetNotificationArgs(
                comparison_operator="GREATER_THAN", notification_type="ACTUAL", threshold=float(percent),
                threshold_type="PERCENTAGE", subscriber_email_addresses=list(args.alert_emails))
            for percent in args.actual_thresholds_percent
        ]
        if args.forecast_threshold_percent:
            notifications.append(aws.budgets.BudgetNotificationArgs(
                comparison_operator="GREATER_THAN", notification_type="FORECASTED",
                threshold=float(args.forecast_threshold_percent), threshold_type="PERCENTAGE",
                subscriber_email_addresses=list(args.alert_emails)))
        self.budget = aws.budgets.Budget(
            f"{name}-budget", name=name, budget_type="COST", time_unit="MONTHLY",
            limit_amount=f"{args.limit_usd:.2f}", limit_unit="USD", notifications=notifications,
            tags=dict(args.tags), opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"budget_name": self.budget.name})
