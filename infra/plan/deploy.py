"""Drive a stack through the Pulumi Automation API: what CI (and a careful human) runs.

    python -m infra.plan.deploy {preview,up,destroy,refresh,outputs} --stack NAME [--policy-pack DIR]...
    python -m infra.plan.deploy install-policy-pack DIR

Where the state lives and how the program runs:

- ``--backend-url URL``: the state backend for this run (``s3://...``, or ``file://DIR`` for a
  self-contained run); otherwise the CLI's login (``pulumi login``, or ``PULUMI_BACKEND_URL``).
- ``--secrets-provider passphrase`` creates a stack whose secrets are encrypted with the
  passphrase in ``PULUMI_CONFIG_PASSPHRASE`` or ``PULUMI_CONFIG_PASSPHRASE_FILE`` (never on the
  command line).
- ``--inline`` runs the program in this process (the Automation API's inline program: the CLI
  attaches to it with ``--client``), with this interpreter and its packages, in the folder
  Pulumi.yaml's ``main`` names, as the language host would; no ``pulumi-language-python`` plugin
  and no program virtualenv are needed. Project and stack settings still come from the project
  directory.

Order of work, each step able to stop the run:

1. the tools it needs are there: the ``pulumi`` CLI always, and the AWS CLI (v2, or v1 from
   1.24.0) for every operation that talks to the cluster (pulumi-eks kubeconfigs run
   ``aws eks get-token``); each policy pack's virtualenv (created from its requirements.txt when
   missing: ``pulumi install`` does not do it for a pack inside a program, pulumi/pulumi#16605);
2. ``preview`` and ``up`` run the offline plan first (``python -m infra.plan``): a config
   mistake or a mandatory plan error stops here, before any credential is used;
3. the stack is selected, or created, in the project directory (the stack file
   ``Pulumi.<NAME>.yaml`` beside ``Pulumi.yaml``);
4. the operation runs with progress streamed line by line and the policy packs passed on;
5. the change summary is printed (a preview's ``change_summary``, an update's ``summary``);
   ``up`` and ``outputs`` print the stack outputs, secret values redacted.

``destroy`` of a stack that holds protected resources is refused before anything is deleted
(the engine itself would delete every other resource first and stop at the protected ones):
``--exclude-protected`` removes the rest and keeps them.

Exit codes: 0 done, 1 the operation failed, 2 the stack config is invalid, 3 a tool is missing.
Every failure is a message naming the stack and the fix, never a traceback.
This layer stays thin on purpose: what it sends to the Automation API is built by
``operation_kwargs`` and tested without the CLI.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from infra.ci import READ_ONLY_ENV

ROOT = Path(__file__).resolve().parents[2]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG_ERROR = 2
EXIT_MISSING_TOOL = 3

OPERATIONS = ("preview", "up", "destroy", "refresh", "outputs")
# Operations that run the program (and so are gated by the offline plan).
PLANNED_OPERATIONS = frozenset({"preview", "up"})
# Operations whose Kubernetes provider calls the cluster through the kubeconfig's exec plugin.
CLUSTER_OPERATIONS = frozenset({"preview", "up", "destroy", "refresh"})
# The Automation API accepts policy packs on these only (see Stack.preview / Stack.up).
POLICY_OPERATIONS = frozenset({"preview", "up"})

PULUMI_INSTALL = "https://www.pulumi.com/docs/iac/download-install/"
AWS_CLI_INSTALL = "https://docs.aws.amazon.com/cli/latest/userguide/getting-started-install.html"
# `aws eks get-token` returns client.authentication.k8s.io/v1beta1 from AWS CLI 1.24.0 on
# (aws/aws-cli PR #6940; aws/containers-roadmap#1736) and in every v2 release since 2.7.0.
AWS_CLI_V1_MINIMUM = (1, 24, 0)
# What the engine runs for a Python pack: <pack>/<virtualenv>/bin/python -u -m pulumi.policy
# (pulumi/pulumi sdk/python/dist/pulumi-analyzer-policy-python), so that directory must exist.
POLICY_PACK_VENV = ".venv"
# URN globs (`pulumi preview --exclude`, `**` spans `::`) of everything the Kubernetes provider owns.
READ_ONLY_EXCLUDE = ("**kubernetes:**",)
# The Pulumi CLI's passphrase secrets provider reads one of these (never a command-line argument).
PASSPHRASE_ENV = ("PULUMI_CONFIG_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE_FILE")
# How many protected URNs a refused destroy lists before "and N more".
PROTECTED_LISTED = 10


@dataclass(frozen=True)
class DeployRequest:
    """One run of ``python -m infra.plan.deploy``."""

    operation: str
    stack: str
    project_dir: Path = ROOT
    policy_packs: tuple[str, ...] = ()
    message: Optional[str] = None
    parallel: Optional[int] = None
    # CI's drift check: a preview that would change anything fails.
    expect_no_changes: bool = False
    # `pulumi destroy` of a stack whose resources are `protect`ed stops at the first one; this
    # removes the unprotected resources and leaves the protected ones (prod's data) in place.
    exclude_protected: bool = False
    skip_plan: bool = False
    # Used when the stack is created (e.g. awskms://alias/mlp-prod-pulumi-state?region=us-west-2);
    # an existing stack keeps the provider recorded in its stack file (`secretsprovider`).
    secrets_provider: Optional[str] = None
    # A pull-request preview with CI's read-only role: the program's AWS providers assume the
    # stack's <name>-ci-reader roles (infra.ci), and the in-cluster resources are left out, since
    # a server-side dry-run needs write access (they are checked offline by infra.plan/render).
    read_only: bool = False
    # The first prod `up` (aws-readiness-4 N1): its API endpoint is private and the in-VPC CI runner
    # does not exist yet, so phase "aws" (from the administrator's machine) creates everything but
    # the in-cluster resources and what depends on them: the VPC, the cluster, the CI roles and the
    # runner. Phase 2 is the whole `up`, run by CI on that runner (docs/runbooks/first-deploy.md).
    aws_only: bool = False
    # The state backend for this run (PULUMI_BACKEND_URL for the CLI): s3://..., file://DIR.
    backend_url: Optional[str] = None
    # Run the program in this process (Automation API inline program), not through the language host.
    inline: bool = False
    # False where the cluster's kubeconfig authenticates without `aws eks get-token` (a test
    # control plane's client certificate): the AWS CLI is then not required.
    aws_cli: bool = True
    # Write the engine's steps (URN, type, operation, changed properties) and its error and warning
    # diagnostics here as JSON, for a machine to read (a pull-request comment, a drift report).
    steps_json: Optional[Path] = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.operation not in OPERATIONS:
            raise ValueError(f"operation {self.operation!r}: use one of {', '.join(OPERATIONS)}")
        if self.read_only and self.operation != "preview":
            raise ValueError(f"--read-only is for preview only, not {self.operation}")
        if self.aws_only and self.operation not in ("preview", "up"):
            raise ValueError(f"--aws-only is for preview and up only, not {self.operation}")


# -- 1. tools --------------------------------------------------------------------------------
def missing_tools(
    operation: str,
    *,
    which: Callable[[str], Optional[str]] = shutil.which,
    version_of: Optional[Callable[[str], str]] = None,
    aws_cli: bool = True,
) -> list[str]:
    """One message per missing prerequisite, with the fix; empty when all are there."""
    version_of = version_of or _version_output
    problems = []
    if which("pulumi") is None:
        problems.append(f"the Pulumi CLI (`pulumi`) is not on PATH: the Automation API drives it; install it ({PULUMI_INSTALL})")
    if operation in CLUSTER_OPERATIONS and aws_cli:
        if which("aws") is None:
            problems.append(
                "the AWS CLI v2 (`aws`) is not on PATH: the cluster's kubeconfig runs `aws eks get-token` "
                f"for every Kubernetes resource; install it ({AWS_CLI_INSTALL})")
        else:
            version = version_of("aws")
            match = re.search(r"aws-cli/(\d+)\.(\d+)\.(\d+)", version)
            found = tuple(int(part) for part in match.groups()) if match else None
            if found is None or (found[0] < 2 and found < AWS_CLI_V1_MINIMUM):
                problems.append(
                    f"`aws --version` says {version.strip() or 'nothing'!r}: the kubeconfig needs an AWS CLI whose "
                    "`aws eks get-token` returns the client.authentication.k8s.io/v1beta1 API (v2, or v1 from "
                    f"1.24.0); install v2 ({AWS_CLI_INSTALL})")
    return problems


def policy_pack_python(pack: Path) -> Path:
    return Path(pack) / POLICY_PACK_VENV / "bin" / "python"


def install_policy_pack(pack: Path, *, run_command: Optional[Callable[..., Any]] = None) -> list[str]:
    """Create ``<pack>/.venv`` from ``<pack>/requirements.txt``; the problems, empty when done."""
    pack = Path(pack)
    requirements = pack / "requirements.txt"
    if not (pack / "PulumiPolicy.yaml").is_file():
        return [f"policy pack {pack}: no PulumiPolicy.yaml there; pass the pack's directory (e.g. policypack)"]
    if not requirements.is_file():
        return [f"policy pack {pack}: no requirements.txt to install its virtualenv from"]
    python = policy_pack_python(pack)
    if not python.exists():
        venv.EnvBuilder(with_pip=True, clear=False).create(pack / POLICY_PACK_VENV)
    done = (run_command or subprocess.run)([str(python), "-m", "pip", "install", "-q", "-r", str(requirements)],
                       capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return [f"policy pack {pack}: `pip install -r {requirements}` failed (exit {done.returncode}):\n"
                f"{(done.stderr or done.stdout).strip()[-2000:]}"]
    return []


def _version_output(tool: str) -> str:
    try:
        done = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    # AWS CLI v1 printed its version on stderr.
    return done.stdout or done.stderr


# -- 2. the offline plan as a gate -------------------------------------------------------------
def offline_plan_gate(request: DeployRequest) -> int:
    """Exit code of ``python -m infra.plan`` for this stack (0: go on)."""
    # The registered module, as `python -m infra.plan` uses it: capabilities add their
    # warnings and sections to that one.
    from infra import plan

    return plan.main(["--stack", request.stack, "--project-dir", str(request.project_dir)])


# -- 3./4. the Automation API calls ------------------------------------------------------------
def operation_kwargs(request: DeployRequest, on_output: Callable[[str], Any]) -> dict[str, Any]:
    """Keyword arguments for ``Stack.<operation>`` (nothing for ``outputs``)."""
    if request.operation == "outputs":
        return {}
    kwargs: dict[str, Any] = {"on_output": on_output, "color": "never"}
    if request.message:
        kwargs["message"] = request.message
    if request.parallel:
        kwargs["parallel"] = request.parallel
    if request.operation in POLICY_OPERATIONS and request.policy_packs:
        kwargs["policy_packs"] = [str(Path(p).resolve()) for p in request.policy_packs]
    if request.operation == "preview":
        kwargs["diff"] = True
        if request.read_only:
            # Their dependents too: on a stack's first preview an AWS resource that waits for an
            # in-cluster one (the GPU idle alarm on the Container Insights release) would fail the
            # preview (pulumi pkg/resource/deploy/step_generator.go: "will be created but was not
            # specified in the target list").
            kwargs["exclude"] = list(READ_ONLY_EXCLUDE)
            kwargs["exclude_dependents"] = True
    if request.aws_only:
        # Pulumi's --exclude with --exclude-dependents: the Kubernetes provider, every in-cluster
        # object, and every resource that depends on one, are left for phase 2.
        kwargs["exclude"] = list(READ_ONLY_EXCLUDE)
        kwargs["exclude_dependents"] = True
    if request.operation in ("preview", "refresh") and request.expect_no_changes:
        kwargs["expect_no_changes"] = True
    if request.operation in ("up", "destroy", "refresh"):
        # The API's default (True) reads `stack history --show-secrets` to fill the result's
        # summary.config with decrypted config values; nothing here needs them.
        kwargs["show_secrets"] = False
    if request.operation == "up":
        # The CLI's own outputs table is not printed; `redacted_outputs` prints them instead.
        kwargs["suppress_outputs"] = True
    if request.operation == "destroy" and request.exclude_protected:
        kwargs["exclude_protected"] = True
    kwargs.update(request.extra)
    return kwargs


def image_before_its_repository(request: DeployRequest, outputs: dict[str, Any]) -> Optional[str]:
    """The first `up` of a stack whose file names an MLflow image in the repository that this same
    `up` creates (the shipped example files do): the ECS service would wait for steady state on an
    image that cannot exist yet and fail the `up` after that wait. A stack that has an
    ``mlflowImageRepository`` output has the repository. None: nothing to refuse."""
    from infra.config import load_platform_config
    from infra.plan import raw_project_config, read_stack_file, stack_file

    if request.operation != "up" or "mlflowImageRepository" in outputs:
        return None
    path = stack_file(request.stack, request.project_dir)
    if not path.is_file():
        return None
    values, _ = read_stack_file(path)
    config = load_platform_config(raw_project_config(values), source=path.name)
    image = config.tracking.image if config.tracking is not None else None
    if not image:
        return None
    repository = f"{config.accounts.automation.id}.dkr.ecr.{config.region}.amazonaws.com/{config.name}/mlflow"
    if not image.startswith(repository + ":") and not image.startswith(repository + "@"):
        return None
    return (f"tracking.image names {image}, in {repository}, which this stack's first `up` creates: the image "
            f"cannot be there yet. Fix: remove tracking.image from {path.name}, run up, push the image "
            "(docs/runbooks/first-deploy.md steps 4-6), then set it and run up again")
def workspace_env(request: DeployRequest) -> Optional[dict[str, str]]:
    """Environment the workspace gives the CLI (and, inline, the program reads) on top of ours."""
    env = {}
    if request.read_only:
        env[READ_ONLY_ENV] = "1"
    if request.backend_url:
        env["PULUMI_BACKEND_URL"] = request.backend_url
    return env or None


class StepRecorder:
    """The Automation API's ``on_event`` callback keeping what ``--steps-json`` writes."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.diagnostics: list[dict[str, Any]] = []

    def __call__(self, event: Any) -> None:
        pre = getattr(event, "resource_pre_event", None)
        if pre is not None and pre.metadata is not None:
            meta = pre.metadata
            self.steps.append({
                "urn": meta.urn, "type": meta.type, "op": getattr(meta.op, "value", meta.op),
                "diffs": sorted(meta.diffs or []), "replace_keys": sorted(meta.keys or []),
                "detailed_diff": {path: getattr(d.diff_kind, "value", d.diff_kind)
                                  for path, d in sorted((meta.detailed_diff or {}).items())},
            })
        diagnostic = getattr(event, "diagnostic_event", None)
        if diagnostic is not None and diagnostic.severity in ("error", "warning"):
            self.diagnostics.append({"severity": diagnostic.severity, "urn": diagnostic.urn,
                                     "message": diagnostic.message.strip()})

    def write(self, path: Path, operation: str) -> None:
        Path(path).write_text(json.dumps({"operation": operation, "steps": self.steps,
                                          "diagnostics": self.diagnostics}, indent=1, sort_keys=True))


