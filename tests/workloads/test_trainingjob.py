"""Job spec -> PyTorchJob / TrainJob: golden files, every setting of the job rendering, the time
budget, the operator's environment, and what changing the GPU type changes.

Facts come from the prod stack's offline plan (the README's example job runs there).
Regenerate golden files after an intended change with ``UPDATE_GOLDEN=1`` and review the diff.
"""
from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import yaml

from workloads.problems import InvalidInputError
from workloads.gpu_catalog import SPOT_NOTICE_SECONDS
from workloads.jobspec import JobSpecError, load_job_spec, parse_job_spec
from workloads.karpenter import EFA_RESOURCE, GPU_RESOURCE
from jobs.local import Replica, expand, operator_env, replicas
from workloads.trainingjob import render, render_pytorchjob, render_trainjob, resolve
from tests.support.validation import validate_custom_resource, validate_pod_template
from tests.workloads.golden_files import assert_golden

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "jobs" / "gpt2-pretrain.yaml"


@pytest.fixture(scope="session")
def prod_facts(prod_plan):
    from jobs.facts import facts_from_plan

    return facts_from_plan(prod_plan)


@pytest.fixture(scope="session")
def example_raw():
    return yaml.safe_load(EXAMPLE.read_text())


def _job(raw, facts):
    return resolve(parse_job_spec(raw), facts)


def _golden(name: str, obj: dict) -> None:
    assert_golden(name, yaml.safe_dump(obj, sort_keys=True))


def _templates(job: dict) -> list[dict]:
    if job["kind"] == "PyTorchJob":
        return [s["template"] for s in job["spec"]["pytorchReplicaSpecs"].values()]
    patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    return [patch["template"]["spec"]["template"]]


# -- golden files and schemas -----------------------------------------------------------------
def test_example_pytorchjob_golden_and_valid(prod_facts, example_raw, schemas):
    job = render(parse_job_spec(example_raw), prod_facts)
    _golden("pytorchjob-gpt2-pretrain", job)
    assert validate_custom_resource(job, schemas) == []
    for template in _templates(job):
        assert validate_pod_template(template) == []


def test_example_trainjob_golden_and_valid(prod_facts, example_raw, schemas):
    facts = dataclasses.replace(prod_facts, trainer_v2_runtime="torch-distributed")
    job = render(parse_job_spec({**example_raw, "runtime": "trainjob"}), facts)
    _golden("trainjob-gpt2-pretrain", job)
    assert job["spec"]["runtimeRef"] == {"name": "torch-distributed", "apiGroup": "trainer.kubeflow.org",
                                         "kind": "ClusterTrainingRuntime"}
    assert job["spec"]["trainer"]["numNodes"] == 2 and job["spec"]["trainer"]["numProcPerNode"] == 8
    assert validate_custom_resource(job, schemas) == []
    # The patched pod (plus the trainer container's fields) must still be a valid pod.
    pod = copy.deepcopy(_templates(job)[0])
    container = pod["spec"]["containers"][0]
    trainer = job["spec"]["trainer"]
    container.update(image=trainer["image"], command=trainer["command"], args=trainer["args"], env=trainer["env"],
                     resources=trainer["resourcesPerNode"])
    assert validate_pod_template(pod) == []


def test_trainjob_needs_trainer_v2_installed(prod_facts, example_raw):
    with pytest.raises(JobSpecError) as info:
        render(parse_job_spec({**example_raw, "runtime": "trainjob"}), prod_facts)
    assert [p.path for p in info.value.problems] == ["runtime"]


