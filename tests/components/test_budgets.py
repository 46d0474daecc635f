"""AWS Budgets: one per account, created in the account whose costs it watches; bad limits refused."""
from __future__ import annotations

import pytest

from components.budgets import AccountBudgetArgs
from workloads.problems import InvalidInputError
from infra.config import ConfigError, load_platform_config
from tests.conftest import stack_config


def test_each_budget_lives_in_the_account_it_watches(plan):
    budgets = [node for node in plan.graph if node["type"] == "aws:budgets/budget:Budget"]
    limits = {key.value: limit for key, limit in plan.config.budgets.monthly_limit_usd.items()}
    # A budget only sees its own account's costs: it must be created through that account's provider.
    assert sorted(node["account"] for node in budgets) == sorted(limits)
    for node in budgets:
        account = node["account"]
        inputs = node["inputs"]
        assert float(inputs["limitAmount"]) == limits[account]
        assert inputs["budgetType"] == "COST" and inputs["timeUnit"] == "MONTHLY" and inputs["limitUnit"] == "USD"
        kinds = sorted((n["notificationType"], float(n["threshold"])) for n in inputs["notifications"])
        expected = sorted([("ACTUAL", float(p)) for p in plan.config.budgets.actual_thresholds_percent]
                          + [("FORECASTED", float(plan.config.budgets.forecast_threshold_percent))])
        assert kinds == expected
        assert all(n["subscriberEmailAddresses"] == list(plan.config.budgets.alert_emails) for n in inputs["notifications"])


def test_bad_budgets_are_refused_all_at_once():
    raw = stack_config("dev")
    raw["budgets"] = {"alertEmails": [], "monthlyLimitUsd": {"workload": float("inf"), "billing": 10, "logging": -5},
                      "actualThresholdsPercent": [50, 60, 70, 80, 90, 100]}
    with pytest.raises(ConfigError) as info:
        load_platform_config(raw)
    text = str(info.value)
    for expected in ("budgets.monthlyLimitUsd.workload", "budgets.monthlyLimitUsd.logging", "billing",
                     "budgets.alertEmails", "budgets.actualThresholdsPercent"):
        assert expected in text, expected
    assert "Traceback" not in text


def test_args_validate_before_any_resource():
    with pytest.raises(InvalidInputError, match="limit_usd"):
        AccountBudgetArgs(limit_usd=0, alert_emails=["a@example.com"])