def select_stack(request: DeployRequest, auto: Any):
    """The stack NAME of the project in ``project_dir``, created if it does not exist yet."""
    opts = auto.LocalWorkspaceOptions(
        work_dir=str(request.project_dir), secrets_provider=request.secrets_provider,
        env_vars=workspace_env(request))
    if request.inline:
        from infra.plan import read_project
        from infra.program import run as program

        # The project's name as Pulumi.yaml gives it (the workspace reads that file from work_dir).
        name = yaml_project_name(request.project_dir)
        # As the language host runs it: in the folder Pulumi.yaml's `main` names, which is also
        # where the CLI starts the providers (paths the program passes them are relative to it).
        os.chdir(read_project(request.project_dir).working_dir)
        return auto.create_or_select_stack(stack_name=request.stack, project_name=name, program=program, opts=opts)
    return auto.create_or_select_stack(stack_name=request.stack, work_dir=str(request.project_dir), opts=opts)


def yaml_project_name(project_dir: Path) -> str:
    import yaml

    document = yaml.safe_load((Path(project_dir) / "Pulumi.yaml").read_text()) or {}
    return str(document.get("name", ""))


def protected_resources(stack: Any) -> list[str]:
    """URNs of the stack's resources marked ``protect`` in its state (empty for a new stack)."""
    deployment = stack.export_stack().deployment or {}
    return [resource["urn"] for resource in deployment.get("resources") or [] if resource.get("protect")]


