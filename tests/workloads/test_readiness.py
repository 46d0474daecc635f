"""Readiness job per GPU pool, and the all-reduce check it runs."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.nccl_check import bus_bandwidth
from workloads.instances import INSTANCES, busbw_floor_gb_per_s
from workloads.readiness import gate_floor_gb_per_s, readiness_job, readiness_namespace
from tests.support.validation import validate_core, validate_custom_resource, validate_pod_template

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def prod_facts(prod_plan):
    from jobs.facts import facts_from_plan

    return facts_from_plan(prod_plan)


def test_readiness_jobs_validate_and_use_the_whole_pool_node(prod_facts, schemas):
    assert validate_core(readiness_namespace()) == []
    for pool in prod_facts.pools:
        job = readiness_job(pool, image="example.com/trainer:1.0.0")
        assert validate_custom_resource(job, schemas) == []
        specs = job["spec"]["pytorchReplicaSpecs"]
        assert specs["Master"]["replicas"] + specs["Worker"]["replicas"] == 2
        pod = specs["Master"]["template"]["spec"]
        assert validate_pod_template(specs["Master"]["template"]) == []
        requests = pod["containers"][0]["resources"]["requests"]
        assert requests["nvidia.com/gpu"] == str(pool.gpus_per_node)
        assert requests.get("vpc.amazonaws.com/efa") == (str(pool.efa_devices_per_node) if pool.efa else None)
        assert pod["nodeSelector"]["mlplatform.io/pool"] == pool.name
        # Only nodes whose own checks passed (readiness startup taint lifted) run the 2-node gate.
        assert "node.mlplatform.io/gpu-not-ready" not in {t["key"] for t in pod["tolerations"]}
        script = pod["containers"][0]["args"][0]
        floor = gate_floor_gb_per_s(pool.instance_types[0], efa=pool.efa)
        assert "nvidia-smi" in script and f"--min-busbw-gb-per-s {floor}" in script
        assert job["metadata"]["annotations"]["mlplatform.io/busbw-floor-gb-per-s"] == str(floor)
        assert "kueue.x-k8s.io/queue-name" not in job["metadata"].get("labels", {})


def test_floor_follows_the_instance_network():
    # p5.48xlarge: 3200 Gbps = 400 GB/s line rate; with EFA a healthy pair exceeds 60% of it.
    assert busbw_floor_gb_per_s("p5.48xlarge", efa=True) == 240.0
    assert busbw_floor_gb_per_s("p4d.24xlarge", efa=True) == 30.0
    assert busbw_floor_gb_per_s("g6e.xlarge", efa=False) < busbw_floor_gb_per_s("g6e.48xlarge", efa=True)
    assert all(i.network_gbps > 0 for i in INSTANCES.values())


def test_bus_bandwidth_is_nccl_tests_definition():
    # nccl-tests doc/PERFORMANCE.md: all-reduce busbw = algbw * 2(n-1)/n.
    assert bus_bandwidth(8_000_000_000, 1.0, 16) == pytest.approx(8e9 * 2 * 15 / 16)
    assert bus_bandwidth(1_000, 1.0, 2) == pytest.approx(1_000)


@pytest.mark.slow
@pytest.mark.parametrize("floor, code", [(0.0, 0), (1e6, 1)])
def test_nccl_check_passes_and_fails_against_its_floor_on_cpu(floor, code):
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           "-m", "trainer.nccl_check", "--size-mib", "1", "--iters", "3", "--warmup", "1",
                           "--min-busbw-gb-per-s", str(floor)], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert (done.returncode != 0) == bool(code), done.stderr[-2000:]
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
    assert result["world_size"] == 2 and result["busbw_gb_per_s"] > 0 and result["ok"] is (code == 0)
