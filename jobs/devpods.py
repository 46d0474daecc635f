"""Interactive GPU pods and the way to the platform's web endpoints, for a team member.

``DevPods.start`` renders the dev pod (workloads/devpod.py: a one-slice Job in the team's Kueue
queue), creates it and its login token's Secret (owned by the Job, so both go together), then waits
for Kueue: admitted, it returns the pod to port-forward to; not admitted within ``wait_seconds``
(the team's quota and what it may borrow are in use), it deletes the Job and raises ``DevPodRefused``
with Kueue's reason. An interactive pod that waits in a queue for hours helps nobody.

``endpoints`` says where the team's MLflow is, where its login lives, and where the dashboards are.
"""
from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Any, Optional

from jobs.kube import NoClusterAccess, PODS, SECRETS, WORKLOADS, JOBS, KubeError
from jobs.records import KUEUE_JOB_UID, admission_from
from workloads import devpod
from workloads.scheduling import team_namespace


class DevPodRefused(RuntimeError):
    """Kueue did not admit the dev pod in time (quota in use): it was deleted again."""


@dataclass(frozen=True)
class DevPod:
    name: str  # the Job's
    namespace: str
    team: str
    pool: str
    owner: str
    admitted: bool
    reason: str  # Kueue's words
    pod: Optional[str] = None  # the pod to port-forward to, once it exists
    phase: str = ""
    token: str = ""  # the notebook's login (only when this client started it)

    def url(self, local_port: int = devpod.PORT) -> str:
        return f"http://127.0.0.1:{local_port}/lab" + (f"?token={self.token}" if self.token else "")

    def forward_command(self, local_port: int = devpod.PORT) -> list[str]:
        return ["kubectl", "-n", self.namespace, "port-forward", f"pod/{self.pod or self.name}",
                f"{local_port}:{devpod.PORT}"]


def owner_slug(username: str) -> str:
    """A short DNS-safe name of the caller: alice@team-research -> alice; an assumed-role
    session arn:aws:sts::1:assumed-role/role/alice -> alice."""
    user = username.rsplit("/", 1)[-1].split("@", 1)[0].lower()
    slug = re.sub(r"[^a-z0-9]+", "-", user).strip("-")[:20].strip("-")
    return slug if slug and slug[0].isalpha() else f"u{slug}"[:20] if slug else "me"


