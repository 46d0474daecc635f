"""The admission attacks of tests/security/admission_cases.py, decided by a real kube-apiserver 1.32.

The same rows that cel-python evaluates (tests/security/test_admission_attacks.py) are sent here
to the API server of the prod stack's cluster, with the policies the stack deploys (taken from
its recorded plan, not from the module that renders them): each request impersonates the row's
user and groups (``kubectl --as/--as-group``; the admin identity may impersonate), CREATEs are
``--dry-run=server``, an UPDATE first stores ``before`` as a cluster admin. A refused row must be
refused by the named policy, in the API server's own words (k8s.io/apiserver
pkg/admission/plugin/policy/validating/dispatcher.go: "ValidatingAdmissionPolicy '%s' with
binding '%s' denied request: %s"); a legitimate row must be admitted.

The cluster runs Kueue, whose pod webhook acts before the policies: a row naming an owner gets an
owner the namespace holds, and where Kueue's admission gate makes the API server refuse a row
before any policy sees it, the row says so (``refused_first_on_cluster``).
"""
from __future__ import annotations

import json

import pytest

from tests.security import admission_cases as cases

ROWS = [c for c in cases.CASES]


# Stores an UPDATE row's starting object: a kube-system controller in system:masters (RBAC allows
# everything; the team policies exempt kube-system's controllers from the rules they leave to them).
STORING_CONTROLLER = {"username": "system:serviceaccount:kube-system:job-controller", "groups": ["system:masters"]}


def merge_patch(before, after):
    """RFC 7386 JSON merge patch from ``before`` to ``after`` (lists are replaced whole)."""
    if not (isinstance(before, dict) and isinstance(after, dict)):
        return after
    patch = {k: merge_patch(before.get(k), v) for k, v in after.items() if before.get(k) != v}
    patch.update({k: None for k in before if k not in after})
    return patch


def _lift_kueue_gate(cluster, namespace: str, name: str) -> None:
    """Lift the admission gate as Kueue does when it admits the pod. Kueue may admit it and lift
    the gate itself between the read and the patch: then the patch's path is gone, and the pod
    is as wanted."""
    stored = json.loads(cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout)
    if stored["spec"].get("schedulingGates"):
        cluster.kubectl("patch", "pod", name, "-n", namespace, "--type=json",
                        "-p", json.dumps([{"op": "remove", "path": "/spec/schedulingGates"}]),
                        *_impersonation(cases.KUEUE), check=False)
    stored = json.loads(cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout)
    assert not stored["spec"].get("schedulingGates"), f"pod {namespace}/{name} still gated: {stored['spec']['schedulingGates']}"


def _impersonation(user) -> list[str]:
    return [f"--as={user['username']}", *(f"--as-group={g}" for g in user["groups"] if g != "system:authenticated")]


def _unique(obj, suffix: str):
    obj = json.loads(json.dumps(obj))
    obj["metadata"]["name"] = f"{obj['metadata'].get('name', 'row')}-{suffix}"[:60]
    obj["metadata"].pop("resourceVersion", None)
    return obj


