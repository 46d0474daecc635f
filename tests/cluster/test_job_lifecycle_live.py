"""A job's life on the real control plane with the real pinned controllers.

A team member submits an example job with ``JobClient`` (the identity the plan's access entries
give the team). From there only real controllers act:

- Kueue v0.19.2, installed by its chart with the stack's values (its webhooks answer through the
  chart's Service), admits the Workload into the team's ClusterQueue and unsuspends the PyTorchJob;
- the Training Operator v1.9.4 (the platform's overlay) creates the pods;
- Karpenter v1.14.1, installed by its chart with the stack's settings (``NodeOverlay`` and
  ``NodeRepair`` gates, its own service account and the chart's RBAC), launches a NodeClaim from
  the pool the job asks for; the node registers without GPUs, the chart's device plugin makes
  them appear, the startup taints' owners lift their taints; kube-scheduler places the pods;
- each pod's container is the trainer's preemption contract running as a process
  (tools/cluster/workload.py): a drain's SIGTERM ends it with the trainer's own 143.

Restarts follow the Training Operator's ``restartPolicy: ExitCode``, which the platform renders for
every replica (workloads/trainingjob.py ``render_pytorchjob``). Upstream, v1.9.4
pkg/controller.v1/common/pod.go ReconcilePods:

    if spec.RestartPolicy == apiv1.RestartPolicyExitCode && trainutil.IsRetryableExitCode(exitCode) || ...
        logger.Infof("Need to restart the pod: %v.%v", pod.Namespace, pod.Name)
    ...
    } else if spec.RestartPolicy == apiv1.RestartPolicyExitCode && !trainutil.IsRetryableExitCode(exitCode) {
        logger.Infof("Pod %q has a non-retryable exit code. Failing job.", klog.KObj(pod))

with pkg/util/train/train_util.go ``IsRetryableExitCode``: ``return exitCode >= 128``.
"""
from __future__ import annotations

import threading
import time

import pytest

from tests.cluster import lifecycle as lc
from workloads.karpenter import STARTUP_TAINT_OWNERS


@pytest.fixture
def cluster(stack_cluster):
    return stack_cluster


def test_a_team_job_is_admitted_launched_run_to_completion_and_read_back(cluster, scope):
    raw = lc.example(cluster, scope, "life")
    client = lc.client(cluster, raw["team"])
    submitted = client.submit(client.load(raw))
    job, namespace = submitted.job, submitted.job.namespace
    name, team = job.name, raw["team"]

    # Kueue admits it within the team's quota (describe reads the Workload).
    detail = lc.wait(cluster, namespace, lambda: (d := client.describe(name, team)).admission.admitted and d,
                     f"Kueue admits {name}", lc.ADMIT_S)
    assert detail.admission.flavors, detail.admission

    # Karpenter launches nodes from the job's pool; the pods run once the node is initialized.
    pods = lc.running_pods(cluster, name, namespace, job.nodes)
    pool = lc.pool(cluster, job.pool)
    template = pool["spec"]["template"]
    for pod in pods:
        node = lc.node(cluster, pod["spec"]["nodeName"])
        labels = node["metadata"]["labels"]
        assert labels.get("karpenter.sh/nodepool") == pool["metadata"]["name"], labels
        assert template["metadata"]["labels"].items() <= labels.items(), (template["metadata"]["labels"], labels)
        taints = {(t["key"], t["effect"]) for t in node["spec"].get("taints", [])}
        assert {(t["key"], t["effect"]) for t in template["spec"].get("taints", [])} <= taints, taints
        assert not {k for k, _ in taints} & set(STARTUP_TAINT_OWNERS), f"startup taints left: {taints}"
        claim = lc.node_claim(cluster, node["metadata"]["name"])
        # Registered with the pool's startup taints (Karpenter copies them to the NodeClaim and the
        # node, the owners lifted them) and initialized only once the GPUs were advertised.
        assert claim["spec"].get("startupTaints", []) == template["spec"].get("startupTaints", []), claim["spec"]
        assert "Initialized" in lc.true_conditions(claim), claim["status"]
        capacity_types = next(r["values"] for r in template["spec"]["requirements"] if r["key"] == "karpenter.sh/capacity-type")
        assert labels["karpenter.sh/capacity-type"] in capacity_types, labels
    running = client.describe(name, team)
    assert running.job.phase == "Running", running.job
    assert {p.node for p in running.pods} == {p["spec"]["nodeName"] for p in pods}, running.pods

    # The training processes complete (exit 0): the PyTorchJob succeeds, and the client says so.
    lc.end_pods(cluster, pods)
    done = lc.phase(client, name, team, ("Succeeded",), cluster, namespace)
    assert done.phase == "Succeeded"
    assert name in [j.name for j in client.list(team, include_finished=True)]
    assert name not in [j.name for j in client.list(team)], "a finished job is listed as active"
    assert client.describe(name, team).job.phase == "Succeeded"


