"""The run records' manifests: the ``RunRecord`` CRD, the recorder's namespace, identity and
Deployment. Pure functions: spec in, Kubernetes objects out (the recorder itself is
``workloads/run_recorder.py``, mounted from the ConfigMap).

Who may do what:
- the recorder's ServiceAccount (ClusterRole): read pods, nodes, PyTorchJobs and TrainJobs
  everywhere (list/watch; get for nodes and jobs), and write RunRecords. Nothing else: no pod,
  job or node writes, no Secrets, no logs;
- a team (``workloads.tenancy.TEAM_RULES``): get/list/watch RunRecords in its own namespace. The
  team writes no record, so its history is the platform's account of what ran, not the team's;
- the records carry no ownerReference: deleting a job (cancel, ``--replace``, its
  ``ttlSecondsAfterFinished``, kubectl, an Argo CD prune) never takes its record with it; the
  recorder deletes a record ``retention_days`` after its run ended (``training.runRecordRetentionDays``).

The recorder runs in the platform's agent image (docker/node-health: python3, standard library),
on the system nodes, as a non-root user with a read-only root file system, one replica with the
Recreate strategy (one writer at a time).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from catalog.prices import PRICES, SPOT_DISCOUNT
from trainer.contract.environment import ENV_CHECKPOINT_DIR
from workloads import run_recorder
from workloads.placement import system_pod_placement
from workloads.scan_skips import skip_annotations
from workloads.system_namespaces import PodSecurityLevel, SystemNamespaceSpec
from workloads.trainingjob import CONTAINER_NAME, TRAINJOB_CONTAINER

NAMESPACE = "mlplatform-system"
NAME = "run-recorder"
AGENT_FILE, PRICES_FILE = "run_recorder.py", "prices.json"
MOUNT_PATH = "/opt/mlplatform"
LABELS = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": "ml-training-platform"}
CRD_NAME = f"{run_recorder.PLURAL}.{run_recorder.GROUP}"
RESOURCE = CRD_NAME  # the kubectl resource name the job client reads
DEFAULT_RETENTION_DAYS = 90
# A non-root uid with no passwd entry in the image (the "nobody" of Debian and Ubuntu).
RUN_AS_UID = 65534


def namespace_spec(vpc_cidr: str, service_cidr: str) -> SystemNamespaceSpec:
    """Restricted; egress to DNS and the API server only (the namespace's default policies)."""
    return SystemNamespaceSpec(name=NAMESPACE, pod_security=PodSecurityLevel.RESTRICTED, vpc_cidr=vpc_cidr,
                               service_cidr=service_cidr)


def _string(nullable: bool = False) -> dict[str, Any]:
    return {"type": "string", **({"nullable": True} if nullable else {})}


def _integer(nullable: bool = False, minimum: int = 0) -> dict[str, Any]:
    return {"type": "integer", "minimum": minimum, **({"nullable": True} if nullable else {})}


ATTEMPT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["rank", "pod", "podUid", "reason"],
    "properties": {
        "rank": _integer(), "pod": _string(), "podUid": _string(), "node": _string(True),
        "instanceType": _string(True), "capacityType": _string(True), "gpus": _integer(), "nodeGpus": _integer(),
        "usdPerHour": {"type": "number", "minimum": 0, "nullable": True},
        "startedAt": {**_string(True), "format": "date-time"}, "endedAt": {**_string(True), "format": "date-time"},
        "exitCode": _integer(True, minimum=-2147483648),
        "reason": {"type": "string", "enum": [run_recorder.DONE, run_recorder.PREEMPTION, run_recorder.FAILURE,
                                              run_recorder.CANCEL, run_recorder.KILLED, run_recorder.LOST,
                                              run_recorder.RUNNING, run_recorder.PENDING]},
        "message": _string(),
    },
}

SPEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["job", "phase", "outcome", "attempts"],
    "properties": {
        "job": {"type": "object", "required": ["name", "kind", "uid", "team"], "properties": {
            "name": _string(), "kind": {"type": "string", "enum": [kind for _, kind in run_recorder.JOB_KINDS]},
            "uid": _string(), "team": _string(), "created": _string(True), "pool": _string(True),
            "nodes": _integer(minimum=1), "gpusPerNode": _integer(minimum=1), "checkpointDir": _string(True)}},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "phase": _string(),
        "outcome": {"type": "string", "enum": ["", "Succeeded", "Failed", "Cancelled", "Replaced", "Deleted"]},
        "endedAt": _string(True), "removedAt": _string(True), "cancelledAt": _string(True), "replacedAt": _string(True),
        "updatedAt": _string(True),
        "attempts": {"type": "array", "maxItems": run_recorder.MAX_ATTEMPTS, "items": ATTEMPT_SCHEMA},
        "droppedAttempts": _integer(),
    },
}


