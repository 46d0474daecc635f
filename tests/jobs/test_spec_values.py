"""Job spec values that used to pass or end in a traceback (review jobs-ops-4; issue "Jobs 5" item 9).

- YAML 1.1 (PyYAML) reads unquoted yes/no/on/off as booleans and `1:30` as the base-60
  number 90; pydantic's lax mode then took `nodes: yes` as 1 node.
- Durations no job can have (`99999h`; a ttl past the CRD's int32).
- An anchor used inside itself (`a: &x [*x]`) built a list that contains itself: RecursionError.
- The kubelet expands `$(VAR)` in command, args and env values from the container's own env,
  Secrets included (core/v1 Container.args: "Variable references $(VAR_NAME) are expanded using
  the container's environment... Double $$ are reduced to a single $"; the algorithm is
  kubernetes third_party/forked/golang/expansion/expand.go, re-implemented below).
- The trainer parses each `key=value` override's value as YAML: a run name `gpt2 #1` lost ` #1`.
"""
from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.jobs.conftest import ROOT, SMOKE, raw_spec
from workloads.jobspec import JobSpecError, SpecFileError, load_job_spec, parse_job_spec

SECRET = "s3cr3t-mlflow-password"


def _write(tmp_path, text: str):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def _problems(raw: dict) -> dict[str, str]:
    with pytest.raises(JobSpecError) as error:
        parse_job_spec(raw)
    return {p.path: f"{p.message}. Fix: {p.fix}" for p in error.value.problems}


@pytest.mark.parametrize("field,yaml_text", [
    ("nodes", "nodes: yes"), ("gpusPerNode", "gpusPerNode: on"), ("backoffLimit", "backoffLimit: no"),
    ("timeBudget.maxStepSeconds", "timeBudget: {maxStepSeconds: on}"),
    ("resources.cpuPerGpu", "resources: {cpuPerGpu: off}"),
])
def test_a_yaml_boolean_is_never_a_count(field, yaml_text, tmp_path):
    base = {k: v for k, v in yaml.safe_load(SMOKE.read_text()).items() if k.split(":")[0] != field.split(".")[0]}
    raw = {**base, **yaml.safe_load(yaml_text)}
    problems = _problems(raw)
    assert "YAML boolean" in problems[field] and "write the number" in problems[field]


def test_a_yaml_boolean_is_never_text_and_quoting_fixes_it():
    problems = _problems(raw_spec(runName=True))
    assert problems["runName"].startswith("is the YAML boolean true") and "quote it" in problems["runName"]
    problems = _problems(raw_spec(script=None, trainer=None, command=["python", "train.py", "--resume", False]))
    assert "command" in problems and "[3] is the YAML boolean false" in problems["command"]
    assert parse_job_spec(raw_spec(runName="yes")).run_name == "yes"


@pytest.mark.parametrize("value,message", [
    ("99999h", "outside 10m..720h"), ("1m", "outside 10m..720h"), ("2 hours", "is not a duration"),
])
def test_a_max_runtime_no_job_can_have_is_refused(value, message):
    assert message in _problems(raw_spec(maxRuntime=value))["maxRuntime"]


def test_a_ttl_past_the_crds_int32_is_refused():
    assert "ttlSecondsAfterFinished is an int32" in _problems(raw_spec(ttlAfterFinished="600000h"))["ttlAfterFinished"]


def test_a_base_60_number_is_not_a_duration(tmp_path):
    path = _write(tmp_path, SMOKE.read_text().replace("maxRuntime: 2h", "maxRuntime: 1:30"))
    with pytest.raises(JobSpecError) as error:
        load_job_spec(path)
    [problem] = [p for p in error.value.problems if p.path == "maxRuntime"]
    assert problem.message.startswith("is the number 90, not a duration") and "1h30m" in problem.fix


def test_an_anchor_inside_itself_is_one_line_not_a_traceback(tmp_path):
    path = _write(tmp_path, SMOKE.read_text() + "extra: &loop [1, *loop]\n")
    with pytest.raises(SpecFileError, match="anchor used inside itself at line"):
        load_job_spec(path)


