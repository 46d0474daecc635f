"""The interactive GPU pod on the real control plane, as a team member.

`JobClient.dev_pods.start` (what `python -m workloads dev` runs) creates the dev pod's Job with the
identity the team's access entry gives (``tests.cluster.clients.team_client``); the platform's
admission policies and Pod Security judge it and its pod, the real Kueue admits it into the team's
ClusterQueue on the shared (time-slicing or MIG) flavor, and refuses it once the slices the cohort
holds are in use (the client then deletes it again). The port-forward policy is judged by the real
API server on a real CONNECT: a team member's `kubectl port-forward` to a training pod is refused
by it, to the dev pod it is not (the connection then fails further on, at the kwok node, which has
no kubelet to forward to).
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


@pytest.fixture(scope="module")
def cluster(stack_controllers):
    return stack_controllers


def _shared_flavor(cluster, team: str) -> tuple[str, str, int, str]:
    """(flavor, slice resource, slices the cohort holds of it, the team's ClusterQueue) of the
    first shared pool the team has quota on, from the stack's own ClusterQueues."""
    namespace = f"team-{team}"
    queues = cluster.layer.of_kind("ClusterQueue")
    own = next(q for q in queues if (q["spec"].get("namespaceSelector") or {}).get("matchLabels", {})
               .get("kubernetes.io/metadata.name") == namespace)
    for group in own["spec"]["resourceGroups"]:
        for flavor in group["flavors"]:
            for resource in flavor["resources"]:
                name = resource["name"]
                if (name == "nvidia.com/gpu.shared" or name.startswith("nvidia.com/mig-")) and int(resource["nominalQuota"]) > 0:
                    cohort = sum(int(r["nominalQuota"]) for q in queues if q["spec"].get("cohort") == own["spec"].get("cohort")
                                 for g in q["spec"]["resourceGroups"] for f in g["flavors"] if f["name"] == flavor["name"]
                                 for r in f["resources"] if r["name"] == name)
                    return flavor["name"], name, cohort, own["metadata"]["name"]
    raise AssertionError(f"team {team} has no shared-pool quota in stack {cluster.stack}")


def _filler(cluster, namespace: str, flavor_resource: str, slices: int, template: dict) -> str:
    """A Job of the platform's (the cluster admin's) in the team's queue that takes ``slices`` more
    slices: what other dev pods and slice jobs of the cohort would hold."""
    name = "slices-in-use"
    pod = json.loads(json.dumps(template))
    pod["containers"] = [{**pod["containers"][0], "name": "filler", "command": ["sleep", "infinity"], "env": [],
                          "resources": {"requests": {flavor_resource: str(slices), "cpu": "100m", "memory": "64Mi"},
                                        "limits": {flavor_resource: str(slices), "cpu": "100m", "memory": "64Mi"}}}]
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": namespace, "labels": {
        "kueue.x-k8s.io/queue-name": template["_queue"]}},
        "spec": {"suspend": True, "backoffLimit": 0, "template": {"spec": {k: v for k, v in pod.items() if k != "_queue"}}}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(job))
    return name


def test_a_dev_pod_is_admitted_as_the_team_and_refused_beyond_the_cohorts_slices(cluster):
    team = TEAM[cluster.stack]
    namespace = f"team-{team}"
    client = team_client(cluster, team)
    flavor, resource, cohort_slices, cluster_queue = _shared_flavor(cluster, team)

    first = client.dev_pods.start(image=IMAGE, wait_seconds=ADMIT_S, poll_seconds=1)
    assert first.admitted and first.name.startswith(devpod.PREFIX), first
    workload = next(w for w in _json(cluster, "get", "workloads.kueue.x-k8s.io", "-n", namespace)["items"]
                    if any(o["name"] == first.name for o in w["metadata"].get("ownerReferences", [])))
    admission = workload["status"]["admission"]
    assert admission["clusterQueue"] == cluster_queue  # the team's own queue and quota
    assert {f for ps in admission["podSetAssignments"] for f in ps["flavors"].values()} == {flavor}
    job = _json(cluster, "get", "job", first.name, "-n", namespace)
    assert job["spec"]["suspend"] is False, "Kueue admitted it but did not start it"
    # The token's Secret belongs to the Job: it goes when the Job goes.
    secret = _json(cluster, "get", "secret", first.name, "-n", namespace)
    assert secret["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]

    # The rest of the cohort's slices taken (other dev pods and slice jobs): the next dev pod waits,
    # and the client deletes it after its wait with Kueue's reason.
    template = {**job["spec"]["template"]["spec"], "_queue": job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]}
    filler = _filler(cluster, namespace, resource, cohort_slices - 1, template)
    _wait(cluster, namespace, lambda: any(
        c["type"] == "Admitted" and c["status"] == "True"
        for w in _json(cluster, "get", "workloads.kueue.x-k8s.io", "-n", namespace)["items"]
        if any(o["name"] == filler for o in w["metadata"].get("ownerReferences", []))
        for c in w.get("status", {}).get("conditions", [])), "the filler admitted", ADMIT_S)
    with pytest.raises(DevPodRefused) as refused:
        client.dev_pods.start(image=IMAGE, wait_seconds=45, poll_seconds=1)
    message = str(refused.value)
    assert "was not admitted within 45 s" in message and "insufficient unused quota" in message, message
    left = [j["metadata"]["name"] for j in _json(cluster, "get", "jobs", "-n", namespace, "-l",
                                                 f"app.kubernetes.io/name={devpod.APP}")["items"]
            if not j["metadata"].get("deletionTimestamp")]
    assert left == [first.name], f"the refused dev pod was left behind: {left}"
    cluster.kubectl("delete", "job", filler, "-n", namespace, "--wait=false")
    client.dev_pods.stop(first.name, team)


def test_port_forward_reaches_dev_pods_and_no_training_pod(cluster):
    team = TEAM[cluster.stack]
    namespace = f"team-{team}"
    client = team_client(cluster, team)
    kubeconfig = cluster.plane.kubeconfig(f"alice@{namespace}", [team_group(namespace)])

    raw = _example(cluster, "pf")
    submitted = client.submit(client.load(raw))
    (master, *_) = sorted(_running_pods(cluster, submitted.job.name, namespace, submitted.job.nodes),
                          key=lambda p: p["metadata"]["name"])
    # The attack: a team member tunnels into a training pod (its trainer's health port).
    refused = cluster.plane.kubectl("-n", namespace, "port-forward", f"pod/{master['metadata']['name']}", "19464:9464",
                                    kubeconfig=kubeconfig, check=False, timeout_s=60)
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
        stderr = (still_forwarding.stderr or b"").decode() if isinstance(still_forwarding.stderr, bytes) else \
            (still_forwarding.stderr or "")
    # Admitted by the policy; the kwok node has no kubelet, so the stream itself cannot be made.
    assert "port-forward only to their dev pods" not in stderr, stderr
    assert "forbidden" not in stderr.lower(), stderr
    client.dev_pods.stop(dev.name, team)
    client.cancel(submitted.job.name, team)
