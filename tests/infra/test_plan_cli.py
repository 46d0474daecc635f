"""The offline plan as a user runs it: exit codes, messages, JSON contract."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
GRAPH_KEYS = {"type", "name", "parent", "provider", "account", "remote", "protect", "retain_on_delete", "inputs",
              "urn", "id", "dependencies"}


def run_plan(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infra.plan", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_plan_exits_zero_and_writes_the_graph(stack, tmp_path):
    out = tmp_path / f"{stack}.json"
    result = run_plan("--stack", stack, "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert "Resources:" in result.stdout and "AWS resources per account:" in result.stdout
    assert "extended support" in result.stdout and "/month" in result.stdout
    # Capabilities' plan sections reach the CLI (they register with infra.plan, not __main__).
    assert "GPU pool" in result.stdout
    graph = json.loads(out.read_text())
    assert graph and all(set(node) == GRAPH_KEYS for node in graph)
    names = {node["name"] for node in graph}
    assert all(node["parent"] in names for node in graph if node["parent"] is not None)
    assert {node["account"] for node in graph} >= {"workload", "logging"}


def bad_stack_dir(tmp_path: Path, mutate) -> Path:
    document = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())
    mutate(document["config"])
    shutil.copy(ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    # A project holds the folder its `main` names: the program runs there (infra.plan.read_project).
    (tmp_path / "infra").symlink_to(ROOT / "infra")
    (tmp_path / "Pulumi.broken.yaml").write_text(yaml.safe_dump(document))
    return tmp_path


def test_malformed_config_exits_nonzero_with_every_problem_and_no_traceback(tmp_path):
    def mutate(config):
        config["ml-training-platform:network"]["cidr"] = "10.0.0.0/33"
        config["ml-training-platform:network"]["availabilityZones"] = ["us-west-2a"]
        config["ml-training-platform:accounts"]["workload"]["id"] = "1234"
        config["ml-training-platform:cluster"]["version"] = "1.99"
        config["ml-training-platform:cluster"]["publicAccessCidrs"] = ["0.0.0.0/0"]
        config["ml-training-platform:cluster"]["systemNodeGroup"]["minSize"] = 9
        config["ml-training-platform:clustr"] = {}

    project = bad_stack_dir(tmp_path, mutate)
    result = run_plan("--stack", "broken", "--project-dir", str(project))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    for expected in ("network.cidr", "accounts.workload.id", "cluster.version", "cluster.publicAccessCidrs[0]",
                     "cluster.systemNodeGroup.minSize", "clustr", "did you mean `cluster`"):
        assert expected in result.stderr, expected


def test_unknown_stack_names_the_available_ones():
    result = run_plan("--stack", "staging")
    assert result.returncode == 2
    assert "Pulumi.staging.yaml" in result.stderr and "dev, prod" in result.stderr


def test_any_stack_file_can_be_planned(tmp_path):
    project = bad_stack_dir(tmp_path, lambda config: config.__setitem__("ml-training-platform:name", "mlp-stage"))
    result = run_plan("--stack", "broken", "--project-dir", str(project))
    assert result.returncode == 0, result.stderr
    assert "cluster mlp-stage-eks" in result.stdout


@pytest.mark.parametrize("tool", ["deploy", "urns", "upgrade", "security_scan", "config_reference"])
def test_the_old_tool_commands_still_run_with_a_one_line_deprecation_notice(tool):
    """`python -m infra.<tool>` is `python -m infra.plan.<tool>` until 1.0.0 (docs/versioning.md):
    the same tool runs, and stderr says once what to run instead and when the old name goes."""
    result = subprocess.run([sys.executable, "-m", f"infra.{tool}", "--help"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"usage: python -m infra.plan.{tool}" in result.stdout
    notice = [line for line in result.stderr.splitlines() if "deprecated" in line]
    assert notice == [f"python -m infra.{tool} is deprecated and is removed in 1.0.0: run python -m infra.plan.{tool}"]
