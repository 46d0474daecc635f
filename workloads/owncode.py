"""Your own training code in the rendered pod: what torchrun runs, and where the code comes from.

The platform keeps everything around the user's entry point (workloads/trainingjob.py): the
launcher (``python -m trainer.launch``: torchrun, its static rendezvous from the operator's
``PET_*`` variables, the shutdown timeout of the time budget, the exit-code contract), the
environment (MLflow, FSx paths, NCCL/EFA), the mounts and the resources. The spec decides only
what torchrun starts on every rank: ``script`` + ``args`` or ``command``.

Where the code comes from:

- the image (default): build FROM the platform's trainer image and copy the code under /app,
  its WORKDIR (docs/trainer.md, "Your own code");
- a pinned archive (``code: {uri, sha256}``, written by ``submit --code DIR``): a tar.gz in
  the team's prefix of the checkpoints bucket, which the team's trainer role may read
  (components/training.py, checkpoint_prefix_policy). The launcher downloads it into an
  emptyDir, refuses it unless its SHA-256 is the pinned one (exit 2, permanent) and runs
  torchrun there. It is done by the launcher, not an init container: a failed init container
  leaves the ``pytorch`` container without a terminated state, which the Training Operator
  reads as the retryable code 0xbeef (kubeflow/trainer@v1.9.4 pkg/controller.v1/common/pod.go:340),
  so a tampered archive would be retried until the job's deadline.

A ``requirements.txt`` in the archive is installed by the launcher too, for the same reason, into a
virtual environment under ``MLP_VENV_ROOT`` (the team's shared subtree, ``.venvs/``) that the job's
pods and restarts share (trainer/requirements_env.py); jobs/usercode.py checks the file at preflight.
"""
from __future__ import annotations

from typing import Any, Optional

from trainer.contract.environment import ENV_CODE_DIR, ENV_CODE_SHA256, ENV_CODE_URI, ENV_DATASET_DIR, ENV_VENV_ROOT
from workloads.fsx import team_subtree_path
from workloads.jobspec import JobSpec, k8s_literal
from workloads.problems import Problem

# The emptyDir the archive is unpacked into (per pod, gone with it).
CODE_VOLUME = "code"
CODE_MOUNT = "/opt/mlplatform/code"
CODE_SIZE_LIMIT = "2Gi"
# Under the team's shared file system, the launcher's requirements.txt environments
# (trainer/requirements_env.py), a directory per key: every pod and restart reuses one.
VENV_DIR = ".venvs"


def code_prefix(namespace: str, job_name: str) -> str:
    """Key prefix of a job's archives in the checkpoints bucket: inside the team's own prefix."""
    return f"{namespace}/code/{job_name}/"


def code_key(namespace: str, job_name: str, sha256: str) -> str:
    # Content-addressed: a new upload never replaces the archive a running job is pinned to.
    return f"{code_prefix(namespace, job_name)}{sha256}.tar.gz"


def torchrun_target(spec: JobSpec) -> list[str]:
    """What follows torchrun's own options: the script and its arguments, a module, or (with
    ``--no-python``) an executable. Every string is passed literally (no ``$(VAR)`` expansion)."""
    if spec.script is not None:
        return [k8s_literal(a) for a in (spec.script, *spec.args)]
    command = list(spec.command or ())
    if command[0] in ("python", "python3"):
        return [k8s_literal(a) for a in command[1:]]
    return ["--no-python", *(k8s_literal(a) for a in command)]


def env(spec: JobSpec) -> list[dict[str, Any]]:
    out = [{"name": ENV_DATASET_DIR, "value": k8s_literal(spec.dataset)}]
    if spec.code is not None:
        out += [{"name": ENV_CODE_URI, "value": spec.code.uri}, {"name": ENV_CODE_SHA256, "value": spec.code.sha256},
                {"name": ENV_CODE_DIR, "value": CODE_MOUNT}, {"name": ENV_VENV_ROOT, "value": venv_root(spec.namespace)}]
    return out


def venv_root(namespace: str) -> str:
    return f"{team_subtree_path(namespace)}/{VENV_DIR}"


def volume(spec: JobSpec) -> Optional[dict[str, Any]]:
    if spec.code is None:
        return None
    return {"name": CODE_VOLUME, "emptyDir": {"sizeLimit": CODE_SIZE_LIMIT}}


def volume_mount(spec: JobSpec) -> Optional[dict[str, Any]]:
    return None if spec.code is None else {"name": CODE_VOLUME, "mountPath": CODE_MOUNT}


def problems(spec: JobSpec, *, checkpoints_bucket: Optional[str], stack: str) -> list[Problem]:
    """The archive must be in the team's own prefix: the only one its trainer role can read."""
    if spec.code is None:
        return []
    if not checkpoints_bucket:
        return [Problem("code.uri", spec.code.uri, f"stack {stack} has no checkpoints bucket to hold code archives",
                        "ship the code in the image (build FROM the trainer image), or configure datasets")]
    prefix = f"s3://{checkpoints_bucket}/{code_prefix(spec.namespace, spec.name)}"
    if not spec.code.uri.startswith(prefix):
        return [Problem("code.uri", spec.code.uri, "is outside the job's code prefix in the team's space",
                        f"use submit --code DIR, which uploads to {prefix}<sha256>.tar.gz")]
    return []
