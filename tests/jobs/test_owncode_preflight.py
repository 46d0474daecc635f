"""Own code is checked at preflight (review jobs-ops-4 §3 S5, §7 gap 1): a `script:` missing from
the `--code` directory passed `preflight` and `submit --dry-run` and failed on a launched GPU
node (`can't open file .../train_lora.py`, exit 1 on every rank); `requirements.txt` was
silently ignored (now checked: tests/jobs/test_requirements_preflight.py)."""
from __future__ import annotations

import json
import shutil

import yaml

from tests.jobs.conftest import ROOT

OWN = ROOT / "examples" / "own-code"


def _setup(tmp_path, dev_facts, *, script: str, source: str = None):
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(OWN / "ddp" / "train.py", code / "train.py")
    if source is not None:
        (code / script).write_text(source)
    (code / "requirements.txt").write_text("peft==0.13.2\ntrl==0.12.1\n")
    raw = yaml.safe_load((OWN / "ddp.yaml").read_text())
    raw.update(script=script, args=["--rank", "16"])
    spec = tmp_path / "lora.yaml"
    spec.write_text(yaml.safe_dump(raw))
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(dev_facts.to_dict()))
    return spec, code, ["--stack", "dev", "--facts", str(facts)]


def test_a_script_missing_from_the_code_directory_is_refused_before_any_gpu(dev_facts, tmp_path, capsys):
    from jobs.__main__ import main

    spec, code, stack = _setup(tmp_path, dev_facts, script="train_lora.py")
    assert main(["preflight", str(spec), *stack, "--code", str(code)]) == 2
    out = capsys.readouterr().out
    assert f"script: is not in the code directory {code} (its .py files: ['train.py'])" in out
    assert "did you mean 'train.py'?" in out
    # requirements.txt is checked too (tests/jobs/test_requirements_preflight.py): no wheels vendored.
    assert "requirements.txt line 1: peft==0.13.2: no wheel for peft" in out

    assert main(["submit", str(spec), *stack, "--dry-run", "--code", str(code)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "script: is not in the code directory" in captured.err


def test_a_script_that_does_not_parse_is_refused_with_its_line(dev_facts, tmp_path, capsys):
    from jobs.__main__ import main

    spec, code, stack = _setup(tmp_path, dev_facts, script="train_lora.py", source="import os\ndef main(:\n    pass\n")
    assert main(["preflight", str(spec), *stack, "--code", str(code)]) == 2
    assert "script: does not parse: line 2: " in capsys.readouterr().out


def test_a_script_that_is_there_and_parses_fits(dev_facts, tmp_path, capsys):
    from jobs.__main__ import main

    spec, code, stack = _setup(tmp_path, dev_facts, script="train.py")
    assert main(["preflight", str(spec), *stack, "--code", str(code)]) == 0
    assert "OK: the job fits" in capsys.readouterr().out
