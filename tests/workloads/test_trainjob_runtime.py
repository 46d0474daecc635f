"""The platform's ClusterTrainingRuntime: TrainJob retries follow the platform's exit-code contract.

Upstream rules the simulation below follows:

- Kubernetes batch/v1 Job, podFailurePolicy (API reference, PodFailurePolicyRule.action):
  "FailJob: indicates that the pod's job is marked as Failed and all running pods are
  terminated." / "Ignore: indicates that the counter towards the .backoffLimit is not
  incremented and a replacement pod is created." / "Count: indicates that the pod is handled in
  the default way - the counter towards the .backoffLimit is incremented." / "The rules are
  evaluated in order. Once a rule matches a Pod failure, the remaining of the rules are
  ignored. When no rule matches the Pod failure, the default handling applies". The Job's
  failure reason is ``PodFailurePolicy`` for FailJob and ``BackoffLimitExceeded`` when the
  counter passes backoffLimit. "This field cannot be used in combination with
  restartPolicy=OnFailure."
- JobSet failurePolicy (Trainer v2.3.0 ClusterTrainingRuntime CRD): "For a given Job failure,
  the rules will be evaluated in order, and only the first matching rule will be executed. If no
  matching rule is found, the RestartJobSet action is applied." / onJobFailureReasons: "The
  requirement is satisfied if at least one reason matches the list." / maxRestarts: "the limit
  on the number of JobSet restarts".
- The finding (jobset@v0.12.0 pkg/webhooks/jobset_webhook.go:124-127): without a policy the pod
  restartPolicy defaults to OnFailure and the child Job keeps ``backoffLimit: 6``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pytest

from workloads import trainjob_runtime
from workloads.trainingjob import TORCH_DISTRIBUTED_RUNTIME, TRAINJOB_CONTAINER
from tests.support.validation import validate_custom_resource, validate_pod_template


@dataclass(frozen=True)
class PodFailure:
    exit_code: int
    disrupted: bool = False  # the pod has condition DisruptionTarget=True
    container: str = "node"


def _rule_matches(rule: dict, failure: PodFailure) -> bool:
    if "onExitCodes" in rule:
        codes = rule["onExitCodes"]
        if codes.get("containerName") not in (None, failure.container):
            return False
        inside = failure.exit_code in codes["values"]
        return inside if codes["operator"] == "In" else not inside
    return any(c["type"] == "DisruptionTarget" and c.get("status", "True") == "True" and failure.disrupted
               for c in rule["onPodConditions"])


def run(runtime: dict, failures: list[PodFailure]) -> tuple[str, int]:
    """('failed'|'running', JobSet restarts) after these pod failures, one after another."""
    spec = runtime["spec"]["template"]["spec"]
    job = spec["replicatedJobs"][0]["template"]["spec"]
    policy = spec.get("failurePolicy", {})
    backoff_limit = job.get("backoffLimit", 6)
    counted, restarts = 0, 0
    for failure in failures:
        reason: Optional[str] = None
        action = "Count"
        for rule in job.get("podFailurePolicy", {}).get("rules", []):
            if _rule_matches(rule, failure):
                action = rule["action"]
                break
        if action == "FailJob":
            reason = "PodFailurePolicy"
        elif action == "Count":
            counted += 1
            if counted > backoff_limit:
                reason = "BackoffLimitExceeded"
        if reason is None:
            continue  # replaced in place
        jobset_action = "RestartJobSet"
        for rule in policy.get("rules", []):
            if not rule.get("onJobFailureReasons") or reason in rule["onJobFailureReasons"]:
                jobset_action = rule["action"]
                break
        if jobset_action == "FailJobSet" or restarts >= policy.get("maxRestarts", 0):
            return "failed", restarts
        restarts += 1
        counted = 0  # Recreate: new child Jobs
    return "running", restarts


RUNTIME = trainjob_runtime.cluster_training_runtime()


def test_runtime_is_valid_for_the_pinned_crd(schemas):
    assert validate_custom_resource(RUNTIME, schemas) == []
    pod = RUNTIME["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    # podFailurePolicy "cannot be used in combination with restartPolicy=OnFailure".
    assert pod["spec"]["restartPolicy"] == "Never"
    container = {**pod["spec"]["containers"][0], "image": "example.com/trainer@sha256:" + "0" * 64}
    assert validate_pod_template({"spec": {**pod["spec"], "containers": [container]}}) == []


def test_trainjobs_reference_it_and_its_container():
    assert TORCH_DISTRIBUTED_RUNTIME == trainjob_runtime.RUNTIME_NAME
    replicated = RUNTIME["spec"]["template"]["spec"]["replicatedJobs"][0]
    assert replicated["name"] == TRAINJOB_CONTAINER
    assert replicated["template"]["spec"]["template"]["spec"]["containers"][0]["name"] == TRAINJOB_CONTAINER
    # The torch plugin finds the trainer by this label (the chart's runtime carries it too).
    assert replicated["template"]["metadata"]["labels"][trainjob_runtime.ANCESTOR_LABEL] == "trainer"


def test_preemptions_never_fail_the_trainjob():
    assert run(RUNTIME, [PodFailure(143, disrupted=True)] * 50) == ("running", 0)


@pytest.mark.parametrize("code", [1, 2, 127])
def test_a_permanent_exit_fails_at_once(code):
    assert run(RUNTIME, [PodFailure(code)]) == ("failed", 0)


def test_retryable_exits_restart_every_node_up_to_the_budget():
    budget = trainjob_runtime.DEFAULT_MAX_RESTARTS
    assert run(RUNTIME, [PodFailure(137)] * budget) == ("running", budget)
    assert run(RUNTIME, [PodFailure(137)] * (budget + 1)) == ("failed", budget)


def test_the_chart_runtime_retried_a_permanent_error_and_failed_on_a_seventh_preemption():
    """The finding, reproduced with the upstream defaults (no failurePolicy, backoffLimit 6)."""
    chart = {"spec": {"template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {}}}]}}}}
    assert run(chart, [PodFailure(1)] * 6) == ("running", 0)  # a bug, retried six times
    assert run(chart, [PodFailure(143, disrupted=True)] * 7) == ("failed", 0)
