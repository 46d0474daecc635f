"""`python -m infra.plan.deploy`: the Automation API calls it builds, its gates and exit codes (no CLI here)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from unittest.mock import create_autospec

import pytest
import yaml

from infra.plan import deploy
from infra.plan.deploy import DeployRequest

ROOT = Path(__file__).resolve().parents[2]
ALL_TOOLS = {"pulumi": "/usr/bin/pulumi", "aws": "/usr/bin/aws"}.get


def aws_v2(_tool: str) -> str:
    return "aws-cli/2.22.35 Python/3.12.6 Linux/6.1 exe/x86_64.debian.12\n"


def fake_auto(calls: list, fail: bool = False, first_up: bool = False, resources: tuple = ()):
    """The real pulumi.automation, with the stack autospecced: a wrong method or keyword fails.

    create_autospec checks every call against the real signature (pulumi 3.272.0), and the results
    are the real result classes: a preview returns a PreviewResult (change_summary, no summary).
    """
    import datetime as dt

    import pulumi.automation as auto
    from pulumi.automation import OpType, OutputValue, PreviewResult, UpdateSummary, UpResult
    from pulumi.automation._cmd import CommandResult

    stack = create_autospec(auto.Stack, instance=True)

    def record(operation):
        def call(*args, **kwargs):
            calls.append((operation, kwargs))
            if fail:
                raise auto.CommandError(CommandResult("", "error: update failed", 255))
            if operation == "preview":
                return PreviewResult("", "", {OpType.CREATE: 3, OpType.SAME: 40})
            summary = UpdateSummary(operation, dt.datetime(2026, 11, 25), "", {}, {}, "succeeded",
                                    resource_changes={"create": 3})
            return UpResult("", "", summary, {}) if operation == "up" else SimpleNamespace(summary=summary)
        return call

    for operation in ("preview", "up", "destroy", "refresh"):
        getattr(stack, operation).side_effect = record(operation)
    stack.export_stack.side_effect = lambda: auto.Deployment(3, {"resources": list(resources)})

    def outputs():
        calls.append(("outputs", {}))
        if first_up:
            return {}
        return {"clusterName": OutputValue("mlp-dev-eks", False), "kubeconfig": OutputValue("apiVersion: v1 token-ish", True),
                "mlflowImageRepository": OutputValue("111122223333.dkr.ecr.us-west-2.amazonaws.com/mlp-dev/mlflow", False)}
    stack.outputs.side_effect = outputs

    create = create_autospec(auto.create_or_select_stack, return_value=stack)
    create.side_effect = lambda *a, **kwargs: calls.append(("create_or_select_stack", kwargs)) or stack
    return SimpleNamespace(create_or_select_stack=create, CommandError=auto.CommandError,
                           LocalWorkspaceOptions=auto.LocalWorkspaceOptions, stack=stack)


def run(request: DeployRequest, calls: list, *, fail: bool = False, which=ALL_TOOLS, version_of=aws_v2,
        first_up: bool = False, resources=()):
    out, err = [], []
    code = deploy.run(request, auto=fake_auto(calls, fail, first_up, resources), which=which, version_of=version_of,
                      out=out.append, err=err.append)
    return code, "\n".join(out), "\n".join(err)


def test_a_first_up_with_an_image_in_the_repository_it_creates_is_refused_before_anything_runs(monkeypatch):
    """The shipped stack files name an MLflow image in `<automation>.dkr.ecr.<region>.amazonaws.com/<name>/mlflow`,
    the repository the stack itself creates: on a stack's first `up` that image cannot exist, and the
    ECS service fails the `up` after waiting for steady state. Refused at once, naming the key and the fix;
    once the stack has its repository (the mlflowImageRepository output) the same file goes through."""
    monkeypatch.setattr(deploy, "offline_plan_gate", lambda request: 0)
    calls: list = []
    code, _, err = run(DeployRequest("up", "dev", project_dir=ROOT), calls, first_up=True)
    assert code == deploy.EXIT_CONFIG_ERROR
    assert "tracking.image names" in err and "Fix: remove tracking.image from Pulumi.dev.yaml" in err and err.count("\n") == 0
    assert not [c for c in calls if c[0] == "up"], "the up ran"
    calls = []
    code, _, _ = run(DeployRequest("up", "dev", project_dir=ROOT), calls)
    assert code == 0 and [c for c in calls if c[0] == "up"]


def test_up_selects_the_stack_in_the_project_dir_after_the_offline_plan_passes(monkeypatch, tmp_path):
    gates = []
    monkeypatch.setattr(deploy, "offline_plan_gate", lambda request: gates.append(request.stack) or 0)
    pack = tmp_path / "policy"
    (pack / ".venv" / "bin").mkdir(parents=True)
    (pack / ".venv" / "bin" / "python").touch()
    calls: list = []
    code, out, _ = run(DeployRequest("up", "dev", project_dir=ROOT, policy_packs=(str(pack),), message="ci #42"), calls)
    assert code == deploy.EXIT_OK and gates == ["dev"]
    # The outputs are read before the up too: a first up must not name an image its own repository lacks.
    (select, select_kwargs), (_, _), (operation, kwargs), (outputs, _) = calls
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
    monkeypatch.setattr(deploy, "policy_pack_python", lambda pack: ROOT)  # the venv "exists"
    request = DeployRequest("preview", "prod", policy_packs=("policy",), expect_no_changes=True)
    code, out, _ = run(request, calls)
    (_, _), (operation, kwargs) = calls
    assert code == 0 and operation == "preview"
    # PreviewResult has change_summary (not summary): its counts are printed.
    assert 'preview: planned {"create": 3, "same": 40}' in out
    assert kwargs["expect_no_changes"] is True and kwargs["diff"] is True and "policy_packs" in kwargs
    kwargs["on_output"]("Updating (prod)")  # progress goes to the caller's stream


@pytest.mark.parametrize("operation", ["destroy", "refresh", "outputs"])
def test_operations_without_a_program_skip_the_plan_and_take_no_policy_packs(monkeypatch, operation):
    monkeypatch.setattr(deploy, "install_policy_pack", lambda pack: pytest.fail("installed a pack"))
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


def test_destroy_of_a_stack_with_protected_resources_is_refused_before_anything_is_deleted():
    """The engine would delete every unprotected resource first and fail at the protected ones
    (pulumi/pulumi pkg/resource/deploy/step.go DeleteStep.Apply: deleteProtectedError, which the
    step executor continues past); the driver refuses up front, naming them and the two ways on."""
    protected = [{"urn": f"urn:pulumi:prod::ml-training-platform::aws:s3/bucket:Bucket::b{i}", "protect": True}
                 for i in range(12)]
    calls: list = []
    code, _, err = run(DeployRequest("destroy", "prod"), calls,
                       resources=(*protected, {"urn": "urn:pulumi:prod::ml-training-platform::aws:iam/role:Role::r"}))
    assert code == deploy.EXIT_FAILED
    assert [name for name, _ in calls] == ["create_or_select_stack"]  # destroy never ran
    assert "refusing to destroy stack 'prod': 12 of its resources are protected" in err
    assert protected[0]["urn"] in err and "and 2 more" in err and "Nothing was deleted" in err
    assert "--exclude-protected" in err and "pulumi state unprotect" in err
    calls.clear()
    code, _, _ = run(DeployRequest("destroy", "prod", exclude_protected=True), calls, resources=tuple(protected))
    assert code == 0 and [name for name, _ in calls] == ["create_or_select_stack", "destroy"]


def test_a_self_contained_run_names_its_backend_and_runs_the_program_inline(monkeypatch, tmp_path):
    """--backend-url reaches the CLI as PULUMI_BACKEND_URL; --inline hands the Automation API the
    program (no language host), run from the folder Pulumi.yaml's main names."""
    from infra.program import run as program

    monkeypatch.setattr(deploy, "offline_plan_gate", lambda request: 0)
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "x")
    monkeypatch.chdir(tmp_path)
    calls: list = []
    request = DeployRequest("preview", "dev", project_dir=ROOT, backend_url=f"file://{tmp_path}", inline=True,
                            secrets_provider="passphrase", aws_cli=False)
    code, _, err = run(request, calls, which={"pulumi": "/usr/bin/pulumi"}.get)
    assert code == 0, err
    (_, select), _ = calls
    assert select["program"] is program and select["project_name"] == "ml-training-platform"
    assert "work_dir" not in select and select["opts"].work_dir == str(ROOT)
    assert select["opts"].env_vars == {"PULUMI_BACKEND_URL": f"file://{tmp_path}"}
    assert select["opts"].secrets_provider == "passphrase"
    assert Path.cwd() == ROOT / "infra"


