"""A team's bare pods take the team's share of the CPU pool, not the pool: on the real control plane
with the real Kueue v0.19.2 configured from the stack's own objects (its plain-pod integration and
the team's ``default`` LocalQueue), as the team's own identity.

The attack: a team member creates bare pods (the team Role may) to fill the shared CPU pool, so
that other teams' Kueue-admitted CPU work, pipelines and the restore drill find no node. Kueue's
plain-pod integration gates every pod of a team namespace that no managed job owns (kueue v0.19.2
pkg/controller/jobs/pod/pod_webhook.go ``Default``: ``gate(&pod.pod)``) and lifts the gate only
when the pod's Workload fits the team's ClusterQueue, whose CPU flavor holds the team's nominal
share of the pool; what a team borrows from idle shares in the cohort is reclaimed by preemption
(workloads/kueue.py). A pod larger than anything the cohort can lend never starts. The ways
around the gate (naming a job as the pod's owner, lifting the gate by an update) are refused by
the team admission policies (tests/security/admission_cases.py, rows ``kueue-bypass``).
"""
from __future__ import annotations

import json

import pytest

from tools.cluster.standins import wait_for
from workloads import kueue, scheduling, tenancy
from workloads.trainingjob import container_security_context, pod_security_context

ADMIT_S = 240


@pytest.fixture
def cluster(stack_cluster):
    return stack_cluster


def _json(cluster, *args):
    return json.loads(cluster.kubectl(*args, "-o", "json").stdout)


def _team(cluster) -> tuple[str, int]:
    namespaces = [n for n in cluster.layer.of_kind("Namespace") if tenancy.TEAM_LABEL in n["metadata"].get("labels", {})]
    namespace = sorted(namespaces, key=lambda n: n["metadata"]["name"])[0]
    return namespace["metadata"]["name"], int(namespace["metadata"]["labels"][tenancy.POSIX_ID_LABEL])


def _cohort_cpu(cluster) -> int:
    """The CPU every team's ClusterQueue holds in the CPU flavor: what the cohort could ever lend."""
    total = 0
    for queue in cluster.layer.of_kind("ClusterQueue"):
        for group in queue["spec"]["resourceGroups"]:
            for flavor in group["flavors"]:
                if flavor["name"].startswith("cpu-"):
                    total += sum(int(r["nominalQuota"]) for r in flavor["resources"] if r["name"] == "cpu")
    return total


def _cpu_pool_labels(cluster) -> dict:
    [flavor] = [f for f in cluster.layer.of_kind("ResourceFlavor") if f["metadata"]["name"].startswith("cpu-")]
    return dict(flavor["spec"]["nodeLabels"])


def _bare_pod(namespace: str, uid: int, name: str, cpu: int, node_selector: dict) -> dict:
    """A team's CPU pod as a pipeline step is written: selecting the CPU pool. Kueue only considers
    flavors whose node labels the pod's selector matches (kueue v0.19.2 flavorassigner.go:
    "flavor %s doesn't match node affinity"), so the CPU pool's flavor is the only one; a pod
    without a selector that spilled into a GPU flavor's CPU quota would get that pool's selector
    at admission, which the gpu-less-pods policy refuses: it never reaches a node either."""
    resources = {"requests": {"cpu": str(cpu), "memory": "1Gi"}, "limits": {"cpu": str(cpu), "memory": "1Gi"}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeSelector": dict(node_selector),
                     "priorityClassName": scheduling.priority_class_name(scheduling.Priority.DEFAULT),
                     "securityContext": pod_security_context(uid), "restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "busybox:1", "resources": resources,
                                     "securityContext": container_security_context(uid)}]}}


def _as_member(namespace: str) -> list[str]:
    return ["--as=alice@example.com", f"--as-group={tenancy.team_group(namespace)}"]


def _workload_of(cluster, namespace: str, pod_name: str):
    for workload in _json(cluster, "get", "workloads.kueue.x-k8s.io", "-n", namespace)["items"]:
        if any(o.get("kind") == "Pod" and o.get("name") == pod_name for o in workload["metadata"].get("ownerReferences", [])):
            return workload
    return None


