"""The interactive GPU pod on the real control plane, as a team member.

`JobClient.dev_pods.start` (what `python -m workloads dev` runs) creates the dev pod's Job with the
identity the plan's access entries give the team (tests/cluster/identities.py); the platform's
admission policies and Pod Security judge it and its pod, the real Kueue admits it into the team's
ClusterQueue on the shared (time-slicing or MIG) flavor, and refuses it once the slices the cohort
holds are in use (the client then deletes it again). The port-forward policy is judged by the real
API server on a real CONNECT: a team member's `kubectl port-forward` to a training pod is refused
by it, to the dev pod it is not (the stream then fails further on, at the node, where no kubelet
serves the streaming API).

The shared pool's nodes are Karpenter's: the pool's NodeOverlay tells it how many slices an
instance type offers, and the node's device plugin advertises them once it runs there
(tools/cluster/kubelet.py). Kueue admits with ``waitForPodsReady`` (blockAdmission): a workload
whose pods never run would hold every later admission, so the slices must have somewhere to run
for quota, not readiness, to be what refuses the last dev pod. The test cluster's kubelet
completes a batch Job's pod as soon as it runs (as kwok's ``pod-complete`` stage does; the dev
server is not run here), so a dev pod here frees its slice at once: the slices in use are held by
one-slice training jobs (their pods run the trainer's contract until told otherwise), and the
port-forward verdict is asked with a raw CONNECT, which the API server judges whatever the pod's
phase.
"""
from __future__ import annotations

import subprocess

import pytest
import yaml

from jobs.devpods import DevPodRefused
from tests.cluster import lifecycle as lc
from tools.cluster.api import eventually
from workloads import devpod
from workloads.tenancy import team_group

IMAGE = "111122223333.dkr.ecr.us-west-2.amazonaws.com/mlp/trainer:1.0.0-dev"
TEAM = {"dev": "research", "prod": "research"}


@pytest.fixture
def cluster(stack_cluster):
    return stack_cluster


def _shared_pool(cluster, team: str) -> dict:
    """The team's first shared pool as the stack declares it: flavor, slice resource, slices per
    node, the slices its cohort holds, the team's ClusterQueue, the NodePool."""
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
                overlay = lc.node_overlay(cluster, pool["metadata"]["name"])
                return {"flavor": flavor["name"], "resource": name, "per_node": int(overlay["spec"]["capacity"][name]),
                        "cohort": cohort, "cluster_queue": own["metadata"]["name"], "pool": pool}
    raise AssertionError(f"team {team} has no shared-pool quota in stack {cluster.stack}")


@pytest.fixture
def shared(cluster, scope):
    """The team's shared pool; when the test ends, however it ends, its dev pods are gone (the
    scope removes its slice jobs), so no workload waits on quota for the next test."""
    yield _shared_pool(cluster, TEAM[cluster.stack])
    namespace = f"team-{TEAM[cluster.stack]}"
    selector = f"app.kubernetes.io/name={devpod.APP}"
    cluster.kubectl("delete", "jobs", "-n", namespace, "-l", selector, "--cascade=background", "--wait=false",
                    check=False)
    eventually(lambda: not cluster.api.get(f"/apis/batch/v1/namespaces/{namespace}/jobs", labelSelector=selector)["items"]
               and not cluster.api.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=selector)["items"],
               f"the dev pods of {namespace} gone", lc.END_S, interval_s=1)


SLICE_EXAMPLE = {"dev": "examples/jobs/l4-shared-slice.yaml", "prod": "examples/jobs/h100-mig-slice.yaml"}


def _slice_jobs(cluster, scope, client, team: str, count: int, base_name: str = "fill") -> list[str]:
    """``count`` one-slice training jobs of the team (the example slice job, renamed into the
    test's scope): what other dev pods and slice jobs of the cohort would hold. Their pods keep
    running (a trainer pod runs until told otherwise; a dev pod's Job pod completes at once,
    which would free the quota)."""
    base = yaml.safe_load((lc.ROOT / SLICE_EXAMPLE[cluster.stack]).read_text())
    names = []
    for index in range(count):
        raw = {**base, "name": scope.name(f"{base_name}-{index}"), "team": team, "trainer": {**base["trainer"], "overrides": [
            o if not o.startswith("export.registered_model_name=") else f"export.registered_model_name=team-{team}.fill"
            for o in base["trainer"]["overrides"]]}}
        names.append(client.submit(client.load(raw)).job.name)
    return names


def _workload_of(cluster, namespace: str, owner: str):
    return next((w for w in lc.as_json(cluster, "get", "workloads.kueue.x-k8s.io", "-n", namespace)["items"]
                 if any(o["name"] == owner for o in w["metadata"].get("ownerReferences", []))), None)


def _dev_pods(cluster, namespace: str, job: str) -> list[dict]:
    return cluster.api.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"job-name={job}")["items"]


