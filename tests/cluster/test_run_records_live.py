"""The platform's run records on the real control plane, read with the team's own identity.

The run recorder's code (``workloads.run_recorder``: list, then watch, pods and PyTorchJobs;
write RunRecords) runs here with the token of the stack's own ``run-recorder`` ServiceAccount
(TokenRequest through the real API server), configured from the stack's own Deployment and
ConfigMap (its prices, containers, checkpoint variable and retention), so the real RBAC and the
real RunRecord CRD (structural schema) judge every call it makes. The team member's client
(``tests.cluster.clients.team_client``: the group the team's access entry carries) may not read
Nodes; what it learns about nodes, attempts and cost it learns from the record.

Jobs live as in tests/cluster/test_job_lifecycle_live.py: the real Kueue admits them, the real
Training Operator creates and recreates their pods, Karpenter launches nodes from the pool and
drains them when their NodeClaim goes (the trainer's contract then exits 143 on the SIGTERM), and
the test cluster's kubelet tells a training process to complete when the test says so.
"""
from __future__ import annotations

import json
import ssl
import threading
import time

import pytest
import yaml

from jobs.client import JobNotFound
from jobs.kube import NODES, NoClusterAccess
from tests.cluster import lifecycle as lc
from tools.cluster.api import eventually
from workloads import run_recorder as rr
from workloads.run_records import NAME as RECORDER

RECORD_S = 120


@pytest.fixture
def cluster(stack_cluster):
    return stack_cluster


def _recorder_settings(cluster) -> dict:
    """What the stack's own Deployment and ConfigMap give the recorder."""
    deployment = next(d for d in cluster.layer.of_kind("Deployment") if d["metadata"]["name"] == RECORDER)
    config = next(c for c in cluster.layer.of_kind("ConfigMap") if c["metadata"]["name"] == RECORDER)
    argv = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    flags = dict(zip(argv[2::2], argv[3::2]))
    prices = json.loads(config["data"]["prices.json"])
    prices.pop("spotDiscount")
    return {"namespace": deployment["metadata"]["namespace"],
            "account": deployment["spec"]["template"]["spec"]["serviceAccountName"],
            "containers": flags["--containers"].split(","), "checkpoint_env": flags["--checkpoint-env"],
            "retention_days": float(flags["--retention-days"]), "prices": prices}


def _recorder_api(cluster, settings, tmp_path_factory) -> rr.KubeApi:
    token = cluster.kubectl("create", "token", settings["account"], "-n", settings["namespace"], "--duration=2h").stdout.strip()
    path = tmp_path_factory.mktemp("recorder") / "token"
    path.write_text(token)
    context = ssl.create_default_context(cafile=str(cluster.plane.pki.ca_cert))
    return rr.KubeApi(base_url=cluster.plane.server, token_path=str(path), context=context)


def _records(cluster) -> set[tuple[str, str]]:
    return {(r["metadata"]["namespace"], r["metadata"]["name"])
            for r in cluster.api.get(f"/apis/{rr.GROUP}/{rr.VERSION}/{rr.PLURAL}")["items"]}


@pytest.fixture
def recorder(cluster, scope, tmp_path_factory):
    """The recorder, running for the test as its own ServiceAccount. When the test ends, the
    recorder stops and the records it wrote for the test go (after the scope's jobs and pods), so
    no test reads another's records."""
    settings = _recorder_settings(cluster)
    before = _records(cluster)
    api = _recorder_api(cluster, settings, tmp_path_factory)
    state = rr.Recorder(api, prices=settings["prices"], containers=settings["containers"],
                        checkpoint_env=settings["checkpoint_env"], retention_seconds=settings["retention_days"] * 86400)
    stop = threading.Event()
    failure: list[BaseException] = []

    def loop():
        try:
            rr.run(api, state, flush_seconds=1, resync_seconds=60, watch_timeout_s=30, stop=stop)
        except BaseException as exc:  # surfaced by the tests below
            failure.append(exc)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield {"state": state, "failure": failure, "settings": settings, "api": api}
    finally:
        stop.set()
        thread.join(timeout=60)
        for namespace, name in _records(cluster) - before:
            cluster.api.delete(f"{rr.records_path(namespace)}/{name}")
        eventually(lambda: not _records(cluster) - before, "the test's run records gone", lc.END_S, interval_s=1)


