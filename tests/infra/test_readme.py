"""The README's and the docs' promises: the README is an entrance (its quick start is two make
targets CI runs), the configuration reference matches the model, the component example runs."""
from __future__ import annotations

import re
from pathlib import Path

from infra.plan.config_reference import DEFAULT_PAGE, END, START, render

ROOT = Path(__file__).resolve().parents[2]
CONFIGURATION = ROOT / DEFAULT_PAGE
README_MAX_LINES = 250


def test_config_reference_is_generated_from_the_model():
    text = CONFIGURATION.read_text()
    block = START + text.split(START, 1)[1].split(END, 1)[0] + END
    assert block == render(), f"{DEFAULT_PAGE} is stale: run `make docs`"


def test_the_readme_is_an_entrance_not_a_manual():
    """The long material lives in docs/; the README points there, and the generated reference is not in it."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < README_MAX_LINES, f"README.md has {len(text.splitlines())} lines: move sections to docs/"
    assert START not in text
    assert "(docs/configuration.md)" in text


def test_quick_start_is_two_make_targets_and_ci_runs_the_test_one():
    text = (ROOT / "README.md").read_text()
    quick_start = text.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in quick_start.strip().splitlines()]
    assert commands == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo", "test"):
        assert re.search(rf"^{target}:", makefile, re.M), target
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_make_docs_writes_the_configuration_page():
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\ndocs:", 1)[1].split("\n\n", 1)[0]
    assert "config_reference --write docs/configuration.md" in recipe


def test_component_example_runs_and_its_flow_log_waits_for_the_archive_policy():
    from infra.plan.mock_engine import run_recorded

    text = (ROOT / "docs" / "platform.md").read_text()
    code = text.split("## Using the components in your own stack", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    code = code.replace("<your account>", "123456789012")
    recording = run_recorded(lambda: exec(code, {}), project="example", stack="dev")
    policy = recording.one("aws:s3/bucketPolicy:BucketPolicy", "logs-logs-policy")
    flow_log = recording.one("aws:ec2/flowLog:FlowLog")
    assert policy.urn in flow_log.dependencies
    assert "aws-account-id=123456789012" in policy.inputs["policy"]