def test_a_passphrase_stack_without_a_passphrase_stops_before_the_cli(monkeypatch):
    for name in deploy.PASSPHRASE_ENV:
        monkeypatch.delenv(name, raising=False)
    calls: list = []
    code, _, err = run(DeployRequest("refresh", "dev", secrets_provider="passphrase"), calls)
    assert code == deploy.EXIT_CONFIG_ERROR and calls == []
    assert "PULUMI_CONFIG_PASSPHRASE" in err and "never passed on the command line" in err


def test_steps_json_keeps_each_step_and_the_error_diagnostics(monkeypatch, tmp_path):
    from pulumi.automation import events

    monkeypatch.setattr(deploy, "offline_plan_gate", lambda request: 0)
    calls: list = []
    path = tmp_path / "steps.json"
    code, _, _ = run(DeployRequest("preview", "dev", steps_json=path), calls)
    (_, _), (_, kwargs) = calls
    assert code == 0
    recorder = kwargs["on_event"]
    meta = events.StepEventMetadata(op=events.OpType.UPDATE, urn="urn:a", type="t", provider="p", diffs=["spec"])
    recorder(events.EngineEvent(sequence=1, timestamp=1, resource_pre_event=events.ResourcePreEvent(meta)))
    recorder(events.EngineEvent(sequence=2, timestamp=1, diagnostic_event=events.DiagnosticEvent(
        message="boom\n", color="never", severity="error", urn="urn:a")))
    recorder.write(path, "preview")
    written = json.loads(path.read_text())
    assert written["steps"] == [{"urn": "urn:a", "type": "t", "op": "update", "diffs": ["spec"], "replace_keys": [],
                                 "detailed_diff": {}}]
    assert written["diagnostics"] == [{"severity": "error", "urn": "urn:a", "message": "boom"}]


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