def _record(cluster, recorder, namespace, name, predicate, what):
    def found():
        assert not recorder["failure"], recorder["failure"]
        for item in lc.as_json(cluster, "get", "runrecords.mlplatform.io", "-n", namespace, "-l",
                               f"mlplatform.io/job={name}")["items"]:
            if predicate(item["spec"]):
                return item
        return None
    return lc.wait(cluster, namespace, found, what, RECORD_S)


def test_a_preempted_run_is_recorded_with_its_nodes_and_cost_and_outlives_its_job(cluster, scope, recorder):
    """A team member's job runs on a Karpenter node, its pod exits 143 when the node goes (spot),
    the Training Operator recreates it on a new node, it completes. The team role cannot read
    Nodes, yet describe names both attempts, their instance and capacity type and the cost; after
    the job object is deleted (as its ttlSecondsAfterFinished would), describe, list --all and
    history still show the run."""
    raw = lc.example(cluster, scope, "rec")
    team = raw["team"]
    client = lc.client(cluster, team, as_member=True)
    # Who the API server says the caller is (SelfSubjectReview): the team, without --team.
    assert client.identity().teams == (team,)
    with pytest.raises(NoClusterAccess):
        client.kube.get(NODES, "any")  # the team's Role grants no Nodes: the record is the only way
    submitted = client.submit(client.load(raw))
    name, namespace = submitted.job.name, submitted.job.namespace
    first = lc.running_pods(cluster, name, namespace, submitted.job.nodes)
    first_uids = {p["metadata"]["uid"] for p in first}
    nodes = {p["spec"]["nodeName"] for p in first}
    running = lc.wait(cluster, namespace, lambda: (d := client.describe(name, team)).cost is not None and d.cost.usd > 0
                    and all(p.instance_type for p in d.pods) and d, "cost so far while it runs", RECORD_S)
    pool = lc.pool(cluster, running.job.pool)
    instance_types = next(r["values"] for r in pool["spec"]["template"]["spec"]["requirements"]
                          if r["key"] == "node.kubernetes.io/instance-type") if any(
        r["key"] == "node.kubernetes.io/instance-type" for r in pool["spec"]["template"]["spec"]["requirements"]) else None
    for pod in running.pods:
        assert pod.capacity_type in ("spot", "on-demand", "reserved"), running.pods
        if instance_types:
            assert pod.instance_type in instance_types, (pod, instance_types)

    # The nodes go (Karpenter drains them once their NodeClaims are deleted, as on a spot loss):
    # the kubelet's SIGTERM ends each training process with the trainer's own 143, and the
    # recorder keeps the exit code the Training Operator saw.
    for node_name in nodes:
        claim = lc.node_claim(cluster, node_name)
        cluster.kubectl("delete", "nodeclaim", claim["metadata"]["name"], "--wait=false")
    _record(cluster, recorder, namespace, name, lambda s: all(
        a.get("exitCode") == 143 for a in s["attempts"] if a["podUid"] in first_uids) and len(s["attempts"]) >= len(first_uids),
        "the 143s recorded")

    def replaced():
        pods = [p for p in lc.job_pods(cluster, name, namespace) if p["metadata"]["uid"] not in first_uids
                and p["status"].get("phase") == "Running" and lc.ready(p) and p["spec"].get("nodeName") not in nodes
                and not p["metadata"].get("deletionTimestamp")]
        return pods if len(pods) == submitted.job.nodes else None
    second = lc.wait(cluster, namespace, replaced, f"{name}'s pods recreated", lc.RUN_S + lc.LAUNCH_S)
    lc.end_pods(cluster, second)
    assert lc.phase(client, name, team, ("Succeeded",), cluster, namespace).phase == "Succeeded"
    second_uids = {p["metadata"]["uid"] for p in second}
    # Every attempt ended (a replacement pod that landed on the draining node and was deleted by
    # Karpenter before it ran is an attempt too: the Training Operator recreated it once more).
    record = _record(cluster, recorder, namespace, name, lambda s: s["phase"] == "Succeeded"
                     and second_uids <= {a["podUid"] for a in s["attempts"]}
                     and all(a.get("endedAt") or not a.get("startedAt") for a in s["attempts"]), "every attempt recorded")
    assert "ownerReferences" not in record["metadata"]

    detail = client.describe(name, team)
    by_pod = {a.pod_uid: a for a in detail.attempts}
    for uid in first_uids:
        assert (by_pod[uid].exit_code, by_pod[uid].reason) == (143, "preemption"), by_pod[uid]
        assert by_pod[uid].instance_type and by_pod[uid].capacity_type, by_pod[uid]
    for uid in second_uids:
        # Rank 0 may complete first: the Training Operator then stops the other ranks (cleanPodPolicy:
        # Running), whose 143 belongs to the finished run, not to a preemption.
        assert by_pod[uid].reason == "done" and by_pod[uid].exit_code in (0, 143), by_pod[uid]
    assert detail.cost is not None and detail.cost.usd > 0 and detail.cost.node_hours > 0, detail.cost

    # Its ttlSecondsAfterFinished (or anyone) removes the object: the record stays.
    cluster.kubectl("delete", "pytorchjob", name, "-n", namespace, "--wait=true", timeout_s=lc.END_S)
    _record(cluster, recorder, namespace, name, lambda s: s["outcome"] == "Succeeded", "the outcome after the delete")
    gone = client.describe(name, team)
    assert gone.job.phase == "Succeeded" and len(gone.attempts) == len(detail.attempts), gone
    assert gone.cost.usd == pytest.approx(detail.cost.usd, abs=0.02)
    assert [j.phase for j in client.list(include_finished=True) if j.name == name] == ["Succeeded"]
    assert [r.job.phase for r in client.runs(name=name)] == ["Succeeded"]


