"""`python -m infra.deploy`: the Automation API calls it builds, its gates and exit codes (no CLI here)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from infra import deploy
from infra.deploy import DeployRequest

ROOT = Path(__file__).resolve().parents[2]
ALL_TOOLS = {"pulumi": "/usr/bin/pulumi", "aws": "/usr/bin/aws"}.get


def aws_v2(_tool: str) -> str:
    return "aws-cli/2.22.35 Python/3.12.6 Linux/6.1 exe/x86_64.debian.12\n"


class FakeCommandError(Exception):
    pass


class FakeStack:
    def __init__(self, calls: list, fail: bool = False):
        self.calls, self.fail = calls, fail

    def __getattr__(self, operation):
        def call(**kwargs):
            self.calls.append((operation, kwargs))
            if self.fail:
                raise FakeCommandError("error: update failed")
            return SimpleNamespace(summary=SimpleNamespace(result="succeeded", resource_changes={"create": 3}))
        return call

    def outputs(self):
        self.calls.append(("outputs", {}))
        return {"clusterName": SimpleNamespace(value="mlp-dev-eks", secret=False),
                "kubeconfig": SimpleNamespace(value="apiVersion: v1 token-ish", secret=True)}


def fake_auto(calls: list, fail: bool = False):
    def create_or_select_stack(**kwargs):
        calls.append(("create_or_select_stack", kwargs))
        return FakeStack(calls, fail)
    return SimpleNamespace(create_or_select_stack=create_or_select_stack, CommandError=FakeCommandError,
                           LocalWorkspaceOptions=lambda **kw: SimpleNamespace(**kw))


def run(request: DeployRequest, calls: list, *, fail: bool = False, which=ALL_TOOLS, version_of=aws_v2):
    out, err = [], []
    code = deploy.run(request, auto=fake_auto(calls, fail), which=which, version_of=version_of,
                      out=out.append, err=err.append)
    return code, "\n".join(out), "\n".join(err)


def test_up_selects_the_stack_in_the_project_dir_after_the_offline_plan_passes(monkeypatch, tmp_path):
    gates = []
    monkeypatch.setattr(deploy, "offline_plan_gate", lambda request: gates.append(request.stack) or 0)
    pack = tmp_path / "policy"
    pack.mkdir()
    calls: list = []
    code, out, _ = run(DeployRequest("up", "dev", project_dir=ROOT, policy_packs=(str(pack),), message="ci #42"), calls)
    assert code == deploy.EXIT_OK and gates == ["dev"]
    (select, select_kwargs), (operation, kwargs), (outputs, _) = calls
    assert select == "create_or_select_stack"
    assert select_kwargs["stack_name"] == "dev" and select_kwargs["work_dir"] == str(ROOT)
    assert operation == "up" and outputs == "outputs"
    assert kwargs["policy_packs"] == [str(pack.resolve())]
    assert kwargs["message"] == "ci #42" and kwargs["show_secrets"] is False
    assert callable(kwargs["on_output"]) and kwargs["color"] == "never"
    # Outputs are printed, the kubeconfig is not.
    assert "mlp-dev-eks" in out and "token-ish" not in out and "[secret]" in out


def test_preview_streams_progress_and_checks_drift_when_asked(monkeypatch):
    monkeypatch.setattr(deploy, "offline_plan_gate", lambda request: 0)
    calls: list = []
    request = DeployRequest("preview", "prod", policy_packs=("policy",), expect_no_changes=True)
    code, _, _ = run(request, calls)
    (_, _), (operation, kwargs) = calls
    assert code == 0 and operation == "preview"
    assert kwargs["expect_no_changes"] is True and kwargs["diff"] is True and "policy_packs" in kwargs
    kwargs["on_output"]("Updating (prod)")  # progress goes to the caller's stream


@pytest.mark.parametrize("operation", ["destroy", "refresh", "outputs"])
def test_operations_without_a_program_skip_the_plan_and_take_no_policy_packs(monkeypatch, operation):
    monkeypatch.setattr(deploy, "offline_plan_gate", lambda request: pytest.fail("the plan gate ran"))
    calls: list = []
    code, _, _ = run(DeployRequest(operation, "dev", policy_packs=("policy",)), calls)
    assert code == 0
    called = [name for name, _ in calls]
    assert called[0] == "create_or_select_stack" and operation in called
    assert all("policy_packs" not in kwargs for _, kwargs in calls)


def test_destroy_can_leave_protected_resources_in_place():
    kwargs = deploy.operation_kwargs(DeployRequest("destroy", "prod", exclude_protected=True), print)
    assert kwargs["exclude_protected"] is True
    assert "exclude_protected" not in deploy.operation_kwargs(DeployRequest("destroy", "prod"), print)


def test_a_failed_operation_exits_non_zero_with_the_cli_message(monkeypatch):
    monkeypatch.setattr(deploy, "offline_plan_gate", lambda request: 0)
    code, _, err = run(DeployRequest("up", "dev"), [], fail=True)
    assert code == deploy.EXIT_FAILED
    assert "`pulumi up` failed for stack 'dev'" in err and "update failed" in err


def test_an_invalid_stack_file_stops_before_any_stack_is_selected(tmp_path):
    document = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())
    document["config"]["ml-training-platform:network"]["cidr"] = "10.0.0.0/33"
    (tmp_path / "Pulumi.dev.yaml").write_text(yaml.safe_dump(document))
    shutil.copy(ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    calls: list = []
    code, _, err = run(DeployRequest("preview", "dev", project_dir=tmp_path), calls)
    assert code == deploy.EXIT_CONFIG_ERROR and calls == []
    assert "offline plan of stack 'dev' failed" in err


@pytest.mark.parametrize("operation", deploy.OPERATIONS)
def test_without_the_pulumi_cli_it_says_so_and_touches_nothing(operation, monkeypatch):
    monkeypatch.setattr(deploy, "offline_plan_gate", lambda request: pytest.fail("the plan gate ran"))
    calls: list = []
    code, _, err = run(DeployRequest(operation, "dev"), calls, which={"aws": "/usr/bin/aws"}.get)
    assert code == deploy.EXIT_MISSING_TOOL and calls == []
    assert "Pulumi CLI (`pulumi`) is not on PATH" in err and "install" in err


def test_cluster_operations_need_aws_cli_v2():
    assert deploy.missing_tools("up", which=ALL_TOOLS, version_of=aws_v2) == []
    [problem] = deploy.missing_tools("up", which=ALL_TOOLS, version_of=lambda _: "aws-cli/1.29.84 Python/3.11")
    assert "aws-cli/1.29.84" in problem and "v2" in problem
    [problem] = deploy.missing_tools("refresh", which={"pulumi": "/usr/bin/pulumi"}.get, version_of=aws_v2)
    assert "aws eks get-token" in problem
    # Reading outputs never calls the cluster.
    assert deploy.missing_tools("outputs", which={"pulumi": "/usr/bin/pulumi"}.get) == []


def test_command_line_without_any_cli_exits_3_with_a_clear_message(tmp_path):
    # An empty PATH: no pulumi, no aws.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    result = subprocess.run([sys.executable, "-m", "infra.deploy", "preview", "--stack", "dev"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={"PATH": str(bin_dir), "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)})
    assert result.returncode == deploy.EXIT_MISSING_TOOL, result.stderr
    assert "Pulumi CLI" in result.stderr and "AWS CLI v2" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_unknown_operation_is_refused():
    with pytest.raises(ValueError, match="use one of preview, up"):
        DeployRequest("apply", "dev")


def test_ci_workflow_previews_every_stack_on_pull_requests_and_deploys_on_merge():
    workflow = yaml.safe_load((ROOT / ".github/workflows/platform.yml").read_text())
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as true
    assert "pull_request" in triggers and triggers["push"]["branches"] == ["main"]
    stacks = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in ROOT.glob("Pulumi.*.yaml"))
    for job_name, operation in (("preview", "preview"), ("deploy", "up")):
        job = workflow["jobs"][job_name]
        assert sorted(job["strategy"]["matrix"]["stack"]) == stacks
        # OIDC to the automation account's role: no long-lived AWS keys anywhere.
        assert job["permissions"]["id-token"] == "write"
        steps = job["steps"]
        credentials = next(s for s in steps if s.get("uses", "").startswith("aws-actions/configure-aws-credentials@"))
        assert credentials["with"]["role-to-assume"] == "${{ vars.AUTOMATION_DEPLOY_ROLE_ARN }}"
        assert any(f"python -m infra.deploy {operation} --stack" in s.get("run", "") for s in steps)
    assert "AWS_SECRET_ACCESS_KEY" not in (ROOT / ".github/workflows/platform.yml").read_text()
    # The plan summary is posted on the pull request.
    assert workflow["jobs"]["preview"]["permissions"]["pull-requests"] == "write"
    assert any("gh pr comment" in s.get("run", "") for s in workflow["jobs"]["preview"]["steps"])
    # The workflow's test job is CI's own entry point.
    assert any(s.get("run") == "bash .ci/run" for s in workflow["jobs"]["test"]["steps"])