def protected_destroy_message(stack_name: str, urns: list[str]) -> str:
    listed = "".join(f"\n  - {urn}" for urn in urns[:PROTECTED_LISTED])
    more = f"\n  ... and {len(urns) - PROTECTED_LISTED} more" if len(urns) > PROTECTED_LISTED else ""
    count = "1 of its resources is" if len(urns) == 1 else f"{len(urns)} of its resources are"
    return (
        f"error: refusing to destroy stack '{stack_name}': {count} protected (`protect`: data and "
        f"account-wide resources the stack keeps on purpose):{listed}{more}\n"
        "`pulumi destroy` would delete every other resource first and then stop at these. Nothing was deleted.\n"
        f"FIX: to remove everything but them, run `python -m infra.plan.deploy destroy --stack {stack_name} "
        "--exclude-protected`; to delete them as well (their data is lost), unprotect them first "
        f"(`pulumi state unprotect --all --stack {stack_name}`) and run destroy again.")


def change_summary_line(operation: str, result: Any) -> Optional[str]:
    """`preview: {"create": 3}` from a PreviewResult's change_summary or an UpResult's summary."""
    if hasattr(result, "change_summary"):
        changes, outcome = result.change_summary, "planned"
    elif getattr(result, "summary", None) is not None:
        changes, outcome = result.summary.resource_changes, result.summary.result
    else:
        return None
    counts = {getattr(op, "value", op): count for op, count in (changes or {}).items()}
    return f"{operation}: {outcome} {json.dumps(counts, sort_keys=True)}"