# The rows are written against the prod stack's teams and pools: only prod's cluster runs them.
@pytest.mark.parametrize("stack_cluster", ["prod"], indirect=True)
@pytest.mark.parametrize("case", ROWS, ids=lambda c: f"{c.finding}-{c.name}")
def test_admission_row_on_the_real_api_server(stack_cluster, case):
    cluster = stack_cluster
    suffix = f"{abs(hash(case.name)) % 10**6}"
    obj = _unique(case.obj, suffix)
    namespace = obj["metadata"]["namespace"]
    stored: list[tuple[str, str]] = []  # (kind, name) to delete afterwards
    try:
        obj = _owned_by_a_stored_owner(cluster, obj, suffix, stored)
        if case.operation == "UPDATE":
            # ``before`` is what the API server already stores (a pod the scheduler bound, say): it is
            # stored by a controller's identity, which the team policies leave to their controller
            # rules; the row's change is then sent as the patch a client would send.
            before = _unique(case.before, suffix)
            if before["kind"] == "Pod" and before["spec"].get("schedulingGates"):
                before, obj = _unadmittable(before), _unadmittable(obj)
            node = before["spec"].pop("nodeName", None) if before["kind"] == "Pod" else None
            cluster.kubectl("create", "-f", "-", *_impersonation(STORING_CONTROLLER), input=json.dumps(before))
            stored.append((before["kind"], before["metadata"]["name"]))
            if node:
                before["spec"]["nodeName"] = _bind(cluster, namespace, before["metadata"]["name"], node)
                obj["spec"]["nodeName"] = before["spec"]["nodeName"]
            verb = ["patch", obj["kind"], obj["metadata"]["name"], "-n", namespace, "--type=merge",
                    "-p", json.dumps(merge_patch(before, obj)), "--dry-run=server"]
            stdin = None
        else:
            verb = ["create", "-f", "-", "--dry-run=server"]
            stdin = json.dumps(obj)
        result = cluster.kubectl(*verb, *_impersonation(case.user), input=stdin, check=False)
    finally:
        for kind, name in stored:
            cluster.kubectl("delete", kind, name, "-n", namespace, "--wait=false", "--grace-period=0", check=False)
    text = result.stderr + result.stdout
    if case.refused_by is None:
        assert result.returncode == 0, f"{case.attack}: a legitimate request was refused:\n{text}"
    else:
        assert result.returncode != 0, f"{case.finding} {case.attack}: ADMITTED by the real API server"
        if case.refused_first_on_cluster:
            assert case.refused_first_on_cluster in text, f"refused, but not as expected:\n{text}"
            return
        policy = f"mlplatform-team-{case.refused_by}"
        assert f"ValidatingAdmissionPolicy '{policy}'" in text, f"refused, but not by {policy}:\n{text}"


def _owned_by_a_stored_owner(cluster, obj, suffix: str, stored: list) -> dict:
    """A row naming an owner names one the namespace holds, with its uid: Kueue's pod webhook looks
    the controller owner up and refuses a pod whose owner does not exist (kueue v0.19.2
    jobframework/reconciler.go FindAncestorJobManagedByKueue: ``ErrWorkloadOwnerNotFound``), and
    trusts an owner it manages. The owner is the team's own Job or pod, created as the team."""
    refs = obj["metadata"].get("ownerReferences") or []
    if not refs:
        return obj
    ref = refs[0]
    owner = cases.job("Job") if ref["kind"] == "Job" else cases.pod()
    owner["metadata"]["name"] = f"{ref['name']}-{suffix}"
    created = json.loads(cluster.kubectl("create", "-f", "-", "-o", "json", *_impersonation(cases.TEAM_USER),
                                         input=json.dumps(owner)).stdout)
    stored.append((owner["kind"], owner["metadata"]["name"]))
    obj = json.loads(json.dumps(obj))
    obj["metadata"]["ownerReferences"] = [{**ref, "name": created["metadata"]["name"], "uid": created["metadata"]["uid"]}]
    return obj


# A resource no ClusterQueue covers: Kueue never admits the pod, so its admission gate is still
# there when the row's change arrives (Kueue would otherwise admit a small pod within a second and
# lift the gate itself). The same amount before and after: a pod's resources are immutable.
UNADMITTABLE = "example.com/never-admitted"


def _unadmittable(obj):
    obj = json.loads(json.dumps(obj))
    for part in ("requests", "limits"):
        obj["spec"]["containers"][0].setdefault("resources", {}).setdefault(part, {})[UNADMITTABLE] = "1"
    return obj


def _bind(cluster, namespace: str, name: str, node: str) -> str:
    """Bind the stored pod as the scheduler does (the pods/binding subresource) once Kueue has
    admitted it: its pod webhook gates a pod of a team namespace that no job it manages owns, the
    API server refuses to bind a gated pod, and admitting lifts the gate. If the scheduler binds it
    first (a node of its pool exists), that node is where it runs. The node it is bound to."""
    _lift_kueue_gate(cluster, namespace, name)
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
               "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    cluster.kubectl("create", "--raw", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", "-f", "-",
                    input=json.dumps(binding), check=False)
    bound_to = json.loads(cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout)["spec"].get("nodeName")
    assert bound_to, f"pod {namespace}/{name} is bound to no node"
    return bound_to

