"""The interactive GPU pod on the real control plane, as a team member.

`JobClient.dev_pods.start` (what `python -m workloads dev` runs) creates the dev pod's Job with the
identity the team's access entry gives (``tests.cluster.clients.team_client``); the platform's
admission policies and Pod Security judge it and its pod, the real Kueue admits it into the team's
ClusterQueue on the shared (time-slicing or MIG) flavor, and refuses it once the slices the cohort
holds are in use (the client then deletes it again). The port-forward policy is judged by the real
API server on a real CONNECT: a team member's `kubectl port-forward` to a training pod is refused
by it, to the dev pod it is not (the stream then fails further on, at the kwok node, which has no
kubelet to forward to).

The shared pool's nodes are stand-ins: the kwok instance types (tools/cluster/controllers.py)
advertise whole GPUs only, as the device plugin would before its time-slicing or MIG
configuration applies, so Karpenter launches no node a slice fits on. Each stand-in node carries
the pool's labels and taints and advertises the slices the pool's NodeOverlay declares per node,
as the device plugin does once configured; kwok runs its pods (annotation kwok.x-k8s.io/node=fake).
Kueue admits with ``waitForPodsReady`` (blockAdmission): a workload whose pods never run would hold
every later admission, so the slices must have somewhere to run for quota, not readiness, to be
what refuses the last dev pod.
"""
from __future__ import annotations

import json
import subprocess

import pytest

from jobs.devpods import DevPodRefused
from tests.cluster.clients import team_client
from tests.cluster.test_job_lifecycle_live import ADMIT_S, LAUNCH_S, RUN_S, _example, _json, _running_pods, _wait
from workloads import devpod
from workloads.tenancy import team_group

IMAGE = "111122223333.dkr.ecr.us-west-2.amazonaws.com/mlp/trainer:1.0.0-dev"
TEAM = {"dev": "research", "prod": "research"}
FILLER = "slices-in-use"


@pytest.fixture(scope="module")
def cluster(stack_controllers):
    return stack_controllers


def _shared_pool(cluster, team: str) -> dict:
    """The team's first shared pool as the stack declares it: flavor, slice resource, slices per
    node, the slices its cohort holds, the team's ClusterQueue, the NodePool's labels and taints."""
    namespace = f"team-{team}"
    queues = cluster.layer.of_kind("ClusterQueue")
    own = next(q for q in queues if (q["spec"].get("namespaceSelector") or {}).get("matchLabels", {})
               .get("kubernetes.io/metadata.name") == namespace)
    flavors = {f["metadata"]["name"]: f for f in cluster.layer.of_kind("ResourceFlavor")}
    for group in own["spec"]["resourceGroups"]:
        for flavor in group["flavors"]:
            for resource in flavor["resources"]:
                name = resource["name"]
                if not (name == "nvidia.com/gpu.shared" or name.startswith("nvidia.com/mig-")) or not int(resource["nominalQuota"]):
                    continue
                cohort = sum(int(r["nominalQuota"]) for q in queues if q["spec"].get("cohortName") == own["spec"].get("cohortName")
                             for g in q["spec"]["resourceGroups"] for f in g["flavors"] if f["name"] == flavor["name"]
                             for r in f["resources"] if r["name"] == name)
                labels = flavors[flavor["name"]]["spec"]["nodeLabels"]
                pool = next(p for p in cluster.layer.of_kind("NodePool")
                            if labels.items() <= p["spec"]["template"]["metadata"]["labels"].items())
                overlay = next(o for o in cluster.layer.of_kind("NodeOverlay") if any(
                    r.get("key") == "karpenter.sh/nodepool" and pool["metadata"]["name"] in r.get("values", [])
                    for r in o["spec"].get("requirements", [])))
                return {"flavor": flavor["name"], "resource": name, "per_node": int(overlay["spec"]["capacity"][name]),
                        "cohort": cohort, "cluster_queue": own["metadata"]["name"], "pool": pool}
    raise AssertionError(f"team {team} has no shared-pool quota in stack {cluster.stack}")


