"""Preflight: memory arithmetic, quota, step time and cost, checkpoint time."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from workloads.jobspec import parse_job_spec
from jobs.preflight import BYTES_PER_PARAMETER, GIB, memory_per_gpu, preflight, trainer_shape
from catalog.prices import PRICES, SPOT_DISCOUNT

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((ROOT / "examples" / "jobs" / "gpt2-pretrain.yaml").read_text())


@pytest.fixture(scope="session")
def prod_facts(prod_plan):
    from jobs.facts import facts_from_plan

    return facts_from_plan(prod_plan)


@pytest.fixture(scope="module")
def a100_40gb_facts(prod_facts):
    """prod's A100 pool as the 40 GB p4d type (the catalog's `a100`)."""
    pool = prod_facts.pool("a100-reserved")
    a100 = dataclasses.replace(pool, gpu_type="a100", instance_types=("p4d.24xlarge",),
                               node_labels={**pool.node_labels, "mlplatform.io/gpu-type": "a100"})
    return dataclasses.replace(prod_facts, pools=tuple(p for p in prod_facts.pools if p.name != pool.name) + (a100,))


def test_example_fits_and_prices_the_run(prod_facts):
    report = preflight(parse_job_spec(EXAMPLE), prod_facts, repo_root=str(ROOT))
    assert report.ok, report.render()
    figures = report.figures
    assert figures["instance_type"] == "p5.48xlarge" and figures["world_size"] == 16
    assert 0 < figures["memory_per_gpu_gib"] < figures["usable_gpu_memory_gib"]
    # cost = hours x nodes x price; spot at the stated discount.
    price = PRICES["p5.48xlarge"].on_demand_usd_per_hour
    assert figures["cost_on_demand_usd"] == pytest.approx(figures["run_hours"] * 2 * price, rel=0.01)
    assert figures["cost_spot_usd"] == pytest.approx(figures["cost_on_demand_usd"] * (1 - SPOT_DISCOUNT), rel=0.01)
    text = report.render()
    assert "aws.amazon.com/ec2/pricing" in text and "MFU 35%" in text


def test_8b_model_with_adamw_on_one_40gb_a100_is_refused_with_the_arithmetic(a100_40gb_facts):
    raw = {**EXAMPLE, "gpuType": "a100", "nodes": 1, "gpusPerNode": 1, "spot": False,
           "model": {"parameters": 8e9, "numLayers": 32, "hiddenSize": 4096}}
    report = preflight(parse_job_spec(raw), a100_40gb_facts, repo_root=str(ROOT))
    assert not report.ok
    (memory,) = [p for p in report.problems if p.path == "gpusPerNode"]
    # 8e9 x 16 B = 119.2 GiB of state alone, against 95% of 40 GiB.
    assert "8.00B params x 16 B" in memory.message and "119.2 GiB state" in memory.message
    assert "38.0 GiB usable on one 40 GiB a100" in memory.message
    assert "REFUSED" in report.render()


def test_fsdp_shards_the_state_over_the_world():
    # The example's own overrides stay (its model name under the team's prefix among them).
    shape, problems = trainer_shape(parse_job_spec({**EXAMPLE, "trainer": {
        "config": "trainer/configs/gpt2-124m.yaml",
        "overrides": [*EXAMPLE.get("trainer", {}).get("overrides", []), "parallelism.strategy=fsdp"]}}), str(ROOT))
    assert not problems
    ddp = dataclasses.replace(shape, strategy="ddp")
    assert memory_per_gpu(shape, 16)["state"] == pytest.approx(shape.parameters * BYTES_PER_PARAMETER / 16)
    assert memory_per_gpu(ddp, 16)["state"] == pytest.approx(shape.parameters * BYTES_PER_PARAMETER)


def test_quota_without_borrowing_refuses(prod_facts):
    team = prod_facts.team("foundation-models")
    facts = dataclasses.replace(prod_facts, teams=tuple(
        dataclasses.replace(t, borrowing=False, gpu_quota={**t.gpu_quota, "gpu-h100": 8}) if t is team else t
        for t in prod_facts.teams))
    report = preflight(parse_job_spec(EXAMPLE), facts, repo_root=str(ROOT))
    assert [p.path for p in report.problems] == ["nodes"]
    assert "16 GPUs exceed team foundation-models's quota of 8" in report.problems[0].message


def test_borrowing_beyond_the_cohort_is_refused_within_it_warned(prod_facts):
    """Kueue lends only the cohort's nominal quota: a job larger than the cohort's GPUs on the
    pool is never admitted (a problem); within it, admitted while GPUs are idle (a warning), and
    the namespace quota of a borrowing team (the cohort's GPUs) lets its pods start."""
    def with_h100(quotas):
        return dataclasses.replace(prod_facts, teams=tuple(
            dataclasses.replace(t, borrowing=True, gpu_quota={**t.gpu_quota, "gpu-h100": quotas.get(t.name, 0)})
            for t in prod_facts.teams))

    never = preflight(parse_job_spec(EXAMPLE), with_h100({"foundation-models": 4, "research": 4}), repo_root=str(ROOT))
    (problem,) = [p for p in never.problems if p.path == "nodes"]
    assert "whole cohort holds on h100 (8)" in problem.message
    borrow = preflight(parse_job_spec(EXAMPLE), with_h100({"foundation-models": 8, "research": 8}), repo_root=str(ROOT))
    assert not [p for p in borrow.problems if p.path == "nodes"]
    assert any("exceed the team's nominal 8" in w for w in borrow.warnings)


def test_checkpoint_slower_than_the_budget_is_refused(prod_facts):
    slow = dataclasses.replace(prod_facts, fsx_write_mb_per_s=150.0)  # 1.2 TiB at 125 MB/s/TiB
    raw = {**EXAMPLE, "trainer": {"config": "trainer/configs/gpt2-124m.yaml", "overrides": ["parallelism.strategy=fsdp"]},
           "model": {"parameters": 8e9, "numLayers": 32, "hiddenSize": 4096}}
    report = preflight(parse_job_spec(raw), slow, repo_root=str(ROOT))
    problem = next(p for p in report.problems if p.path == "timeBudget.checkpointSeconds")
    assert "150 MB/s" in problem.message and f"{8e9 * 16 / (150e6):.0f} s" in problem.message


def test_the_checkpoint_estimate_names_the_file_system_the_checkpoints_land_on(dev_plan, prod_facts):
    """Dev (datasets.storage s3-mountpoint) checkpoints to EFS, whose per-client write rate is
    500 MiB/s (EFS User Guide, "Amazon EFS performance specifications"); prod to FSx for Lustre.
    The line and the fix must name the store the rate belongs to."""
    from jobs.facts import facts_from_plan

    dev_facts = facts_from_plan(dev_plan)
    assert dev_facts.checkpoint_store == "EFS" and dev_facts.fsx_write_mb_per_s == pytest.approx(500 * 1.048576)
    assert prod_facts.checkpoint_store == "FSx for Lustre"
    smoke = parse_job_spec(yaml.safe_load((ROOT / "examples" / "jobs" / "l4-dev-smoke.yaml").read_text()))
    (line,) = [l for l in preflight(smoke, dev_facts, repo_root=str(ROOT)).lines if l.startswith("checkpoint")]
    assert "/ EFS 524 MB/s" in line and "FSx" not in line
    slow = dataclasses.replace(dev_facts, fsx_write_mb_per_s=1.0)
    problem = next(p for p in preflight(smoke, slow, repo_root=str(ROOT)).problems if p.path == "timeBudget.checkpointSeconds")
    assert "datasets.storage fsx" in problem.fix
    (prod_line,) = [l for l in preflight(parse_job_spec(EXAMPLE), prod_facts, repo_root=str(ROOT)).lines if l.startswith("checkpoint")]
    assert "/ FSx for Lustre " in prod_line


def test_memory_figures_are_arithmetic_not_constants():
    shape, _ = trainer_shape(parse_job_spec(EXAMPLE), str(ROOT))
    small, big = memory_per_gpu(shape, 1), memory_per_gpu(dataclasses.replace(shape, micro_batch_size=32), 1)
    assert big["activations"] == pytest.approx(2 * small["activations"]) and big["state"] == small["state"]
    assert small["total"] == pytest.approx(small["state"] + small["activations"] + small["logits"] + 2 * GIB)


def _llama3_8b(model: dict) -> dict:
    """jobs-ops-4 S1: Llama 3.1 8B SFT on 2 x 8 H100, seq 4096, micro-batch 2."""
    overrides = [*EXAMPLE["trainer"]["overrides"], "model.kind=hf",
                 "model.hf_path=/fsx/datasets/team-foundation-models/llama-3.1-8b", "parallelism.strategy=fsdp",
                 "parallelism.activation_checkpointing=true", "data.seq_len=4096", "data.micro_batch_size=2"]
    return {**EXAMPLE, "trainer": {**EXAMPLE["trainer"], "overrides": overrides}, "model": model}


def test_hf_model_logits_use_the_models_vocabulary():
    """jobs-ops-4 §8: the logits term used GPT-2's padded 50,304 for Llama 3, whose tokenizer has
    128,256 tokens (meta-llama/Meta-Llama-3-8B config.json "vocab_size": 128256): 2.5x under.
    Logits per GPU = micro-batch x seq x vocabulary x 8 B (bf16 logits + the fp32 upcast for the loss)."""
    llama = {"parameters": 8.03e9, "numLayers": 32, "hiddenSize": 4096, "vocabSize": 128256}
    shape, problems = trainer_shape(parse_job_spec(_llama3_8b(llama)), str(ROOT))
    assert problems == [] and shape.vocab_size == 128256
    assert memory_per_gpu(shape, 16)["logits"] == 2 * 4096 * 128256 * 8  # 7.83 GiB, not 3.07


def test_hf_model_without_a_vocabulary_is_asked_for_it():
    shape, problems = trainer_shape(parse_job_spec(_llama3_8b({"parameters": 8.03e9, "numLayers": 32,
                                                               "hiddenSize": 4096})), str(ROOT))
    assert shape is None
    (problem,) = [p for p in problems if p.path == "model.vocabSize"]
    assert "vocabSize: 128256" in problem.fix and "config.json" in problem.fix


def test_reserved_pool_is_priced_as_reserved_not_on_demand(prod_facts):
    """jobs-ops-4 S3: a job on prod's a100-reserved pool (capacityTypes [reserved, on-demand],
    capacityReservationIds [cr-...]) was priced "on-demand $8,933". Karpenter launches into the
    reservation first ("reserved capacity is prioritized over spot and on-demand", karpenter.sh
    tasks/odcrs); an On-Demand Capacity Reservation is billed at the on-demand rate whether used or
    not (EC2 User Guide, capacity-reservation-pricing-billing), so the job adds $0 while it fits
    and on-demand is only the fallback."""
    raw = {**EXAMPLE, "gpuType": "a100-80gb", "spot": False, "nodes": 2, "gpusPerNode": 8}
    report = preflight(parse_job_spec(raw), prod_facts, repo_root=str(ROOT))
    figures = report.figures
    assert figures["pool"] == "a100-reserved"
    rate = PRICES["p4de.24xlarge"].on_demand_usd_per_hour
    assert figures["cost_marginal_usd"] == 0.0
    assert figures["cost_reserved_usd"] == pytest.approx(figures["run_hours"] * 2 * rate, rel=0.01)
    text = report.render()
    (cost,) = [line for line in text.splitlines() if line.startswith("cost ")]
    assert "reserved, $0 beyond the reservation" in cost and "when the reservation is full: on-demand" in cost
    assert "spot" not in cost  # spot: false, and the pool offers none
    assert "p4de.24xlarge reserved (billed $27.45/h used or not)" in text


def test_process_mode_staging_beyond_the_pods_shm_is_refused_with_the_arithmetic(prod_facts):
    """checkpoint.async_mode=process stages every rank's saved state (fp32 weights + AdamW
    moments, 12 B per parameter) in /dev/shm: 8 GPT-2 ranks need 11 GiB, which a 2 GiB /dev/shm
    refuses (the first save would fail, for good)."""
    from jobs.preflight import STAGED_BYTES_PER_PARAMETER, host_memory_per_node

    overrides = [*EXAMPLE["trainer"]["overrides"], "checkpoint.async_mode=process"]
    raw = {**EXAMPLE, "trainer": {**EXAMPLE["trainer"], "overrides": overrides}, "resources": {"shmGib": 2}}
    report = preflight(parse_job_spec(raw), prod_facts, repo_root=str(ROOT))
    (problem,) = [p for p in report.problems if p.path == "trainer[checkpoint.async_mode]"]
    shape, _ = trainer_shape(parse_job_spec(raw), str(ROOT))
    need = host_memory_per_node(shape, 16, 8)["shm"]
    assert need == pytest.approx(shape.parameters * STAGED_BYTES_PER_PARAMETER * 8)
    assert f"x {STAGED_BYTES_PER_PARAMETER} B (fp32 weights 4 + AdamW 8)" in problem.message
    assert f"= {need / GIB:,.1f} GiB > the pod's /dev/shm of 2 GiB" in problem.message
    assert "checkpoint.async_mode=thread" in problem.fix
    roomy = preflight(parse_job_spec({**raw, "resources": {"shmGib": 16}}), prod_facts, repo_root=str(ROOT))
    assert not [p for p in roomy.problems if p.path == "trainer[checkpoint.async_mode]"], roomy.render()
    assert any(line.startswith("host memory    checkpoint staging in /dev/shm") for line in roomy.lines)
