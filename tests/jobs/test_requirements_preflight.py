"""`requirements.txt` at preflight and in the rendered job (review jobs-ops-4 §3 S5, §7 gap 1: it was
silently ignored, and own code had no cost line at all, §1 row 7).

The pod installs the file offline (trainer/requirements_env.py; tests/jobs/test_requirements_env.py
runs it): preflight refuses what could never install there, each problem naming its line and the
fix, all at once."""
from __future__ import annotations

import json
import shutil

import pytest
import yaml

from jobs import usercode
from tests.jobs.conftest import ROOT
from tests.jobs.test_requirements_env import build_wheel
from workloads import owncode
from workloads.jobspec import parse_job_spec

OWN = ROOT / "examples" / "own-code"


def _code(tmp_path, requirements: str):
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(OWN / "ddp" / "train.py", code / "train.py")
    (code / "requirements.txt").write_text(requirements)
    return code


def test_every_line_the_pod_cannot_install_is_refused_with_its_line_and_fix(tmp_path):
    (tmp_path / "mylib").mkdir()
    code = _code(tmp_path, "# deps\npeft==0.13.2\ntorch>=2.14\n-e ../mylib\n--index-url https://pypi.org/simple\n"
                           "./local/pkg\nfoo bar baz\nmylib @ file:///home/me/mylib\n-r other.txt\n--find-links /wheels\n"
                           "--trusted-host example.org\n")
    check = usercode.check_requirements(code)
    rendered = [p.render() for p in check.problems]
    expected = [
        ("requirements.txt line 3: asks for another version than the image's torch==2.13.0", "drop the line"),
        ("requirements.txt line 4: is an editable install", "pip wheel PATH -w wheels/"),
        ("requirements.txt line 5: names a package index the pod cannot reach", "pip install --dry-run"),
        ("requirements.txt line 6: is a local path", "write the package's name==version"),
        ("requirements.txt line 7: does not parse as a requirement", "PEP 508"),
        ("requirements.txt line 8: installs from a URL or path the pod cannot reach", "put the wheel in wheels/"),
        ("requirements.txt line 9: includes another file", "list the requirements in requirements.txt"),
        ("requirements.txt line 10: points outside your code directory", "put the wheels in wheels/"),
        ("requirements.txt line 11: is an option the pod's offline install does not take", "drop it"),
    ]
    assert len(rendered) == len(expected), rendered
    for (message, fix), line in zip(expected, rendered):
        assert line.startswith(message) and "Fix: " in line and fix in line.split("Fix: ", 1)[1], line
    # peft: no wheel vendored and no index in the pod: said, not refused (the image may have it).
    assert check.warnings == [w for w in check.warnings if w.startswith("requirements.txt line 2: peft==0.13.2: no wheel")]
    assert len(check.warnings) == 1


def test_what_the_image_satisfies_or_the_wheels_hold_passes(tmp_path):
    code = _code(tmp_path, "torch>=2\ntransformers\naccelerate==1.15.0\ntinydep==1.0 \\\n  --hash=sha256:00\n")
    (only,) = usercode.check_requirements(code).warnings  # torch, transformers, accelerate: the image's
    assert only.startswith("requirements.txt line 4: tinydep==1.0 --hash=sha256:00: no wheel for tinydep")
    build_wheel(code / "wheels", "tinydep", "1.0", "VALUE = 1\n")
    check = usercode.check_requirements(code)
    assert (check.problems, check.warnings) == ([], [])
    assert check.requirements == ("torch>=2", "transformers", "accelerate==1.15.0", "tinydep==1.0")


def test_the_image_pins_are_the_trainer_extra(tmp_path):
    pins = usercode.image_pins()
    assert pins["torch"] == "2.13.0" and pins["transformers"] == "5.23.0" and "numpy" not in pins  # a range, not a pin


@pytest.fixture
def lora(tmp_path, dev_facts):
    raw = yaml.safe_load((OWN / "ddp.yaml").read_text())
    spec = tmp_path / "own.yaml"
    spec.write_text(yaml.safe_dump(raw))
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(dev_facts.to_dict()))
    return spec, ["--stack", "dev", "--facts", str(facts)], raw


def test_preflight_and_dry_run_show_the_install_step_and_render_the_env_root(lora, tmp_path, capsys):
    from jobs.__main__ import main

    spec, stack, _ = lora
    code = _code(tmp_path, "tinydep==1.0\n")
    build_wheel(code / "wheels", "tinydep", "1.0", "VALUE = 1\n")
    assert main(["preflight", str(spec), *stack, "--code", str(code)]) == 0
    out = capsys.readouterr().out
    step = ("requirements   requirements.txt: 1 requirement(s), installed by the launcher before torchrun, offline from "
            "wheels/ (1 file(s)), into /fsx/checkpoints/team-research/.venvs/")
    assert step in out and "a failed install exits 3 (permanent)" in out

    assert main(["submit", str(spec), *stack, "--dry-run", "--code", str(code)]) == 0
    captured = capsys.readouterr()
    assert step in captured.err
    manifest = yaml.safe_load(captured.out)
    env = {e["name"]: e.get("value") for e in
           manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"]}
    assert env["MLP_VENV_ROOT"] == "/fsx/checkpoints/team-research/.venvs"


def test_a_refused_requirement_stops_preflight_and_submit(lora, tmp_path, capsys):
    from jobs.__main__ import main

    spec, stack, _ = lora
    code = _code(tmp_path, "torch==2.14.0\n")
    assert main(["preflight", str(spec), *stack, "--code", str(code)]) == 2
    assert "requirements.txt line 1: asks for another version than the image's torch==2.13.0" in capsys.readouterr().out
    assert main(["submit", str(spec), *stack, "--dry-run", "--code", str(code)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "requirements.txt line 1" in captured.err


def test_the_venv_root_is_the_teams_shared_subtree():
    spec = parse_job_spec({"name": "own", "team": "research", "image": "i:1", "script": "train.py", "gpuType": "l4",
                           "nodes": 1, "gpusPerNode": 1, "dataset": "/fsx/datasets/x/v1"})
    code = usercode.CodeArchive(b"x", "a" * 64, ("train.py",))
    spec = usercode.pin(spec, code, "mlp-dev-checkpoints", "dev")
    env = {e["name"]: e["value"] for e in owncode.env(spec)}
    assert env["MLP_VENV_ROOT"] == "/fsx/checkpoints/team-research/.venvs"
    assert "MLP_VENV_ROOT" not in {e["name"] for e in owncode.env(spec.model_copy(update={"code": None}))}


def test_own_code_preflight_bounds_the_cost_by_max_runtime(lora, capsys):
    """No step-time arithmetic for own code, but activeDeadlineSeconds (maxRuntime) stops the job:
    nodes x maxRuntime x $/h is an upper bound (review jobs-ops-4 §1 row 7: no cost line at all)."""
    from jobs.__main__ import main
    from workloads.prices import PRICES

    spec, stack, raw = lora
    assert main(["preflight", str(spec), *stack]) == 0
    out = capsys.readouterr().out
    price = PRICES["g5.12xlarge"]
    bound = 2 * 2 * price.on_demand_usd_per_hour
    assert f"cost           at most 2 x g5.12xlarge x 2 h (maxRuntime 2h): on-demand ${bound:,.2f}" in out, out
    raw["maxRuntime"] = "6h"
    spec.write_text(yaml.safe_dump(raw))
    assert main(["preflight", str(spec), *stack]) == 0
    assert f"on-demand ${3 * bound:,.2f}" in capsys.readouterr().out
