"""`pulumi up` runs infra/__main__.py: a config mistake must surface as a RunError (no traceback)."""
from __future__ import annotations

import runpy
from pathlib import Path

import pulumi
import pytest

from infra.config import PROJECT
from infra.plan.mock_engine import run_recorded
from tests.conftest import stack_config, to_values

MAIN = Path(__file__).resolve().parents[2] / "infra" / "__main__.py"


@pytest.fixture(autouse=True)
def _no_download(monkeypatch):
    """The entry point fetches the Training Operator tree (infra.vendor); tests stay offline."""
    import infra.vendor

    monkeypatch.setattr(infra.vendor, "prepare", lambda: None)


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


def test_entrypoint_prepares_the_vendored_overlay_after_the_config_is_valid(monkeypatch):
    import infra.vendor

    calls = []
    monkeypatch.setattr(infra.vendor, "prepare", lambda: calls.append("prepare"))
    raw = stack_config("dev")
    raw["cluster"]["version"] = "1.99"
    with pytest.raises(pulumi.RunError):
        run_recorded(lambda: runpy.run_path(str(MAIN), run_name="__main__"), project=PROJECT, stack="dev",
                     config=to_values(raw))
    assert calls == []  # a bad config is reported before anything is downloaded
    run_recorded(lambda: runpy.run_path(str(MAIN), run_name="__main__"), project=PROJECT, stack="dev",
                 config=to_values(stack_config("dev")))
    assert calls == ["prepare"]


def test_a_vendoring_failure_is_a_run_error(monkeypatch):
    import infra.vendor

    def refuse():
        raise infra.vendor.VendorError("build/vendor/x has tree id 0, pinned 1. FIX: delete it")

    monkeypatch.setattr(infra.vendor, "prepare", refuse)
    with pytest.raises(pulumi.RunError, match="pinned 1. FIX"):
        run_recorded(lambda: runpy.run_path(str(MAIN), run_name="__main__"), project=PROJECT, stack="dev",
                     config=to_values(stack_config("dev")))
