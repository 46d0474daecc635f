"""`pulumi up` runs infra/__main__.py: a config mistake must surface as a RunError (no traceback)."""
from __future__ import annotations

import runpy
from pathlib import Path

import pulumi
import pytest

from infra.config import PROJECT
from infra.mock_engine import run_recorded
from tests.conftest import stack_config, to_values

MAIN = Path(__file__).resolve().parents[2] / "infra" / "__main__.py"


def test_bad_config_becomes_a_run_error_listing_every_problem():
    raw = stack_config("prod")
    raw["cluster"]["version"] = "1.99"
    raw["network"]["availabilityZones"] = ["us-west-2a"]
    with pytest.raises(pulumi.RunError) as info:
        run_recorded(lambda: runpy.run_path(str(MAIN), run_name="__main__"), project=PROJECT, stack="prod",
                     config=to_values(raw))
    message = str(info.value)
    assert "cluster.version" in message and "network.availabilityZones" in message and "Fix:" in message


def test_entrypoint_builds_the_stack_from_engine_config():
    recording = run_recorded(lambda: runpy.run_path(str(MAIN), run_name="__main__"), project=PROJECT,
                             stack="dev", config=to_values(stack_config("dev")))
    assert recording.one("eks:index:Cluster").inputs["version"] == "1.32"
    assert recording.stack_outputs["clusterName"] == "mlp-dev-eks"
