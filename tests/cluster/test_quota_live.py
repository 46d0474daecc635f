"""Quotas, priorities and gang admission, decided by the real Kueue with the stack's queues.

- a job beyond what the cohort has waits, and a job of the team's highest priority preempts one of
  its lowest (``preemption.withinClusterQueue: LowerPriority``);
- borrowing and reclaim: a team runs beyond its nominal quota on another team's idle GPUs, and
  gives them back when that team needs them (``reclaimWithinCohort: Any``);
- ``waitForPodsReady``: an admitted gang whose pods cannot all start is evicted and queued again;
- the namespace ResourceQuota refuses what bypasses Kueue;
- the restore drill is admitted to the CPU pool.
"""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
import yaml

from tests.cluster import lifecycle as lc
from tests.cluster.lifecycle import ROOT
from tools.cluster.api import EventuallyTimeout

# A pool whose GPUs the cohort shares: the team's own nominal quota plus what the others may lend
# (Kueue lends only nominal quota of the cohort's ClusterQueues).
QUOTA_EXAMPLE = {"dev": "examples/jobs/a10g-multinode-ddp.yaml", "prod": "examples/jobs/a100-reserved-continued-pretrain.yaml"}


@pytest.fixture
def cluster(stack_cluster):
    return stack_cluster


def nominal_gpus(cluster, flavor: str) -> dict[str, int]:
    """GPUs of ``flavor`` each ClusterQueue holds as nominal quota."""
    quota = {}
    for queue in cluster.layer.of_kind("ClusterQueue"):
        for group in queue["spec"]["resourceGroups"]:
            for entry in group["flavors"]:
                if entry["name"] == flavor:
                    quota[queue["metadata"]["name"]] = sum(int(r["nominalQuota"]) for r in entry["resources"]
                                                           if r["name"] == "nvidia.com/gpu")
    return quota


def priorities(cluster, team: str) -> tuple[str, str]:
    """The team's lowest and highest entitled priority (the namespace's annotation; values from
    the platform's PriorityClasses)."""
    from workloads.tenancy import ALLOWED_PRIORITIES_ANNOTATION

    namespace = cluster.layer.find("Namespace", f"team-{team}")
    allowed = namespace["metadata"]["annotations"][ALLOWED_PRIORITIES_ANNOTATION].split(",")
    values = {p["metadata"]["name"]: p["value"] for p in cluster.layer.of_kind("PriorityClass")}
    ordered = sorted(allowed, key=values.__getitem__)
    return ordered[0].removeprefix("training-"), ordered[-1].removeprefix("training-")


def condition(obj, kind: str):
    return next((c for c in (obj or {}).get("status", {}).get("conditions", []) if c["type"] == kind), None)


