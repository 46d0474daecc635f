"""The pipeline's train step through a PyTorchJob's life: preemptions wait, terminal conditions end it.

Upstream behaviour these tests are written from:

kubeflow/trainer v1.9.4 (Training Operator) pkg/core/status.go, ``updateJobReplicaStatuses``
counts a terminating pod as failed::

    case corev1.PodRunning:
        if pod.DeletionTimestamp != nil {
            // when node is not ready, the pod will be in terminating state.
            // Count deleted Pods as failures to account for orphan Pods that
            // never have a chance to reach the Failed phase.
            jobStatus.ReplicaStatuses[rtype].Failed++

pkg/util/status.go: ``setCondition`` -- "Do nothing if JobStatus have failed condition" ...
``newConditions := filterOutCondition(status.Conditions, condition.Type)`` /
``status.Conditions = append(newConditions, condition)``; pkg/controller.v1/common/pod.go (ExitCode,
non-retryable): ``commonutil.UpdateJobConditions(jobStatus, apiv1.JobFailed, v1.ConditionTrue,
commonutil.NewReason(jobKind, commonutil.JobFailedReason), msg)`` with no completionTime;
pkg/controller.v1/common/job.go (backoff, deadline): ``if jobStatus.CompletionTime == nil {
jobStatus.CompletionTime = &now }`` then the same JobFailed condition.

argo-workflows v4.1.2 workflow/executor/resource.go ``matchConditions``: "for _, req := range
failReqs { failed := req.Matches(ls) ... if failed { // We return false here to not retry when
failure conditions met." then "if numMatched >= len(successReqs) { return false, nil }"
(tests/workloads/argo_selector.py evaluates the conditions the same way).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.workloads import argo_selector
from tests.workloads.test_gitops_manifests import PIPELINE
from workloads import pipeline

SEQUENCES = yaml.safe_load((Path(__file__).parent / "data" / "pytorchjob-statuses.yaml").read_text())["sequences"]
# The conditions the step had before this change (the review's finding F2).
OLD_FAILURE = "status.replicaStatuses.Master.failed > 0"
OLD_SUCCESS = "status.replicaStatuses.Master.succeeded > 0"


def _operator_verdict(status: dict) -> str:
    """What the operator says (pkg/util/status.go IsSucceeded/IsFailed: a condition of that type
    with status True)."""
    true_types = {c["type"] for c in status.get("conditions", []) if c["status"] == "True"}
    if "Failed" in true_types:
        return "failed"
    if "Succeeded" in true_types:
        return "succeeded"
    return "waiting"


def _step_conditions() -> tuple[str, str]:
    train = next(t for t in pipeline.workflow_template(PIPELINE)["spec"]["templates"] if t["name"] == "train")
    return train["resource"]["successCondition"], train["resource"]["failureCondition"]


@pytest.mark.parametrize("sequence", sorted(SEQUENCES))
def test_the_train_step_follows_the_jobs_terminal_conditions(sequence):
    success, failure = _step_conditions()
    seen = []
    for entry in SEQUENCES[sequence]:
        job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "status": entry["status"]}
        outcome = argo_selector.step_outcome(job, success=success, failure=failure)
        assert outcome == _operator_verdict(entry["status"]), entry["what"]
        seen.append(outcome)
        if outcome != "waiting":
            break  # the step is over: Argo stops polling
    assert seen[-1] != "waiting", "every recorded sequence ends in a terminal condition"


def test_a_preemption_fails_the_old_step_but_not_this_one():
    """The finding, reproduced: the old failure condition fired on the drained Master."""
    entries = SEQUENCES["preempted-twice-then-succeeds"]
    preempted = next(e for e in entries if "deletionTimestamp" in e["what"])
    job = {"status": preempted["status"]}
    assert argo_selector.step_outcome(job, success=OLD_SUCCESS, failure=OLD_FAILURE) == "failed"
    success, failure = _step_conditions()
    assert argo_selector.step_outcome(job, success=success, failure=failure) == "waiting"


def test_a_failed_condition_is_seen_at_every_position_it_can_take():
    """At most one condition per type (filterOutCondition), six types: Failed sits at 0-5."""
    success, failure = _step_conditions()
    others = [t for t in pipeline.JOB_CONDITION_TYPES if t != "Failed"]
    for position in range(len(pipeline.JOB_CONDITION_TYPES)):
        conditions = [{"type": t, "status": "True"} for t in others[:position]]
        conditions.append({"type": "Failed", "status": "True", "reason": "PyTorchJobFailed"})
        job = {"status": {"conditions": conditions, "replicaStatuses": {"Master": {"succeeded": 1}},
                          "completionTime": "2026-11-20T13:00:00Z"}}
        assert argo_selector.step_outcome(job, success=success, failure=failure) == "failed", position


def test_the_conditions_parse_as_argo_parses_them():
    """labels.Parse accepts them; a gjson query such as #(type==Failed) is refused by it."""
    success, failure = _step_conditions()
    assert len(argo_selector.parse(failure)) == len(pipeline.JOB_CONDITION_TYPES)
    assert len(argo_selector.parse(success)) == 2
    with pytest.raises(argo_selector.SelectorError):
        argo_selector.parse('status.conditions.#(type=="Failed").status == True')


def test_only_executor_errors_are_retried():
    """A failure condition is final (resource.go: "not to retry when failure conditions met"); a
    lost executor pod is an Error and re-attaches with ``apply``."""
    template = pipeline.workflow_template(PIPELINE)
    train = next(t for t in template["spec"]["templates"] if t["name"] == "train")
    assert train["retryStrategy"]["retryPolicy"] == "OnError"
    assert "expression" not in train["retryStrategy"]
    assert train["resource"]["action"] == "apply"
