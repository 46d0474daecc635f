"""Offline plan: run a stack's real program with no CLI, network or credentials.

    python -m infra.plan --stack dev [--json plan.json]

Reads ``Pulumi.<stack>.yaml``, validates it (every problem at once, exit 2, no traceback),
runs ``infra.program.main`` under the recording mock engine and prints the resource tree,
a count per account and the warnings a platform engineer must read before ``pulumi up``.
``--json`` writes the resource graph, one object per resource (a stable interface):
``{"type", "name", "parent", "provider", "account", "remote", "protect",
"retain_on_delete", "inputs", "urn", "id", "dependencies"}`` (README, "The offline plan").

This package is the offline wing beside the program: the recording engine and its fabricated
outputs (``mock_engine``, ``mock_outputs``), the provider rules and the pulumi-eks model it shares
with the stand-in provider plugins (``input_rules``, ``pulumi_eks``; tools/engine/standins) and the tools that run the program without a cloud
(``urns``, ``security_scan``, ``deploy``, ``config_reference``, ``upgrade``). It imports the
program; nothing `pulumi up` runs imports it (tests/infra/test_layout.py).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Optional

import yaml

from workloads.problems import InvalidInputError, Problem
from infra import costs, program
from infra.capabilities import CAPABILITIES
from infra.config import PROJECT, PlatformConfig, load_platform_config
from infra.costs import CostLine
from infra.plan.mock_engine import EngineRefusal, run_recorded
from infra.recording import SECRET_PLACEHOLDER, Recording, RecordedResource

if TYPE_CHECKING:
    from infra.plan.second_up import SecondUp

ROOT = Path(__file__).resolve().parents[2]


def default_project_dir(start: Optional[Path] = None) -> Path:
    """The nearest directory holding Pulumi.yaml, from the working directory up.

    Installed as a package (not from a checkout), this module lives in site-packages, where
    no stack file is: the project is where the user runs the command.
    """
    start = (start or Path.cwd()).resolve()
    for directory in (start, *start.parents):
        if (directory / "Pulumi.yaml").is_file():
            return directory
    return ROOT
EXIT_CONFIG_ERROR = 2
# `pulumi preview` would fail: a mandatory warning, or a program the engine refuses (EngineRefusal).
EXIT_FAILED = 1


@dataclass
class Plan:
    stack: str
    config: PlatformConfig
    recording: Recording
    graph: list[dict[str, Any]]
    warnings: list[str]
    sections: list[tuple[str, list[str]]]


# -- reading stack files -----------------------------------------------------------------
def stack_file(stack: str, project_dir: Path = ROOT) -> Path:
    return project_dir / f"Pulumi.{stack}.yaml"


def available_stacks(project_dir: Path = ROOT) -> list[str]:
    return sorted(p.name[len("Pulumi."):-len(".yaml")] for p in project_dir.glob("Pulumi.*.yaml"))


class StackFileError(InvalidInputError):
    """A stack file that is not valid YAML, or not shaped like one."""


def read_stack_file(path: Path) -> tuple[dict[str, str], list[str]]:
    """Config as the CLI passes it to a program: full keys, structured values as JSON.

    Also returns the paths stored encrypted (``secure:``, from ``pulumi config set --secret``,
    top-level or nested with ``--path``), e.g. ``ml-training-platform:accounts.logging.externalId``.
    Their ciphertext is replaced by ``[secret]``: the offline plan never decrypts, prints or
    writes it.
    """
    text = path.read_text()
    try:
        document = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        source_line = text.splitlines()[line - 1].strip() if 0 < line <= len(text.splitlines()) else ""
        what = " ".join(filter(None, (exc.context, exc.problem)))
        raise StackFileError(path.name, [Problem(
            f"{path.name} line {line}, column {column}", source_line, f"is not valid YAML: {what}",
            "fix the syntax there: indent with spaces (not tabs) consistently, put ': ' after every key, "
            "quote values that contain ': ' or start with '*', '&', '!', '%' or '@'",
        )]) from None
    except yaml.YAMLError as exc:
        raise StackFileError(path.name, [Problem(path.name, None, f"is not valid YAML: {exc}", "fix the YAML syntax")]) from None
    document = document if document is not None else {}
    config = document.get("config") if isinstance(document, dict) else None
    if not isinstance(document, dict) or not isinstance(config or {}, dict):
        raise StackFileError(path.name, [Problem(f"{path.name}: config", type(config or document).__name__,
                                                 "the stack file must be a mapping with a `config:` mapping",
                                                 f"write `config:` and below it `{PROJECT}:<key>: <value>` lines")])
    values: dict[str, str] = {}
    secret_paths: list[str] = []
    for key, value in (config or {}).items():
        value = _redact_secure(value, str(key), secret_paths)
        values[str(key)] = value if isinstance(value, str) else json.dumps(value)
    return values, secret_paths


def _redact_secure(value: Any, path: str, found: list[str]) -> Any:
    if isinstance(value, dict) and set(value) == {"secure"}:
        found.append(path)
        return SECRET_PLACEHOLDER
    if isinstance(value, dict):
        return {k: _redact_secure(v, f"{path}.{k}", found) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_secure(v, f"{path}[{i}]", found) for i, v in enumerate(value)]
    return value


def raw_project_config(values: dict[str, str]) -> dict[str, Any]:
    prefix = f"{PROJECT}:"
    return {k[len(prefix):]: program.decode(v) for k, v in values.items() if k.startswith(prefix)}


# -- the project file: what the CLI reads before running the program ---------------------
@dataclass(frozen=True)
class Project:
    """Pulumi.yaml as the engine uses it: its ``config:`` values (merged under the stack's) and
    the program's working directory."""

    config: dict[str, str]
    main: str  # as written (for messages)
    working_dir: Path


def read_project(project_dir: Path = ROOT) -> Project:
    """Pulumi.yaml's ``config:`` and ``main``.

    Project-level config with ``value:`` is stack config the stack file may override
    (sdk/go/common/workspace/project.go); the CLI passes structured values as JSON, so
    ``pulumi:disable-default-providers: {value: [aws, kubernetes]}`` reaches the engine as
    '["aws","kubernetes"]'. ``main`` decides the working directory of the program and of every
    provider it launches (pkg/engine/project.go getPwdMain: ``if maininfo.IsDir() { pwd = main``,
    else its folder; sdk/go/common/resource/plugin/plugin.go: ``cmd.Dir = pwd``).
    """
    path = project_dir / "Pulumi.yaml"
    document = yaml.safe_load(path.read_text()) if path.is_file() else {}
    document = document if isinstance(document, dict) else {}
    values: dict[str, str] = {}
    for key, entry in (document.get("config") or {}).items():
        key = str(key) if ":" in str(key) else f"{document.get('name', PROJECT)}:{key}"
        value = entry.get("value", entry.get("default")) if isinstance(entry, dict) else entry
        if value is not None:
            values[key] = value if isinstance(value, str) else json.dumps(value)
    main = str(document.get("main") or "")
    target = (project_dir / main) if main else project_dir
    if not target.exists():
        raise FileNotFoundError(f"{path}: project 'main' could not be read: no {target} "
                                f"(the program and its providers run in that folder)")
    return Project(values, main or ".", target if target.is_dir() else target.parent)


# Written by the entry point (infra/__main__.py: infra.program.prepare_files) before the program
# registers anything; the offline plan does not fetch them, so they need not exist here.
def prepared_paths() -> tuple[Path, ...]:
    from components.charts import archive_path
    from catalog.versions import HELM_CHARTS, TRAINING_OPERATOR_OVERLAY_DIR
    from infra import vendor

    return (vendor.ROOT / TRAINING_OPERATOR_OVERLAY_DIR, *(archive_path(chart, vendor.ROOT) for chart in HELM_CHARTS))


# -- building the plan -------------------------------------------------------------------
def build_plan(stack: str, project_dir: Path = ROOT) -> Plan:
    path = stack_file(stack, project_dir)
    if not path.exists():
        raise FileNotFoundError(
            f"no stack file {path.name} in {project_dir}; available stacks: {', '.join(available_stacks(project_dir)) or 'none'}"
        )
    values, secret_paths = read_stack_file(path)
    return plan_from_values(stack, values, source=path.name, secret_paths=secret_paths, project_dir=project_dir)


def plan_from_values(stack: str, values: dict[str, str], *, source: str = "config",
                     secret_paths: Iterable[str] = (), project_dir: Path = ROOT) -> Plan:
    """Plan config values given as the CLI passes them (full keys, JSON for structures).

    The program runs as `pulumi up` runs it: with Pulumi.yaml's config under the stack's, in the
    folder ``main`` names; what the engine would refuse raises ``EngineRefusal``."""
    prefix = f"{PROJECT}:"
    project_secrets = [p[len(prefix):] for p in secret_paths if p.startswith(prefix)]
    config = load_platform_config(raw_project_config(values), source=f"stack '{stack}' ({source})",
                                  secret_paths=project_secrets)

    top_level_secrets = sorted({re.split(r"[.\[]", p, maxsplit=1)[0] for p in secret_paths})
    recording = record_program(stack, values, top_level_secrets, project_dir)
    graph = resource_graph(recording, config)
    return Plan(stack, config, recording, graph, plan_warnings(config, recording), plan_sections(config, recording))


def record_program(stack: str, values: dict[str, str], secret_keys: Iterable[str] = (), project_dir: Path = ROOT,
                   *, epoch: Optional[int] = None) -> Recording:
    """Run the program once under the recording engine, as the CLI would run it."""
    project = read_project(project_dir)
    return run_recorded(program.main, project=PROJECT, stack=stack, config={**project.config, **values},
                        secret_keys=list(secret_keys), working_dir=project.working_dir, main=project.main,
                        prepared_paths=prepared_paths(), epoch=epoch)


def second_up_of(stack: str, project_dir: Path = ROOT) -> "SecondUp":
    """What a second `pulumi up` of the stack file, unchanged, would update (``infra.plan.second_up``)."""
    from infra.plan.second_up import second_up

    values, secret_paths = read_stack_file(stack_file(stack, project_dir))
    keys = sorted({re.split(r"[.\[]", p, maxsplit=1)[0] for p in secret_paths})
    return second_up(lambda epoch: record_program(stack, values, keys, project_dir, epoch=epoch))


def render_second_up(result: "SecondUp") -> list[str]:
    lines = ["", "Second `up` of the same program and config (run twice; ignore_changes and write-only inputs applied):"]
    lines += [f"  update {line}" for line in result.changes] or ["  no resource would change"]
    lines += [f"  held   {line}" for line in result.write_only_held]
    lines += [f"  ! {line}" for line in result.ignores_nothing]
    return lines


def plan_sections(config: PlatformConfig, recording: Recording) -> list[tuple[str, list[str]]]:
    """Each capability's sections, in deployment order, then the idle cost of them all."""
    sections = [section for capability in CAPABILITIES for section in capability.plan_sections(config, recording)]
    return sections + [("Idle cost per month (no job running)", cost_report(config, recording))]


def plan_warnings(config: PlatformConfig, recording: Recording) -> list[str]:
    return [warning for capability in CAPABILITIES for warning in capability.warnings(config, recording)]


def idle_costs(recording: Recording, today: Optional[dt.date] = None) -> list[CostLine]:
    """Every capability's idle monthly cost lines, from the recorded graph."""
    today = today or dt.date.today()
    return [line for capability in CAPABILITIES for line in capability.cost_lines(recording, today)]


def cost_report(config: PlatformConfig, recording: Recording, today: Optional[dt.date] = None) -> list[str]:
    return costs.report(config, idle_costs(recording, today))


def account_of(resource: RecordedResource, recording: Recording, config: PlatformConfig) -> Optional[str]:
    """The account key whose role the resource's AWS provider assumes (None if not AWS)."""
    provider = recording.by_urn(resource.provider_for("aws"))
    if provider is None or not provider.type == "pulumi:providers:aws":
        return None
    roles = provider.inputs.get("assumeRoles") or []
    # A secret inside (an external id) turns the whole list into "[secret]".
    role_arn = roles[0].get("roleArn") if isinstance(roles, list) and roles and isinstance(roles[0], dict) else None
    keys = ("automation", "workload", "logging")
    for key in keys:
        if getattr(config.accounts, key).role_arn == role_arn:
            return key
    allowed = provider.inputs.get("allowedAccountIds") or []
    matches = [key for key in keys if [getattr(config.accounts, key).id] == allowed]
    if len(matches) > 1:  # single-account layout: the provider's name says which role it is
        matches = [key for key in matches if provider.name == f"{key}-account"]
    return matches[0] if len(matches) == 1 else None


def resource_graph(recording: Recording, config: PlatformConfig) -> list[dict[str, Any]]:
    names = {r.urn: r.name for r in recording.resources}
    graph = []
    for resource in recording.resources:
        provider_urn = resource.provider or (resource.providers.get(resource.package) if resource.remote else None)
        if resource.remote and provider_urn is None:
            provider_urn = resource.providers.get("aws")
        graph.append({
            "type": resource.type,
            "name": resource.name,
            "parent": names.get(resource.parent or ""),
            "provider": names.get(provider_urn or ""),
            "account": account_of(resource, recording, config) if (resource.custom or resource.remote) else None,
            "remote": resource.remote,
            "protect": resource.protect,
            "retain_on_delete": resource.retain_on_delete,
            "inputs": resource.inputs,
            "urn": resource.urn,
            # The mock engine's id: what other resources' inputs (securityGroupId, targetBucket...) hold.
            "id": resource.id,
            # Explicit depends_on plus every resource an input was built from (the engine's
            # `dependencies`); the parent is in "parent", not here.
            "dependencies": sorted({d.name for d in recording.dependencies_of(resource)}),
        })
    return graph


# -- printing ----------------------------------------------------------------------------
def render_tree(plan: Plan) -> list[str]:
    children: dict[Optional[str], list[dict[str, Any]]] = {}
    for node in plan.graph:
        children.setdefault(node["parent"], []).append(node)
    lines: list[str] = []

    def walk(parent: Optional[str], depth: int) -> None:
        for node in children.get(parent, []):
            flags = [flag for flag, on in (("protected", node["protect"]), ("remote", node["remote"])) if on]
            account = f" [{node['account']}]" if node["account"] else ""
            suffix = f" ({', '.join(flags)})" if flags else ""
            lines.append(f"{'  ' * depth}{node['type']}  {node['name']}{account}{suffix}")
            walk(node["name"], depth + 1)

    walk(None, 0)
    return lines


def render(plan: Plan) -> str:
    config = plan.config
    out = [f"Offline plan of stack '{plan.stack}' ({config.environment.value}, {config.region}, "
           f"cluster {config.cluster_name}, EKS {config.cluster.version}, upgrade policy {config.cluster.upgrade_policy.value})",
           ""]
    out += ["Resources:"] + [f"  {line}" for line in render_tree(plan)] + [""]
    counts = Counter(node["account"] or "none" for node in plan.graph if node["type"].startswith(("aws:", "eks:")))
    out.append("AWS resources per account:")
    for key in ("automation", "workload", "logging", "none"):
        if counts.get(key):
            out.append(f"  {key:<11} {counts[key]}")
    out.append(f"  total       {sum(counts.values())} AWS resources, {len(plan.graph)} resources in all")
    for title, lines in plan.sections:
        out += ["", f"{title}:"] + [f"  {line}" for line in lines]
    out += ["", f"Warnings ({len(plan.warnings)}):"] + [f"  ! {w}" for w in plan.warnings or ["none"]]
    return "\n".join(out)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--stack", required=True, help="stack name: plans Pulumi.<stack>.yaml")
    parser.add_argument("--json", type=Path, help="write the resource graph here as JSON")
    parser.add_argument("--second-up", action="store_true",
                        help="also run the program twice and list what a second `pulumi up` would update (exit 1 if any)")
    parser.add_argument("--project-dir", type=Path, default=None,
                        help="directory holding Pulumi.yaml (default: the nearest one from the working directory up)")
    args = parser.parse_args(argv)
    args.project_dir = args.project_dir or default_project_dir()
    started = time.perf_counter()
    try:
        plan = build_plan(args.stack, args.project_dir)
    except InvalidInputError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except EngineRefusal as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_FAILED
    except (OSError, UnicodeDecodeError) as error:  # missing, unreadable or not UTF-8
        print(f"error: {error}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    print(render(plan))
    second = second_up_of(args.stack, args.project_dir) if args.second_up else None
    if second is not None:
        print("\n".join(render_second_up(second)))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(plan.graph, indent=1, sort_keys=True) + "\n")
        print(f"\nResource graph: {args.json} ({len(plan.graph)} resources)")
    print(f"Planned in {time.perf_counter() - started:.1f} s")
    errors = [w for w in plan.warnings if w.startswith("ERROR")]
    unsettled = second is not None and bool(second.changes or second.ignores_nothing)
    return 1 if errors or unsettled else 0