def test_a_job_beyond_the_quota_waits_and_a_higher_priority_job_preempts_a_lower_one(cluster, scope):
    """Kueue (the stack's ClusterQueues, v0.19.2): a job that needs GPUs the cohort has already
    given out stays unadmitted, and ``describe`` quotes Kueue's reason; a job of the team's
    highest priority preempts a running job of its lowest (``preemption.withinClusterQueue:
    LowerPriority``, workloads/kueue.py), whose Workload is evicted with reason Preempted
    (kueue apis/kueue/v1beta2/workload_types.go: ``WorkloadEvictedByPreemption = "Preempted"``)
    and whose PyTorchJob is suspended again."""
    base = yaml.safe_load((ROOT / QUOTA_EXAMPLE[cluster.stack]).read_text())
    team, per_node = base["team"], int(base["gpusPerNode"])
    flavor = f"gpu-{base['pool']}"
    cohort_nodes = sum(nominal_gpus(cluster, flavor).values()) // per_node
    assert cohort_nodes >= 2, f"{flavor}: the cohort's quota holds {cohort_nodes} node(s)"
    low, high = priorities(cluster, team)
    assert low != high, f"team {team} is entitled to one priority only"
    client = lc.client(cluster, team)

    def submit(suffix, nodes, priority):
        raw = {**base, "name": scope.name(suffix), "nodes": nodes, "priority": priority}
        return client.submit(client.load(raw)).job

    lc.release_empty_nodes(cluster, base["pool"])  # the holder takes the whole pool, in one zone
    holder = submit("holder", cohort_nodes, low)
    try:
        lc.running_pods(cluster, holder.name, holder.namespace, holder.nodes)
    except EventuallyTimeout as exc:
        # Not what this test checks (Kueue's quota and preemption): once, in a whole parallel run,
        # Karpenter launched the holder's nodes in two zones, so the pods that must share one zone
        # (pod affinity) could not all start within the pool's node limit. Karpenter takes the
        # zone from pods already bound (v1.14.1 scheduling/topology.go countDomains skips unbound
        # pods) and otherwise picks one at random (topologygroup.go nextDomainAffinity); under the
        # load of a full run the holder's pods can reach it in separate passes before any is bound.
        pytest.xfail(f"the holder's {holder.nodes} nodes did not all start in one zone: {str(exc)[:400]}")

    waiting = submit("waiting", 1, low)
    namespace = waiting.namespace

    def reason_given():
        quota = condition(lc.workload_of(cluster, waiting.uid, namespace), "QuotaReserved")
        return quota if quota and quota["status"] == "False" and quota.get("message") else None
    reserved = lc.wait(cluster, namespace, reason_given, f"Kueue gives {waiting.name} a reason to wait", lc.ADMIT_S)
    assert "insufficient unused quota" in reserved["message"], reserved
    detail = client.describe(waiting.name, team)
    assert not detail.admission.admitted and detail.job.phase == "Queued", detail
    assert reserved["message"] in detail.admission.reason, (reserved["message"], detail.admission.reason)
    assert not lc.job_pods(cluster, waiting.name, namespace), "a job Kueue did not admit has pods"

    urgent = submit("urgent", max(1, cohort_nodes // 2), high)

    def preempted():
        evicted = condition(lc.workload_of(cluster, holder.uid, namespace), "Evicted")
        return evicted if evicted and evicted["status"] == "True" else None
    evicted = lc.wait(cluster, namespace, preempted, f"{urgent.name} ({high}) preempts {holder.name} ({low})", lc.ADMIT_S)
    assert evicted["reason"] == "Preempted", evicted
    lc.wait(cluster, namespace, lambda: client.describe(urgent.name, team).admission.admitted,
            f"{urgent.name} admitted after the preemption", lc.ADMIT_S)
    lc.wait(cluster, namespace, lambda: client.get(holder.name, team).phase == "Queued",
            f"{holder.name} suspended and queued again", lc.END_S)


def _borrowing_flavor(cluster):
    """A GPU flavor two teams both hold nominal quota of, and its example job: the one whose
    borrow-then-reclaim needs the fewest nodes."""
    best = None
    for path in sorted((ROOT / "examples" / "jobs").glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        if not isinstance(raw, dict) or "team" not in raw or f"# stack: {cluster.stack}" not in path.read_text():
            continue
        flavor = f"gpu-{lc.pool_of(cluster, raw)}"
        quota = {q: g for q, g in nominal_gpus(cluster, flavor).items() if g}
        per_node = int(raw.get("gpusPerNode", 1))
        if len(quota) < 2 or any(g % per_node for g in quota.values()):
            continue
        lender, borrower = sorted(quota, key=lambda q: (quota[q], q))[:2]
        nodes = quota[borrower] // per_node + 1 + quota[lender] // per_node
        if best is None or nodes < best[0]:
            best = (nodes, path, flavor, borrower, lender, quota, per_node)
    assert best, f"{cluster.stack}: no GPU flavor is held by two teams"
    return best[1:]


def test_a_team_borrows_idle_gpus_and_gives_them_back_when_their_owner_needs_them(cluster, scope):
    """Borrowing: a team's job one node beyond its nominal quota of a flavor is admitted on the
    cohort's idle quota (the other team's). Reclaim: when the lending team submits a job within
    its own nominal quota, Kueue evicts the borrower's job (``reclaimWithinCohort: Any``; with fair
    sharing on, the eviction is the fair-sharing preemption of the borrower) and admits the
    owner's."""
    path, flavor, borrower, lender, quota, per_node = _borrowing_flavor(cluster)
    base = yaml.safe_load(path.read_text())
    team_of = {q["metadata"]["name"]: q["spec"]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
               for q in cluster.layer.of_kind("ClusterQueue")}

    def submit(queue, suffix, nodes):
        team = team_of[queue].removeprefix("team-")
        client = lc.client(cluster, team)
        low, _ = priorities(cluster, team)
        raw = {**base, "team": team, "name": scope.name(suffix), "nodes": nodes, "priority": low}
        # The model name under the submitting team's prefix (MLflow lets a team register only there).
        raw["trainer"] = {**raw["trainer"], "overrides": [o.replace(f"team-{base['team']}.", f"team-{team}.")
                                                         for o in raw["trainer"].get("overrides", [])]}
        return client, client.submit(client.load(raw)).job

    borrow_nodes = quota[borrower] // per_node + 1
    lc.release_empty_nodes(cluster, lc.pool_of(cluster, base))  # jobs of up to the whole pool, in one zone
    borrower_client, borrowing = submit(borrower, "borrow", borrow_nodes)
    namespace = borrowing.namespace
    admitted = lc.wait(cluster, namespace,
                       lambda: (w := lc.workload_of(cluster, borrowing.uid, namespace)) and condition(w, "Admitted")
                       and condition(w, "Admitted")["status"] == "True" and w,
                       f"{borrowing.name} ({borrow_nodes * per_node} GPUs, nominal {quota[borrower]}) admitted by borrowing",
                       lc.ADMIT_S)
    def borrowed_gpus() -> int:
        # GPU counts are whole numbers; CPU comes in Kubernetes' canonical quantity form ("91800m").
        usage = cluster.api.get(f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{borrower}")["status"]["flavorsUsage"]
        return next((int(r.get("borrowed", 0)) for f in usage if f["name"] == flavor for r in f["resources"]
                     if r["name"] == "nvidia.com/gpu"), 0)
    # The ClusterQueue's status follows the admission asynchronously (Kueue's queue status updates).
    lc.wait(cluster, namespace, lambda: borrowed_gpus() == per_node or None,
            f"{borrower} reports {per_node} GPUs borrowed of {flavor} (admission: {admitted['status']['admission']})", 120)
    lc.running_pods(cluster, borrowing.name, namespace, borrow_nodes)

    lender_client, owner_job = submit(lender, "reclaim", quota[lender] // per_node)

    def evicted():
        cond = condition(lc.workload_of(cluster, borrowing.uid, namespace), "Evicted")
        return cond if cond and cond["status"] == "True" else None
    eviction = lc.wait(cluster, namespace, evicted, f"{borrowing.name} evicted to give {lender} its quota back", lc.ADMIT_S)
    assert eviction["reason"] == "Preempted", eviction
    preempted = condition(lc.workload_of(cluster, borrowing.uid, namespace), "Preempted") or {}
    assert preempted.get("reason") in ("InCohortReclamation", "InCohortFairSharing"), preempted
    lc.wait(cluster, owner_job.namespace,
            lambda: lender_client.describe(owner_job.name, owner_job.team if hasattr(owner_job, "team") else
                                           team_of[lender].removeprefix("team-")).admission.admitted,
            f"{owner_job.name} admitted on its own quota", lc.ADMIT_S)


def test_an_admitted_gang_that_cannot_start_is_evicted_by_wait_for_pods_ready(cluster, scope):
    """``waitForPodsReady`` (the stack's Kueue Configuration): a multi-node job Kueue admitted
    whose pods cannot all start (EC2 has no capacity for its pool's instance types: every offering
    answers InsufficientInstanceCapacity) is evicted once the timeout passes since admission and
    queued again (kueue v0.19.2 pkg/controller/core/workload_controller.go
    ``admittedNotReadyWorkload``: ``elapsedTime := r.clock.Since(admittedCond.LastTransitionTime.Time)``,
    then ``Evict(..., kueue.WorkloadEvictedByPodsReadyTimeout, "Exceeded the PodsReady timeout ...")``).
    The stack's timeout is minutes (dev 10m, prod 15m): the test moves the Admitted condition's
    ``lastTransitionTime`` back by the timeout instead of waiting, which is the one input Kueue's
    rule reads."""
    config = yaml.safe_load(cluster.layer.helm_values["kueue"]["managerConfig"]["controllerManagerConfigYaml"])
    wait_for = config["waitForPodsReady"]
    assert wait_for.get("enable", True), wait_for
    timeout_s = _seconds(wait_for["timeout"])
    raw = lc.example(cluster, scope, "gang")
    pool = lc.pool(cluster, raw.get("pool") or raw["gpuType"])
    cluster.aws.exhaust()  # no EC2 capacity for anything, until restored below
    # Nodes of the pool that earlier tests left (pools consolidate only after minutes) would start
    # the gang: cordoned, they take no new pod, as if they were not there.
    left = [n["metadata"]["name"] for n in cluster.api.get(
        "/api/v1/nodes", labelSelector=f"karpenter.sh/nodepool={pool['metadata']['name']}")["items"]]
    for node_name in left:
        cluster.kubectl("cordon", node_name)
    try:
        client = lc.client(cluster, raw["team"])
        job = client.submit(client.load(raw)).job
        namespace = job.namespace

        def admitted():
            workload = lc.workload_of(cluster, job.uid, namespace)
            cond = condition(workload, "Admitted")
            return workload if cond and cond["status"] == "True" else None
        workload = lc.wait(cluster, namespace, admitted, f"Kueue admits {job.name}", lc.ADMIT_S)
        ready = condition(workload, "PodsReady")
        assert not ready or ready["status"] == "False", ready
        conditions = workload["status"]["conditions"]
        index = next(i for i, c in enumerate(conditions) if c["type"] == "Admitted")
        past = (datetime.now(timezone.utc) - timedelta(seconds=timeout_s + 5)).strftime("%Y-%m-%dT%H:%M:%SZ")
        cluster.api.json_patch(
            f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{namespace}/workloads/{workload['metadata']['name']}/status",
            [{"op": "test", "path": f"/status/conditions/{index}/type", "value": "Admitted"},
             {"op": "replace", "path": f"/status/conditions/{index}/lastTransitionTime", "value": past}])

        def evicted():
            cond = condition(lc.workload_of(cluster, job.uid, namespace), "Evicted")
            return cond if cond and cond["status"] == "True" else None
        eviction = lc.wait(cluster, namespace, evicted, f"{job.name} evicted after the PodsReady timeout", lc.ADMIT_S)
        assert eviction["reason"] == "PodsReadyTimeout", eviction
        assert "Exceeded the PodsReady timeout" in eviction["message"], eviction
        lc.wait(cluster, namespace, lambda: client.get(job.name, raw["team"]).phase == "Queued",
                f"{job.name} suspended and queued again", lc.END_S)
        assert pool  # the pool the gang asked for
    finally:
        cluster.aws.restore()
        for node_name in left:
            cluster.kubectl("uncordon", node_name, check=False)


def _seconds(duration: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600}
    return int(float(duration[:-1]) * units[duration[-1]])


def test_the_namespace_gpu_quota_refuses_a_pod_that_bypasses_kueue(cluster):
    """The team namespace's ResourceQuota is the backstop behind Kueue: a pod that no queue
    admitted, created by a controller the platform's own policies leave alone (the ReplicaSet
    controller's identity), may not take more GPUs than the namespace's ``requests.nvidia.com/gpu``
    hard limit. kube-apiserver's ResourceQuota admission refuses it (server-side dry run: the whole
    admission chain, nothing stored): "exceeded quota: <name>, requested: requests.nvidia.com/gpu=N,
    used: ..., limited: ...". The same pod within the limit is admitted."""
    quota = next(q for q in cluster.layer.of_kind("ResourceQuota")
                 if q["metadata"]["namespace"].startswith("team-") and "requests.nvidia.com/gpu" in q["spec"]["hard"])
    namespace, hard = quota["metadata"]["namespace"], int(quota["spec"]["hard"]["requests.nvidia.com/gpu"])
    posix = int(cluster.layer.find("Namespace", namespace)["metadata"]["labels"]["mlplatform.io/posix-id"])
    controller = ["--as=system:serviceaccount:kube-system:replicaset-controller",
                  "--as-group=system:serviceaccounts", "--as-group=system:serviceaccounts:kube-system"]

    def pod(gpus: int) -> str:
        return json.dumps({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"bypass-{gpus}", "namespace": namespace},
            "spec": {"securityContext": {"runAsNonRoot": True, "runAsUser": posix, "runAsGroup": posix, "fsGroup": posix,
                                         "seccompProfile": {"type": "RuntimeDefault"}},
                     "containers": [{"name": "main", "image": "trainer:test",
                                     "resources": {"requests": {"nvidia.com/gpu": str(gpus), "cpu": "1", "memory": "1Gi"},
                                                   "limits": {"nvidia.com/gpu": str(gpus), "cpu": "1", "memory": "1Gi"}},
                                     "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                                         "readOnlyRootFilesystem": True}}]}})

    within = cluster.kubectl("create", "--dry-run=server", *controller, "-f", "-", input=pod(1), check=False)
    assert within.returncode == 0, f"the control pod was refused:\n{within.stderr}"
    beyond = cluster.kubectl("create", "--dry-run=server", *controller, "-f", "-", input=pod(hard + 1), check=False)
    assert beyond.returncode != 0, f"a pod asking {hard + 1} GPUs in {namespace} (hard {hard}) was admitted"
    assert f"exceeded quota: {quota['metadata']['name']}" in beyond.stderr, beyond.stderr
    assert f"requests.nvidia.com/gpu={hard + 1}" in beyond.stderr, beyond.stderr


def test_the_restore_drill_is_admitted_to_the_cpu_pool_and_its_pod_is_created(cluster, scope):
    """The restore drill (``checkpoints --verify``) is a CPU-only Job in the team's queue. Kueue
    gives a workload the first flavor, in the ClusterQueue's order, where its requests fit (kueue
    v0.19.2 flavorassigner.go ``findFlavorForPodSets``) and writes that flavor's node labels and
    tolerations into the pods (pkg/podset/podset.go). When the GPU flavors came first, the drill got a
    GPU pool's selector and GPU toleration, and the job controller's pod was refused by the
    gpu-less-pods policy: no drill ever ran. Here the real Kueue must admit it to the general CPU
    pool's flavor, and the real job controller's pod must be created (the policies admit it) with
    that pool's selector and no GPU toleration."""
    from workloads.trainingjob import team_checkpoint_root

    raw = lc.example(cluster, scope, "drill")
    team = raw["team"]
    namespace = f"team-{team}"
    client = lc.client(cluster, team)
    verdict, detail = client.verify_checkpoint_in_cluster(
        raw["name"], team, 5, checkpoint_dir=f"{team_checkpoint_root(namespace)}/{raw['name']}", image="trainer:drill",
        timeout_seconds=0, poll_seconds=0)
    assert verdict == "FAIL" and "no verdict" in detail, detail  # nothing here runs the verifier: no verdict yet

    def admitted():
        for workload in cluster.api.get(f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{namespace}/workloads")["items"]:
            owners = [o["name"] for o in workload["metadata"].get("ownerReferences", [])]
            if any(o.startswith(f"verify-{raw['name']}") for o in owners) and "Admitted" in lc.true_conditions(workload):
                return workload
        return None

    workload = lc.wait(cluster, namespace, admitted, "the drill's Workload admitted", lc.ADMIT_S)
    flavors = {f for ps in workload["status"]["admission"]["podSetAssignments"] for f in ps["flavors"].values()}
    assert flavors == {"cpu-general"}, flavors

    def created():
        pods = cluster.api.get(f"/api/v1/namespaces/{namespace}/pods",
                               labelSelector="app.kubernetes.io/name=checkpoint-drill")["items"]
        return [p for p in pods if raw["name"] in json.dumps(p["metadata"])] or None

    (pod,) = lc.wait(cluster, namespace, created, "the drill's pod created by the job controller", lc.ADMIT_S)
    assert pod["spec"]["nodeSelector"] == {"mlplatform.io/pool": "general"}
    assert not [t for t in pod["spec"].get("tolerations", []) if t.get("key") == "nvidia.com/gpu"]
    events = cluster.kubectl("get", "events", "-n", namespace, "--field-selector", "reason=FailedCreate",
                             "-o", "json").stdout
    assert f"verify-{raw['name']}" not in events, events