@pytest.fixture
def shared_nodes(cluster):
    """Stand-in nodes of the team's shared pool, enough for every slice the cohort holds."""
    shared = _shared_pool(cluster, TEAM[cluster.stack])
    template = shared["pool"]["spec"]["template"]
    names = []
    for index in range(-(-shared["cohort"] // shared["per_node"])):
        name = f"stand-in-{shared['flavor']}-{index}"
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {**template["metadata"]["labels"], "kubernetes.io/hostname": name, "type": "kwok",
                       "node.kubernetes.io/instance-type": "stand-in", "karpenter.sh/capacity-type": "on-demand"}},
            "spec": {"taints": [{"key": t["key"], "value": t.get("value", ""), "effect": t["effect"]}
                                for t in template["spec"].get("taints", [])]},
            "status": {"capacity": {"cpu": "16", "memory": "64Gi", "pods": "110", shared["resource"]: str(shared["per_node"])},
                       "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110",
                                       shared["resource"]: str(shared["per_node"])}}}
        cluster.kubectl("apply", "-f", "-", input=json.dumps(node))
        cluster.kubectl("patch", "node", name, "--subresource=status", "--type=merge",
                        "-p", json.dumps({"status": node["status"]}))
        names.append(name)
    yield shared
    for name in names:
        cluster.kubectl("delete", "node", name, "--wait=false", check=False)


def _cleanup(cluster, namespace: str) -> None:
    """Every dev pod and filler of the test, so no workload waits on quota for the next test."""
    cluster.kubectl("delete", "jobs", "-n", namespace, "-l", f"app.kubernetes.io/name={devpod.APP}", "--wait=false",
                    check=False)
    cluster.kubectl("delete", "job", FILLER, "-n", namespace, "--ignore-not-found", "--wait=false", check=False)


def _filler(cluster, namespace: str, resource: str, pods: int, template: dict, queue: str) -> None:
    """A Job of the platform's in the team's queue whose ``pods`` pods take one slice each: what
    other dev pods and slice jobs of the cohort would hold."""
    pod = json.loads(json.dumps(template))
    pod["containers"] = [{**pod["containers"][0], "name": "filler", "command": ["sleep", "infinity"], "env": [],
                          "volumeMounts": [],
                          "resources": {"requests": {resource: "1", "cpu": "100m", "memory": "64Mi"},
                                        "limits": {resource: "1", "cpu": "100m", "memory": "64Mi"}}}]
    pod["volumes"] = []
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": FILLER, "namespace": namespace,
                                                                  "labels": {"kueue.x-k8s.io/queue-name": queue}},
           "spec": {"suspend": True, "parallelism": pods, "completions": pods, "backoffLimit": 0,
                    "template": {"metadata": {"labels": {"app.kubernetes.io/name": "slices-in-use"}}, "spec": pod}}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(job))


def _workload_of(cluster, namespace: str, owner: str):
    return next((w for w in _json(cluster, "get", "workloads.kueue.x-k8s.io", "-n", namespace)["items"]
                 if any(o["name"] == owner for o in w["metadata"].get("ownerReferences", []))), None)