def test_cancel_removes_a_running_job_and_its_pods(cluster, scope):
    raw = lc.example(cluster, scope, "cancel")
    client = lc.client(cluster, raw["team"])
    submitted = client.submit(client.load(raw))
    name, team, namespace = submitted.job.name, raw["team"], submitted.job.namespace
    lc.running_pods(cluster, name, namespace, submitted.job.nodes)
    cancelled = client.cancel(name, team, wait=True, timeout_seconds=lc.END_S, poll_seconds=1)
    assert cancelled.gone, cancelled
    assert not lc.job_pods(cluster, name, namespace), "pods outlived the cancelled job"
    assert name not in [j.name for j in client.list(team)]
    # The history record (a ConfigMap the submitting identity wrote) keeps it in `list --all`.
    assert [j.phase for j in client.list(team, include_finished=True) if j.name == name] == ["Cancelled"]


class PodExits:
    """Every container exit the API server reports for a job's pods, seen on a watch (a pod the
    kubelet deletes after its container ended is otherwise gone before anyone reads it)."""

    def __init__(self, cluster, namespace: str, name: str):
        self.exits: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(cluster, namespace, name), daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()

    def _watch(self, cluster, namespace, name):
        while not self._stop.is_set():
            try:
                for event in cluster.api.watch(f"/api/v1/namespaces/{namespace}/pods", timeout_s=60,
                                               labelSelector=f"training.kubeflow.org/job-name={name}"):
                    pod = event.get("object") or {}
                    for status in pod.get("status", {}).get("containerStatuses") or []:
                        terminated = (status.get("state") or {}).get("terminated")
                        if terminated:
                            self.exits[pod["metadata"]["uid"]] = terminated["exitCode"]
                    if self._stop.is_set():
                        return
            except Exception:  # noqa: BLE001 - the watch ends every minute: start another
                time.sleep(0.5)


def test_spot_loss_drains_the_node_the_trainer_exits_143_and_the_job_resumes_on_demand(cluster, scope):
    """EC2 sends a Spot Instance Interruption Warning for the node of a spot job. Karpenter's
    interruption controller (the AWS provider's, v1.14.1) marks that spot offering unavailable and
    deletes the NodeClaim; Karpenter's termination controller drains the node (eviction); the
    kubelet sends SIGTERM to the training process, which stops at the next step boundary and exits
    143 by the trainer's own contract (nothing here sets the code); the Training Operator recreates
    the pods (``ExitCode``: 143 is retryable); Karpenter launches their new node on-demand (the pool
    allows both); the job completes. The spot market is set so that only the interrupted offering
    had spot capacity (every other spot offering answers InsufficientInstanceCapacity): without the
    interruption controller's marking, Karpenter would relaunch on that same offering. Nodes of the
    pool that earlier tests left (empty until their pool consolidates them) are released first, so
    the job's first node is a new one (spot, the cheaper offering in whichever zone Karpenter picks
    for the job), and cordoned meanwhile, so the new pods need a new node."""
    raw = lc.example(cluster, scope, "spot")
    # A job that allows spot also fits an on-demand node another test left: release those first.
    lc.release_empty_nodes(cluster, lc.pool_of(cluster, raw))
    before = {n["metadata"]["name"] for n in cluster.api.get("/api/v1/nodes")["items"]}
    client = lc.client(cluster, raw["team"])
    submitted = client.submit(client.load(raw))
    name, team, namespace = submitted.job.name, raw["team"], submitted.job.namespace
    capacity_types = next(r["values"] for r in lc.pool(cluster, submitted.job.pool)["spec"]["template"]["spec"]["requirements"]
                          if r["key"] == "karpenter.sh/capacity-type")
    assert {"spot", "on-demand"} <= set(capacity_types), f"pool {submitted.job.pool} allows {capacity_types}"
    with PodExits(cluster, namespace, name) as exits, lc.no_spare_nodes(cluster, submitted.job.pool) as spare:
        first = lc.running_pods(cluster, name, namespace, submitted.job.nodes)
        first_uids = {p["metadata"]["uid"] for p in first}
        nodes = {p["spec"]["nodeName"] for p in first}
        spare.keep(nodes)
        offerings = set()
        for node_name in nodes:
            labels = lc.node(cluster, node_name)["metadata"]["labels"]
            assert labels["karpenter.sh/capacity-type"] == "spot", (
                f"{node_name} ({'there before the job' if node_name in before else 'launched for the job'}, "
                f"zone {labels.get('topology.kubernetes.io/zone')}): {labels}")
            offerings.add((labels["node.kubernetes.io/instance-type"], labels["topology.kubernetes.io/zone"]))
        assert len(offerings) == 1, offerings
        # The spot market has no other capacity: only the interruption's marking keeps Karpenter
        # from relaunching on the very offering that was just taken back.
        cluster.aws.exhaust_all_but(*next(iter(offerings)), "spot")
        for node_name in nodes:
            cluster.aws.spot_interruption(node_name)

        def replaced():
            pods = [p for p in lc.job_pods(cluster, name, namespace) if p["metadata"]["uid"] not in first_uids
                    and lc.ready(p) and p["status"].get("phase") == "Running" and p["spec"].get("nodeName") not in nodes]
            return pods if len(pods) == submitted.job.nodes else None
        second = lc.wait(cluster, namespace, replaced, f"{name}'s pods recreated and Running on a new node",
                         lc.RUN_S + lc.LAUNCH_S)
        ended = {uid: exits.exits.get(uid) for uid in first_uids}
    assert set(ended.values()) == {143}, f"the interrupted pods' exit codes: {ended}"
    for pod in first:
        log = lc.container_log(cluster, pod)
        assert "preemption requested (SIGTERM)" in log, log[-2000:]
    for node_name in {p["spec"]["nodeName"] for p in second}:
        labels = lc.node(cluster, node_name)["metadata"]["labels"]
        assert labels["karpenter.sh/capacity-type"] == "on-demand", labels
    job = lc.as_json(cluster, "get", "pytorchjob", name, "-n", namespace)
    assert "Failed" not in lc.true_conditions(job), job["status"]
    events = cluster.api.get("/api/v1/events", fieldSelector="reason=SpotInterrupted")["items"]
    assert {e["involvedObject"]["name"] for e in events} & nodes, [e["involvedObject"] for e in events]

    lc.end_pods(cluster, second)
    assert lc.phase(client, name, team, ("Succeeded",), cluster, namespace).phase == "Succeeded"