def test_cluster_operations_need_an_aws_cli_with_the_v1beta1_token():
    """aws/aws-cli PR #6940 (1.24.0): `eks get-token` returns client.authentication.k8s.io/v1beta1."""
    assert deploy.missing_tools("up", which=ALL_TOOLS, version_of=aws_v2) == []
    for accepted in ("aws-cli/1.24.0 Python/3.10", "aws-cli/1.45.11 Python/3.11"):
        assert deploy.missing_tools("up", which=ALL_TOOLS, version_of=lambda _, v=accepted: v) == [], accepted
    [problem] = deploy.missing_tools("up", which=ALL_TOOLS, version_of=lambda _: "aws-cli/1.23.13 Python/3.9")
    assert "aws-cli/1.23.13" in problem and "1.24.0" in problem and "v1beta1" in problem
    [problem] = deploy.missing_tools("refresh", which={"pulumi": "/usr/bin/pulumi"}.get, version_of=aws_v2)
    assert "aws eks get-token" in problem
    # Reading outputs never calls the cluster.
    assert deploy.missing_tools("outputs", which={"pulumi": "/usr/bin/pulumi"}.get) == []


def test_command_line_without_any_cli_exits_3_with_a_clear_message(tmp_path):
    # An empty PATH: no pulumi, no aws.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    result = subprocess.run([sys.executable, "-m", "infra.plan.deploy", "preview", "--stack", "dev"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={"PATH": str(bin_dir), "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)})
    assert result.returncode == deploy.EXIT_MISSING_TOOL, result.stderr
    assert "Pulumi CLI" in result.stderr and "AWS CLI v2" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_unknown_operation_is_refused():
    with pytest.raises(ValueError, match="use one of preview, up"):
        DeployRequest("apply", "dev")


def test_ci_workflow_previews_on_pull_requests_and_deploys_on_merge():
    """The workflow's structure; tests/infra/test_workflow.py lints it and checks its credentials."""
    workflow = yaml.safe_load((ROOT / ".github/workflows/platform.yml").read_text())
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as true
    assert "pull_request" in triggers and triggers["push"]["branches"] == ["main"]
    stacks = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in ROOT.glob("Pulumi.*.yaml"))
    for job_name, operation in (("preview", "preview"), ("deploy", "up")):
        job = workflow["jobs"][job_name]
        assert sorted(leg["stack"] for leg in job["strategy"]["matrix"]["include"]) == stacks
        assert job["permissions"]["id-token"] == "write"
        assert any(f"python -m infra.plan.deploy {operation} " in s.get("run", "") for s in job["steps"])
    assert "AWS_SECRET_ACCESS_KEY" not in (ROOT / ".github/workflows/platform.yml").read_text()
    assert any(s.get("run") == "bash .ci/run" for s in workflow["jobs"]["test"]["steps"])