def test_a_dev_pod_is_admitted_as_the_team_and_refused_beyond_the_cohorts_slices(cluster, shared_nodes):
    team = TEAM[cluster.stack]
    namespace = f"team-{team}"
    client = team_client(cluster, team)
    try:
        first = client.dev_pods.start(image=IMAGE, wait_seconds=ADMIT_S, poll_seconds=1)
        assert first.admitted and first.name.startswith(devpod.PREFIX), first
        admission = _workload_of(cluster, namespace, first.name)["status"]["admission"]
        assert admission["clusterQueue"] == shared_nodes["cluster_queue"]  # the team's own queue and quota
        assert {f for ps in admission["podSetAssignments"] for f in ps["flavors"].values()} == {shared_nodes["flavor"]}
        job = _json(cluster, "get", "job", first.name, "-n", namespace)
        assert job["spec"]["suspend"] is False, "Kueue admitted it but did not start it"
        # The token's Secret belongs to the Job: it goes when the Job goes.
        secret = _json(cluster, "get", "secret", first.name, "-n", namespace)
        assert secret["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
        running = client.dev_pods.wait_running(first, wait_seconds=RUN_S, poll_seconds=2)
        assert running.phase == "Running", running  # its pod runs: Kueue's PodsReady, admission goes on

        # The rest of the cohort's slices taken (other dev pods and slice jobs), running: the next
        # dev pod waits on quota, and the client deletes it after its wait with Kueue's reason.
        _filler(cluster, namespace, shared_nodes["resource"], shared_nodes["cohort"] - 1, job["spec"]["template"]["spec"],
                job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"])

        def filler_running():
            pods = _json(cluster, "get", "pods", "-n", namespace, "-l", f"job-name={FILLER}")["items"]
            return [p for p in pods if p["status"].get("phase") == "Running"] if len(
                [p for p in pods if p["status"].get("phase") == "Running"]) == shared_nodes["cohort"] - 1 else None
        _wait(cluster, namespace, filler_running, "the other slices in use", ADMIT_S + RUN_S)
        try:
            extra = client.dev_pods.start(image=IMAGE, wait_seconds=45, poll_seconds=1)
        except DevPodRefused as refused:
            message = str(refused)
        else:
            states = [(w["metadata"]["name"], w.get("status", {}).get("admission"),
                       [(c["type"], c["status"], c.get("reason")) for c in w.get("status", {}).get("conditions", [])])
                      for w in _json(cluster, "get", "workloads.kueue.x-k8s.io", "-n", namespace)["items"]]
            usage = _json(cluster, "get", "clusterqueues.kueue.x-k8s.io")["items"]
            raise AssertionError(f"{extra.name} was admitted beyond the cohort's {shared_nodes['cohort']} slices:\n"
                                 f"{json.dumps(states, indent=1)}\n"
                                 f"{json.dumps([(q['metadata']['name'], q.get('status', {}).get('flavorsUsage')) for q in usage], indent=1)}")
        assert "was not admitted within 45 s" in message and "insufficient unused quota" in message, message
        left = [j["metadata"]["name"] for j in _json(cluster, "get", "jobs", "-n", namespace, "-l",
                                                     f"app.kubernetes.io/name={devpod.APP}")["items"]
                if not j["metadata"].get("deletionTimestamp")]
        assert left == [first.name], f"the refused dev pod was left behind: {left}"
    finally:
        _cleanup(cluster, namespace)


def test_port_forward_reaches_dev_pods_and_no_training_pod(cluster, shared_nodes):
    team = TEAM[cluster.stack]
    namespace = f"team-{team}"
    client = team_client(cluster, team)
    kubeconfig = cluster.plane.kubeconfig(f"alice@{namespace}", [team_group(namespace)])
    raw = _example(cluster, "pf")
    try:
        submitted = client.submit(client.load(raw))
        (master, *_) = sorted(_running_pods(cluster, submitted.job.name, namespace, submitted.job.nodes),
                              key=lambda p: p["metadata"]["name"])
        # The attack: a team member tunnels into a training pod (its trainer's health port).
        refused = cluster.plane.kubectl("-n", namespace, "port-forward", f"pod/{master['metadata']['name']}",
                                        "19464:9464", kubeconfig=kubeconfig, check=False, timeout_s=60)
        assert refused.returncode != 0
        assert "port-forward only to their dev pods" in refused.stderr, refused.stderr
        assert cluster.plane.kubectl("auth", "can-i", "create", "pods/portforward", "-n", namespace,
                                     kubeconfig=kubeconfig, check=False).stdout.strip() == "yes"

        dev = client.dev_pods.start(image=IMAGE, wait_seconds=ADMIT_S, poll_seconds=1)
        running = client.dev_pods.wait_running(dev, wait_seconds=RUN_S + LAUNCH_S, poll_seconds=2)
        assert running.phase == "Running" and running.pod.startswith(devpod.PREFIX), running
        try:
            allowed = cluster.plane.kubectl("-n", namespace, "port-forward", f"pod/{running.pod}", "18888:8888",
                                            kubeconfig=kubeconfig, check=False, timeout_s=60)
            stderr = allowed.stderr
        except subprocess.TimeoutExpired as still_forwarding:  # the stream was made: admitted
            stderr = still_forwarding.stderr.decode() if isinstance(still_forwarding.stderr, bytes) else (
                still_forwarding.stderr or "")
        # Admitted by the policy; the kwok node has no kubelet, so the stream itself cannot be made.
        assert "port-forward only to their dev pods" not in stderr, stderr
        assert "forbidden" not in stderr.lower(), stderr
    finally:
        _cleanup(cluster, namespace)
        cluster.kubectl("delete", "pytorchjob", raw["name"], "-n", namespace, "--ignore-not-found", "--wait=false",
                        check=False)