def crd() -> dict[str, Any]:
    """RunRecord, namespaced (a team's records live in the team's namespace)."""
    columns = [
        {"name": "Job", "type": "string", "jsonPath": ".spec.job.name"},
        {"name": "Phase", "type": "string", "jsonPath": ".spec.phase"},
        {"name": "Outcome", "type": "string", "jsonPath": ".spec.outcome"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": dict(LABELS)},
        "spec": {
            "group": run_recorder.GROUP, "scope": "Namespaced",
            "names": {"plural": run_recorder.PLURAL, "singular": "runrecord", "kind": run_recorder.KIND,
                      "listKind": f"{run_recorder.KIND}List", "categories": ["mlplatform"]},
            "versions": [{"name": run_recorder.VERSION, "served": True, "storage": True, "additionalPrinterColumns": columns,
                          "schema": {"openAPIV3Schema": {"type": "object", "required": ["spec"], "properties": {
                              "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                              "metadata": {"type": "object"}, "spec": SPEC_SCHEMA}}}}],
        },
    }


def _meta(name: str, namespace: str | None = NAMESPACE) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(LABELS)}
    if namespace:
        meta["namespace"] = namespace
    return meta


def cluster_role_rules() -> list[dict[str, Any]]:
    return [
        # Which pods ran where, and how they ended: list/watch only (no get, no logs, no writes).
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
        # The instance and capacity type of each pod's node (a team role cannot read nodes).
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
        {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [run_recorder.GROUP], "resources": [run_recorder.PLURAL],
         "verbs": ["get", "list", "watch", "create", "update", "delete"]},
    ]


def rbac_objects() -> list[dict[str, Any]]:
    subject = [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(NAME)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": _meta(NAME, None),
         "rules": cluster_role_rules()},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": _meta(NAME, None),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME}, "subjects": subject},
    ]


def prices_table() -> dict[str, dict[str, float]]:
    """USD per instance-hour, on demand and at the spot assumption, from the one price table
    (catalog/prices.py). Reserved capacity is billed at the on-demand rate, used or not."""
    return {name: {"onDemand": price.on_demand_usd_per_hour, "spot": price.spot_usd_per_hour}
            for name, price in sorted(PRICES.items())}


def config_map() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(NAME), "data": {
        AGENT_FILE: Path(run_recorder.__file__).read_text(encoding="utf-8"),
        PRICES_FILE: json.dumps({"spotDiscount": SPOT_DISCOUNT, **prices_table()}, indent=1, sort_keys=True) + "\n",
    }}


RECORDER_CHECKOV_SKIPS = (
    ("CKV_K8S_8", "a controller with no server: its liveness is its process (restartPolicy Always)"),
    ("CKV_K8S_9", "no Service routes to it: readiness gates nothing"),
    ("CKV_K8S_38", "the recorder watches pods and jobs and writes RunRecords with its service account token"),
    ("CKV_K8S_43", "the platform's agent image: dev names an immutable ECR tag; prod's config refuses anything but a "
                   "digest (gpuEnablement.nodeHealthImage)"),
)


def command(retention_days: int) -> list[str]:
    return ["python3", f"{MOUNT_PATH}/{AGENT_FILE}", "--prices", f"{MOUNT_PATH}/{PRICES_FILE}",
            "--containers", ",".join((CONTAINER_NAME, TRAINJOB_CONTAINER)), "--checkpoint-env", ENV_CHECKPOINT_DIR,
            "--retention-days", str(retention_days)]


def deployment(*, image: str, retention_days: int) -> dict[str, Any]:
    skips = skip_annotations(RECORDER_CHECKOV_SKIPS)
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {**_meta(NAME), "annotations": skips},
        "spec": {
            "replicas": 1,
            # One writer: the old pod is gone before the new one starts.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
            "template": {
                "metadata": {"labels": dict(LABELS), "annotations": dict(skips)},
                "spec": {
                    "serviceAccountName": NAME,
                    **system_pod_placement(),
                    "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS_UID, "runAsGroup": RUN_AS_UID,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "terminationGracePeriodSeconds": 10,
                    "containers": [{
                        "name": "recorder", "image": image, "imagePullPolicy": "Always",
                        "command": command(retention_days),
                        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}, {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
                        "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}},
                        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}},
                        "volumeMounts": [{"name": "recorder", "mountPath": MOUNT_PATH, "readOnly": True}],
                    }],
                    "volumes": [{"name": "recorder", "configMap": {"name": NAME}}],
                },
            },
        },
    }


def run_record_objects(*, image: str, retention_days: int) -> list[dict[str, Any]]:
    """The CRD first, then the recorder's identity, code and Deployment (its namespace comes from
    ``namespace_spec`` through ``system_namespaces.namespace_objects``)."""
    return [crd(), *rbac_objects(), config_map(), deployment(image=image, retention_days=retention_days)]

