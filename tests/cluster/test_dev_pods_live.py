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
what refuses the last dev pod. kwok completes a batch Job's pod as soon as it runs (its
``pod-complete`` stage), so a dev pod here frees its slice at once: the slices in use are held by
one-slice training jobs (PyTorchJob pods run until told otherwise), and the port-forward verdict is
asked with a raw CONNECT, which the API server judges whatever the pod's phase.
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


SLICE_EXAMPLE = {"dev": "examples/jobs/l4-shared-slice.yaml", "prod": "examples/jobs/h100-mig-slice.yaml"}


def _cleanup(cluster, namespace: str) -> None:
    """Every dev pod and slice job of the test, so no workload waits on quota for the next test."""
    cluster.kubectl("delete", "jobs", "-n", namespace, "-l", f"app.kubernetes.io/name={devpod.APP}", "--wait=false",
                    check=False)
    cluster.kubectl("delete", "pytorchjobs", "-n", namespace, "-l", "mlplatform.io/test=slices-in-use", "--wait=false",
                    check=False)


def _slice_jobs(cluster, client, team: str, count: int) -> list[str]:
    """``count`` one-slice training jobs of the team (the example slice job, renamed): what other
    dev pods and slice jobs of the cohort would hold. Their pods keep running (kwok ends a job's
    pod only when told; a dev pod's Job pods it completes at once, which would free the quota)."""
    import yaml

    from tests.cluster.test_job_lifecycle_live import ROOT

    base = yaml.safe_load((ROOT / SLICE_EXAMPLE[cluster.stack]).read_text())
    names = []
    for index in range(count):
        name = f"fill-{index}"
        raw = {**base, "name": name, "team": team, "trainer": {**base["trainer"], "overrides": [
            o if not o.startswith("export.registered_model_name=") else f"export.registered_model_name=team-{team}.fill"
            for o in base["trainer"]["overrides"]]}}
        job = client.submit(client.load(raw)).job
        cluster.kubectl("label", "pytorchjob", job.name, "-n", job.namespace, "mlplatform.io/test=slices-in-use")
        names.append(name)
    return names


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
        # Its pod, created by the Job controller from the admitted template, passed every team policy.
        _wait(cluster, namespace, lambda: _json(cluster, "get", "pods", "-n", namespace, "-l", f"job-name={first.name}")[
            "items"], "the dev pod's pod created", RUN_S)

        # Every slice of the cohort taken by running slice jobs: the next dev pod waits on quota,
        # and the client deletes it after its wait, with Kueue's reason.
        names = _slice_jobs(cluster, client, team, shared_nodes["cohort"])

        def all_running():
            running = [n for n in names if any(p["status"].get("phase") == "Running" for p in _json(
                cluster, "get", "pods", "-n", namespace, "-l", f"training.kubeflow.org/job-name={n}")["items"])]
            return running if len(running) == len(names) else None
        _wait(cluster, namespace, all_running, f"the cohort's {len(names)} slices in use", ADMIT_S + RUN_S + LAUNCH_S)
        with pytest.raises(DevPodRefused) as refused:
            client.dev_pods.start(image=IMAGE, wait_seconds=45, poll_seconds=1)
        message = str(refused.value)
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

        # The same CONNECT, raw (kubectl's own port-forward checks the pod's phase first, and kwok
        # completes a dev pod's Job pod at once): the policy's verdict, whatever the pod's phase.
        def connect(pod: str):
            path = f"/api/v1/namespaces/{namespace}/pods/{pod}/portforward?ports=8888"
            return cluster.plane.kubectl("create", "--raw", path, "-f", "/dev/null", kubeconfig=kubeconfig, check=False,
                                         timeout_s=60)

        denied = connect(master["metadata"]["name"])
        assert "port-forward only to their dev pods" in denied.stderr, denied.stderr
        dev = client.dev_pods.start(image=IMAGE, wait_seconds=ADMIT_S, poll_seconds=1)
        pods = _wait(cluster, namespace, lambda: _json(cluster, "get", "pods", "-n", namespace, "-l",
                                                       f"job-name={dev.name}")["items"], "the dev pod's pod", RUN_S)
        pod = pods[0]["metadata"]["name"]
        assert pod.startswith(devpod.PREFIX), pod
        try:
            allowed = connect(pod)
            stderr = allowed.stderr
        except subprocess.TimeoutExpired as still_connecting:  # the stream was made: admitted
            stderr = still_connecting.stderr.decode() if isinstance(still_connecting.stderr, bytes) else (
                still_connecting.stderr or "")
        # Admitted by RBAC and the policy; what fails is the stream itself (no upgrade, no kubelet).
        assert "port-forward only to their dev pods" not in stderr, stderr
        assert "forbidden" not in stderr.lower(), stderr
    finally:
        _cleanup(cluster, namespace)
        cluster.kubectl("delete", "pytorchjob", raw["name"], "-n", namespace, "--ignore-not-found", "--wait=false",
                        check=False)
