"""The restore drill as a Job in the team's namespace: a team's checkpoint is only ever read with
that team's rights (audit security-4 N1).

`python -m trainer verify-checkpoint` unpickles DCP metadata and loads the checkpoint into a
model. Run on an operator's machine it ran whatever a team wrote into its own prefix with the
platform's credentials. Here it runs where the team's own jobs run: in the team's namespace, as
the team's uid, under the team's trainer service account (its Pod Identity role reads only the
team's prefix of the checkpoints bucket) and with the team's `checkpoint-signing` key mounted, so
the manifest's signature is verified with the key the team's trainer signed it with. Whatever the
checkpoint holds, it runs with no more than the team's own rights.

The client (`jobs.client.JobClient.verify_checkpoint_in_cluster`) applies it and reads the
verdict back from the pod: the exit code (0 PASS, 1 FAIL, 2 nothing to verify; trainer/verify.py)
and the termination message. `terminationMessagePolicy: FallbackToLogsOnError`: "use the last
chunk of container log output if the termination message file is empty and the container exited
with an error. The log output is limited to 2048 bytes or 80 lines, whichever is smaller"
(Kubernetes API reference, Container v1), which holds the drill's FAIL lines.

It is a batch Job in a team namespace, so Kueue admits it against the team's quota (the queue
label is required there: workloads/tenancy.py `queue-label-jobs`) and places it on a flavor of the
team's ClusterQueue; it asks for CPU and memory only. Pure function: spec in, manifest out.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from trainer.contract.environment import ENV_CHECKPOINT_KEY_FILE as KEY_FILE_ENV
from workloads.jobspec import k8s_literal
from workloads.karpenter import GENERAL_POOL, POOL_LABEL
from workloads.kueue import QUEUE_LABEL
from workloads.trainingjob import (CHECKPOINT_KEY_ITEM, CHECKPOINT_KEY_MOUNT, CHECKPOINT_KEY_SECRET,
                                   container_security_context, pod_security_context)

CONTAINER = "drill"
SCRATCH_MOUNT = "/scratch"
# trainer/verify.py's exit codes.
EXIT_PASS, EXIT_FAIL, EXIT_NOTHING = 0, 1, 2
MAX_NAME = 63  # a Job's name becomes the pods' `batch.kubernetes.io/job-name` label value
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"  # set by the Job controller on its pods (Kubernetes 1.27+)


@dataclass(frozen=True)
class DrillSpec:
    """One drill of one checkpoint step.

    job: the training job whose checkpoint it is; step: its step.
    team / namespace: the team and its namespace (the Job runs there, nowhere else).
    source: the step to verify, as the trainer reads it (s3://<bucket>/<namespace>/<job>/step-N/).
    image: the trainer image (the job's own: the code that would resume from it).
    service_account: the team's trainer service account (Pod Identity: the team's trainer role).
    uid: the team's uid/gid (the namespace's posix-id label; the admission policy refuses others).
    local_queue: the team's Kueue LocalQueue.
    region: the AWS region of the bucket.
    cpu / memory_gib: the drill's pod; memory holds one full training state per process
        (16 bytes/parameter) for the recorded world size plus one.
    scratch_gib: the emptyDir the step is downloaded into.
    timeout_seconds: per load (verify-checkpoint --timeout-s); the Job's deadline adds the
        download and the checks around it.
    ttl_seconds: how long the finished Job (and its verdict) stays.
    """

    job: str
    step: int
    team: str
    namespace: str
    source: str
    image: str
    service_account: str
    uid: int
    local_queue: str
    region: str
    cpu: int = 4
    memory_gib: int = 32
    scratch_gib: int = 100
    timeout_seconds: int = 1800
    ttl_seconds: int = 7 * 24 * 3600

    @property
    def name(self) -> str:
        suffix = f"-{self.step}"
        base = f"verify-{self.job}"[: MAX_NAME - len(suffix)].rstrip("-")
        return base + suffix

    def problems(self) -> list[str]:
        """Every field that cannot make a valid Job, each with its value and the fix."""
        out = []
        for field in ("job", "team", "namespace", "image", "service_account", "local_queue", "region", "source"):
            if not getattr(self, field):
                out.append(f"{field}: empty; the team's facts or the job name it (stack facts: teams[{self.team!r}])")
        if self.job and not _NAME.match(self.job):
            out.append(f"job: {self.job!r} is not a Kubernetes name (lowercase letters, digits, '-')")
        if not self.namespace.startswith("team-"):
            out.append(f"namespace: {self.namespace!r}: the drill runs only in a team namespace (team-<name>)")
        if self.step < 0:
            out.append(f"step: {self.step} is negative")
        if self.source and not self.source.startswith("s3://"):
            out.append(f"source: {self.source!r}: give the step's s3:// URI in the team's prefix")
        elif self.source and f"/{self.namespace}/" not in self.source:
            out.append(f"source: {self.source!r} is not in the prefix of {self.namespace}: the team's role reads "
                       "only its own prefix")
        if self.uid < 1:
            out.append(f"uid: {self.uid}; the team's uid/gid (its namespace's posix-id label) is needed, and the stack's "
                       "facts do not record it (facts from an older plan): refresh them")
        for field in ("cpu", "memory_gib", "scratch_gib", "timeout_seconds"):
            if getattr(self, field) < 1:
                out.append(f"{field}: {getattr(self, field)}; must be at least 1")
        return out


class DrillSpecError(ValueError):
    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("checkpoint drill: " + "; ".join(problems))


def labels(spec: DrillSpec) -> dict[str, str]:
    return {"app.kubernetes.io/name": "checkpoint-drill", "app.kubernetes.io/managed-by": "mlplatform",
            "mlplatform.io/job": spec.job, "mlplatform.io/team": spec.team}


def render_drill(spec: DrillSpec) -> dict[str, Any]:
    problems = spec.problems()
    if problems:
        raise DrillSpecError(problems)
    amounts = {"cpu": str(spec.cpu), "memory": f"{spec.memory_gib}Gi"}
    container = {
        "name": CONTAINER,
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        # tini reaps the drill's worker processes (one per recorded rank) and forwards signals.
        "command": ["/usr/bin/tini", "--", "python", "-m", "trainer", "verify-checkpoint"],
        "args": [k8s_literal(spec.source), "--scratch", f"{SCRATCH_MOUNT}/checkpoint",
                 "--timeout-s", str(spec.timeout_seconds)],
        "env": [
            {"name": KEY_FILE_ENV, "value": f"{CHECKPOINT_KEY_MOUNT}/{CHECKPOINT_KEY_ITEM}"},
            {"name": "AWS_REGION", "value": spec.region},
            {"name": "AWS_DEFAULT_REGION", "value": spec.region},
            # The team's uid has no passwd entry in the image (workloads.trainingjob.team_runtime_env).
            {"name": "HOME", "value": "/tmp"},
            {"name": "USER", "value": "trainer"},
        ],
        # requests == limits: the namespace's LimitRange adds nothing, and Kueue counts exactly this.
        "resources": {"requests": dict(amounts), "limits": dict(amounts)},
        "volumeMounts": [{"name": "checkpoint-key", "mountPath": CHECKPOINT_KEY_MOUNT, "readOnly": True},
                         {"name": "scratch", "mountPath": SCRATCH_MOUNT}],
        "securityContext": container_security_context(spec.uid),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec = {
        "restartPolicy": "Never",
        # The general CPU pool: Kueue then admits the drill only to the CPU flavor (a flavor whose
        # node labels name another pool does not match, kueue flavorassigner.go
        # checkFlavorForPodSets), never to a GPU flavor, whose pool selector and GPU toleration
        # the gpu-less-pods policy refuses: the pod would never be created.
        "nodeSelector": {POOL_LABEL: GENERAL_POOL},
        "serviceAccountName": spec.service_account,
        "securityContext": pod_security_context(spec.uid),
        "containers": [container],
        "volumes": [
            {"name": "checkpoint-key", "secret": {"secretName": CHECKPOINT_KEY_SECRET,
                                                  "items": [{"key": CHECKPOINT_KEY_ITEM, "path": CHECKPOINT_KEY_ITEM}]}},
            {"name": "scratch", "emptyDir": {"sizeLimit": f"{spec.scratch_gib}Gi"}},
        ],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": spec.name, "namespace": spec.namespace,
                     "labels": {QUEUE_LABEL: spec.local_queue, **labels(spec)}},
        "spec": {
            # One verdict per drill: a failed pod is the verdict, not something to retry.
            "backoffLimit": 0,
            # Two loads (the recorded world size and one process) plus the download and checks.
            "activeDeadlineSeconds": 3 * spec.timeout_seconds,
            "ttlSecondsAfterFinished": spec.ttl_seconds,
            "template": {"metadata": {"labels": labels(spec)}, "spec": pod_spec},
        },
    }


def verdict_from_pod(pod: Mapping[str, Any], image: Optional[str] = None) -> Optional[tuple[str, str]]:
    """("PASS" | "FAIL", detail) once the drill's container has terminated, else None.
    ``image``: the drill's image; a pod whose container ran another (a pod's image may be
    changed by an update, and the team may update its pods) is a FAIL, never a PASS."""
    containers = {c.get("name"): c for c in (pod.get("spec") or {}).get("containers") or []}
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") != CONTAINER:
            continue
        terminated = (status.get("state") or {}).get("terminated")
        if not terminated:
            return None
        ran = (containers.get(CONTAINER) or {}).get("image")
        if image is not None and ran != image:
            return "FAIL", f"the drill's pod ran image {ran!r}, not the drill's {image!r}: it was changed after the drill was made"
        code = terminated.get("exitCode")
        message = (terminated.get("message") or "").strip()
        if code == EXIT_PASS:
            return "PASS", message or "VERDICT: PASS"
        meaning = {EXIT_FAIL: "the checkpoint would not restore", EXIT_NOTHING: "nothing to verify at the source"}
        detail = f"exit code {code} ({meaning.get(code, 'the drill did not finish')})"
        return "FAIL", f"{detail}\n{message}" if message else detail
    return None
