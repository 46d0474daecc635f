"""Every mistake of a job spec in one run, one exit code per class (2 bad input, 3 does not fit)."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import yaml

from workloads.jobspec import JobSpecError, SpecFileError, load_job_spec, parse_job_spec, read_job_spec_file
from jobs.preflight import (EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT, GIB, USABLE_MEMORY_FRACTION, ModelShape, memory_per_gpu,
                                 preflight_file)
from workloads.problems import BAD_INPUT, DOES_NOT_FIT

ROOT = Path(__file__).resolve().parents[2]
L4_SMOKE = yaml.safe_load((ROOT / "examples" / "jobs" / "l4-dev-smoke.yaml").read_text())

# The review's spec d (shared reviews, jobs-ux-3 §2): five mistakes that took three runs and two
# exit codes, plus the trainer's cross-field rules of spec c2.
FIVE_MISTAKES = """\
name: Llama_SFT
team: reserach
image: 111122223333.dkr.ecr.us-west-2.amazonaws.com/mlp-dev/trainer:latest
trainer:
  config: trainer/configs/gpt2-124m.yaml
  overrides: [optimizer.learning_rate=1e-4, data.micro_batch_size=0, schedule.warmup_steps=5000, schedule.num_steps=500]
nodes: 2
gpusPerNode: 8
gpuType: l4
dataset: /fsx/datasets/tinystories/gpt2-v1
"""


@pytest.fixture(scope="module")
def dev_facts(dev_plan):
    from jobs.facts import facts_from_plan

    return facts_from_plan(dev_plan)


def write(tmp_path: Path, text: str, name: str = "job.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_five_mistakes_and_the_trainer_rules_come_in_one_run_with_exit_2(tmp_path, dev_facts):
    report = preflight_file(write(tmp_path, FIVE_MISTAKES), dev_facts, repo_root=str(ROOT))
    by_path = {p.path: p for p in report.problems}
    assert {"name", "image", "team", "gpusPerNode", "trainer[optimizer.learning_rate]", "trainer[data.micro_batch_size]",
            "trainer[schedule.warmup_steps]"} <= set(by_path), report.render()
    assert by_path["team"].fix.startswith("did you mean 'research'?")
    assert by_path["trainer[optimizer.learning_rate]"].fix == "did you mean optimizer.lr?"
    assert by_path["trainer[optimizer.learning_rate]"].value == "1e-4"
    assert "must be > 0" in by_path["trainer[data.micro_batch_size]"].message
    assert report.exit_code == EXIT_BAD_INPUT


def test_the_trainers_cross_field_rules_run_on_a_spec_the_schema_accepts(tmp_path, dev_facts):
    """trainer/config.py validate(): "schedule.warmup_steps=...: must be in [0, schedule.num_steps=...]" and
    "data.micro_batch_size=...: must be > 0" were found only in the pod (review spec c2)."""
    raw = {**L4_SMOKE, "trainer": {"config": "trainer/configs/gpt2-124m.yaml",
                                   "overrides": ["data.micro_batch_size=0", "schedule.warmup_steps=5000", "schedule.num_steps=500"]}}
    report = preflight_file(write(tmp_path, yaml.safe_dump(raw)), dev_facts, repo_root=str(ROOT))
    assert {"trainer[data.micro_batch_size]", "trainer[schedule.warmup_steps]"} <= {p.path for p in report.problems}
    assert "OK: the job fits" not in report.render() and report.exit_code == EXIT_BAD_INPUT


def test_a_well_formed_spec_that_does_not_fit_exits_3(tmp_path, dev_facts):
    raw = {**L4_SMOKE, "model": {"parameters": 7e9, "numLayers": 32, "hiddenSize": 4096}}
    report = preflight_file(write(tmp_path, yaml.safe_dump(raw)), dev_facts, repo_root=str(ROOT))
    assert report.problems and all(p.kind == DOES_NOT_FIT for p in report.problems), report.render()
    assert report.exit_code == EXIT_DOES_NOT_FIT


def test_bad_input_wins_over_does_not_fit(tmp_path, dev_facts):
    raw = {**L4_SMOKE, "model": {"parameters": 7e9, "numLayers": 32, "hiddenSize": 4096}, "experiment": "team-x/y"}
    report = preflight_file(write(tmp_path, yaml.safe_dump(raw)), dev_facts, repo_root=str(ROOT))
    kinds = {p.kind for p in report.problems}
    assert kinds == {BAD_INPUT, DOES_NOT_FIT} and report.exit_code == EXIT_BAD_INPUT


def test_a_valid_spec_passes_with_exit_0(tmp_path, dev_facts):
    report = preflight_file(write(tmp_path, yaml.safe_dump(L4_SMOKE)), dev_facts, repo_root=str(ROOT))
    assert report.exit_code == 0, report.render()


# -- the FSDP suggestion must fit (review spec b: a 7B on 4 x A10G) ------------------------------------
def test_memory_fix_offers_only_what_fits(tmp_path, dev_facts):
    raw = {**L4_SMOKE, "pool": "a10g-x4", "gpuType": None, "gpusPerNode": 4,
           "trainer": {"config": "trainer/configs/gpt2-124m.yaml",
                       "overrides": ["parallelism.strategy=ddp", "data.seq_len=4096", "data.micro_batch_size=1",
                                     "schedule.grad_accum_steps=16"]},
           "model": {"parameters": 7.25e9, "numLayers": 32, "hiddenSize": 4096}}
    raw = {k: v for k, v in raw.items() if v is not None}
    report = preflight_file(write(tmp_path, yaml.safe_dump(raw)), dev_facts, repo_root=str(ROOT))
    (memory,) = [p for p in report.problems if p.path == "gpusPerNode"]
    usable = 24 * GIB * USABLE_MEMORY_FRACTION
    base = ModelShape(7.25e9, 32, 4096, 50304, 4096, 1, 16, 1, "ddp", False, "test")
    # Plain FSDP over 4 GPUs: 27 GiB of state alone, more than 22.8 usable: not offered.
    assert memory_per_gpu(dataclasses.replace(base, strategy="fsdp"), 4)["total"] > usable
    assert "shard it with FSDP (parallelism.strategy=fsdp" not in memory.fix
    # What is offered fits by the same arithmetic: FSDP + checkpointing over both nodes of the pool.
    assert "over 2 nodes (8 GPUs)" in memory.fix, memory.fix
    shown = float(memory.fix.rsplit("(", 1)[1].split(" GiB")[0])
    assert shown * GIB <= usable


def test_when_nothing_on_the_pool_fits_it_says_so(tmp_path, dev_facts):
    raw = {**L4_SMOKE, "model": {"parameters": 70e9, "numLayers": 80, "hiddenSize": 8192}}
    report = preflight_file(write(tmp_path, yaml.safe_dump(raw)), dev_facts, repo_root=str(ROOT))
    (memory,) = [p for p in report.problems if p.path == "gpusPerNode"]
    assert memory.fix.startswith("nothing on pool l4 fits"), memory.fix


# -- the file itself -----------------------------------------------------------------------------------
def test_duplicate_keys_are_an_error_not_last_wins(tmp_path, dev_facts):
    text = yaml.safe_dump(L4_SMOKE) + "nodes: 3\n"
    raw, problems = read_job_spec_file(write(tmp_path, text))
    (dup,) = problems
    assert dup.path == "nodes" and "given twice" in dup.message
    report = preflight_file(write(tmp_path, text), dev_facts, repo_root=str(ROOT))
    assert report.exit_code == EXIT_BAD_INPUT and "nodes" in [p.path for p in report.problems]
    with pytest.raises(JobSpecError):
        load_job_spec(write(tmp_path, text))


def test_nested_duplicate_keys_are_found_too(tmp_path):
    text = "trainer:\n  config: a\n  config: b\n"
    _, problems = read_job_spec_file(write(tmp_path, text))
    assert [p.path for p in problems] == ["trainer.config"] and problems[0].value == "lines 2 and 3"
    _, problems = read_job_spec_file(write(tmp_path, "a:\n- {x: 1, x: 2}\n"))
    assert [p.path for p in problems] == ["a[0].x"]


def _file(directory: Path, data: bytes) -> str:
    (directory / "x.yaml").write_bytes(data)
    return str(directory / "x.yaml")


@pytest.mark.parametrize("make, words", [
    (lambda d: str(d), "is a directory"),
    (lambda d: _file(d, b"\x7fELF\x00\x01"), "binary"),
    (lambda d: _file(d, "name: caf\u00e9\n".encode("latin-1")), "not UTF-8"),
    (lambda d: str(d / "missing.yaml"), "does not exist"),
    (lambda d: _file(d, b"name: [unclosed\n"), "not valid YAML at line"),
])
def test_unreadable_files_are_one_clear_line(tmp_path, make, words):
    path = make(tmp_path)
    with pytest.raises(SpecFileError) as caught:
        read_job_spec_file(path)
    line = str(caught.value)
    assert words in line and "\n" not in line and "Fix:" in line


def test_unreadable_file_cli_exits_2_with_one_line(tmp_path, dev_facts, capsys, monkeypatch):
    import jobs.__main__ as cli

    monkeypatch.setattr(cli, "_facts", lambda *a, **k: dev_facts)
    assert cli.main(["preflight", str(tmp_path), "--stack", "dev"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is a directory" in err and "Traceback" not in err


# -- trainer config paths ------------------------------------------------------------------------------
@pytest.mark.parametrize("config", ["/etc/passwd", "../secrets.yaml", "trainer/configs/../../x.yaml", "examples/jobs/gpt2-pretrain.yaml",
                                    "trainer/configs/gpt2-124m.txt"])
def test_trainer_configs_outside_the_repositorys_configs_are_refused(config):
    with pytest.raises(JobSpecError) as caught:
        parse_job_spec({**L4_SMOKE, "trainer": {"config": config}})
    assert "trainer.config" in [p.path for p in caught.value.problems]


def test_a_link_out_of_the_configs_is_refused(tmp_path, dev_facts):
    repo = tmp_path / "repo"
    (repo / "trainer" / "configs").mkdir(parents=True)
    (tmp_path / "outside.yaml").write_text("model: {size: gpt2}\n")
    os.symlink(tmp_path / "outside.yaml", repo / "trainer" / "configs" / "evil.yaml")
    raw = {**L4_SMOKE, "trainer": {"config": "trainer/configs/evil.yaml"}}
    report = preflight_file(write(tmp_path, yaml.safe_dump(raw)), dev_facts, repo_root=str(repo))
    (problem,) = [p for p in report.problems if p.path == "trainer.config"]
    assert "outside" in problem.message


def test_a_missing_config_suggests_the_closest(tmp_path, dev_facts):
    raw = {**L4_SMOKE, "trainer": {"config": "trainer/configs/gpt2-124.yaml"}}
    report = preflight_file(write(tmp_path, yaml.safe_dump(raw)), dev_facts, repo_root=str(ROOT))
    (problem,) = [p for p in report.problems if p.path == "trainer.config"]
    assert problem.fix == "did you mean 'trainer/configs/gpt2-124m.yaml'?"


# -- did you mean ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra, path, hint", [
    ({"gpus": 1}, "gpus", "gpusPerNode"),
    ({"maxRuntme": "4h"}, "maxRuntme", "maxRuntime"),
    ({"timeBudget": {"maxStepSecs": 5}}, "timeBudget.maxStepSecs", "maxStepSeconds"),
])
def test_misspelt_keys_get_did_you_mean(extra, path, hint):
    with pytest.raises(JobSpecError) as caught:
        parse_job_spec({**L4_SMOKE, **extra})
    problem = next(p for p in caught.value.problems if p.path == path)
    assert problem.fix == f"did you mean {hint!r}?"


def test_a_missing_field_does_not_print_the_whole_spec():
    raw = {k: v for k, v in L4_SMOKE.items() if k != "dataset"}
    with pytest.raises(JobSpecError) as caught:
        parse_job_spec(raw)
    (missing,) = [p for p in caught.value.problems if p.path == "dataset"]
    assert missing.value is None