def test_an_alias_bomb_is_refused_before_it_is_built(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    path = _write(tmp_path, SMOKE.read_text() + "\n".join(lines) + "\n")
    with pytest.raises(SpecFileError, match="expands to more than 10,000 values"):
        load_job_spec(path)


def test_a_control_character_cannot_reach_the_pod():
    problems = _problems(raw_spec(runName="line one\nline two"))
    assert "control character '\\n' at position 8" in problems["runName"]


# -- $(VAR) and the trainer's argv ------------------------------------------------------------------
_REF = re.compile(r"\$(\$|\(([A-Za-z_][A-Za-z0-9_.-]*)\))")


def kubelet_expand(value: str, env: dict[str, str]) -> str:
    """kubernetes third_party/forked/golang/expansion/expand.go Expand: `$$` -> `$`; `$(NAME)` ->
    NAME's value when NAME is defined, else left as is; any other `$` stays."""
    def replace(match: re.Match) -> str:
        if match.group(1) == "$":
            return "$"
        return env.get(match.group(2), match.group(0))

    return _REF.sub(replace, value)


def _containers(manifest: dict) -> list[dict]:
    if manifest["kind"] == "PyTorchJob":
        return [r["template"]["spec"]["containers"][0] for r in manifest["spec"]["pytorchReplicaSpecs"].values()]
    return [manifest["spec"]["trainer"]]


def _as_the_kubelet_runs_it(container: dict) -> tuple[list[str], dict[str, str]]:
    """argv and env after expansion; every Secret-backed variable holds SECRET (a ConfigMap-backed
    one, the platform's deployed names, a plain stand-in)."""
    env: dict[str, str] = {}
    for entry in container.get("env") or []:  # each value may refer to the ones before it
        if "valueFrom" in entry:
            env[entry["name"]] = "deployed-name" if "configMapKeyRef" in entry["valueFrom"] else SECRET
        else:
            env[entry["name"]] = kubelet_expand(entry["value"], env)
    argv = [kubelet_expand(a, env) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
    return argv, env


POISON = "$(MLFLOW_TRACKING_PASSWORD)"


def test_no_spec_string_is_expanded_by_the_kubelet_and_each_reaches_the_trainer_verbatim(dev_facts):
    """Every user string that reaches the built-in trainer's argv or env, poisoned with a
    reference to the team's MLflow password and YAML-significant text: after the kubelet's
    expansion no value holds the secret, and the trainer's own override parser reads back
    exactly what the spec said."""
    from trainer.config import parse_overrides
    from workloads.trainingjob import render

    run_name = f"gpt2 #1: {POISON} 'quoted'"
    spec = parse_job_spec(raw_spec(runName=run_name, experiment="exp.1",
                                   dataset=f"/fsx/datasets/tinystories/{POISON}",
                                   checkpointDir=f"/fsx/checkpoints/team-research/{POISON}"))
    manifest = render(spec, dev_facts)
    for container in _containers(manifest):
        argv, env = _as_the_kubelet_runs_it(container)
        assert SECRET not in json.dumps([argv, {k: v for k, v in env.items() if v != SECRET}])
        overrides = dict(parse_overrides(argv[argv.index("--config") + 2:]))
        assert overrides["tracking.run_name"] == run_name
        assert overrides["data.dir"] == f"/fsx/datasets/tinystories/{POISON}"
        assert env["TRAINER_CHECKPOINT_DIR"] == f"/fsx/checkpoints/team-research/{POISON}"
        assert env["DATASET_VERSION"] == POISON


def test_own_code_arguments_reach_the_script_verbatim(dev_facts):
    from workloads.trainingjob import render

    args = ["--note", POISON, "--text", "a #b: c", "$$(HOME)"]
    raw = {k: v for k, v in raw_spec().items() if k != "trainer"}
    spec = parse_job_spec({**raw, "script": "train.py", "args": args})
    for container in _containers(render(spec, dev_facts)):
        argv, _ = _as_the_kubelet_runs_it(container)
        assert argv[argv.index("train.py") + 1:] == args


def test_a_sweep_name_that_is_no_job_name_is_refused(dev_facts, tmp_path, capsys):
    from jobs.__main__ import main

    facts_file = tmp_path / "facts.json"
    facts_file.write_text(json.dumps(dev_facts.to_dict()))
    code = main(["submit", str(SMOKE), "--stack", "dev", "--dry-run", "--facts", str(facts_file),
                 "--sweep", "optimizer.lr=1e-4,3e-4", "--sweep-name", POISON])
    assert code == 2
    assert f"--sweep-name {POISON!r}: is not a DNS label" in capsys.readouterr().err


def test_another_teams_experiment_is_refused_in_prod(prod_plan):
    from jobs.facts import facts_from_plan
    from jobs.preflight import preflight

    spec = load_job_spec(ROOT / "examples/jobs/gpt2-pretrain.yaml").model_copy(update={"experiment": "team-applied/gpt2"})
    report = preflight(spec, facts_from_plan(prod_plan), repo_root=str(ROOT))
    assert [p.path for p in report.problems] == ["experiment"]
    assert "not the team's prefix team-foundation-models/" in report.problems[0].message
