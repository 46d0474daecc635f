"""Right-sized pods: the pod's CPU, memory and /dev/shm come from the smallest instance of the pool that fits."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from workloads.jobspec import JobSpecError, parse_job_spec
from workloads.nodefit import DoesNotFit, node_allocatable, size_pod
from jobs.preflight import preflight
from workloads.trainingjob import render, resolve

ROOT = Path(__file__).resolve().parents[2]
L4_SMOKE = yaml.safe_load((ROOT / "examples" / "jobs" / "l4-dev-smoke.yaml").read_text())
H100 = yaml.safe_load((ROOT / "examples" / "jobs" / "gpt2-pretrain.yaml").read_text())


@pytest.fixture(scope="module")
def dev_facts(dev_plan):
    from jobs.facts import facts_from_plan

    return facts_from_plan(dev_plan)


@pytest.fixture(scope="module")
def prod_facts(prod_plan):
    from jobs.facts import facts_from_plan

    return facts_from_plan(prod_plan)


def test_allocatable_takes_the_vm_overhead_reserves_eviction_and_daemonsets():
    """types.go memory(): mem.Sub(ceil(mem * VMMemoryOverheadPercent)) (default 0.075);
    evictionThreshold: memory 100Mi (nodeadm evictionHard memory.available: "100Mi")."""
    node = node_allocatable("g6.xlarge", 1)
    total = 16 * 1024
    assert node.memory_mib == total - 1229 - (11 * 58 + 255) - 100 - 1024
    assert node.cpu_millicores == 4000 - 80 - 1000


def test_one_l4_lands_on_g6_xlarge_not_g6_16xlarge(dev_facts):
    """The review's spec c: one L4 used to ask for 12 CPU and 120 GiB and so bought a g6.16xlarge."""
    job = resolve(parse_job_spec(L4_SMOKE), dev_facts)
    assert job.instance_type == "g6.xlarge"
    container = render(parse_job_spec(L4_SMOKE), dev_facts)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    requests = container["containers"][0]["resources"]["requests"]
    alloc = node_allocatable("g6.xlarge", 1)
    assert int(requests["cpu"].removesuffix("m")) <= alloc.cpu_millicores
    assert int(requests["memory"].removesuffix("Gi")) * 1024 <= alloc.memory_mib
    shm = next(v for v in container["volumes"] if v["name"] == "dshm")["emptyDir"]["sizeLimit"]
    assert int(shm.removesuffix("Gi")) < int(requests["memory"].removesuffix("Gi"))
    report = preflight(parse_job_spec(L4_SMOKE), dev_facts, repo_root=str(ROOT))
    assert "instance       g6.xlarge at $0.80/h on-demand" in report.render()
    assert report.figures["instance_usd_per_hour"] == pytest.approx(0.8048)


def test_eight_h100_take_a_p5_48xlarge_capped_at_the_kueue_share(prod_facts):
    job = resolve(parse_job_spec(H100), prod_facts)
    assert job.instance_type == "p5.48xlarge"
    pool = job.pool
    # The node would give ~190 CPU; the team's Kueue quota holds cpu_per_gpu per GPU.
    assert job.size.cpu_millicores == int(pool.cpu_per_gpu * 1000 * 8)
    assert job.memory_gib == int(pool.memory_gib_per_gpu * 8)
    assert job.size.source == "Kueue share"


def test_a_larger_request_picks_a_larger_instance_and_preflight_prices_it(dev_facts):
    raw = {**L4_SMOKE, "resources": {"cpuPerGpu": 12, "memoryGibPerGpu": 120}}
    job = resolve(parse_job_spec(raw), dev_facts)
    # g6.8xlarge: 128 GiB -> 114.5 GiB after 7.5 % VM overhead, 2829 MiB kube-reserved (234 pods),
    # eviction and DaemonSets: not enough for 120; g6.16xlarge is the next by price.
    assert job.instance_type == "g6.16xlarge"
    assert job.cpu == "12" and job.memory_gib == 120
    smaller = resolve(parse_job_spec({**L4_SMOKE, "resources": {"memoryGibPerGpu": 110}}), dev_facts)
    assert smaller.instance_type == "g6.8xlarge"
    report = preflight(parse_job_spec(raw), dev_facts, repo_root=str(ROOT))
    assert "g6.16xlarge at $3.40/h" in report.render()


def test_a_request_no_instance_holds_is_refused_with_the_limit(dev_facts):
    raw = {**L4_SMOKE, "resources": {"memoryGibPerGpu": 500}}
    with pytest.raises(JobSpecError) as caught:
        resolve(parse_job_spec(raw), dev_facts)
    (problem,) = [p for p in caught.value.problems if p.path == "resources.memoryGibPerGpu"]
    assert problem.value == 500 and "g6.16xlarge" in problem.message and "at most" in problem.fix


def test_shm_must_leave_memory_for_the_trainer():
    with pytest.raises(DoesNotFit) as caught:
        size_pod(["g6.xlarge"], node_gpus=1, gpus=1, shm_gib=40)
    assert caught.value.field == "resources.shmGib"


@pytest.mark.parametrize("resources, path", [
    ({"cpuPerGpu": 0}, "resources.cpuPerGpu"),
    ({"cpuPerGpu": "lots"}, "resources.cpuPerGpu"),
    ({"memoryGibPerGpu": -1}, "resources.memoryGibPerGpu"),
    ({"shmGib": 0}, "resources.shmGib"),
    ({"cpus": 4}, "resources.cpus"),
])
def test_bad_resources_name_the_field(resources, path):
    with pytest.raises(JobSpecError) as caught:
        parse_job_spec({**L4_SMOKE, "resources": resources})
    assert path in [p.path for p in caught.value.problems]


def test_half_a_node_gets_half_of_it():
    whole = size_pod(["g5.12xlarge"], node_gpus=4, gpus=4)
    half = size_pod(["g5.12xlarge"], node_gpus=4, gpus=2)
    assert half.cpu_millicores == pytest.approx(whole.cpu_millicores / 2, abs=100)
