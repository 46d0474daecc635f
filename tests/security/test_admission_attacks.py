"""The admission rows of security review 4 (tests/security/admission_cases.py), evaluated the way
the API server evaluates a ValidatingAdmissionPolicy (Kubernetes docs, "Validating Admission
Policy"; the evaluator is ``tests/infra/test_tenant_attacks.admit``): the request matches a
policy's resource rules (resource and operation) and its binding's namespace selector, every
``matchConditions`` expression is true, and then a false ``validations`` expression refuses it.

Each attack row fails on the code before the fix (the policies admitted it: security-4 section 4),
and each baseline row shows the rule does not refuse the platform's own requests.
"""
from __future__ import annotations

import copy

import pytest

pytest.importorskip("celpy", reason="cel-python is in the dev extra (pyproject.toml)")

from tests.infra.test_tenant_attacks import admit
from tests.security import admission_cases as cases
from workloads import tenancy


def _refusals(case: cases.Case, policies=cases.POLICIES) -> list[str]:
    return admit(case.obj, case.namespace, case.user, policies, operation=case.operation, old=case.before)


@pytest.mark.parametrize("case", cases.CASES, ids=lambda c: f"{c.finding}-{c.name}")
def test_admission_row(case: cases.Case):
    refusals = _refusals(case)
    if case.refused_by is None:
        assert refusals == [], f"{case.attack}: the platform's own request is refused: {refusals}"
    else:
        assert refusals, f"{case.finding} {case.attack}: ADMITTED"
        assert any(r.startswith(f"{tenancy.POLICY_PREFIX}{case.refused_by}:") for r in refusals), refusals


def test_every_finding_has_an_attack_and_the_attacks_differ():
    attacks = [c for c in cases.CASES if c.refused_by]
    assert {c.finding for c in attacks} >= {"N2", "N3", "N10", "N13", "L3"}
    assert len({c.name for c in cases.CASES}) == len(cases.CASES)


def test_the_gpu_less_rule_is_what_refuses_the_n2_pod():
    """Drop the new policy and the N2 pod goes through: the refusal is the rule's, not a side effect."""
    without = [p for p in cases.POLICIES if not p["metadata"]["name"].endswith("gpu-less-pods")]
    (row,) = [c for c in cases.CASES if c.name == "cpu-pod-on-gpu-pool"]
    assert _refusals(row, without) == []


def test_a_policy_without_gpu_pools_still_refuses_the_toleration():
    """The toleration is the gate (GPU nodes are tainted); pool names only add the selector check."""
    policies = tenancy.admission_policies()
    (row,) = [c for c in cases.CASES if c.name == "cpu-pod-tolerates-gpu-taint"]
    assert _refusals(row, policies)


def test_the_update_rows_start_from_an_admitted_object():
    for case in (c for c in cases.CASES if c.operation == "UPDATE"):
        created = copy.deepcopy(case.before)
        created["spec"].pop("nodeName", None)
        assert admit(created, case.namespace, case.user, cases.POLICIES) == [], case.name


def test_policies_validate_against_kubernetes_1_32():
    from tests.support.validation import validate_core

    for obj in cases.POLICIES:
        assert validate_core(obj) == [], obj["metadata"]["name"]