def test_a_wrong_automation_api_call_fails_against_the_real_signature(monkeypatch):
    """The fake is autospecced: a misspelled keyword (policy_pack) is a TypeError, reported as a message."""
    monkeypatch.setattr(deploy, "offline_plan_gate", lambda request: 0)
    code, _, err = run(DeployRequest("up", "dev", extra={"policy_pack": ["x"]}), [])
    assert code == deploy.EXIT_FAILED
    assert "TypeError" in err and "policy_pack" in err and "Traceback" not in err


def test_up_hides_secrets_and_new_stacks_get_the_secrets_provider(monkeypatch):
    monkeypatch.setattr(deploy, "offline_plan_gate", lambda request: 0)
    calls: list = []
    provider = "awskms://alias/mlp-dev-pulumi-state?region=us-west-2"
    code, out, _ = run(DeployRequest("up", "dev", secrets_provider=provider), calls)
    (_, select), _, (_, kwargs), _ = calls
    assert code == 0
    assert select["opts"].secrets_provider == provider
    assert kwargs["show_secrets"] is False and kwargs["suppress_outputs"] is True
    assert 'up: succeeded {"create": 3}' in out and "token-ish" not in out


def test_any_other_error_is_a_message_not_a_traceback(monkeypatch):
    import pulumi.automation as auto

    monkeypatch.setattr(deploy, "offline_plan_gate", lambda request: 0)
    calls: list = []
    fake = fake_auto(calls)
    fake.create_or_select_stack.side_effect = auto.InvalidVersionError("Minimum version requirement failed")
    out, err = [], []
    code = deploy.run(DeployRequest("up", "dev"), auto=fake, which=ALL_TOOLS, version_of=aws_v2,
                      out=out.append, err=err.append)
    assert code == deploy.EXIT_FAILED
    assert "InvalidVersionError" in err[0] and "Minimum version" in err[0] and "stack 'dev'" in err[0]


def test_a_missing_policy_pack_venv_is_created_from_its_requirements(monkeypatch, tmp_path):
    """pulumi/pulumi#16605: `pulumi install` does not create a pack's venv; infra.plan.deploy does."""
    monkeypatch.setattr(deploy, "offline_plan_gate", lambda request: 0)
    pack = tmp_path / "pack"
    pack.mkdir()
    (pack / "PulumiPolicy.yaml").write_text("runtime: python\n")
    (pack / "requirements.txt").write_text("pulumi-policy==1.21.0\n")
    commands = []
    monkeypatch.setattr(deploy.venv, "EnvBuilder", lambda **kw: SimpleNamespace(create=lambda d: commands.append(("venv", d))))
    monkeypatch.setattr(deploy.subprocess, "run", lambda cmd, **kw: commands.append(cmd) or SimpleNamespace(returncode=0))
    calls: list = []
    code, out, _ = run(DeployRequest("preview", "dev", policy_packs=(str(pack),)), calls)
    assert code == 0
    assert commands[0] == ("venv", pack / ".venv")
    assert commands[1] == [str(pack / ".venv/bin/python"), "-m", "pip", "install", "-q", "-r", str(pack / "requirements.txt")]
    assert "creating the virtualenv of policy pack" in out


def _pulumi_glob(glob: str) -> "re.Pattern[str]":
    """pulumi/pulumi pkg/resource/deploy UrnTargets.getMatcher: `**` is `.*`, `*` is `[^:]*`, anchored."""
    import re

    segments = ["[^:]*".join(re.escape(part) for part in segment.split("*")) for segment in glob.split("**")]
    return re.compile("^" + ".*".join(segments) + "$")