def redacted_outputs(outputs: dict[str, Any]) -> dict[str, Any]:
    """Stack outputs as plain data; secret values (the kubeconfig) replaced by a marker."""
    return {key: "[secret]" if getattr(value, "secret", False) else getattr(value, "value", value)
            for key, value in sorted(outputs.items())}


def run(
    request: DeployRequest,
    *,
    auto: Any = None,
    which: Callable[[str], Optional[str]] = shutil.which,
    version_of: Optional[Callable[[str], str]] = None,
    out: Callable[[str], Any] = print,
    err: Callable[[str], Any] = lambda line: print(line, file=sys.stderr),
) -> int:
    problems = missing_tools(request.operation, which=which, version_of=version_of, aws_cli=request.aws_cli)
    if problems:
        err(f"error: cannot run `pulumi {request.operation}` for stack '{request.stack}':")
        for problem in problems:
            err(f"  - {problem}")
        return EXIT_MISSING_TOOL

    if request.operation in PLANNED_OPERATIONS and not request.skip_plan:
        code = offline_plan_gate(request)
        if code != EXIT_OK:
            err(f"error: the offline plan of stack '{request.stack}' failed (exit {code}); "
                f"fix what it reports, then run `python -m infra.plan.deploy {request.operation}` again")
            return EXIT_CONFIG_ERROR if code == EXIT_CONFIG_ERROR else EXIT_FAILED

    if request.operation in POLICY_OPERATIONS:
        for pack in request.policy_packs:
            if not policy_pack_python(Path(pack)).exists():
                out(f"creating the virtualenv of policy pack {pack} from its requirements.txt")
                problems = install_policy_pack(Path(pack))
                if problems:
                    for problem in problems:
                        err(f"error: {problem}")
                    return EXIT_MISSING_TOOL

    if request.secrets_provider == "passphrase" and not any(os.environ.get(name) for name in PASSPHRASE_ENV):
        err(f"error: --secrets-provider passphrase for stack '{request.stack}': set {PASSPHRASE_ENV[0]} "
            f"(or {PASSPHRASE_ENV[1]}, a file holding it) in the environment; it is never passed on the command line")
        return EXIT_CONFIG_ERROR

    if auto is None:
        import pulumi.automation as auto

    recorder = StepRecorder() if request.steps_json and request.operation != "outputs" else None
    try:
        stack = select_stack(request, auto)
        problem = image_before_its_repository(request, stack.outputs()) if request.operation == "up" else None
        if problem:
            err(f"error: stack '{request.stack}': {problem}")
            return EXIT_CONFIG_ERROR
        if request.operation == "destroy" and not request.exclude_protected:
            protected = protected_resources(stack)
            if protected:
                err(protected_destroy_message(request.stack, protected))
                return EXIT_FAILED
        if request.operation != "outputs":
            kwargs = operation_kwargs(request, out)
            if recorder is not None:
                kwargs["on_event"] = recorder
            try:
                result = getattr(stack, request.operation)(**kwargs)
            finally:
                if recorder is not None:
                    recorder.write(request.steps_json, request.operation)
            line = change_summary_line(request.operation, result)
            if line:
                out(line)
        if request.operation in ("up", "outputs"):
            out(json.dumps(redacted_outputs(stack.outputs()), indent=1, sort_keys=True, default=str))
    except auto.CommandError as error:
        err(f"error: `pulumi {request.operation}` failed for stack '{request.stack}':\n{error}")
        return EXIT_FAILED
    except Exception as error:  # noqa: BLE001 - e.g. InvalidVersionError: a message, not a traceback
        err(f"error: `pulumi {request.operation}` for stack '{request.stack}' could not run: "
            f"{type(error).__name__}: {error}")
        return EXIT_FAILED
    return EXIT_OK


