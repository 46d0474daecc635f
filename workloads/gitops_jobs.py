"""What changes about a training job when Git owns it (Argo CD applies ``workloads/rendered``).

A job submitted with ``python -m workloads submit`` runs once; a job declared in Git is whatever
Argo CD keeps in the cluster. Two upstream behaviours make those differ:

- **TTL.** The Training Operator deletes a finished job after ``ttlSecondsAfterFinished``
  (v1.9.4 pkg/controller.v1/common/job.go ``CleanupJob``: "if currentTime.After(expireTime) {
  err := jc.Controller.DeleteJob(job)"). The object is still in Git, so Argo CD finds it missing
  and creates it again (automated sync with self-heal at once, a manual sync later): the job
  resumes from its final checkpoint and exports and registers again. A Git-owned job carries no
  TTL: it stays, finished, until its declaration is deleted from Git and Argo CD prunes it.
- **Immutable TrainJob fields.** ``spec.trainer``, ``runtimeRef``, ``activeDeadlineSeconds`` and
  most of ``runtimePatches`` are immutable (``self == oldSelf`` in the Trainer v2.3 CRD), so
  an edited TrainJob cannot be patched in place. Its name carries a hash of its spec: an edit in
  Git is a new TrainJob, and the old one is pruned in the same sync (the child Applications do
  not prune last, which would keep the old job running until the new one has finished). Both
  use the job spec's checkpoint directory, so the new job resumes from the old one's last
  complete checkpoint.

A PyTorchJob is mutable and keeps its name: an edit applies in place (the operator uses the new
pod template for pods it creates from then on).
"""
from __future__ import annotations

import copy
import hashlib
import json
from typing import Any, Mapping

SPEC_HASH_ANNOTATION = "mlplatform.io/spec-hash"
JOB_NAME_LABEL = "mlplatform.io/job"
SPEC_HASH_CHARS = 8


def spec_hash(manifest: Mapping[str, Any]) -> str:
    """A short, stable hash of what an edit in Git changes (the spec and the labels)."""
    content = {"spec": manifest.get("spec"), "labels": manifest.get("metadata", {}).get("labels")}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:SPEC_HASH_CHARS]


def git_owned(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The rendered job as Argo CD should own it (see the module docstring)."""
    job = copy.deepcopy(dict(manifest))
    kind = job.get("kind")
    if kind == "PyTorchJob":
        job["spec"].get("runPolicy", {}).pop("ttlSecondsAfterFinished", None)
    elif kind == "TrainJob":
        name = job["metadata"]["name"]
        digest = spec_hash(job)
        job["metadata"] = {
            **job["metadata"],
            "name": f"{name}-{digest}",
            "labels": {**job["metadata"].get("labels", {}), JOB_NAME_LABEL: name},
            "annotations": {**job["metadata"].get("annotations", {}), SPEC_HASH_ANNOTATION: digest},
        }
    return job