@pytest.fixture(autouse=True)
def _capacity_restored(cluster):
    yield
    cluster.aws.restore()


def test_a_permanent_failure_exit_2_fails_the_job_without_a_retry(cluster, scope):
    raw = lc.example(cluster, scope, "exit2")
    client = lc.client(cluster, raw["team"])
    submitted = client.submit(client.load(raw))
    name, team, namespace = submitted.job.name, raw["team"], submitted.job.namespace
    pods = lc.running_pods(cluster, name, namespace, submitted.job.nodes)
    uids = {p["metadata"]["uid"] for p in pods}
    master = [p for p in pods if p["metadata"]["labels"].get("training.kubeflow.org/replica-type", "").lower() == "master"]
    lc.end_pods(cluster, master, exit_code=2)
    failed = lc.phase(client, name, team, ("Failed",), cluster, namespace)
    assert failed.phase == "Failed"
    detail = client.describe(name, team)
    assert detail.job.phase == "Failed", detail.job
    assert any(p.exit_code == 2 for p in detail.pods), detail.pods
    # Nothing was recreated: every pod of the job is one of the first ones.
    assert {p["metadata"]["uid"] for p in lc.job_pods(cluster, name, namespace)} <= uids


@pytest.mark.parametrize("stack_cluster", ["dev"], indirect=True)
def test_an_empty_gpu_node_is_removed_after_its_pools_consolidate_after(cluster, scope):
    """Scale to zero: the GPU pools consolidate ``WhenEmpty`` after ``consolidateAfter`` (dev: 5m).
    Once the last job on a node ends (its DaemonSet pods do not count), the real Karpenter deletes
    the NodeClaim and its node after that delay, and not before. (Prod's pools wait 10-30 minutes:
    the same rule, not awaited here.)"""
    raw = lc.example(cluster, scope, "zero")
    client = lc.client(cluster, raw["team"])
    submitted = client.submit(client.load(raw))
    name, team, namespace = submitted.job.name, raw["team"], submitted.job.namespace
    pods = lc.running_pods(cluster, name, namespace, submitted.job.nodes)
    nodes = {p["spec"]["nodeName"] for p in pods}
    disruption = lc.pool(cluster, submitted.job.pool)["spec"]["disruption"]
    assert disruption["consolidationPolicy"] == "WhenEmpty", disruption
    after_s = int(disruption["consolidateAfter"].rstrip("m")) * 60
    lc.end_pods(cluster, pods)
    lc.phase(client, name, team, ("Succeeded",), cluster, namespace)
    emptied = time.monotonic()

    def gone():
        present = {n["metadata"]["name"] for n in cluster.api.get("/api/v1/nodes")["items"]}
        return not (nodes & present)
    lc.wait(cluster, namespace, gone, f"nodes {sorted(nodes)} removed once empty for {after_s} s", after_s + 240)
    waited = time.monotonic() - emptied
    assert waited >= after_s - 30, f"the nodes went after {waited:.0f} s, before consolidateAfter ({after_s} s)"
