"""`submit --local`: the README example job's rendered pods, made tiny, run as 2 CPU processes:
start, train, checkpoint, one pod SIGTERMed (its node reclaimed) -> every pod exits 143 ->
recreated pods resume from the newest checkpoint and finish."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from workloads.jobspec import parse_job_spec
from jobs.local import LocalOverrides, run_local, shrink
from workloads.trainingjob import render

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rendered(prod_plan):
    from jobs.facts import facts_from_plan

    spec = parse_job_spec(yaml.safe_load((ROOT / "examples" / "jobs" / "gpt2-pretrain.yaml").read_text()))
    return render(spec, facts_from_plan(prod_plan))


def test_shrink_changes_only_processes_config_and_overrides(rendered):
    small = shrink(rendered, LocalOverrides(num_steps=30))
    assert small["spec"]["nprocPerNode"] == "1"
    for name, spec in rendered["spec"]["pytorchReplicaSpecs"].items():
        before = spec["template"]["spec"]["containers"][0]
        after = small["spec"]["pytorchReplicaSpecs"][name]["template"]["spec"]["containers"][0]
        assert {k: v for k, v in before.items() if k != "args"} == {k: v for k, v in after.items() if k != "args"}
        config_at = before["args"].index("--config") + 1
        assert after["args"][:config_at] == before["args"][:config_at]
        assert after["args"][config_at] == "trainer/configs/tiny.yaml"
        assert after["args"][config_at + 1:len(before["args"])] == before["args"][config_at + 1:]
    assert {k: v for k, v in small["spec"].items() if k not in ("nprocPerNode", "pytorchReplicaSpecs")} == \
        {k: v for k, v in rendered["spec"].items() if k not in ("nprocPerNode", "pytorchReplicaSpecs")}


def test_local_run_trains_survives_sigterm_and_resumes(rendered, tmp_path):
    secrets = {"mlflow-tracking": {"MLFLOW_TRACKING_URI": "", "MLFLOW_TRACKING_USERNAME": "", "MLFLOW_TRACKING_PASSWORD": ""},
               "checkpoint-signing": {"key": "k" * 64}}
    lines: list[str] = []
    # Interrupt early: 35 steps remain, so even a fast machine cannot finish before the signal.
    result = run_local(shrink(rendered, LocalOverrides(num_steps=40, checkpoint_every_steps=5)), workdir=tmp_path,
                       secrets=secrets, interrupt_at_step=5, timeout_seconds=300, say=lines.append)
    logs = "\n".join(p.read_text() for a in result.attempts for p in a.logs)
    assert result.succeeded, "\n".join(lines) + logs[-4000:]
    first, second = result.attempts
    # Only the worker was signalled; the master learnt of it through the trainer's all-reduced flag.
    assert first.interrupted and first.exit_codes == [143, 143]
    assert second.exit_codes == [0, 0]
    # The checkpoint landed on the job's FSx path (mapped locally), and training resumed from it.
    assert result.checkpoint_dir == tmp_path / "fsx" / "checkpoints" / "team-foundation-models" / "gpt2-pretrain"
    assert result.steps[-1] == 40
    final = json.loads((result.checkpoint_dir / f"step-{result.steps[-1]:06d}" / "complete.json").read_text())
    assert final["step"] == 40
    master_second = second.logs[0].read_text()
    started = re.search(r"world size 2, cpu\) from step (\d+) to 40", master_second)
    assert started and 5 <= int(started.group(1)) < 40, master_second[:2000]
    # The operator's variables reached torchrun: 2 nodes x 1 process, node ranks 0 and 1.
    assert "[trainer.launch] torchrun exited 0" in master_second


def test_trainjob_pods_run_locally_with_trainer_v2_env(prod_plan, tmp_path):
    """The same arguments work under Trainer v2's torch plugin (PET_* only, no MASTER_ADDR/RANK)."""
    import dataclasses

    from jobs.facts import facts_from_plan

    facts = dataclasses.replace(facts_from_plan(prod_plan), trainer_v2_runtime="torch-distributed")
    raw = yaml.safe_load((ROOT / "examples" / "jobs" / "gpt2-pretrain.yaml").read_text())
    job = render(parse_job_spec({**raw, "runtime": "trainjob"}), facts)
    secrets = {"mlflow-tracking": {k: "" for k in facts.tracking_secret_keys}, "checkpoint-signing": {"key": "k" * 64}}
    result = run_local(shrink(job, LocalOverrides(num_steps=10, checkpoint_every_steps=5)), workdir=tmp_path,
                       secrets=secrets, timeout_seconds=300, say=lambda _: None)
    assert result.succeeded and [a.exit_codes for a in result.attempts] == [[0, 0]]
    assert result.steps[-1] == 10
