"""The admission attacks of tests/security/admission_cases.py, decided by a real kube-apiserver 1.32.

The same rows that cel-python evaluates (tests/security/test_admission_attacks.py) are sent here
to the API server of the prod stack's cluster, with the policies the stack deploys (taken from
its recorded plan, not from the module that renders them): each request impersonates the row's
user and groups (``kubectl --as/--as-group``; the admin identity may impersonate), CREATEs are
``--dry-run=server``, an UPDATE first stores ``before`` as a cluster admin. A refused row must be
refused by the named policy, in the API server's own words (k8s.io/apiserver
pkg/admission/plugin/policy/validating/dispatcher.go: "ValidatingAdmissionPolicy '%s' with
binding '%s' denied request: %s"); a legitimate row must be admitted.
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
    stored = json.loads(cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout)
    if stored["spec"].get("schedulingGates"):
        cluster.kubectl("patch", "pod", name, "-n", namespace, "--type=json",
                        "-p", json.dumps([{"op": "remove", "path": "/spec/schedulingGates"}]),
                        *_impersonation(cases.KUEUE))


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
    if case.operation == "UPDATE":
        # ``before`` is what the API server already stores (a pod the scheduler bound, say): it is
        # stored by a controller's identity, which the team policies leave to their controller
        # rules; the row's change is then sent as the patch a client would send.
        before = _unique(case.before, suffix)
        node = before["spec"].pop("nodeName", None) if before["kind"] == "Pod" else None
        cluster.kubectl("create", "-f", "-", *_impersonation(STORING_CONTROLLER), input=json.dumps(before))
        if node:
            # Kueue's pod webhook gates a pod of a team namespace that no job it manages owns; a
            # bound pod is one Kueue admitted, and admitting lifts the gate (the API server refuses
            # to bind a gated pod: "pod ... has non-empty .spec.schedulingGates").
            _lift_kueue_gate(cluster, namespace, before["metadata"]["name"])
            # Bound as the scheduler binds: the pods/binding subresource, not a nodeName on create.
            binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": before["metadata"]["name"]},
                       "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
            cluster.kubectl("create", "--raw",
                            f"/api/v1/namespaces/{namespace}/pods/{before['metadata']['name']}/binding",
                            "-f", "-", input=json.dumps(binding))
            before["spec"]["nodeName"] = node
        verb = ["patch", obj["kind"], obj["metadata"]["name"], "-n", namespace, "--type=merge",
                "-p", json.dumps(merge_patch(before, obj)), "--dry-run=server"]
        stdin = None
    else:
        verb = ["create", "-f", "-", "--dry-run=server"]
        stdin = json.dumps(obj)
    try:
        result = cluster.kubectl(*verb, *_impersonation(case.user), input=stdin, check=False)
    finally:
        if case.operation == "UPDATE":
            cluster.kubectl("delete", obj["kind"], obj["metadata"]["name"], "-n", namespace,
                            "--wait=false", "--grace-period=0", check=False)
    text = result.stderr + result.stdout
    if case.refused_by is None:
        assert result.returncode == 0, f"{case.attack}: a legitimate request was refused:\n{text}"
    else:
        assert result.returncode != 0, f"{case.finding} {case.attack}: ADMITTED by the real API server"
        policy = f"mlplatform-team-{case.refused_by}"
        assert f"ValidatingAdmissionPolicy '{policy}'" in text, f"refused, but not by {policy}:\n{text}"