def test_cancel_replace_and_kubectl_delete_each_leave_their_outcome(cluster, scope, recorder):
    raw = lc.example(cluster, scope, "outc")
    team = raw["team"]
    client = lc.client(cluster, team)
    name = raw["name"]
    first = client.submit(client.load(raw)).job
    lc.running_pods(cluster, name, first.namespace, first.nodes)
    _record(cluster, recorder, first.namespace, name, lambda s: any(a["reason"] == "running" for a in s["attempts"]),
            "the running attempt recorded")
    second = client.submit(client.load(raw), replace=True, poll_seconds=1).job  # --replace
    assert second.uid != first.uid
    lc.running_pods(cluster, name, second.namespace, second.nodes)
    client.cancel(name, team, wait=True, timeout_seconds=lc.END_S, poll_seconds=1)
    third = client.submit(client.load(raw)).job
    lc.running_pods(cluster, name, third.namespace, third.nodes)
    cluster.kubectl("delete", "pytorchjob", name, "-n", third.namespace, "--cascade=background", "--wait=false")

    def outcomes():
        runs = {r.job.uid: r for r in client.runs(team, name=name)}
        wanted = {first.uid: "Replaced", second.uid: "Cancelled", third.uid: "Deleted"}
        return runs if all(runs.get(uid) and runs[uid].outcome == o for uid, o in wanted.items()) else None
    runs = lc.wait(cluster, first.namespace, outcomes, "the three outcomes recorded", RECORD_S + lc.END_S)
    for uid in (first.uid, second.uid):
        assert any(a.reason == "cancel" for a in runs[uid].attempts), runs[uid].attempts
    with pytest.raises(JobNotFound):
        client.get(name, team)
    history = {j.uid: j.phase for j in client.list(team, include_finished=True) if j.name == name}
    assert history == {first.uid: "Replaced", second.uid: "Cancelled", third.uid: "Deleted"}


