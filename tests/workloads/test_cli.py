"""`python -m workloads`: exit codes, dry-run output, clear errors, kubectl commands."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jobs.__main__ import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "jobs" / "gpt2-pretrain.yaml")


def test_dry_run_prints_the_pytorchjob(capsys):
    assert main(["submit", EXAMPLE, "--stack", "prod", "--dry-run", "--offline"]) == 0
    out, err = capsys.readouterr()
    job = yaml.safe_load(out)
    assert job["kind"] == "PyTorchJob" and job["metadata"]["name"] == "gpt2-pretrain"
    assert "OK: the job fits" in err


def test_bad_spec_exits_2_without_traceback(tmp_path):
    bad = tmp_path / "job.yaml"
    bad.write_text("name: x\nnodes: two\n")
    done = subprocess.run([sys.executable, "-m", "workloads", "submit", str(bad), "--stack", "prod", "--dry-run", "--offline"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "nodes:" in done.stderr and "team: is required" in done.stderr and "Traceback" not in done.stderr


def test_refused_preflight_exits_3(tmp_path, capsys):
    raw = yaml.safe_load(Path(EXAMPLE).read_text())
    raw.update(nodes=1, gpusPerNode=1, spot=False, model={"parameters": 8e9, "numLayers": 32, "hiddenSize": 4096})
    job = tmp_path / "big.yaml"
    job.write_text(yaml.safe_dump(raw))
    assert main(["preflight", str(job), "--stack", "prod", "--offline"]) == 3
    assert "does not fit" in capsys.readouterr().out


def test_submit_without_cluster_access_says_how(monkeypatch, capsys):
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    assert main(["submit", EXAMPLE, "--stack", "prod", "--offline"]) == 4
    assert "--dry-run or --local" in capsys.readouterr().err


def test_facts_json_round_trips_and_renders_the_same_job(tmp_path, capsys):
    assert main(["facts", "--stack", "prod", "--offline"]) == 0
    facts_file = tmp_path / "facts.json"
    facts_file.write_text(capsys.readouterr().out)
    assert main(["submit", EXAMPLE, "--stack", "prod", "--dry-run", "--offline"]) == 0
    from_plan = capsys.readouterr().out
    assert main(["submit", EXAMPLE, "--stack", "prod", "--dry-run", "--facts", str(facts_file)]) == 0
    assert capsys.readouterr().out == from_plan


@pytest.mark.slow
def test_submit_local_runs_the_example(tmp_path, capsys):
    code = main(["submit", EXAMPLE, "--stack", "prod", "--offline", "--local", "--steps", "8", "--no-tracking",
                 "--workdir", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "attempts: [[0, 0]]" in out and "complete checkpoints: [" in out
    assert (tmp_path / "run" / "fsx" / "checkpoints" / "team-foundation-models" / "gpt2-pretrain" / "step-000008" / "complete.json").exists()
