"""Malformed stack input, class by class: one clear problem naming the field, the value and the fix.

Each row breaks one thing of a valid stack (dev or prod) and names the path the problem must
be reported at and words its message or fix must contain. A few go through the plan CLI
(exit code 2, no traceback), as a user meets them.
"""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from infra.config import ConfigError, load_platform_config
from tests.conftest import stack_config

ROOT = Path(__file__).resolve().parents[2]


def setter(*path: Any, value: Any) -> Callable[[dict], None]:
    def mutate(raw: dict) -> None:
        target = raw
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def chain(*mutations: Callable[[dict], None]) -> Callable[[dict], None]:
    def mutate(raw: dict) -> None:
        for mutation in mutations:
            mutation(raw)

    return mutate


# (class, stack, mutation, path of the problem, words in message + fix)
CASES = [
    # 9: field validators of top-level fields run in the per-section pass; the region itself is checked
    ("9 name", "dev", setter("name", value="ML_Dev"), "name", "lowercase"),
    ("9 region", "dev", setter("region", value="us-west-9"), "region", "us-west-2"),
    ("9 region partition", "dev", setter("region", value="mars-north-1"), "region", "partition"),
    ("9 list length", "dev", lambda raw: raw.__setitem__("gpuPools", raw["gpuPools"] * 17), "gpuPools", "at most 32"),
    # 10: non-finite numbers, int and float fields
    ("10 inf int", "dev", setter("cluster", "systemNodeGroup", "maxSize", value=math.inf),
     "cluster.systemNodeGroup.maxSize", "finite"),
    ("10 nan float", "dev", setter("tracking", "database", "maxCapacityAcu", value=math.nan),
     "tracking.database.maxCapacityAcu", "finite"),
    ("10 -inf", "prod", setter("datasets", "fsx", "storageCapacityGib", value=-math.inf),
     "datasets.fsx.storageCapacityGib", "finite"),
    # 11: upper bounds name the limit and its source
    ("11 fsx", "prod", setter("datasets", "fsx", "storageCapacityGib", value=240000),
     "datasets.fsx.storageCapacityGib", "docs.aws.amazon.com/fsx"),
    ("11 acu", "dev", setter("tracking", "database", "maxCapacityAcu", value=512),
     "tracking.database.maxCapacityAcu", "256"),
    ("11 nodes", "dev", setter("cluster", "systemNodeGroup", "maxSize", value=1000),
     "cluster.systemNodeGroup.maxSize", "Nodes per managed node group"),
    ("11 gpu nodes", "prod", lambda raw: raw["gpuPools"][0].__setitem__("maxGpus", 8 * 6000),
     "gpuPools[0].maxGpus", "kubernetes.io"),
    ("11 retention", "dev", setter("cluster", "logRetentionDays", value=42), "cluster.logRetentionDays", "PutRetentionPolicy"),
    # 12: exposure judged together; prod internet-facing ALB open to all needs the opt-in; duplicates
    ("12 two halves", "dev", setter("cluster", "publicAccessCidrs", value=["0.0.0.0/1", "128.0.0.0/1"]),
     "cluster.publicAccessCidrs", "whole internet"),
    ("12 prod alb", "prod", chain(setter("tracking", "loadBalancerScheme", value="internet-facing"),
                                  setter("tracking", "ingressCidrs", value=["0.0.0.0/0"])),
     "tracking.ingressCidrs[0]", "allowInternetIngress"),
    ("12 duplicate", "dev", setter("cluster", "systemNodeGroup", "instanceTypes", value=["m7i.large", "m7i.large"]),
     "cluster.systemNodeGroup.instanceTypes[1]", "once"),
    ("12 nested cidr", "dev", setter("tracking", "ingressCidrs", value=["203.0.113.0/24", "203.0.113.128/25"]),
     "tracking.ingressCidrs[1]", "inside"),
    # 13: accounts
    ("13 same account", "dev", chain(setter("accounts", "logging", "id", value="444455556666"),
                                     setter("accounts", "logging", "roleArn", value="arn:aws:iam::444455556666:role/x")),
     "accounts.logging.id", "single-account"),
    ("13 partition", "dev", setter("accounts", "logging", "roleArn", value="arn:aws-cn:iam::777788889999:role/x"),
     "accounts.logging.roleArn", "partition"),
    ("13 external id", "dev", setter("accounts", "workload", "externalId", value="s3cr3t-id"),
     "accounts.workload.externalId", "get-token"),
    # 14: tags
    ("14 aws prefix", "dev", setter("tags", value={"aws:owner": "me"}), "tags", "aws:"),
    ("14 tag chars", "dev", setter("tags", value={"team": "ml<platform>"}), "tags", "characters"),
    ("14 tag length", "dev", setter("tags", value={"k" * 129: "v"}), "tags", "1-128"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_each_class_of_bad_input_gives_one_clear_problem(case):
    _, stack, mutate, path, words = case
    raw = stack_config(stack)
    mutate(raw)
    with pytest.raises(ConfigError) as info:
        load_platform_config(raw)
    at_path = [p for p in info.value.problems if p.path == path]
    assert at_path, f"no problem at {path}: {[p.render() for p in info.value.problems]}"
    problem = at_path[0]
    assert words.lower() in (problem.message + " " + problem.fix).lower(), problem.render()
    assert problem.fix, problem.render()
    assert problem.value is not None, problem.render()  # the bad value is named (secrets as "[secret]")


def test_accepted_when_explicitly_opted_in():
    raw = stack_config("dev")
    raw["accounts"]["logging"] = {"id": "444455556666", "roleArn": "arn:aws:iam::444455556666:role/x"}
    raw["accounts"]["layout"] = "single-account"
    assert load_platform_config(raw).accounts.logging.id == "444455556666"
    raw = stack_config("prod")
    raw["tracking"]["ingressCidrs"] = ["0.0.0.0/0"]
    raw["tracking"]["allowInternetIngress"] = True
    assert load_platform_config(raw).tracking.allow_internet_ingress


def test_external_id_of_other_accounts_is_a_secret_value():
    raw = stack_config("dev")
    raw["accounts"]["logging"]["externalId"] = "s3cr3t-id"
    config = load_platform_config(raw)
    assert "s3cr3t-id" not in repr(config) and "s3cr3t-id" not in config.model_dump_json()
    assert config.accounts.logging.external_id.get_secret_value() == "s3cr3t-id"


def paths_of(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path of a stack config (dict keys, and the first item of lists of objects)."""
    found = []
    if isinstance(value, dict):
        for key, item in value.items():
            found.append(prefix + (key,))
            found += paths_of(item, prefix + (key,))
    elif isinstance(value, list) and value and isinstance(value[0], dict):
        found += paths_of(value[0], prefix + (0,))
    return found


def test_no_traceback_for_values_of_the_wrong_shape():
    """Whatever YAML can hold, at any key of either stack: a ConfigError, never another exception."""
    shapes = [None, True, -1, 1.5, math.inf, math.nan, "", "x" * 300, [], [1, "a"], {"a": {"b": []}}]
    for stack in ("dev", "prod"):
        for path in paths_of(stack_config(stack)):
            for shape in shapes:
                raw = stack_config(stack)
                setter(*path, value=shape)(raw)
                try:
                    load_platform_config(raw)
                except ConfigError as error:
                    assert error.problems, path


# -- through the CLI -----------------------------------------------------------------------
def run_plan(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infra.plan", "--stack", "broken", "--project-dir", str(project), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)


def project_with(tmp_path: Path, text: str) -> Path:
    shutil.copy(ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    # A project holds the folder its `main` names: the program runs there (infra.plan.read_project).
    (tmp_path / "infra").symlink_to(ROOT / "infra")
    (tmp_path / "Pulumi.broken.yaml").write_text(text)
    return tmp_path


def stack_text(stack: str, mutate: Callable[[dict], None]) -> str:
    document = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())
    mutate(document["config"])
    return yaml.safe_dump(document)


@pytest.mark.parametrize("case", [c for c in CASES if c[0] in ("9 region", "10 inf int", "12 two halves", "13 same account")],
                         ids=lambda c: c[0])
def test_cli_exits_2_with_the_problem_and_no_traceback(case, tmp_path):
    _, stack, mutate, path, words = case

    def on_config(config: dict) -> None:
        raw = {k.split(":", 1)[1]: v for k, v in config.items()}
        mutate(raw)
        config.clear()
        config.update({f"ml-training-platform:{k}": v for k, v in raw.items()})

    result = run_plan(project_with(tmp_path, stack_text(stack, on_config)))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert f"{path}:" in result.stderr and words.lower() in result.stderr.lower()


def test_yaml_syntax_error_names_file_line_and_column(tmp_path):
    text = (ROOT / "Pulumi.dev.yaml").read_text().replace("  ml-training-platform:region: us-west-2",
                                                         "  ml-training-platform:region: us-west-2\n    bad: [unclosed")
    result = run_plan(project_with(tmp_path, text))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    line = text.splitlines().index("    bad: [unclosed") + 1
    assert "Pulumi.broken.yaml line" in result.stderr and "column" in result.stderr, result.stderr
    assert f"line {line}" in result.stderr or f"line {line + 1}" in result.stderr, result.stderr


CIPHERTEXT = "v1:QmFkIHNlY3JldCBjaXBoZXJ0ZXh0:c2VjcmV0LWV4dGVybmFsLWlk"


def test_stack_with_secure_values_plans_offline_redacted(tmp_path):
    def add_secret(config: dict) -> None:
        config["ml-training-platform:accounts"]["logging"]["externalId"] = {"secure": CIPHERTEXT}

    out = tmp_path / "plan.json"
    result = run_plan(project_with(tmp_path, stack_text("dev", add_secret)), "--json", str(out))
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert CIPHERTEXT not in text + result.stdout + result.stderr
    graph = json.loads(text)
    logging_provider = next(n for n in graph if n["name"] == "logging-account")
    assert "[secret]" in json.dumps(logging_provider["inputs"]["assumeRoles"])
    # The archive is still attributed to the logging account.
    assert {n["account"] for n in graph if n["provider"] == "logging-account"} == {"logging"}


def test_secure_value_on_a_field_that_is_not_secret_is_refused_without_printing_it(tmp_path):
    def secret_name(config: dict) -> None:
        config["ml-training-platform:name"] = {"secure": CIPHERTEXT}

    result = run_plan(project_with(tmp_path, stack_text("dev", secret_name)))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "name: is stored encrypted" in result.stderr and CIPHERTEXT not in result.stderr + result.stdout


def test_at_deploy_secret_config_reaches_resources_as_secret_outputs():
    """The engine passes decrypted values and marks the key secret; read through pulumi.Config,
    the external id reaches the provider as a secret Output (the mock records it as [secret])."""
    from infra import program
    from infra.config import PROJECT
    from infra.plan.mock_engine import run_recorded
    from tests.conftest import to_values

    raw = stack_config("dev")
    raw["accounts"]["logging"]["externalId"] = "plain-external-id"
    recording = run_recorded(program.main, project=PROJECT, stack="dev", config=to_values(raw),
                             secret_keys=[f"{PROJECT}:accounts"])
    provider = recording.one("pulumi:providers:aws", "logging-account")
    assert "[secret]" in json.dumps(provider.inputs["assumeRoles"])
    assert "plain-external-id" not in json.dumps([r.inputs for r in recording.resources])


@pytest.mark.parametrize("bad", [123456, "topsecret"])
def test_a_secret_fields_value_never_appears_in_a_problem(bad):
    raw = stack_config("dev")
    raw["accounts"]["workload"]["externalId"] = bad  # refused (kubeconfig), or of the wrong type
    with pytest.raises(ConfigError) as info:
        load_platform_config(raw)
    assert str(bad) not in str(info.value)
    assert any(p.path == "accounts.workload.externalId" for p in info.value.problems)