def test_a_dev_pod_is_admitted_as_the_team_and_refused_beyond_the_cohorts_slices(cluster, scope, shared):
    team = TEAM[cluster.stack]
    namespace = f"team-{team}"
    client = lc.client(cluster, team)
    first = client.dev_pods.start(image=IMAGE, team=team, wait_seconds=lc.ADMIT_S, poll_seconds=1)
    assert first.admitted and first.name.startswith(devpod.PREFIX), first
    admission = _workload_of(cluster, namespace, first.name)["status"]["admission"]
    assert admission["clusterQueue"] == shared["cluster_queue"]  # the team's own queue and quota
    assert {f for ps in admission["podSetAssignments"] for f in ps["flavors"].values()} == {shared["flavor"]}
    job = lc.as_json(cluster, "get", "job", first.name, "-n", namespace)
    assert job["spec"]["suspend"] is False, "Kueue admitted it but did not start it"
    # The token's Secret belongs to the Job: it goes when the Job goes.
    secret = lc.as_json(cluster, "get", "secret", first.name, "-n", namespace)
    assert secret["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    # Its pod, created by the Job controller from the admitted template, passed every team policy.
    lc.wait(cluster, namespace, lambda: _dev_pods(cluster, namespace, first.name), "the dev pod's pod created", lc.RUN_S)

    # Every slice of the cohort taken by running slice jobs: the next dev pod waits on quota,
    # and the client deletes it after its wait, with Kueue's reason.
    names = _slice_jobs(cluster, scope, client, team, shared["cohort"])

    def all_running():
        running = [n for n in names if any(p["status"].get("phase") == "Running" and lc.ready(p)
                                           for p in lc.job_pods(cluster, n, namespace))]
        return running if len(running) == len(names) else None
    lc.wait(cluster, namespace, all_running, f"the cohort's {len(names)} slices in use",
            lc.ADMIT_S + lc.RUN_S + lc.LAUNCH_S)
    with pytest.raises(DevPodRefused) as refused:
        client.dev_pods.start(image=IMAGE, team=team, wait_seconds=45, poll_seconds=1)
    message = str(refused.value)
    assert "was not admitted within 45 s" in message and "insufficient unused quota" in message, message
    left = [j["metadata"]["name"] for j in lc.as_json(cluster, "get", "jobs", "-n", namespace, "-l",
                                                      f"app.kubernetes.io/name={devpod.APP}")["items"]
            if not j["metadata"].get("deletionTimestamp")]
    assert left == [first.name], f"the refused dev pod was left behind: {left}"


def test_port_forward_reaches_dev_pods_and_no_training_pod(cluster, scope, shared):
    team = TEAM[cluster.stack]
    namespace = f"team-{team}"
    client = lc.client(cluster, team)
    kubeconfig = cluster.plane.kubeconfig(f"alice@{namespace}", [team_group(namespace)])
    # A training job of the team's own (one slice: the namespace the attacker may port-forward in).
    (job_name,) = _slice_jobs(cluster, scope, client, team, 1, base_name="pf")
    (master,) = lc.running_pods(cluster, job_name, namespace, 1)
    # The attack: a team member tunnels into a training pod (its trainer's health port).
    refused = cluster.plane.kubectl("-n", namespace, "port-forward", f"pod/{master['metadata']['name']}",
                                    "19464:9464", kubeconfig=kubeconfig, check=False, timeout_s=60)
    assert refused.returncode != 0
    assert "port-forward only to their dev pods" in refused.stderr, refused.stderr
    assert cluster.plane.kubectl("auth", "can-i", "create", "pods/portforward", "-n", namespace,
                                 kubeconfig=kubeconfig, check=False).stdout.strip() == "yes"

    # The same CONNECT, raw (kubectl's own port-forward checks the pod's phase first, and a dev
    # pod's Job pod completes at once here): the policy's verdict, whatever the pod's phase.
    def connect(pod: str):
        path = f"/api/v1/namespaces/{namespace}/pods/{pod}/portforward?ports=8888"
        return cluster.plane.kubectl("create", "--raw", path, "-f", "/dev/null", kubeconfig=kubeconfig, check=False,
                                     timeout_s=60)

    denied = connect(master["metadata"]["name"])
    assert "port-forward only to their dev pods" in denied.stderr, denied.stderr
    dev = client.dev_pods.start(image=IMAGE, team=team, wait_seconds=lc.ADMIT_S, poll_seconds=1)
    pods = lc.wait(cluster, namespace, lambda: _dev_pods(cluster, namespace, dev.name), "the dev pod's pod", lc.RUN_S)
    pod = pods[0]["metadata"]["name"]
    assert pod.startswith(devpod.PREFIX), pod
    try:
        allowed = connect(pod)
        stderr = allowed.stderr
    except subprocess.TimeoutExpired as still_connecting:  # the stream was made: admitted
        stderr = still_connecting.stderr.decode() if isinstance(still_connecting.stderr, bytes) else (
            still_connecting.stderr or "")
    # Admitted by RBAC and the policy; what fails is the stream itself (no kubelet streaming API).
    assert "port-forward only to their dev pods" not in stderr, stderr
    assert "forbidden" not in stderr.lower(), stderr