def _condition(obj, kind: str):
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), None)


@pytest.mark.parametrize("stack_cluster", ["prod"], indirect=True)
def test_a_teams_bare_pods_wait_for_kueue_and_never_exceed_what_the_cohort_holds(cluster, scope):
    namespace, uid = _team(cluster)
    # Named in the test's scope: both pods go when the test ends, however it ends.
    greedy_name, fits_name = scope.name("fill-the-pool"), scope.name("small-step")
    cohort = _cohort_cpu(cluster)
    assert cohort > 0, "no CPU flavor quota: bare pods would be admitted nowhere"

    # More CPU than the whole cohort holds: created (Kueue gates it), never admitted.
    pool = _cpu_pool_labels(cluster)
    greedy = _bare_pod(namespace, uid, greedy_name, cohort + 8, pool)
    cluster.kubectl("create", "-f", "-", *_as_member(namespace), input=json.dumps(greedy))
    pod = _json(cluster, "get", "pod", greedy_name, "-n", namespace)
    assert {"name": kueue.ADMISSION_GATE} in pod["spec"].get("schedulingGates", []), \
        f"a bare team pod was created without Kueue's gate: {pod['spec'].get('schedulingGates')}"
    assert pod["metadata"]["labels"].get(kueue.QUEUE_LABEL) == kueue.DEFAULT_LOCAL_QUEUE_NAME

    def refused_for_quota():
        workload = _workload_of(cluster, namespace, greedy_name)
        reserved = workload and _condition(workload, "QuotaReserved")
        return reserved if reserved and reserved["status"] == "False" and "insufficient" in reserved["message"] else None

    reserved = wait_for(refused_for_quota, "Kueue refuses the oversized pod for quota", timeout_s=ADMIT_S, interval_s=2)
    assert "cpu" in reserved["message"], reserved
    pod = _json(cluster, "get", "pod", greedy_name, "-n", namespace)
    assert {"name": kueue.ADMISSION_GATE} in pod["spec"].get("schedulingGates", []) and not pod["spec"].get("nodeName")

    # The gate is Kueue's to lift: the team member who owns the pod cannot.
    lifted = cluster.kubectl("patch", "pod", greedy_name, "-n", namespace, "--type=json",
                             "-p", json.dumps([{"op": "remove", "path": "/spec/schedulingGates"}]),
                             *_as_member(namespace), check=False)
    assert lifted.returncode != 0 and "mlplatform-team-pod-queue" in lifted.stderr, lifted.stderr
    cluster.kubectl("delete", "pod", greedy_name, "-n", namespace, "--wait=false")

    # A pod within the team's share is admitted to the CPU pool's flavor and its gate lifted.
    fits = _bare_pod(namespace, uid, fits_name, 1, pool)
    cluster.kubectl("create", "-f", "-", *_as_member(namespace), input=json.dumps(fits))

    def admitted():
        workload = _workload_of(cluster, namespace, fits_name)
        return workload if workload and (_condition(workload, "Admitted") or {}).get("status") == "True" else None

    workload = wait_for(admitted, "Kueue admits the pod within the team's share", timeout_s=ADMIT_S, interval_s=2)
    flavors = {f for ps in workload["status"]["admission"]["podSetAssignments"] for f in ps["flavors"].values()}
    assert flavors and all(f.startswith("cpu-") for f in flavors), flavors
    assert workload["spec"]["queueName"] == kueue.DEFAULT_LOCAL_QUEUE_NAME

    def ungated():
        pod = _json(cluster, "get", "pod", fits_name, "-n", namespace)
        return pod if not pod["spec"].get("schedulingGates") else None

    pod = wait_for(ungated, "Kueue lifts the admitted pod's gate", timeout_s=ADMIT_S, interval_s=2)
    assert pod["spec"].get("nodeSelector") == pool, pod["spec"].get("nodeSelector")
