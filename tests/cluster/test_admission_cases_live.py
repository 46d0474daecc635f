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

cases = pytest.importorskip("tests.security.admission_cases")

ROWS = [c for c in cases.CASES]


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
        before = _unique(case.before, suffix)
        cluster.kubectl("create", "-f", "-", input=json.dumps(before))
        stored = json.loads(cluster.kubectl("get", before["kind"], before["metadata"]["name"], "-n", namespace,
                                            "-o", "json").stdout)
        obj["metadata"]["resourceVersion"] = stored["metadata"]["resourceVersion"]
        verb = ["replace", "-f", "-", "--dry-run=server"]
    else:
        verb = ["create", "-f", "-", "--dry-run=server"]
    try:
        result = cluster.kubectl(*verb, *_impersonation(case.user), input=json.dumps(obj), check=False)
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