# -- every setting of the rendering ----------------------------------------------------------
def test_example_renders_every_training_setting(prod_facts, example_raw):
    resolved = _job(example_raw, prod_facts)
    job = render_pytorchjob(resolved)
    pool = prod_facts.pool("h100")
    team = prod_facts.team("foundation-models")
    spec = job["spec"]
    assert job["metadata"]["namespace"] == team.namespace
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == team.local_queue
    assert spec["nprocPerNode"] == "8"
    replica_specs = spec["pytorchReplicaSpecs"]
    assert (replica_specs["Master"]["replicas"], replica_specs["Worker"]["replicas"]) == (1, 1)
    assert {s["restartPolicy"] for s in replica_specs.values()} == {"ExitCode"}
    run = spec["runPolicy"]
    assert run["activeDeadlineSeconds"] == 72 * 3600 and run["backoffLimit"] > 0
    assert run["cleanPodPolicy"] == "Running" and run["ttlSecondsAfterFinished"] > 0
    assert run["schedulingPolicy"]["priorityClass"] == "training-production"

    for template in _templates(job):
        pod = template["spec"]
        (container,) = pod["containers"]
        assert template["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
        assert pod["priorityClassName"] == "training-production" and "training-production" in prod_facts.priority_classes
        assert pod["serviceAccountName"] == team.trainer_service_account
        # Node selection on the pool's own labels (read from its NodePool), GPU taint tolerated.
        assert pod["nodeSelector"] == {k: pool.node_labels[k] for k in pod["nodeSelector"]}
        assert set(pod["nodeSelector"]) == {"mlplatform.io/pool", "mlplatform.io/gpu-type"}
        assert {(t["key"], t["effect"]) for t in pod["tolerations"]} == {(t["key"], t["effect"]) for t in pool.taints}
        # Guaranteed resources, EFA from the node class's interfaces.
        res = container["resources"]
        assert res["requests"] == res["limits"]
        assert res["requests"][GPU_RESOURCE] == "8" and res["requests"][EFA_RESOURCE] == str(pool.efa_devices_per_node) == "32"
        # The trainer through the launcher, torchrun's rendezvous from the operator's variables.
        assert container["command"][-3:] == ["python", "-m", "trainer.launch"]
        args = container["args"]
        for var in ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"):
            assert any(f"$({var})" in a for a in args), var
        assert args[args.index("--config") + 1] == "trainer/configs/gpt2-124m.yaml"
        assert "data.dir=/fsx/datasets/fineweb-edu/gpt2-v1" in args and "optimizer.lr=6e-4" in args
        assert container["ports"][0] == {"name": "pytorchjob-port", "containerPort": 23456, "protocol": "TCP"}
        env = {e["name"]: e for e in container["env"]}
        for key in prod_facts.tracking_secret_keys:
            assert env[key]["valueFrom"]["secretKeyRef"] == {"name": team.tracking_secret, "key": key}
        assert env["FI_PROVIDER"]["value"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"]["value"] == "1"
        assert env["TRAINER_CHECKPOINT_DIR"]["value"] == "/fsx/checkpoints/team-foundation-models/gpt2-pretrain"
        # Volumes: /dev/shm in memory, the team's own FSx subtree at its file-system path, the
        # datasets read-only; never the file system's root.
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert volumes["dshm"]["emptyDir"]["medium"] == "Memory" and mounts["dshm"] == "/dev/shm"
        assert volumes["fsx"]["persistentVolumeClaim"]["claimName"] == prod_facts.fsx_claim_name
        assert mounts["fsx"] == "/fsx/checkpoints/team-foundation-models"
        assert volumes["fsx-datasets"]["persistentVolumeClaim"] == {"claimName": "fsx-datasets", "readOnly": True}
        assert mounts["fsx-datasets"] == "/fsx/datasets" and "/fsx" not in mounts.values()
        # The team's uid/gid (its namespace label), which the admission policy requires.
        assert pod["securityContext"]["runAsUser"] == pod["securityContext"]["fsGroup"] == team.posix_id
        # Security: non-root, no escalation, every capability dropped.
        sc = container["securityContext"]
        assert sc["runAsNonRoot"] and not sc["allowPrivilegeEscalation"] and sc["capabilities"] == {"drop": ["ALL"]}
        assert "add" not in sc["capabilities"]
        # One time budget: torchrun's shutdown wait < pod grace < NodePool grace and < the spot notice.
        shutdown = int(next(a for a in args if a.startswith("--shutdown-timeout=")).split("=")[1])
        grace = pod["terminationGracePeriodSeconds"]
        assert int(env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]["value"]) == shutdown
        assert example_raw["timeBudget"]["checkpointSeconds"] < shutdown < grace < pool.termination_grace_period_seconds
        assert grace < SPOT_NOTICE_SECONDS


def test_changing_gpu_type_to_a100_changes_only_selection(prod_facts, example_raw):
    h100 = render(parse_job_spec(example_raw), prod_facts)
    a100 = render(parse_job_spec({**example_raw, "gpuType": "a100"}), prod_facts)

    def flatten(obj, prefix=""):
        if isinstance(obj, dict):
            for k, v in obj.items():
                yield from flatten(v, f"{prefix}.{k}")
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                yield from flatten(v, f"{prefix}[{i}]")
        else:
            yield prefix, obj

    before, after = dict(flatten(h100)), dict(flatten(a100))
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    selection = ("nodeSelector.", "resources.requests.", "resources.limits.", "labels.mlplatform.io/pool")
    assert changed and all(any(s in k for s in selection) for k in changed), sorted(changed)
    assert any(k.endswith("nodeSelector.mlplatform.io/pool") for k in changed)
    # Same gpus and time budget: the node's size and EFA count follow the pool, nothing else.
    assert not any(k.endswith(GPU_RESOURCE) or "terminationGracePeriodSeconds" in k for k in changed)


@pytest.mark.parametrize("checkpoint, spot, field", [(100, True, "timeBudget.checkpointSeconds"), (60, True, None)])
def test_time_budget_is_validated_against_the_spot_notice_and_pool_grace(prod_facts, example_raw, checkpoint, spot, field):
    raw = {**example_raw, "spot": spot, "timeBudget": {"maxStepSeconds": 10, "checkpointSeconds": checkpoint}}
    if field is None:
        assert _job(raw, prod_facts).budget.grace_seconds < SPOT_NOTICE_SECONDS
        return
    with pytest.raises(JobSpecError) as info:
        _job(raw, prod_facts)
    messages = [p.message for p in info.value.problems if p.path == field]
    assert any("spot notice" in m for m in messages) and any("terminationGracePeriod" in m for m in messages)


def test_on_demand_pool_with_long_grace_allows_a_longer_save(prod_facts, example_raw):
    # a100-reserved: reserved/on-demand only, NodePool grace 150 s: no spot notice to fit.
    job = _job({**example_raw, "gpuType": "a100", "timeBudget": {"maxStepSeconds": 10, "checkpointSeconds": 100}}, prod_facts)
    assert not job.interruptible and SPOT_NOTICE_SECONDS <= job.budget.grace_seconds < 150


def test_spot_false_keeps_the_job_off_spot_nodes(prod_facts, example_raw):
    job = render(parse_job_spec({**example_raw, "spot": False}), prod_facts)
    term = _templates(job)[0]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"] == [{"key": "karpenter.sh/capacity-type", "operator": "NotIn", "values": ["spot"]}]


def test_multi_node_jobs_stay_in_one_zone(prod_facts, example_raw):
    """jobs-ops-4 §5.6: the rendered 2 x p5 PyTorchJob had no zone affinity, so its nodes could sit
    in two AZs (EFA talks only within a subnet, hence an AZ; cross-AZ all-reduce pays latency and
    transfer). Every pod now requires the zone of the job's other pods (Kubernetes inter-pod
    affinity, topologyKey topology.kubernetes.io/zone; the first pod matches itself and may go
    anywhere). A one-node job needs no such term."""
    job = render(parse_job_spec(example_raw), prod_facts)
    for template in _templates(job):
        (term,) = template["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "topology.kubernetes.io/zone"
        # The selector picks this job's pods, and only them: each pod matches its own term.
        assert term["labelSelector"] == {"matchLabels": {"mlplatform.io/job": example_raw["name"]}}
        assert template["metadata"]["labels"]["mlplatform.io/job"] == example_raw["name"]
    single = render(parse_job_spec({**example_raw, "nodes": 1}), prod_facts)
    assert all("podAffinity" not in t["spec"].get("affinity", {}) for t in _templates(single))


def test_unknown_team_and_pool_are_reported_together(prod_facts, example_raw):
    with pytest.raises(JobSpecError) as info:
        _job({**example_raw, "team": "foundation-model", "gpuType": None, "pool": "h10"}, prod_facts)
    problems = {p.path: p for p in info.value.problems}
    assert "did you mean 'foundation-models'" in problems["team"].fix and "did you mean 'h100'" in problems["pool"].fix


def test_priority_above_the_teams_entitlement_is_refused_before_the_cluster_would(prod_facts, example_raw):
    """team-research's default is research: production is refused at render, with the classes it
    may use, as the namespace's admission policy would refuse it (workloads.tenancy)."""
    research = prod_facts.team("research")
    assert research.allowed_priority_classes == ("training-default", "training-research")
    with pytest.raises(JobSpecError) as info:
        _job({**example_raw, "team": "research", "priority": "production"}, prod_facts)
    (problem,) = [p for p in info.value.problems if p.path == "priority"]
    assert "not entitled to training-production" in problem.message and "research" in problem.fix


def test_facts_follow_the_stack_config(plan_config, example_raw):
    """Nothing is hard-coded: a pool's grace period and a team's queue come from the plan."""
    from jobs.facts import facts_from_plan
    from tests.conftest import stack_config

    raw = stack_config("prod")
    assert raw["gpuPools"][0]["name"] == "h100"
    raw["gpuPools"][0].update(checkpointSeconds=40, terminationGracePeriodSeconds=60)
    raw["scheduling"]["teams"][0]["gpuQuota"]["h100"] = 8
    facts = facts_from_plan(plan_config("prod", raw))
    assert facts.pool("h100").termination_grace_period_seconds == 60
    assert facts.team("foundation-models").gpu_quota["gpu-h100"] == 8
    with pytest.raises(JobSpecError) as info:
        _job(example_raw, facts)  # pod grace 75 s is not below the pool's 60 s any more
    assert any("terminationGracePeriod (60s)" in p.message for p in info.value.problems)


# -- job spec errors ----------------------------------------------------------------------------
def test_every_spec_mistake_is_reported_at_once():
    raw = {"name": "Bad_Name", "team": "research", "image": "repo/trainer:latest",
           "trainer": {"config": "trainer/configs/tiny.yaml", "overrides": ["checkpoint.dir=/x", "lr"]},
           "nodes": 0, "gpusPerNode": 8, "gpuType": "h100", "pool": "h100", "dataset": "/data/x", "maxRuntim": "3h"}
    with pytest.raises(JobSpecError) as info:
        parse_job_spec(raw)
    problems = {p.path: p for p in info.value.problems}
    assert set(problems) == {"name", "image", "trainer.overrides", "nodes", "dataset", "maxRuntim", "pool/gpuType"}
    assert problems["maxRuntim"].fix == "did you mean 'maxRuntime'?"
    assert problems["nodes"].value == 0 and ">= 1" in problems["nodes"].fix
    assert "checkpoint.dir" in problems["trainer.overrides"].message
    assert isinstance(info.value, InvalidInputError) and "Traceback" not in str(info.value)


def test_example_spec_file_loads():
    spec = load_job_spec(EXAMPLE)
    assert (spec.nodes, spec.gpus_per_node, spec.gpu_type, spec.spot) == (2, 8, "h100", True)


# -- the operator's environment (what --local emulates) -----------------------------------------
def test_operator_env_follows_training_operator_envvar_go(prod_facts, example_raw):
    job = render(parse_job_spec({**example_raw, "nodes": 3}), prod_facts)
    reps = replicas(job)
    assert [(r.replica_type, r.index) for r in reps] == [("master", 0), ("worker", 0), ("worker", 1)]
    envs = [operator_env(job, r, master_addr="10.0.0.1", master_port=23456) for r in reps]
    # WORLD_SIZE = replicas x nprocPerNode; RANK = PET_NODE_RANK = index, +1 for workers.
    assert {e["WORLD_SIZE"] for e in envs} == {"24"} and {e["PET_NNODES"] for e in envs} == {"3"}
    assert [e["RANK"] for e in envs] == [e["PET_NODE_RANK"] for e in envs] == ["0", "1", "2"]
    assert {e["PET_NPROC_PER_NODE"] for e in envs} == {"8"}
    assert {(e["MASTER_ADDR"], e["PET_MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("10.0.0.1", "10.0.0.1", "23456")}


def test_kubelet_expansion_of_args():
    env = {"PET_NNODES": "2", "A": "x"}
    assert expand("--nnodes=$(PET_NNODES)", env) == "--nnodes=2"
    assert expand("$(UNDEFINED)-$$(A)-$(A)", env) == "$(UNDEFINED)-$(A)-x"


def test_gpus_per_node_beyond_the_pool_instances_is_refused(prod_facts, example_raw):
    with pytest.raises(JobSpecError) as info:
        _job({**example_raw, "gpusPerNode": 16}, prod_facts)
    (problem,) = [p for p in info.value.problems if p.path == "gpusPerNode"]
    assert "p5.48xlarge" in problem.message and "8 GPUs per node" in problem.message


def test_gpudirect_rdma_only_on_p_instances(prod_facts, example_raw):
    def env_of(facts):
        job = render(parse_job_spec(example_raw), facts)
        return {e["name"] for e in _templates(job)[0]["spec"]["containers"][0]["env"]}

    assert {"FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA"} <= env_of(prod_facts)
    h100 = prod_facts.pool("h100")
    g6e = dataclasses.replace(h100, instance_types=("g6e.48xlarge",), efa_devices_per_node=4)
    facts = dataclasses.replace(prod_facts, pools=tuple(g6e if p is h100 else p for p in prod_facts.pools))
    env = env_of(facts)
    assert "FI_PROVIDER" in env and "FI_EFA_USE_DEVICE_RDMA" not in env and "NCCL_NET_GDR_LEVEL" not in env


def test_without_an_experiment_the_job_logs_where_its_team_login_may_write(prod_facts, example_raw):
    # A team's MLflow login may create experiments only under its prefix <namespace>/ (and then
    # MANAGEs them): the default is the job's name there.
    raw = {k: v for k, v in copy.deepcopy(example_raw).items() if k != "experiment"}
    job = _job(raw, prod_facts)
    env = {e["name"]: e.get("value") for e in render_pytorchjob(job)["spec"]["pytorchReplicaSpecs"]["Master"]
           ["template"]["spec"]["containers"][0]["env"]}
    assert env["MLFLOW_EXPERIMENT_NAME"] == f"{job.team.namespace}/{raw['name']}"


def test_only_the_master_pod_serves_and_is_scraped_for_trainer_health(prod_facts, example_raw):
    """Rank 0 lives in the Master pod: it alone gets the health port, its env and the label the
    PodMonitor selects; workers would be scraped as always-down targets."""
    from workloads.monitoring.stack import TRAINER_METRICS_LABEL, TRAINER_METRICS_PORT, trainer_pod_monitor
    job = render_pytorchjob(_job(example_raw, prod_facts))
    master, worker = (job["spec"]["pytorchReplicaSpecs"][r]["template"] for r in ("Master", "Worker"))
    assert master["metadata"]["labels"][TRAINER_METRICS_LABEL] == "true"
    assert TRAINER_METRICS_LABEL not in worker["metadata"]["labels"]
    (port,) = [p for p in master["spec"]["containers"][0]["ports"] if p["name"] == "metrics"]
    assert port["containerPort"] == TRAINER_METRICS_PORT
    env = {e["name"]: e.get("value") for e in master["spec"]["containers"][0]["env"]}
    assert env["TRAINER_METRICS_PORT"] == str(TRAINER_METRICS_PORT) and env["TRAINER_JOB_NAME"] == job["metadata"]["name"]
    monitor = trainer_pod_monitor(job["metadata"]["namespace"])
    assert monitor["spec"]["selector"]["matchLabels"] == {TRAINER_METRICS_LABEL: "true"}
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


def test_trainjob_rank0_is_scraped_for_trainer_health(prod_facts, example_raw):
    """A TrainJob's nodes share one pod template and cannot declare ports (runtimePatches
    containers take env, volumeMounts, securityContext only: the TrainJob CRD 2.3.0). Trainer
    v2.3's torch plugin sets PET_NODE_RANK from the Job completion index; Kubernetes labels an
    Indexed Job's pods ``batch.kubernetes.io/job-completion-index`` (v1.28+). Prometheus's pod
    role: "If a container has no specified ports, a port-free target per container is created for
    manually adding a port via relabeling". So: every node's pod carries the label and the port
    env, and the TrainJob PodMonitor keeps node 0's trainer container at <pod IP>:<port>."""
    import re

    from workloads.monitoring.stack import (
        JOB_COMPLETION_INDEX_LABEL, TRAINER_METRICS_LABEL, TRAINER_METRICS_PORT, trainer_scrape_policy, trainjob_pod_monitor,
    )
    raw = {**copy.deepcopy(example_raw), "runtime": "trainjob"}
    facts = dataclasses.replace(prod_facts, trainer_v2_runtime=prod_facts.trainer_v2_runtime or "torch-distributed")
    trainjob = render_trainjob(_job(raw, facts))
    template = trainjob["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0][
        "template"]["spec"]["template"]
    env = {e["name"]: e.get("value") for e in trainjob["spec"]["trainer"]["env"]}
    assert env["TRAINER_METRICS_PORT"] == str(TRAINER_METRICS_PORT) and env["TRAINER_JOB_NAME"] == raw["name"]
    namespace = trainjob["metadata"]["namespace"]
    monitor = trainjob_pod_monitor(namespace)
    selector = monitor["spec"]["selector"]["matchLabels"]
    # The pods JobSet creates for numNodes=2: the template's labels plus each pod's index.
    pods = [{**template["metadata"]["labels"], JOB_COMPLETION_INDEX_LABEL: str(i)} for i in range(2)]
    selected = [i for i, labels in enumerate(pods) if all(labels.get(k) == v for k, v in selector.items())]
    assert selected == [0]
    # Prometheus applies the relabelings to each container target of the selected pod.
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    targets = []
    for container in ("node", "istio-proxy"):
        meta = {"__meta_kubernetes_pod_container_name": container, "__meta_kubernetes_pod_ip": "10.0.1.7",
                "__address__": "10.0.1.7"}
        keep = True
        for rule in endpoint["relabelings"]:
            value = ";".join(meta.get(s, "") for s in rule["sourceLabels"])
            match = re.fullmatch(rule.get("regex", "(.*)"), value)
            if rule.get("action") == "keep":
                keep = keep and match is not None
            elif match:
                meta[rule["targetLabel"]] = match.expand(rule.get("replacement", "$1").replace("$1", r"\1"))
        if keep:
            targets.append(meta["__address__"])
    assert targets == [f"10.0.1.7:{TRAINER_METRICS_PORT}"]
    # The team namespace's NetworkPolicy admits Prometheus to both kinds of rank-0 pod.
    expressions = trainer_scrape_policy(namespace)["spec"]["podSelector"]["matchExpressions"]
    assert expressions == [{"key": TRAINER_METRICS_LABEL, "operator": "In", "values": ["true", "trainjob"]}]


def test_training_operator_service_monitor_matches_the_pinned_service():
    """kubeflow/trainer v1.9.4 (commit 4445c12a), manifests/base/service.yaml:
        metadata: {labels: {app: training-operator}, name: training-operator}
        spec: {ports: [{name: monitoring-port, port: 8080, targetPort: 8080},
                       {name: webhook-server, port: 443, targetPort: 9443}],
               selector: {control-plane: kubeflow-training-operator}}
    cmd/training-operator.v1/main.go: --metrics-bind-address default ":8080".
    A ServiceMonitor's selector matches the *Service's* labels (prometheus-operator API), not its
    pod selector."""
    from workloads.monitoring.stack import platform_scrape_targets, service_monitor

    upstream_service = {"metadata": {"labels": {"app": "training-operator"}, "name": "training-operator"},
                        "spec": {"ports": [{"name": "monitoring-port", "port": 8080, "targetPort": 8080},
                                           {"name": "webhook-server", "port": 443, "targetPort": 9443}],
                                 "selector": {"control-plane": "kubeflow-training-operator"}}}
    (target,) = [t for t in platform_scrape_targets(gpu_namespace="g", karpenter_namespace="k", kueue_namespace="q",
                                                    training_operator_namespace="kubeflow") if t.name == "training-operator"]
    monitor = service_monitor(target)
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert all(upstream_service["metadata"]["labels"].get(k) == v for k, v in selector.items())
    (port,) = [p for p in upstream_service["spec"]["ports"] if p["name"] == monitor["spec"]["endpoints"][0]["port"]]
    assert port["targetPort"] == 8080
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == ["kubeflow"]


def test_a_gpu_fault_report_names_the_node_the_kubelet_ran_the_pod_on(prod_facts, example_raw, tmp_path, monkeypatch):
    """The launcher names the faulty node in the termination message from NODE_NAME; the rendered
    pod gets it from the downward API, which the kubelet resolves to the pod's spec.nodeName."""
    from trainer.gpu_faults import gpu_fault, parse_termination_message
    from trainer.launch import report_gpu_fault

    job = render(parse_job_spec(example_raw), prod_facts)
    for template in _templates(job):
        (container,) = [c for c in template["spec"]["containers"] if c["name"] == "pytorch"]
        source = next(e for e in container["env"] if e["name"] == "NODE_NAME")["valueFrom"]["fieldRef"]["fieldPath"]
        bound_pod = {"spec": {"nodeName": "ip-10-1-2-3.ec2.internal"}}
        value = bound_pod
        for part in source.split("."):
            value = value[part]
        monkeypatch.setenv("NODE_NAME", value)
        log = tmp_path / "termination-log"
        log.write_text("")
        report_gpu_fault([{"rank": 0, "local_rank": 0, "gpu_fault": gpu_fault(RuntimeError("CUDA error: unspecified launch failure"))}],
                         path=str(log))
        assert [line.node for line in parse_termination_message(log.read_text())] == ["ip-10-1-2-3.ec2.internal"]
