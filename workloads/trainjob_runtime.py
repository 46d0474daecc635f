"""The platform's ClusterTrainingRuntime for TrainJobs: torch-distributed with a failure policy.

The chart's ``torch-distributed`` runtime has no ``failurePolicy``; JobSet then restarts on any
failure and its child Job keeps the batch defaults (pod ``restartPolicy: OnFailure`` from the
JobSet webhook, ``backoffLimit: 6``): a permanent error is retried in place six times, and a
seventh preemption of one node fails the whole TrainJob. A TrainJob cannot fix that itself:
``runtimePatches`` reach only the pod template of a replicated job (Trainer v2.3 CRD:
``replicatedJobs[].template.spec`` has ``template`` alone), so the policy lives in the runtime.

The platform's exit-code contract (the same as PyTorchJob's ``restartPolicy: ExitCode``):
- a pod disrupted by the cluster (spot interruption or drain through the eviction API, Kueue or
  scheduler preemption, a lost node: the pod's ``DisruptionTarget`` condition) is replaced and
  not counted (Job ``podFailurePolicy`` action ``Ignore``);
- exit codes 1-127 of the trainer container are permanent (bad input, a bug): the Job fails with
  reason ``PodFailurePolicy`` and the JobSet rule fails the whole TrainJob at once;
- any other failure (128-255: killed by a signal, OOM) fails the child Job (``backoffLimit: 0``)
  and JobSet recreates every node from the last checkpoint, at most ``max_restarts`` times.

Upstream: Kubernetes batch/v1 Job ``podFailurePolicy`` (needs pod ``restartPolicy: Never``) and
the failure reasons ``PodFailurePolicy`` / ``BackoffLimitExceeded``; JobSet ``failurePolicy``
(rules matched in order on the child Job's failure reason, "If no matching rule is found, the
RestartJobSet action is applied", restarts bounded by ``maxRestarts``), both in the Trainer
v2.3.0 ClusterTrainingRuntime CRD.
"""
from __future__ import annotations

from typing import Any

RUNTIME_NAME = "mlplatform-torch-distributed"
CONTAINER = "node"  # the replicated job and its container, as in the chart's torch-distributed runtime
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
PERMANENT_EXIT_CODES = tuple(range(1, 128))
# JobSet restarts for retryable failures (the job spec's default backoffLimit; a TrainJob cannot
# change it, runtimePatches do not reach failurePolicy).
DEFAULT_MAX_RESTARTS = 20
TRAINER_UID = 1000


def cluster_training_runtime(*, max_restarts: int = DEFAULT_MAX_RESTARTS) -> dict[str, Any]:
    security = {"runAsNonRoot": True, "runAsUser": TRAINER_UID, "seccompProfile": {"type": "RuntimeDefault"}}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": RUNTIME_NAME, "labels": {"trainer.kubeflow.org/framework": "torch",
                                                      "app.kubernetes.io/managed-by": "pulumi"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {"spec": {
                "failurePolicy": {
                    "maxRestarts": max_restarts,
                    "restartStrategy": "Recreate",
                    "rules": [{"name": "PermanentExit", "action": "FailJobSet",
                               "onJobFailureReasons": ["PodFailurePolicy"]}],
                },
                "replicatedJobs": [{
                    "name": CONTAINER,
                    "template": {
                        "metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
                        "spec": {
                            "backoffLimit": 0,
                            "podFailurePolicy": {"rules": [
                                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                                {"action": "FailJob", "onExitCodes": {"containerName": CONTAINER, "operator": "In",
                                                                      "values": list(PERMANENT_EXIT_CODES)}},
                            ]},
                            "template": {"spec": {
                                # podFailurePolicy needs Never (JobSet would default OnFailure).
                                "restartPolicy": "Never",
                                "securityContext": dict(security),
                                # No image: every TrainJob sets spec.trainer.image.
                                "containers": [{"name": CONTAINER, "workingDir": "/tmp", "securityContext": {
                                    **security, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}],
                            }},
                        },
                    },
                }],
            }},
        },
    }