def test_the_team_reads_its_records_and_cannot_write_delete_or_read_another_teams(cluster, scope, recorder):
    raw = lc.example(cluster, scope, "rbac")
    team = raw["team"]
    namespace = f"team-{team}"
    kubeconfig = cluster.plane.kubeconfig(f"mallory@{namespace}", [f"mlplatform:{namespace}"])

    def as_team(*args):
        return cluster.plane.kubectl(*args, kubeconfig=kubeconfig, check=False)

    assert as_team("auth", "can-i", "list", "runrecords.mlplatform.io", "-n", namespace).stdout.strip() == "yes"
    for verb in ("create", "update", "patch", "delete"):
        assert as_team("auth", "can-i", verb, "runrecords.mlplatform.io", "-n", namespace).stdout.strip() == "no", verb
    # The attack: forge a record of a run that never happened.
    forged = {"apiVersion": rr.API_VERSION, "kind": rr.KIND, "metadata": {"name": "forged", "namespace": namespace},
              "spec": {"job": {"name": "x", "kind": "PyTorchJob", "uid": "u", "team": team}, "phase": "Succeeded",
                       "outcome": "Succeeded", "attempts": []}}
    refused = cluster.plane.kubectl("create", "-f", "-", kubeconfig=kubeconfig, input=json.dumps(forged), check=False)
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower(), refused.stderr
    other = next(n["metadata"]["name"] for n in cluster.layer.of_kind("Namespace")
                 if n["metadata"]["name"].startswith("team-") and n["metadata"]["name"] != namespace)
    assert as_team("auth", "can-i", "list", "runrecords.mlplatform.io", "-n", other).stdout.strip() == "no"


def test_records_are_removed_after_the_stacks_retention(cluster, recorder, tmp_path_factory):
    """A second recorder whose clock is past the stack's retention removes an ended run's record
    (one resync, as the running recorder does every few minutes). The ended run is one the
    recorder's own code closed (``new_record``, ``end_run``) and wrote as its ServiceAccount, so
    the test needs no other test's runs; every other ended record in the cluster goes too."""
    settings = recorder["settings"]
    raw = yaml.safe_load((lc.ROOT / lc.EXAMPLE[cluster.stack]).read_text())
    namespace = f"team-{raw['team']}"
    started = time.time() - 3600
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
           "metadata": {"name": "retention-run", "namespace": namespace, "uid": "0f0e0d0c-retention",
                        "creationTimestamp": rr.now_text(started),
                        "labels": {"mlplatform.io/team": raw["team"], "app.kubernetes.io/managed-by": "mlplatform"}},
           "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1}}},
           "status": {"conditions": [{"type": "Succeeded", "status": "True", "lastTransitionTime": rr.now_text(started + 600)}]}}
    record = rr.new_record(job, settings["checkpoint_env"], started)
    rr.observe_job(record, job, deleted=True, now=started + 900)
    recorder["api"].call("POST", rr.records_path(namespace), record)
    ended = [r for r in lc.as_json(cluster, "get", "runrecords.mlplatform.io", "--all-namespaces")["items"]
             if r["spec"]["outcome"]]
    assert (namespace, record["metadata"]["name"]) in {(r["metadata"]["namespace"], r["metadata"]["name"]) for r in ended}
    later = rr.parse_time(max(r["spec"].get("removedAt") or r["spec"]["endedAt"] for r in ended)) + \
        settings["retention_days"] * 86400 + 60
    api = _recorder_api(cluster, settings, tmp_path_factory)
    sweeper = rr.Recorder(api, prices=settings["prices"], containers=settings["containers"],
                          checkpoint_env=settings["checkpoint_env"],
                          retention_seconds=settings["retention_days"] * 86400, clock=lambda: later)
    sweeper.resync()
    left = {(r["metadata"]["namespace"], r["metadata"]["name"])
            for r in lc.as_json(cluster, "get", "runrecords.mlplatform.io", "--all-namespaces")["items"]}
    assert not left & {(r["metadata"]["namespace"], r["metadata"]["name"]) for r in ended}, (namespace, left)
