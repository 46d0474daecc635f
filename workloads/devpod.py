"""An interactive GPU pod: one notebook server on a slice of a shared or MIG pool, with the team's
mounts, identity and image, admitted through the team's Kueue queue, gone after an idle timeout.

Pure: spec and platform facts in, Kubernetes objects out. The pod is a batch/v1 Job with the team's
queue label (Kueue's ``batch/job`` integration admits it against the team's quota, like the restore
drill), so it passes the same admission policies as a training pod: the team's uid, Pod Security
``restricted``, a GPU request only through an admitted job. Its placement, size, volumes and
identity are the training renderer's for a one-pod, one-slice job (``workloads.trainingjob``).

The notebook server (``trainer/devserver.py`` in the image) listens on 127.0.0.1 only: nothing in
the VPC reaches it; the way in is ``kubectl port-forward`` with the team's identity, which the API
server allows for pods named ``devpod-*`` only (workloads/tenancy.py, ``port-forward`` policy).
Two clocks end it: the server shuts itself down after ``idle`` without a kernel, terminal or
request (JupyterLab's ``ServerApp.shutdown_no_activity_timeout``; idle kernels are culled first,
``MappingKernelManager.cull_idle_timeout``), which ends the Job; and the Job's
``activeDeadlineSeconds`` bounds its life whatever happens inside.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from workloads.jobspec import FSX_MOUNT_PATH, JobSpec, k8s_literal, parse_job_spec
from workloads.kueue import QUEUE_LABEL
from workloads.platform_facts import PlatformFacts, PoolFacts
from workloads.problems import InvalidInputError, Problem
from workloads.tenancy import DEV_POD_PREFIX
from workloads.trainingjob import (ResolvedJob, container_security_context, node_selector, pod_security_context, resolve,
                                   resources, team_runtime_env, team_uid, tolerations, volume_mounts, volumes)

PREFIX = DEV_POD_PREFIX  # every dev pod's (and so its pod's) name; the port-forward policy admits only these
APP = "dev-pod"
CONTAINER = "notebook"
PORT = 8888
OWNER_LABEL = "mlplatform.io/dev-pod-owner"
TOKEN_KEY = "JUPYTER_TOKEN"  # jupyter_server reads its token from this variable (ServerApp.token's default)
MIN_IDLE_MINUTES, MAX_IDLE_MINUTES = 5, 24 * 60
MAX_HOURS = 72
_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?$")


class DevPodError(InvalidInputError):
    pass


def minutes(text: str) -> Optional[int]:
    """``90m``, ``2h``, ``1h30m`` -> minutes; None when it is not one."""
    match = _DURATION.match(text or "")
    if not match or not any(match.groups()):
        return None
    return int(match.group(1) or 0) * 60 + int(match.group(2) or 0)


@dataclass(frozen=True)
class DevPodSpec:
    """A dev pod. ``pool``: a shared or MIG pool (default: the first the team has quota on).
    ``idle``: the notebook stops after this long unused; ``max_life``: the most it may run."""

    name: str
    team: str
    image: str
    owner: str
    pool: Optional[str] = None
    idle: str = "1h"
    max_life: str = "8h"
    token_secret: str = ""


def shared_pools(facts: PlatformFacts, team: str) -> list[PoolFacts]:
    """The pools a dev pod may use: shared (time-slicing) or MIG, where the team has quota."""
    tenant = facts.team(team)
    quota = tenant.gpu_quota if tenant is not None else {}
    return [p for p in facts.pools if p.shared and quota.get(p.kueue_flavor or "", 0) > 0]


def problems(spec: DevPodSpec, facts: PlatformFacts) -> list[Problem]:
    out: list[Problem] = []
    idle, life = minutes(spec.idle), minutes(spec.max_life)
    if idle is None or not MIN_IDLE_MINUTES <= idle <= MAX_IDLE_MINUTES:
        out.append(Problem("--idle", spec.idle, f"is not a duration between {MIN_IDLE_MINUTES}m and {MAX_IDLE_MINUTES // 60}h",
                           "e.g. --idle 30m or --idle 2h"))
    if life is None or not 10 <= life <= MAX_HOURS * 60:
        out.append(Problem("--max", spec.max_life, f"is not a duration between 10m and {MAX_HOURS}h", "e.g. --max 8h"))
    elif idle is not None and idle > life:
        out.append(Problem("--idle", spec.idle, f"is longer than --max {spec.max_life}: the pod would stop first",
                           f"give --idle at most {spec.max_life}"))
    allowed = shared_pools(facts, spec.team)
    if spec.pool is not None and spec.pool not in [p.name for p in allowed]:
        pool = facts.pool(spec.pool)
        why = ("is not a pool of stack " + facts.stack if pool is None else
               "runs whole GPUs (a dev pod takes one slice of a shared or MIG pool)" if not pool.shared else
               f"gives team {spec.team} no quota")
        out.append(Problem("--pool", spec.pool, why, f"use one of {[p.name for p in allowed] or 'none: no shared pool has quota for the team'}"))
    elif spec.pool is None and not allowed and facts.team(spec.team) is not None:
        out.append(Problem("--pool", None, f"stack {facts.stack} has no shared or MIG pool with quota for team {spec.team}",
                           "ask the platform team for a slice quota (scheduling.teams[].gpuQuota on a shared pool)"))
    return out


def job_spec(spec: DevPodSpec, facts: PlatformFacts) -> JobSpec:
    """The one-pod, one-slice job the training renderer resolves (pool, queue, size, identity)."""
    pool = facts.pool(spec.pool) if spec.pool else shared_pools(facts, spec.team)[0]
    slice_resource = sorted(pool.slices_per_node)[0]
    raw: dict[str, Any] = {"name": "dev", "team": spec.team, "image": spec.image, "pool": pool.name,
                           "nodes": 1, "gpusPerNode": 1, "spot": False, "dataset": f"{FSX_MOUNT_PATH}/datasets",
                           "maxRuntime": spec.max_life, "command": ["python", "-m", "trainer.devserver"]}
    if slice_resource.startswith("nvidia.com/mig-"):
        raw["slice"] = slice_resource.removeprefix("nvidia.com/mig-")
    else:
        raw["shared"] = True
    if not set(pool.capacity_types) - {"spot"}:
        raw["spot"] = True  # a spot-only pool: the notebook may be interrupted
    return parse_job_spec(raw, source="dev pod")


def render(spec: DevPodSpec, facts: PlatformFacts) -> dict[str, Any]:
    """The dev pod's Job. Raises ``DevPodError`` with every problem of the spec."""
    found = problems(spec, facts)
    if found:
        raise DevPodError(f"dev pod {spec.name}", found)
    job: ResolvedJob = resolve(job_spec(spec, facts), facts)
    idle_s = (minutes(spec.idle) or 0) * 60
    labels = {"app.kubernetes.io/name": APP, "app.kubernetes.io/managed-by": "mlplatform", "mlplatform.io/team": spec.team,
              "mlplatform.io/pool": job.pool.name, OWNER_LABEL: spec.owner}
    env = [
        {"name": "DEVSERVER_PORT", "value": str(PORT)},
        {"name": "DEVSERVER_IDLE_SECONDS", "value": str(idle_s)},
        {"name": "DEVSERVER_ROOT", "value": k8s_literal(f"{FSX_MOUNT_PATH}/checkpoints/{job.spec.namespace}")},
        *[{"name": key, "valueFrom": {"secretKeyRef": {"name": job.team.tracking_secret or "", "key": key}}}
          for key in facts.tracking_secret_keys],
        {"name": "AWS_REGION", "value": facts.region},
        *team_runtime_env(job.spec.namespace),
    ]
    if spec.token_secret:
        env.append({"name": TOKEN_KEY, "valueFrom": {"secretKeyRef": {"name": spec.token_secret, "key": TOKEN_KEY}}})
    container = {
        "name": CONTAINER, "image": spec.image, "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-m", "trainer.devserver"], "env": env,
        "ports": [{"name": "notebook", "containerPort": PORT, "protocol": "TCP"}],
        "resources": resources(job), "volumeMounts": volume_mounts(job.spec.namespace),
        "securityContext": container_security_context(team_uid(job)),
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never", "priorityClassName": job.priority_class,
        "serviceAccountName": job.team.trainer_service_account, "nodeSelector": node_selector(job),
        "tolerations": tolerations(job), "securityContext": pod_security_context(team_uid(job)),
        "terminationGracePeriodSeconds": 30, "containers": [container], "volumes": volumes(job),
    }
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": spec.name, "namespace": job.spec.namespace,
                     "labels": {**labels, QUEUE_LABEL: job.team.local_queue or ""}},
        "spec": {
            # Kueue starts it once the team's quota admits it (it would suspend it itself anyway).
            "suspend": True, "backoffLimit": 0, "activeDeadlineSeconds": job.spec.max_runtime_seconds,
            "ttlSecondsAfterFinished": 3600,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def token_secret(name: str, namespace: str, token: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace,
                                                               "labels": {"app.kubernetes.io/name": APP}},
            "type": "Opaque", "stringData": {TOKEN_KEY: token}}
