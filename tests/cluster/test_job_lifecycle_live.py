"""A job's life on the real control plane with the real pinned controllers (issue 32, 4a-4b).

A team member submits an example job with ``JobClient`` (a kubeconfig carrying the group the
platform's access mapping gives the team). From there only real controllers act:

- Kueue v0.19.2, configured with the stack's own manager Configuration, admits the Workload into
  the team's ClusterQueue and unsuspends the PyTorchJob;
- the Training Operator v1.9.4 creates the pods;
- Karpenter v1.14.1 (kwok provider) launches a NodeClaim from the pool the job asks for, registers
  its node with the pool's labels, taints and startup taints; the startup taints' owners lift
  them (tools/cluster/standins.py); kube-scheduler places the pods;
- kwok runs the pods, and ends them when the test says how (``standins.signalled_pod_stages``:
  kwok's own chaos stage for an exit code, its pod-complete stage for success).

Restarts follow the Training Operator's ``restartPolicy: ExitCode``, which the platform renders for
every replica (workloads/trainingjob.py ``render_pytorchjob``). Upstream, v1.9.4
pkg/controller.v1/common/pod.go ReconcilePods:

    if spec.RestartPolicy == apiv1.RestartPolicyExitCode && trainutil.IsRetryableExitCode(exitCode) || ...
        logger.Infof("Need to restart the pod: %v.%v", pod.Namespace, pod.Name)
        if err := jc.PodControl.DeletePod(pod.Namespace, pod.Name, runtimeObject); err != nil {
    ...
    } else if spec.RestartPolicy == apiv1.RestartPolicyExitCode && !trainutil.IsRetryableExitCode(exitCode) {
        logger.Infof("Pod %q has a non-retryable exit code. Failing job.", klog.KObj(pod))

with pkg/util/train/train_util.go ``IsRetryableExitCode``: ``return exitCode >= 128``. So a pod that
exits 143 (the trainer's answer to SIGTERM when the spot node goes) is deleted and recreated, and
a pod that exits 2 fails the job at once: no retry is spent on a permanent error.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from jobs.client import JobClient
from tests.cluster.clients import team_client
from jobs.store import LocalStore
from tools.cluster.standins import (POD_COMPLETE_LABEL, POD_FAILED_EXIT_CODE, POD_FAILED_LABEL,
                                    STARTUP_TAINT_OWNERS, wait_for)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = {"dev": "examples/jobs/l4-dev-smoke.yaml", "prod": "examples/jobs/gpt2-pretrain.yaml"}
# Bounded waits: a real controller on a loaded 2-core machine, not a sleep standing for a result.
ADMIT_S, LAUNCH_S, RUN_S, END_S = 240, 300, 300, 240


def _client(cluster, team: str) -> JobClient:
    # Checkpoints: an empty local store stands for the bucket (nothing here runs the trainer,
    # so there is nothing to read; no AWS call).
    return team_client(cluster, team, store=LocalStore(str(cluster.plane.workdir / "checkpoints")))


def _example(cluster, suffix: str) -> dict:
    raw = yaml.safe_load((ROOT / EXAMPLE[cluster.stack]).read_text())
    raw["name"] = f"{raw['name']}-{suffix}"
    return raw


def _json(cluster, *args):
    return json.loads(cluster.kubectl(*args, "-o", "json").stdout)


def _pods(cluster, name, namespace):
    return _json(cluster, "get", "pods", "-n", namespace, "-l", f"training.kubeflow.org/job-name={name}")["items"]


def _conditions(obj) -> dict[str, dict]:
    return {c["type"]: c for c in obj.get("status", {}).get("conditions", []) if c.get("status") == "True"}


def _diagnose(cluster, namespace) -> str:
    parts = [cluster.kubectl("get", "workloads,pytorchjobs,pods", "-n", namespace, "-o", "wide", check=False).stdout,
             cluster.kubectl("get", "nodeclaims,nodes", "-o", "wide", check=False).stdout,
             cluster.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False).stdout[-3000:],
             cluster.controllers.logs(8)]
    return "\n".join(parts)


def _wait(cluster, namespace, predicate, what, timeout_s):
    try:
        return wait_for(predicate, what, timeout_s=timeout_s, interval_s=1)
    except TimeoutError as exc:
        raise AssertionError(f"{cluster.stack}: {exc}\n{_diagnose(cluster, namespace)}") from None


def _running_pods(cluster, name, namespace, count):
    def ready():
        pods = _pods(cluster, name, namespace)
        running = [p for p in pods if p["status"].get("phase") == "Running" and p["spec"].get("nodeName")
                   and not p["metadata"].get("deletionTimestamp")]
        return running if len(running) == count else None
    return _wait(cluster, namespace, ready, f"{count} pod(s) of {name} Running on a node", RUN_S + LAUNCH_S)


def _end_pods(cluster, pods, *, exit_code=None):
    for pod in pods:
        meta = pod["metadata"]
        if exit_code is None:
            cluster.kubectl("label", "pod", meta["name"], "-n", meta["namespace"], f"{POD_COMPLETE_LABEL}=true")
        else:
            cluster.kubectl("annotate", "pod", meta["name"], "-n", meta["namespace"], f"{POD_FAILED_EXIT_CODE}={exit_code}")
            cluster.kubectl("label", "pod", meta["name"], "-n", meta["namespace"], f"{POD_FAILED_LABEL}=true")


def _phase(client, name, team, phases, cluster, namespace, timeout_s=END_S):
    return _wait(cluster, namespace, lambda: client.get(name, team).phase in phases and client.get(name, team),
                 f"{name} reaches {phases}", timeout_s)


@pytest.fixture(scope="module")
def cluster(stack_controllers):
    return stack_controllers


def _pool(cluster, spec_pool: str) -> dict:
    for pool in cluster.layer.of_kind("NodePool"):
        if pool["spec"]["template"]["metadata"]["labels"].get("mlplatform.io/pool") == spec_pool:
            return pool
    raise AssertionError(f"no NodePool for pool {spec_pool}")


def test_a_team_job_is_admitted_launched_run_to_completion_and_read_back(cluster):
    raw = _example(cluster, "life")
    client = _client(cluster, raw["team"])
    submitted = client.submit(client.load(raw))
    job, namespace = submitted.job, submitted.job.namespace
    name, team = job.name, raw["team"]

    # Kueue admits it within the team's quota (describe reads the Workload).
    detail = _wait(cluster, namespace, lambda: (d := client.describe(name, team)).admission.admitted and d,
                   f"Kueue admits {name}", ADMIT_S)
    assert detail.admission.flavors, detail.admission

    # Karpenter launches nodes from the job's pool; kwok runs the pods once the startup taints are gone.
    pods = _running_pods(cluster, name, namespace, job.nodes)
    pool = _pool(cluster, job.pool)
    template = pool["spec"]["template"]
    for pod in pods:
        node = _json(cluster, "get", "node", pod["spec"]["nodeName"])
        labels = node["metadata"]["labels"]
        assert labels.get("karpenter.sh/nodepool") == pool["metadata"]["name"], labels
        assert template["metadata"]["labels"].items() <= labels.items(), (template["metadata"]["labels"], labels)
        taints = {(t["key"], t["effect"]) for t in node["spec"].get("taints", [])}
        assert {(t["key"], t["effect"]) for t in template["spec"].get("taints", [])} <= taints, taints
        assert not {k for k, _ in taints} & set(STARTUP_TAINT_OWNERS), f"startup taints left: {taints}"
        claim = next(c for c in _json(cluster, "get", "nodeclaims")["items"]
                     if c.get("status", {}).get("nodeName") == node["metadata"]["name"])
        # The node was registered with the pool's startup taints (Karpenter copies them to the
        # NodeClaim and the node; the owners lifted them).
        assert claim["spec"].get("startupTaints", []) == template["spec"].get("startupTaints", []), claim["spec"]
    capacity_types = next(r["values"] for r in template["spec"]["requirements"] if r["key"] == "karpenter.sh/capacity-type")
    for pod in pods:
        node_labels = _json(cluster, "get", "node", pod["spec"]["nodeName"])["metadata"]["labels"]
        assert node_labels["karpenter.sh/capacity-type"] in capacity_types, node_labels
    running = client.describe(name, team)
    assert running.job.phase == "Running", running.job
    assert {p.node for p in running.pods} == {p["spec"]["nodeName"] for p in pods}, running.pods

    # kwok ends the containers with exit 0: the PyTorchJob succeeds, and the client says so.
    _end_pods(cluster, pods)
    done = _phase(client, name, team, ("Succeeded",), cluster, namespace)
    assert done.phase == "Succeeded"
    assert name in [j.name for j in client.list(team, include_finished=True)]
    assert name not in [j.name for j in client.list(team)], "a finished job is listed as active"
    assert client.describe(name, team).job.phase == "Succeeded"


def test_cancel_removes_a_running_job_and_its_pods(cluster):
    raw = _example(cluster, "cancel")
    client = _client(cluster, raw["team"])
    submitted = client.submit(client.load(raw))
    name, team, namespace = submitted.job.name, raw["team"], submitted.job.namespace
    _running_pods(cluster, name, namespace, submitted.job.nodes)
    cancelled = client.cancel(name, team, wait=True, timeout_seconds=END_S, poll_seconds=1)
    assert cancelled.gone, cancelled
    assert not _pods(cluster, name, namespace), "pods outlived the cancelled job"
    assert name not in [j.name for j in client.list(team)]
    # The history record (a ConfigMap the team's own identity wrote) keeps it in `list --all`.
    assert [j.phase for j in client.list(team, include_finished=True) if j.name == name] == ["Cancelled"]


def test_spot_loss_pods_exit_143_and_are_restarted_then_the_job_completes(cluster):
    """The spot node goes: its pods end 143 (the kubelet's report of a container that exited on
    SIGTERM, kwok's chaos stage), and Karpenter deletes the node (the NodeClaim is deleted, as
    Karpenter's interruption handling does on a spot notice). The Training Operator deletes the
    failed pods and creates new ones (retryable exit code under ExitCode), Karpenter launches a
    new node for them, and the job completes."""
    raw = _example(cluster, "spot")
    client = _client(cluster, raw["team"])
    submitted = client.submit(client.load(raw))
    name, team, namespace = submitted.job.name, raw["team"], submitted.job.namespace
    first = _running_pods(cluster, name, namespace, submitted.job.nodes)
    first_uids = {p["metadata"]["uid"] for p in first}
    nodes = {p["spec"]["nodeName"] for p in first}

    _end_pods(cluster, first, exit_code=143)
    for claim in _json(cluster, "get", "nodeclaims")["items"]:
        if claim.get("status", {}).get("nodeName") in nodes:
            cluster.kubectl("delete", "nodeclaim", claim["metadata"]["name"], "--wait=false")

    def replaced():
        pods = [p for p in _pods(cluster, name, namespace) if p["metadata"]["uid"] not in first_uids
                and p["status"].get("phase") == "Running" and p["spec"].get("nodeName") not in nodes]
        return pods if len(pods) == submitted.job.nodes else None
    second = _wait(cluster, namespace, replaced, f"{name}'s pods recreated and Running on a new node", RUN_S + LAUNCH_S)
    # The operator said why (its event; the Restarting condition is dropped again once Running,
    # pkg/util/status.go filterOutCondition).
    events = _json(cluster, "get", "events", "-n", namespace, "--field-selector",
                   f"involvedObject.kind=PyTorchJob,involvedObject.name={name}")["items"]
    restarts = [e["message"] for e in events if "restarting because" in e.get("message", "")]
    assert restarts, [e.get("message") for e in events]
    job = _json(cluster, "get", "pytorchjob", name, "-n", namespace)
    assert "Failed" not in _conditions(job), job["status"]

    _end_pods(cluster, second)
    assert _phase(client, name, team, ("Succeeded",), cluster, namespace).phase == "Succeeded"


def test_a_permanent_failure_exit_2_fails_the_job_without_a_retry(cluster):
    raw = _example(cluster, "exit2")
    client = _client(cluster, raw["team"])
    submitted = client.submit(client.load(raw))
    name, team, namespace = submitted.job.name, raw["team"], submitted.job.namespace
    pods = _running_pods(cluster, name, namespace, submitted.job.nodes)
    uids = {p["metadata"]["uid"] for p in pods}
    master = [p for p in pods if p["metadata"]["labels"].get("training.kubeflow.org/replica-type", "").lower() == "master"]
    _end_pods(cluster, master, exit_code=2)
    failed = _phase(client, name, team, ("Failed",), cluster, namespace)
    assert failed.phase == "Failed"
    detail = client.describe(name, team)
    assert detail.job.phase == "Failed", detail.job
    assert any(p.exit_code == 2 for p in detail.pods), detail.pods
    # Nothing was recreated: every pod of the job is one of the first ones.
    assert {p["metadata"]["uid"] for p in _pods(cluster, name, namespace)} <= uids


# -- quota and priority (issue 32, 4c) ------------------------------------------------------------
# A pool whose GPUs the cohort shares: the team's own nominal quota plus what the others may lend
# (Kueue lends only nominal quota of the cohort's ClusterQueues).
QUOTA_EXAMPLE = {"dev": "examples/jobs/a10g-multinode-ddp.yaml", "prod": "examples/jobs/a100-reserved-continued-pretrain.yaml"}


def _cohort_gpus(cluster, flavor: str) -> int:
    total = 0
    for queue in cluster.layer.of_kind("ClusterQueue"):
        for group in queue["spec"]["resourceGroups"]:
            for entry in group["flavors"]:
                if entry["name"] == flavor:
                    total += sum(int(r["nominalQuota"]) for r in entry["resources"] if r["name"] == "nvidia.com/gpu")
    return total


def _priorities(cluster, team: str) -> tuple[str, str]:
    """The team's lowest and highest entitled priority (the namespace's annotation; values from
    the platform's PriorityClasses)."""
    from workloads.tenancy import ALLOWED_PRIORITIES_ANNOTATION

    namespace = cluster.layer.find("Namespace", f"team-{team}")
    allowed = namespace["metadata"]["annotations"][ALLOWED_PRIORITIES_ANNOTATION].split(",")
    values = {p["metadata"]["name"]: p["value"] for p in cluster.layer.of_kind("PriorityClass")}
    ordered = sorted(allowed, key=values.__getitem__)
    return ordered[0].removeprefix("training-"), ordered[-1].removeprefix("training-")


def _workload(cluster, job_uid: str, namespace: str):
    for workload in _json(cluster, "get", "workloads", "-n", namespace)["items"]:
        if any(ref.get("uid") == job_uid for ref in workload["metadata"].get("ownerReferences", [])):
            return workload
    return None


def test_a_job_beyond_the_quota_waits_and_a_higher_priority_job_preempts_a_lower_one(cluster):
    """Kueue (the stack's ClusterQueues, v0.19.2): a job that needs GPUs the cohort has already
    given out stays unadmitted, and ``describe`` quotes Kueue's reason; a job of the team's
    highest priority preempts a running job of its lowest (``preemption.withinClusterQueue:
    LowerPriority``, workloads/kueue.py), whose Workload is evicted with reason Preempted
    (kueue apis/kueue/v1beta2/workload_types.go: ``WorkloadEvictedByPreemption = "Preempted"``) and whose PyTorchJob is
    suspended again."""
    base = yaml.safe_load((ROOT / QUOTA_EXAMPLE[cluster.stack]).read_text())
    team, per_node = base["team"], int(base["gpusPerNode"])
    flavor = f"gpu-{base['pool']}"
    cohort_nodes = _cohort_gpus(cluster, flavor) // per_node
    assert cohort_nodes >= 2, f"{flavor}: the cohort's quota holds {cohort_nodes} node(s)"
    low, high = _priorities(cluster, team)
    assert low != high, f"team {team} is entitled to one priority only"
    client = _client(cluster, team)

    def submit(suffix, nodes, priority):
        raw = {**base, "name": f"{base['name'][:40]}-{suffix}", "nodes": nodes, "priority": priority}
        return client.submit(client.load(raw)).job

    holder = submit("holder", cohort_nodes, low)
    _running_pods(cluster, holder.name, holder.namespace, holder.nodes)

    waiting = submit("waiting", 1, low)
    namespace = waiting.namespace

    def reason_given():
        workload = _workload(cluster, waiting.uid, namespace)
        if workload is None:
            return None
        quota = next((c for c in workload.get("status", {}).get("conditions", []) if c["type"] == "QuotaReserved"), None)
        return quota if quota and quota["status"] == "False" and quota.get("message") else None
    condition = _wait(cluster, namespace, reason_given, f"Kueue gives {waiting.name} a reason to wait", ADMIT_S)
    assert "insufficient unused quota" in condition["message"], condition
    detail = client.describe(waiting.name, team)
    assert not detail.admission.admitted and detail.job.phase == "Queued", detail
    assert condition["message"] in detail.admission.reason, (condition["message"], detail.admission.reason)
    assert not _pods(cluster, waiting.name, namespace), "a job Kueue did not admit has pods"

    urgent = submit("urgent", max(1, cohort_nodes // 2), high)

    def preempted():
        workload = _workload(cluster, holder.uid, namespace)
        evicted = next((c for c in (workload or {}).get("status", {}).get("conditions", [])
                        if c["type"] == "Evicted" and c["status"] == "True"), None)
        return evicted
    evicted = _wait(cluster, namespace, preempted, f"{urgent.name} ({high}) preempts {holder.name} ({low})", ADMIT_S)
    assert evicted["reason"] == "Preempted", evicted
    _wait(cluster, namespace, lambda: client.describe(urgent.name, team).admission.admitted,
          f"{urgent.name} admitted after the preemption", ADMIT_S)
    _wait(cluster, namespace, lambda: client.get(holder.name, team).phase == "Queued",
          f"{holder.name} suspended and queued again", END_S)
    for job in (holder, waiting, urgent):
        client.cancel(job.name, team)


def test_the_restore_drill_is_admitted_to_the_cpu_pool_and_its_pod_is_created(cluster):
    """The restore drill (``checkpoints --verify``) is a CPU-only Job in the team's queue. Kueue
    gives a workload the first flavor, in the ClusterQueue's order, where its requests fit (kueue
    v0.19.2 flavorassigner.go ``findFlavorForPodSets``) and writes that flavor's node labels and
    tolerations into the pods (pkg/podset/podset.go). When the GPU flavors came first, the drill got a
    GPU pool's selector and GPU toleration, and the job controller's pod was refused by the
    gpu-less-pods policy: no drill ever ran. Here the real Kueue must admit it to the general CPU
    pool's flavor, and the real job controller's pod must be created (the policies admit it) with
    that pool's selector and no GPU toleration."""
    from workloads.trainingjob import team_checkpoint_root

    raw = _example(cluster, "drill")
    team = raw["team"]
    namespace = f"team-{team}"
    client = _client(cluster, team)
    verdict, detail = client.verify_checkpoint_in_cluster(
        raw["name"], team, 5, checkpoint_dir=f"{team_checkpoint_root(namespace)}/{raw['name']}", image="trainer:drill",
        timeout_seconds=0, poll_seconds=0)
    assert verdict == "FAIL" and "no verdict" in detail, detail  # kwok runs no trainer: no verdict is expected

    def admitted():
        for workload in _json(cluster, "get", "workloads.kueue.x-k8s.io", "-n", namespace)["items"]:
            owners = [o["name"] for o in workload["metadata"].get("ownerReferences", [])]
            if any(o.startswith(f"verify-{raw['name']}") for o in owners) and "Admitted" in _conditions(workload):
                return workload
        return None

    workload = _wait(cluster, namespace, admitted, "the drill's Workload admitted", ADMIT_S)
    flavors = {f for ps in workload["status"]["admission"]["podSetAssignments"] for f in ps["flavors"].values()}
    assert flavors == {"cpu-general"}, flavors

    def created():
        pods = _json(cluster, "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/name=checkpoint-drill")["items"]
        return pods or None

    (pod,) = _wait(cluster, namespace, created, "the drill's pod created by the job controller", ADMIT_S)
    assert pod["spec"]["nodeSelector"] == {"mlplatform.io/pool": "general"}
    assert not [t for t in pod["spec"].get("tolerations", []) if t.get("key") == "nvidia.com/gpu"]
    events = cluster.kubectl("get", "events", "-n", namespace, "--field-selector", "reason=FailedCreate",
                             "-o", "json").stdout
    assert "verify-" not in events, events