def parse_args(argv: Optional[list[str]] = None) -> DeployRequest:
    parser = argparse.ArgumentParser(prog="python -m infra.plan.deploy", description=__doc__.split("\n\n")[0])
    parser.add_argument("operation", choices=OPERATIONS)
    parser.add_argument("--stack", required=True, help="stack name (Pulumi.<stack>.yaml in the project directory)")
    parser.add_argument("--policy-pack", action="append", default=[], metavar="DIR",
                        help="a policy pack directory to enforce (preview and up); repeatable")
    parser.add_argument("--project-dir", type=Path, default=None,
                        help="directory holding Pulumi.yaml (default: the nearest one from the working directory up)")
    parser.add_argument("--message", help="update message recorded in the stack history")
    parser.add_argument("--parallel", type=int, help="resource operations run at once")
    parser.add_argument("--expect-no-changes", action="store_true", help="fail a preview or refresh that finds changes")
    parser.add_argument("--exclude-protected", action="store_true",
                        help="destroy: remove everything but the protected (stateful) resources")
    parser.add_argument("--skip-plan", action="store_true", help="do not run the offline plan first (not for CI)")
    parser.add_argument("--read-only", action="store_true",
                        help="preview with CI's read-only reader roles, in-cluster resources left out (pull requests)")
    parser.add_argument("--aws-only", action="store_true",
                        help="preview/up everything but the in-cluster resources and their dependents (first prod up, phase 1)")
    parser.add_argument("--secrets-provider",
                        help="secrets provider for a new stack, e.g. awskms://alias/<name>-pulumi-state, or passphrase "
                             "(from PULUMI_CONFIG_PASSPHRASE or PULUMI_CONFIG_PASSPHRASE_FILE)")
    parser.add_argument("--backend-url", help="state backend for this run, e.g. s3://BUCKET or file://DIR "
                                              "(default: the CLI's login)")
    parser.add_argument("--inline", action="store_true",
                        help="run the program in this process (no pulumi-language-python plugin, no program virtualenv)")
    parser.add_argument("--steps-json", type=Path, metavar="PATH",
                        help="write the engine's steps (URN, operation, changed properties) and its error and "
                             "warning diagnostics to PATH as JSON")
    parser.add_argument("--no-aws-cli", action="store_true",
                        help="the cluster's kubeconfig does not run `aws eks get-token` (a test control plane): "
                             "do not require the AWS CLI")
    args = parser.parse_args(argv)
    from infra.plan import default_project_dir

    return DeployRequest(
        operation=args.operation, stack=args.stack, project_dir=(args.project_dir or default_project_dir()).resolve(),
        policy_packs=tuple(args.policy_pack), message=args.message, parallel=args.parallel,
        expect_no_changes=args.expect_no_changes, exclude_protected=args.exclude_protected,
        skip_plan=args.skip_plan, secrets_provider=args.secrets_provider, read_only=args.read_only,
        aws_only=args.aws_only, backend_url=args.backend_url, inline=args.inline, aws_cli=not args.no_aws_cli,
        steps_json=args.steps_json,
    )


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["install-policy-pack"]:
        if len(argv) != 2:
            print("usage: python -m infra.plan.deploy install-policy-pack DIR", file=sys.stderr)
            return EXIT_CONFIG_ERROR
        problems = install_policy_pack(Path(argv[1]))
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        if not problems:
            print(f"policy pack {argv[1]}: {policy_pack_python(Path(argv[1]))} ready")
        return EXIT_MISSING_TOOL if problems else EXIT_OK
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