class DevPods:
    """Dev pods of the cluster ``backend`` reaches (jobs/backends/kubernetes.py)."""

    def __init__(self, backend: Any):
        self.backend = backend

    @property
    def kube(self):
        return self.backend.kube

    def start(self, *, image: str, team: Optional[str] = None, pool: Optional[str] = None, idle: str = "1h",
              max_life: str = "8h", wait_seconds: float = 120, poll_seconds: float = 2) -> DevPod:
        team = self.backend.team_for(team)
        facts = self.backend.ctx.facts
        owner = owner_slug(self.backend.identity().username)
        name = f"{devpod.PREFIX}{owner}-{secrets.token_hex(2)}"
        spec = devpod.DevPodSpec(name=name, team=team, image=image, owner=owner, pool=pool, idle=idle, max_life=max_life,
                                 token_secret=name)
        manifest = devpod.render(spec, facts)  # every problem of the settings, before anything exists
        namespace = team_namespace(team)
        token = secrets.token_urlsafe(24)
        job = self.kube.create(manifest)
        owner_ref = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job["metadata"]["uid"],
                     "controller": False, "blockOwnerDeletion": False}
        secret = devpod.token_secret(name, namespace, token)
        secret["metadata"]["ownerReferences"] = [owner_ref]
        try:
            self.kube.create(secret)
        except (KubeError, NoClusterAccess):
            self.kube.delete(JOBS, name, namespace, propagation="Background")
            raise
        dev = self._wait_admitted(name, namespace, team, job["metadata"]["uid"], manifest, token, wait_seconds, poll_seconds)
        return dev

    def _wait_admitted(self, name: str, namespace: str, team: str, uid: str, manifest: dict, token: str,
                       wait_seconds: float, poll_seconds: float) -> DevPod:
        clock, sleep = self.backend.clock, self.backend.sleep
        deadline = clock() + wait_seconds
        pool = manifest["metadata"]["labels"]["mlplatform.io/pool"]
        owner = manifest["metadata"]["labels"][devpod.OWNER_LABEL]
        while True:
            workloads = self.kube.list(WORKLOADS, namespace, f"{KUEUE_JOB_UID}={uid}")
            admission = admission_from(workloads[0] if workloads else None)
            if admission.admitted:
                return DevPod(name, namespace, team, pool, owner, True, admission.reason, token=token)
            if clock() >= deadline:
                self.kube.delete(JOBS, name, namespace, propagation="Background")
                raise DevPodRefused(
                    f"dev pod {name} was not admitted within {wait_seconds:.0f} s (Kueue: {admission.reason}); it was "
                    f"deleted again. Fix: see what the team uses with `python -m workloads pools --team {team}` and stop "
                    f"a dev pod or job you no longer need (`python -m workloads dev --list`), or try another --pool")
            sleep(poll_seconds)

    def wait_running(self, dev: DevPod, *, wait_seconds: float = 600, poll_seconds: float = 2) -> DevPod:
        """The dev pod with its pod's name once the pod runs (or the pod's state at the deadline)."""
        clock, sleep = self.backend.clock, self.backend.sleep
        deadline = clock() + wait_seconds
        while True:
            pods = self.kube.list(PODS, dev.namespace, f"job-name={dev.name}")
            pod = max(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "", default=None)
            phase = ((pod or {}).get("status") or {}).get("phase", "")
            if pod is not None and phase in ("Running", "Succeeded", "Failed"):
                found = DevPod(**{**dev.__dict__, "pod": pod["metadata"]["name"], "phase": phase})
                if phase != "Running":
                    message = next((((s.get("state") or {}).get("terminated") or {}).get("message", "")
                                    for s in (pod.get("status") or {}).get("containerStatuses") or []), "")
                    raise DevPodRefused(f"dev pod {dev.name} ended ({phase}) before it served"
                                        + (f": {message.strip()}" if message else ""))
                return found
            if clock() >= deadline:
                return DevPod(**{**dev.__dict__, "pod": pod["metadata"]["name"] if pod else None, "phase": phase or "Pending"})
            sleep(poll_seconds)

    def list(self, team: Optional[str] = None) -> list[DevPod]:
        team = self.backend.team_for(team)
        namespace = team_namespace(team)
        out = []
        for job in self.kube.list(JOBS, namespace, f"app.kubernetes.io/name={devpod.APP}"):
            labels = job["metadata"].get("labels") or {}
            workloads = self.kube.list(WORKLOADS, namespace, f"{KUEUE_JOB_UID}={job['metadata'].get('uid')}")
            admission = admission_from(workloads[0] if workloads else None)
            conditions = {c.get("type") for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}
            phase = ("Succeeded" if "Complete" in conditions else "Failed" if "Failed" in conditions
                     else "Running" if (job.get("status") or {}).get("active") else "Queued")
            out.append(DevPod(job["metadata"]["name"], namespace, team, labels.get("mlplatform.io/pool", ""),
                              labels.get(devpod.OWNER_LABEL, ""), admission.admitted, admission.reason, phase=phase))
        return sorted(out, key=lambda d: d.name)

    def stop(self, name: str, team: Optional[str] = None) -> None:
        team = self.backend.team_for(team)
        if not name.startswith(devpod.PREFIX):
            raise ValueError(f"--stop {name}: not a dev pod (their names start with {devpod.PREFIX}). "
                             "Fix: python -m workloads dev --list names them")
        # Foreground: the pod (and the token's Secret, owned by the Job) go before the Job.
        self.kube.delete(JOBS, name, team_namespace(team), propagation="Foreground")

    def token(self, name: str, team: Optional[str] = None) -> str:
        """The login of a running dev pod (its Secret, readable by the team)."""
        import base64

        secret = self.kube.get(SECRETS, name, team_namespace(self.backend.team_for(team))) or {}
        value = (secret.get("data") or {}).get(devpod.TOKEN_KEY)
        return base64.b64decode(value).decode() if value else ""


def endpoints(facts: Any, team: str) -> list[str]:
    """Where a team member finds MLflow (URL, and where its login lives), Argo CD and the dashboards."""
    from jobs.access import access_fix
    from workloads.monitoring import dashboards

    tenant = facts.team(team)
    namespace = team_namespace(team)
    lines = [f"endpoints of stack {facts.stack} for team {team}"]
    if facts.tracking_url:
        lines.append(f"MLflow:      {facts.tracking_url} (the platform's load balancer; from the VPC or your VPN)")
        if tenant is not None and tenant.tracking_secret:
            keys = ", ".join(facts.tracking_secret_keys)
            lines.append(f"  login:     Secret {tenant.tracking_secret} in {namespace} ({keys}): your team's own MLflow user, "
                         "which may create and read the team's experiments and models only")
            lines.append(f"  read it:   kubectl -n {namespace} get secret {tenant.tracking_secret} -o "
                         "jsonpath='{.data.MLFLOW_TRACKING_PASSWORD}' | base64 -d")
            lines.append(f"  in Python: MLFLOW_TRACKING_URI={facts.tracking_url} MLFLOW_TRACKING_USERNAME=<the Secret's> "
                         "MLFLOW_TRACKING_PASSWORD=<the Secret's> (jobs and dev pods get all three from the Secret)")
    else:
        lines.append(f"MLflow:      none: stack {facts.stack} has no tracking section")
    if facts.argocd_url:
        lines.append(f"Argo CD:     {facts.argocd_url} (single sign-on; your team's project: its Applications and pod logs)")
    boards = ", ".join(sorted(dashboards.load()))
    if facts.grafana == "managed":
        lines.append(f"dashboards:  Amazon Managed Grafana (IAM Identity Center sign-in; the workspace URL is the stack output "
                     f"managedGrafanaEndpoint): {boards}")
    elif facts.grafana == "in-cluster":
        lines.append(f"dashboards:  Grafana in the cluster (namespace monitoring, no public address): {boards}. A team role "
                     "may not port-forward outside its dev pods: ask a platform engineer, or use `describe` and MLflow "
                     "for a job's figures")
    else:
        lines.append(f"dashboards:  none: stack {facts.stack} has no monitoring section")
    lines.append(f"cluster:     {access_fix(facts, team)}")
    return lines