def test_read_only_preview_leaves_out_exactly_the_in_cluster_resources(dev_plan):
    request = DeployRequest("preview", "dev", read_only=True)
    kwargs = deploy.operation_kwargs(request, print)
    matchers = [_pulumi_glob(glob) for glob in kwargs["exclude"]]
    excluded = {r.urn for r in dev_plan.recording.resources if any(m.match(r.urn) for m in matchers)}
    for resource in dev_plan.recording.resources:
        # The Kubernetes resources, their children, and the Kubernetes provider itself (it dials the API).
        in_cluster = resource.type == "pulumi:providers:kubernetes" or any(
            t.startswith("kubernetes:") for t in resource.urn.split("::")[2].split("$"))
        assert (resource.urn in excluded) == in_cluster, resource.urn
    assert any(r.type.startswith("aws:") for r in dev_plan.recording.resources if r.urn not in excluded)
    with pytest.raises(ValueError, match="preview only"):
        DeployRequest("up", "dev", read_only=True)


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_a_read_only_preview_of_a_new_stack_has_no_dependent_of_an_excluded_resource(stack, request):
    """pulumi/pulumi pkg/resource/deploy/step_generator.go: a resource that is not excluded but
    depends on an excluded one that is not in the state yet gets
    ``GetResourceWillBeCreatedButWasNotSpecifiedInTargetList`` and ``sawError = true``: the
    preview fails, unless ``--exclude-dependents`` leaves those out too. On a stack's first
    preview (nothing in state) every AWS resource that waits for an in-cluster one is such a
    dependent (the GPU idle alarm on the Container Insights release, an add-on on a NodePool)."""
    plan = request.getfixturevalue(f"{stack}_plan")
    kwargs = deploy.operation_kwargs(DeployRequest("preview", stack, read_only=True), print)
    matchers = [_pulumi_glob(glob) for glob in kwargs["exclude"]]
    excluded = {r.urn for r in plan.recording.resources if any(m.match(r.urn) for m in matchers)}
    if kwargs.get("exclude_dependents"):
        excluded = {r.urn for r in plan.recording.resources} - {r.urn for r in _phase_one(plan.recording, kwargs["exclude"])}
    refused = sorted(r.name for r in plan.recording.resources if r.urn not in excluded
                     and {r.parent, r.provider, *r.dependencies} & excluded)
    assert not refused, f"the preview would fail: these depend on left-out resources not in state: {refused}"
    assert any(r.type.startswith("aws:eks/cluster") for r in plan.recording.resources if r.urn not in excluded)


def test_read_only_preview_tells_the_program_to_use_the_reader_roles(monkeypatch):
    from infra.ci import READ_ONLY_ENV

    monkeypatch.setattr(deploy, "offline_plan_gate", lambda request: 0)
    calls: list = []
    code, _, _ = run(DeployRequest("preview", "dev", read_only=True), calls)
    (_, select), (_, kwargs) = calls
    assert code == 0 and select["opts"].env_vars == {READ_ONLY_ENV: "1"} and kwargs["exclude"]


def _phase_one(recording, exclude):
    """What Pulumi's ``--exclude <globs> --exclude-dependents`` leaves: the matched resources and,
    transitively, every resource whose parent, provider or dependencies include one of them
    (pulumi/pulumi pkg/resource/deploy/deployment_executor.go, excludes + ExcludeDependents)."""
    matchers = [_pulumi_glob(glob) for glob in exclude]
    excluded = {r.urn for r in recording.resources if any(m.match(r.urn) for m in matchers)}
    changed = True
    while changed:
        changed = False
        for r in recording.resources:
            if r.urn in excluded:
                continue
            edges = {r.parent, r.provider, *r.dependencies, *(u for us in r.property_dependencies.values() for u in us)}
            if edges & excluded:
                excluded.add(r.urn)
                changed = True
    return [r for r in recording.resources if r.urn not in excluded]


def test_first_prod_up_phase_one_creates_the_cluster_and_the_in_vpc_runner_without_the_api(prod_plan):
    """aws-readiness-4 N1: prod's endpoint is private and the runner is created by the stack it
    deploys. Phase 1 (`up --aws-only`, from the administrator's machine) must contain the cluster,
    the CI roles and the CodeBuild runner with its webhook, and nothing that dials the API server;
    phase 2 is CI's whole `up` on that runner."""
    kwargs = deploy.operation_kwargs(DeployRequest("up", "prod", aws_only=True), print)
    assert kwargs["exclude_dependents"] is True
    kept = _phase_one(prod_plan.recording, kwargs["exclude"])
    types = {r.type for r in kept}
    assert not [r.urn for r in kept if r.type.startswith("kubernetes:") or r.type == "pulumi:providers:kubernetes"]
    assert {"aws:codebuild/project:Project", "aws:codebuild/webhook:Webhook", "aws:eks/cluster:Cluster"} <= types
    roles = {r.name for r in kept if r.type == "aws:iam/role:Role"}
    assert any(name.endswith("ci-deploy") for name in roles), sorted(roles)
    runner = next(r for r in kept if r.type == "aws:codebuild/project:Project")
    assert "runner" in runner.name
    with pytest.raises(ValueError, match="preview and up only"):
        DeployRequest("destroy", "prod", aws_only=True)
    assert deploy.parse_args(["up", "--stack", "prod", "--aws-only"]).aws_only
