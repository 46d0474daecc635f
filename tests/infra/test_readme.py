"""The README's promises: its config reference matches the model, its commands exist."""
from __future__ import annotations

import re
from pathlib import Path

from infra.plan.config_reference import END, START, render

ROOT = Path(__file__).resolve().parents[2]


def test_config_reference_is_generated_from_the_model():
    text = (ROOT / "README.md").read_text()
    block = START + text.split(START, 1)[1].split(END, 1)[0] + END
    assert block == render(), "README config reference is stale: run `make docs`"


def test_quick_start_is_two_make_targets_and_ci_runs_the_test_one():
    text = (ROOT / "README.md").read_text()
    quick_start = text.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in quick_start.strip().splitlines()]
    assert commands == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo", "test"):
        assert re.search(rf"^{target}:", makefile, re.M), target
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_component_example_runs_and_its_flow_log_waits_for_the_archive_policy():
    from infra.plan.mock_engine import run_recorded

    text = (ROOT / "README.md").read_text()
    code = text.split("## Using the components in your own stack", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    code = code.replace("<your account>", "123456789012")
    recording = run_recorded(lambda: exec(code, {}), project="example", stack="dev")
    policy = recording.one("aws:s3/bucketPolicy:BucketPolicy", "logs-logs-policy")
    flow_log = recording.one("aws:ec2/flowLog:FlowLog")
    assert policy.urn in flow_log.dependencies
    assert "aws-account-id=123456789012" in policy.inputs["policy"]
