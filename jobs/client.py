"""A Python client for training jobs, for notebooks and scripts; ``python -m workloads`` is a
thin layer over it (jobs/cli.py).

    from jobs.client import JobClient
    jobs = JobClient(stack="dev")
    report = jobs.preflight("examples/jobs/l4-dev-smoke.yaml")   # fits? cost? (no cluster needed)
    job = jobs.submit("examples/jobs/l4-dev-smoke.yaml")        # Job(name=..., phase="Queued")
    jobs.list(team="research")                                  # [Job, ...]
    jobs.describe(job.name, team="research")                    # JobDetail: admission, attempts, cost
    for line in jobs.logs(job.name, team="research", follow=True): print(line)
    jobs.cancel(job.name, team="research", wait=True)           # SIGTERM, checkpoint, gone
    jobs.checkpoints(job.name, team="research")                 # [Checkpoint(step=..., uri=...)]

Every method returns frozen dataclasses. The cluster is reached through a ``KubeApi``
(jobs/kube.py: kubectl in production); checkpoints and the attempt history through a
``CheckpointStore`` (jobs/store.py: the checkpoints bucket the file system exports to).

Where pods are found (by the labels their controllers put on them):
- PyTorchJob, Training Operator v1.9.4: ``training.kubeflow.org/job-name=<job>``, and the node
  rank from ``training.kubeflow.org/replica-type`` (master: 0) and ``replica-index`` (worker i:
  i + 1) (pkg/apis/kubeflow.org/v1/common_types.go:25-34; PET_NODE_RANK in
  pkg/controller.v1/pytorch/envvar.go).
- TrainJob, Trainer v2.3.0: the TrainJob's JobSet has the TrainJob's name
  (pkg/runtime/framework/plugins/jobset/jobset.go:413 ``JobSet(trainJob.Name, ...)``) and JobSet
  v0.12.0 labels every pod template ``jobset.sigs.k8s.io/jobset-name=<jobset>`` and
  ``jobset.sigs.k8s.io/replicatedjob-name=<replicated job>`` (pkg/controllers/jobset_controller.go:
  950, 1020-1022). The node rank is the pod's Job completion index (Kubernetes adds the label
  ``batch.kubernetes.io/job-completion-index`` to Indexed Job pods; the torch plugin derives
  PET_NODE_RANK from it). TrainJob pods carry no ``training.kubeflow.org/*`` label.
"""
from __future__ import annotations

import difflib
import json
import signal as _signal
import threading
import queue as _queue
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Optional, Sequence, Union

from jobs.kube import (CONFIGMAPS, LOCALQUEUES, NAMESPACES, NODES, PODS, PYTORCHJOBS, TRAINJOBS, WORKLOADS, AlreadyExists, KubeApi,
                       KubeError, KubectlApi, NoClusterAccess)
from jobs.store import EXPORT, MIRROR, AttemptRecord, CheckpointStore, S3Store, StoreError
from trainer.contract.environment import ENV_CHECKPOINT_DIR
from workloads.scheduling import team_namespace, team_of_namespace

if TYPE_CHECKING:
    from jobs.sweep import SweepResults

ROOT = Path(__file__).resolve().parent.parent
MANAGED_BY = "app.kubernetes.io/managed-by=mlplatform"
# Training Operator v1 pod labels (kubeflow/trainer v1.9.4 pkg/apis/kubeflow.org/v1/common_types.go).
V1_JOB_NAME = "training.kubeflow.org/job-name"
V1_REPLICA_TYPE = "training.kubeflow.org/replica-type"
V1_REPLICA_INDEX = "training.kubeflow.org/replica-index"
# JobSet v0.12.0 pod labels (api/jobset/v1alpha2/jobset_types.go:24, 32), Kubernetes Indexed Job.
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
KUEUE_JOB_UID = "kueue.x-k8s.io/job-uid"  # kueue v0.19.2 pkg/controller/constants/constants.go:43
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# Argo CD 3.x tracks what it applied by this annotation (its default tracking method since 3.0,
# docs/user-guide/resource_tracking.md).
ARGOCD_TRACKING_ID = "argocd.argoproj.io/tracking-id"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
GPU_RESOURCE = "nvidia.com/gpu"
PYTORCH_CONTAINER = "pytorch"  # workloads.trainingjob.CONTAINER_NAME
TRAINJOB_CONTAINER = "node"  # workloads.trainjob_runtime.CONTAINER
TRAINJOB_REPLICATED_JOB = "node"
FINISHED = ("Succeeded", "Failed", "Cancelled")
# A cancelled job's object is deleted with its pods; what `list --all` and `describe` say about it
# afterwards is a ConfigMap in the team's namespace (team roles may write ConfigMaps,
# workloads/tenancy.py TEAM_RULES), labelled with this key, written by `cancel` before the delete.
HISTORY_LABEL = "mlplatform.io/job-history"
HISTORY_KEY = "job.json"


class JobNotFound(LookupError):
    pass


class UnknownTeam(ValueError):
    """``--team`` names no team of the stack (or no namespace of the cluster)."""


class GitOpsOwned(ValueError):
    """The job is an Argo CD application's resource: deleting it by hand does not last."""


class JobExists(ValueError):
    """A job of that name is already in the team's namespace: a submit neither re-runs it nor
    edits it (``replace=True`` deletes it first)."""

    def __init__(self, message: str, job: "Job"):
        super().__init__(message)
        self.job = job


class PreflightRefused(ValueError):
    def __init__(self, report: "PreflightResult"):
        super().__init__(report.text)
        self.report = report


# -- what an exit code means ---------------------------------------------------------------
def exit_code_meaning(code: Optional[int]) -> str:
    """The launcher's contract (trainer/launch.py) in one phrase, and what the operator does with it
    (restartPolicy ExitCode: 1-127 permanent, 128-255 retried, kubeflow/trainer v1.9.4
    pkg/util/train/train_util.go:24-26)."""
    if code is None:
        return "still running"
    if code == 0:
        return "done"
    if code == 1:
        return "failed (permanent: an error in the trainer, or retries exhausted; see the log)"
    if code == 2:
        return "bad input (permanent: the trainer refused its config or data)"
    if code == 3:
        return "requirements.txt not installable (permanent: the pod's termination message names the requirement)"
    if code == 143:
        return "preempted: SIGTERM (spot notice, drain, Kueue preemption or cancel), checkpointed, retried"
    if code == 137:
        return "killed: SIGKILL (OOM killer, lost node, or grace period exceeded), retried from the last checkpoint"
    if code == 141:
        return "peer lost: a rank on another node vanished, retried"
    if code == 0xBEEF:
        return "pod failed without a container exit code (the operator's 0xbeef), retried"
    if 128 < code <= 255:
        try:
            name = _signal.Signals(code - 128).name
        except ValueError:
            name = f"signal {code - 128}"
        return f"died of {name}, retried from the last checkpoint"
    return "failed (permanent)"


# -- typed results -------------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    name: str
    team: str
    namespace: str
    kind: str  # PyTorchJob | TrainJob
    phase: str  # Queued | Pending | Running | Restarting | Succeeded | Failed | Terminating
    created: Optional[str]
    pool: Optional[str]
    nodes: int
    gpus_per_node: int
    message: str
    uid: str
    checkpoint_dir: Optional[str]
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED


@dataclass(frozen=True)
class Admission:
    workload: Optional[str]
    admitted: bool
    reason: str  # why it waits, or where it was admitted
    flavors: tuple[str, ...] = ()


@dataclass(frozen=True)
class Pod:
    name: str
    node_rank: int
    phase: str
    node: Optional[str]
    instance_type: Optional[str]
    capacity_type: Optional[str]
    started_at: Optional[str]
    exit_code: Optional[int]
    deleting: bool
    gpus: int
    node_gpus: int  # the node's nvidia.com/gpu capacity (0: node not readable)


@dataclass(frozen=True)
class Attempt:
    node_rank: int
    exit_code: Optional[int]
    meaning: str
    step_at_start: Optional[int]
    step_at_end: Optional[int]
    source: str  # "history" (trainer/retries.py records) or the pod's name


@dataclass(frozen=True)
class Cost:
    usd: float
    node_hours: float
    basis: str


@dataclass(frozen=True)
class JobDetail:
    job: Job
    admission: Admission
    pods: tuple[Pod, ...]
    attempts: tuple[Attempt, ...]
    checkpoint_steps: tuple[int, ...]
    cost: Optional[Cost]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Checkpoint:
    step: int
    uri: str
    verdict: Optional[str] = None  # PASS | FAIL | None (not verified)
    detail: str = ""


@dataclass(frozen=True)
class LogLine:
    node_rank: int
    pod: str
    attempt: int
    text: str

    def __str__(self) -> str:
        return f"[rank {self.node_rank} #{self.attempt}] {self.text}"


@dataclass(frozen=True)
class PreflightResult:
    ok: bool
    text: str
    exit_code: int = 0  # the command line's: 0 fits, 2 bad input, 3 does not fit
    spec: Any = field(default=None, repr=False, compare=False)  # the parsed JobSpec (None: it did not parse)
    figures: Mapping[str, Any] = field(default_factory=dict, compare=False)  # pool, cost, memory... as numbers


@dataclass(frozen=True)
class Submitted:
    job: Job
    manifest: dict = field(repr=False, compare=False)
    replaced: Optional[Job] = None  # the job of the same name that replace=True deleted first
    code_uri: Optional[str] = None  # where the code archive is (code=DIR)
    code_uploaded: bool = False  # False: the same archive was already there


@dataclass(frozen=True)
class Cancelled:
    name: str
    namespace: str
    grace_seconds: Optional[int]
    gone: bool
    newest_checkpoint: Optional[int]
    recorded: bool = True  # False: the history record could not be written (list --all will not show it)


def history_record_name(job: Job) -> str:
    """One record per run (a later job of the same name is another run): name + uid."""
    return f"job-history-{job.name}-{(job.uid or 'nouid')[:8]}"[:253]


def history_record(job: Job, outcome: str, at: str) -> dict:
    """The ConfigMap that keeps a removed job in the team's history."""
    body = {"name": job.name, "team": job.team, "kind": job.kind, "outcome": outcome, "at": at,
            "phase_before": job.phase, "created": job.created, "pool": job.pool, "nodes": job.nodes,
            "gpus_per_node": job.gpus_per_node, "uid": job.uid, "checkpoint_dir": job.checkpoint_dir}
    keep = {k: v for k, v in job.labels.items() if k.startswith("mlplatform.io/")}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": history_record_name(job), "namespace": job.namespace,
                         "labels": {**keep, "app.kubernetes.io/managed-by": "mlplatform", HISTORY_LABEL: outcome.lower(),
                                    "mlplatform.io/job": job.name[:63]}},
            "data": {HISTORY_KEY: json.dumps({**body, "labels": keep}, sort_keys=True)}}


def job_from_history(obj: dict) -> Optional[Job]:
    try:
        body = json.loads((obj.get("data") or {}).get(HISTORY_KEY) or "")
        return Job(name=body["name"], team=body["team"], namespace=obj["metadata"]["namespace"], kind=body["kind"],
                   phase=body["outcome"], created=body.get("created"), pool=body.get("pool"),
                   nodes=int(body.get("nodes") or 1), gpus_per_node=int(body.get("gpus_per_node") or 1),
                   message=f"{body['outcome'].lower()} at {body.get('at')} while {body.get('phase_before')}",
                   uid=body.get("uid") or "", checkpoint_dir=body.get("checkpoint_dir"),
                   labels=dict(body.get("labels") or {}))
    except (ValueError, KeyError, TypeError):
        return None  # not ours, or damaged: history is best effort, never a reason to fail a listing


@dataclass(frozen=True)
class TeamQuota:
    """One team on one pool: its Kueue quota as declared, and what its LocalQueue reports now."""
    team: str
    pool: str
    flavor: str
    nominal_gpus: int
    borrowing: bool
    cohort_gpus: int  # what the cohort holds on the flavor: the most a borrowing team is admitted
    in_use_gpus: Optional[int] = None  # None: not read from the cluster
    pending_jobs: Optional[int] = None


@dataclass(frozen=True)
class PoolsView:
    pools: tuple[Any, ...]  # workloads.platform_facts.PoolFacts
    quotas: tuple[TeamQuota, ...]
    live: bool  # usage read from the cluster
    note: str = ""  # why it was not


def _local_queue_usage(obj: Optional[dict]) -> tuple[dict[str, int], int]:
    """(GPUs in use per flavor, pending workloads) of a LocalQueue's status (kueue v0.19.2
    localqueue_types.go: v1beta2 ``flavorsUsage``, v1beta1 ``flavorUsage``, each
    ``{name, resources: [{name, total}]}``)."""
    status = (obj or {}).get("status") or {}
    usage = status.get("flavorsUsage") or status.get("flavorUsage") or []
    gpus: dict[str, int] = {}
    for flavor in usage:
        for resource in flavor.get("resources") or []:
            # nvidia.com/gpu, or a shared pool's slices (nvidia.com/gpu.shared, nvidia.com/mig-*)
            if str(resource.get("name", "")).startswith("nvidia.com/"):
                gpus[flavor.get("name", "")] = gpus.get(flavor.get("name", ""), 0) + int(str(resource.get("total", 0)))
    return gpus, int(status.get("pendingWorkloads") or 0)


# -- parsing objects -----------------------------------------------------------------------
def _unliteral(value: str) -> str:
    return value.replace("$$", "$")  # workloads.jobspec.k8s_literal doubled every '$'


def _containers(obj: dict) -> list[dict]:
    spec = obj.get("spec", {})
    if obj.get("kind") == "TrainJob":
        return [spec.get("trainer", {})]
    return [r["template"]["spec"]["containers"][0] for r in spec.get("pytorchReplicaSpecs", {}).values()]


def _env(obj: dict, name: str) -> Optional[str]:
    for container in _containers(obj):
        for entry in container.get("env") or []:
            if entry.get("name") == name and "value" in entry:
                return _unliteral(entry["value"])
    return None


def _conditions(obj: dict) -> dict[str, dict]:
    return {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}


def parse_job(obj: dict) -> Job:
    meta, spec = obj["metadata"], obj.get("spec", {})
    kind = obj["kind"]
    conditions = _conditions(obj)
    latest = max((c for c in conditions.values()), key=lambda c: c.get("lastTransitionTime") or "", default={})
    if meta.get("deletionTimestamp"):
        phase = "Terminating"
    elif kind == "PyTorchJob":
        order = (("Succeeded", "Succeeded"), ("Failed", "Failed"), ("Suspended", "Queued"),
                 ("Restarting", "Restarting"), ("Running", "Running"))
        phase = next((p for cond, p in order if cond in conditions), "Pending")
    else:  # TrainJob (Trainer v2.3.0 trainjob_types.go:58-64: Suspended, Complete, Failed)
        phase = ("Succeeded" if "Complete" in conditions else "Failed" if "Failed" in conditions
                 else "Queued" if spec.get("suspend") or "Suspended" in conditions else "Running")
    if kind == "PyTorchJob":
        replicas = spec.get("pytorchReplicaSpecs", {})
        nodes = sum(int(r.get("replicas", 1)) for r in replicas.values())
        gpus = int(spec.get("nprocPerNode") or 1)
    else:
        nodes = int(spec.get("trainer", {}).get("numNodes") or 1)
        gpus = int(spec.get("trainer", {}).get("numProcPerNode") or 1)
    labels = meta.get("labels") or {}
    namespace = meta["namespace"]
    return Job(name=meta["name"], team=labels.get("mlplatform.io/team") or team_of_namespace(namespace),
               namespace=namespace, kind=kind, phase=phase, created=meta.get("creationTimestamp"),
               pool=labels.get("mlplatform.io/pool"), nodes=nodes, gpus_per_node=gpus,
               message=latest.get("message", ""), uid=meta.get("uid", ""),
               checkpoint_dir=_env(obj, ENV_CHECKPOINT_DIR), labels=dict(labels),
               annotations=dict(meta.get("annotations") or {}))


def pod_selector(job: Job) -> str:
    if job.kind == "TrainJob":
        return f"{JOBSET_NAME}={job.name},{JOBSET_REPLICATED_JOB}={TRAINJOB_REPLICATED_JOB}"
    return f"{V1_JOB_NAME}={job.name}"


def container_name(job: Job) -> str:
    return TRAINJOB_CONTAINER if job.kind == "TrainJob" else PYTORCH_CONTAINER


def node_rank(job: Job, pod: dict) -> int:
    labels = pod["metadata"].get("labels") or {}
    if job.kind == "TrainJob":
        return int(labels.get(COMPLETION_INDEX, 0))
    if labels.get(V1_REPLICA_TYPE, "").lower() == "master":
        return 0
    return int(labels.get(V1_REPLICA_INDEX, 0)) + 1


def _exit_code(pod: dict, container: str) -> Optional[int]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            terminated = (status.get("state") or {}).get("terminated")
            if terminated:
                return terminated.get("exitCode")
    return None


def _started(pod: dict, container: str) -> Optional[str]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            state = status.get("state") or {}
            return (state.get("running") or state.get("terminated") or {}).get("startedAt")
    return None


def _ended(pod: dict, container: str) -> Optional[str]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            return ((status.get("state") or {}).get("terminated") or {}).get("finishedAt")
    return None


def _timestamp(text: Optional[str]) -> Optional[float]:
    if not text:
        return None
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


def admission_from(workload: Optional[dict]) -> Admission:
    """Kueue's view, from the Workload's conditions (kueue v0.19.2 workload_types.go: QuotaReserved,
    Admitted, Evicted, Finished): admitted where, or the reason it waits."""
    if workload is None:
        return Admission(None, False, "no Kueue Workload yet (Kueue creates it for a job with a queue label)")
    name = workload["metadata"]["name"]
    conditions = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
    flavors = tuple(sorted({f for ps in ((workload.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []
                            for f in (ps.get("flavors") or {}).values()}))
    admitted = conditions.get("Admitted", {}).get("status") == "True"
    evicted = conditions.get("Evicted", {})
    if evicted.get("status") == "True":
        return Admission(name, False, f"evicted ({evicted.get('reason')}): {evicted.get('message', '')}".strip(), flavors)
    if admitted:
        where = ", ".join(flavors) or "its ClusterQueue"
        return Admission(name, True, f"admitted on {where}", flavors)
    reserved = conditions.get("QuotaReserved", {})
    if reserved:
        return Admission(name, False, f"waiting ({reserved.get('reason')}): {reserved.get('message', '')}".strip(), flavors)
    return Admission(name, False, "waiting: not yet considered by its ClusterQueue", flavors)


class SweepRefused(Exception):
    """A sweep point did not preflight (the report was printed); ``exit_code`` is preflight's."""

    def __init__(self, exit_code: int):
        self.exit_code = exit_code
        super().__init__(f"the sweep was refused by preflight (exit {exit_code}); nothing was created")


# -- the client ----------------------------------------------------------------------------
SpecLike = Union[str, Path, Any]


class JobClient:
    """Training jobs of one stack. ``kube`` defaults to kubectl; ``store`` to the stack's
    checkpoints bucket; ``facts`` to the stack's (read lazily: only preflight, submit and
    checkpoints need them)."""

    def __init__(self, stack: Optional[str] = None, *, kube: Optional[KubeApi] = None, facts: Any = None,
                 store: Optional[CheckpointStore] = None, offline: bool = False,
                 kubeconfig: Optional[Union[str, Path]] = None, context: Optional[str] = None,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep):
        """``kubeconfig``/``context``: the cluster to talk to (default: $KUBECONFIG, its current
        context); ``kube`` replaces the transport altogether."""
        self.stack = stack
        self.kube: KubeApi = kube if kube is not None else KubectlApi(
            kubeconfig=str(kubeconfig) if kubeconfig is not None else None, context=context)
        self._facts = facts
        self._store = store
        self.offline = offline
        self.clock = clock
        self.sleep = sleep

    # -- platform facts, the store -----------------------------------------------------------
    @property
    def facts(self):
        if self._facts is None:
            if self.stack is None:
                raise ValueError("this needs the stack's facts: give --stack STACK (in Python: JobClient(stack=...))")
            from jobs.facts import facts_for_stack

            self._facts = facts_for_stack(self.stack, use_outputs=not self.offline)
        return self._facts

    @property
    def store(self) -> Optional[CheckpointStore]:
        if self._store is None:
            bucket = self.facts.checkpoints_bucket  # no stack: ValueError, saying so
            if bucket:
                # On EFS (datasets storage s3-mountpoint) nothing exports /fsx/checkpoints: the
                # only copy in S3 is a job's s3Mirror (jobs/store.py).
                efs = self.facts.checkpoint_store == "EFS"
                self._store = S3Store(bucket, region=self.facts.region, layout=MIRROR if efs else EXPORT,
                                      file_system=self.facts.checkpoint_store or "FSx for Lustre")
        return self._store

    def store_note(self) -> Optional[str]:
        """What the store cannot see on this stack, or None."""
        store = self._store_or_none()
        if isinstance(store, S3Store) and store.layout == MIRROR:
            return (f"stack {self.stack} keeps checkpoints on EFS, which is not exported to S3: only jobs with "
                    "s3Mirror: true have their complete steps readable from here")
        return None

    # -- pools and quotas --------------------------------------------------------------------
    def pools(self, team: Optional[str] = None, *, live: bool = True) -> PoolsView:
        """The stack's GPU pools and each team's Kueue quota on them; with ``live``, what each
        team's LocalQueue reports in use now (a cluster that cannot be read leaves the declared
        figures, and ``note`` says why)."""
        facts = self.facts
        if team:
            self.check_team(team)
        teams = [t for t in facts.teams if team in (None, t.name)]
        usage: dict[str, tuple[dict[str, int], int]] = {}
        note = ""
        if live:
            try:
                for tenant in teams:
                    queue = self.kube.get(LOCALQUEUES, tenant.local_queue, tenant.namespace) if tenant.local_queue else None
                    if queue is not None:  # absent: not deployed yet, nothing to read
                        usage[tenant.name] = _local_queue_usage(queue)
            except (NoClusterAccess, KubeError) as exc:
                usage, note = {}, f"in use not read ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}): declared quotas only"
        else:
            note = "in use not read (not asked): declared quotas only"
        quotas = []
        for tenant in teams:
            for pool in facts.pools:
                flavor = pool.kueue_flavor or ""
                if flavor not in tenant.gpu_quota:
                    continue
                used, pending = usage.get(tenant.name, (None, None))
                quotas.append(TeamQuota(tenant.name, pool.name, flavor, int(tenant.gpu_quota[flavor]), tenant.borrowing,
                                        sum(int(t.gpu_quota.get(flavor, 0)) for t in facts.teams),
                                        None if used is None else used.get(flavor, 0), pending))
        if live and not note and not usage:
            note = "in use not read (no team LocalQueue on this cluster): declared quotas only"
        return PoolsView(tuple(facts.pools), tuple(quotas), bool(usage), note)

    # -- before the cluster ------------------------------------------------------------------
    def load(self, spec: SpecLike):
        from workloads.jobspec import JobSpec, load_job_spec, parse_job_spec

        if isinstance(spec, JobSpec):
            return spec
        if isinstance(spec, dict):
            return parse_job_spec(spec)
        return load_job_spec(spec)

    def preflight(self, spec: SpecLike, *, mfu: Optional[float] = None,
                  code: Optional[Union[str, Path]] = None) -> PreflightResult:
        """Does the job fit the stack: the report of ``python -m workloads preflight``. A spec
        file is checked whole (file, schema, stack facts, trainer config, fit: every problem in
        one report); a mapping or JobSpec that does not parse raises
        ``workloads.problems.InvalidInputError``."""
        from jobs.preflight import preflight, preflight_file
        from workloads.problems import Problem

        if isinstance(spec, (str, Path)):
            report = preflight_file(str(spec), self.facts, repo_root=str(ROOT), mfu=mfu)
        else:
            report = preflight(self.load(spec), self.facts, repo_root=str(ROOT), mfu=mfu)
        job_spec = report.job.spec if report.job is not None else None
        if job_spec is not None and code is not None:
            # Your code (submit --code DIR): the script torchrun starts is there and parses.
            from jobs.usercode import check_requirements, entry_point_problems

            if not Path(code).is_dir():
                report.problems.append(Problem("--code", str(code), "is not a directory",
                                               "give the directory holding your script"))
            problems, warnings = entry_point_problems(job_spec, code)
            report.problems += problems
            report.warnings += warnings
            if Path(code).is_dir() and (check := check_requirements(code)) is not None:
                report.lines.append(check.install_step(job_spec.namespace))
        if job_spec is not None and not report.problems:
            # initFrom is read from the checkpoint store once everything else holds.
            problems, warnings = self._init_from_check(job_spec)
            report.problems += problems
            report.warnings += warnings
        return PreflightResult(report.ok, report.render(), report.exit_code, job_spec, dict(report.figures))

    def init_from_problems(self, spec) -> list[str]:
        """``initFrom: <job>/step-N`` names a complete checkpoint of the team's job, each problem
        one line (empty when it does, or when the store cannot be read: see ``preflight``)."""
        return [p.render() for p in self._init_from_check(spec)[0]]

    def _init_from_check(self, spec) -> tuple[list, list[str]]:
        """(problems, warnings) of ``initFrom`` against the store; the spec's own rules ran when
        it loaded. A store that cannot be read (no credentials) is a warning: the pod checks it
        again and refuses a missing step as a permanent failure."""
        from workloads.jobspec import init_from_path
        from workloads.problems import Problem

        ref = getattr(spec, "init_from", None)
        if not ref:
            return [], []
        try:
            store = self.store
        except ValueError:
            store = None
        if store is None:
            return [], [f"initFrom {ref} not checked: stack {self.stack} has no checkpoint store to read"]
        path = init_from_path(spec)
        job_dir, _, step = path.rpartition("/")
        try:
            steps = store.complete_steps(job_dir)
        except StoreError as exc:
            return [], [f"initFrom {ref} not checked: {exc}"]
        if int(step.removeprefix("step-")) not in steps:
            return [Problem("initFrom", ref, f"no complete checkpoint there (complete steps of that job: {steps or 'none'})",
                            f"name one of them; list them: python -m workloads checkpoints {job_dir.rsplit('/', 1)[-1]} "
                            f"--team {spec.team} --stack {self.stack}")], []
        return [], []

    def render(self, spec: SpecLike) -> dict:
        from workloads.trainingjob import render

        return render(self.load(spec), self.facts)

    def submit(self, spec: SpecLike, *, mfu: Optional[float] = None, replace: bool = False,
               code: Optional[Union[str, Path]] = None, checked: Optional[PreflightResult] = None,
               replace_timeout_seconds: float = 900, poll_seconds: float = 5) -> Submitted:
        """Preflight, render, create. Raises ``PreflightRefused`` if it does not fit and
        ``JobExists`` if the team already has a job of that name, unless ``replace``: then that job
        is deleted in the foreground first (its pods get SIGTERM and their grace period to
        checkpoint, as in ``cancel``) and the new one created once it is gone. ``code``: a
        directory of your own code, packed, pinned by digest and uploaded (jobs/usercode.py).
        ``checked``: this spec's preflight, already run (the command line shows it first)."""
        result = checked if checked is not None else self.preflight(spec, mfu=mfu, code=code)
        if not result.ok or result.spec is None:
            raise PreflightRefused(result)
        job_spec = result.spec
        archive = None
        if code is not None:
            from jobs import usercode

            archive = usercode.archive(code)
            job_spec = usercode.pin(job_spec, archive, self.facts.checkpoints_bucket, self.facts.stack)
        manifest = self.render(job_spec)
        uploaded: list[bool] = []

        def upload() -> None:
            if archive is not None:
                from jobs import usercode

                uploaded.append(usercode.upload(job_spec, archive))

        (created, replaced), = self.create_jobs([manifest], replace=replace, before_write=upload,
                                                 replace_timeout_seconds=replace_timeout_seconds, poll_seconds=poll_seconds)
        return Submitted(created, manifest, replaced=replaced, code_uri=job_spec.code.uri if job_spec.code else None,
                         code_uploaded=bool(uploaded and uploaded[0]))

    def create_jobs(self, manifests: Sequence[dict], *, replace: bool = False,
                    before_write: Optional[Callable[[], None]] = None, replace_timeout_seconds: float = 900,
                    poll_seconds: float = 5) -> list[tuple[Job, Optional[Job]]]:
        """Create rendered jobs (one, or a sweep's points): every name is checked before anything
        is written, so a taken name refuses the whole lot (``JobExists``, listing every taken name)
        unless ``replace``. Returns (created, the job it replaced) per manifest."""
        existing = [self._existing(m["metadata"]["name"], team_of_namespace(m["metadata"]["namespace"]))
                    for m in manifests]
        taken = [e for e in existing if e is not None]
        if taken and not replace:
            first = taken[0]
            more = f" (and {len(taken) - 1} more: {', '.join(t.name for t in taken[1:])})" if len(taken) > 1 else ""
            raise JobExists(self._exists_message(first) + more, first)
        for job in taken:
            self._refuse_gitops(job, "replace")
        if before_write is not None:
            before_write()
        out = []
        for manifest, old in zip(manifests, existing):
            if old is not None:
                self._delete_and_wait(old, replace_timeout_seconds, poll_seconds)
            try:
                created = self.kube.create(manifest)
            except AlreadyExists:  # created by someone else between the check and now
                raced = self.get(manifest["metadata"]["name"], team_of_namespace(manifest["metadata"]["namespace"]))
                raise JobExists(self._exists_message(raced), raced) from None
            out.append((parse_job(created), old))
        return out

    def _existing(self, name: str, team: str) -> Optional[Job]:
        try:
            return self.get(name, team)
        except JobNotFound:
            return None

    @staticmethod
    def _exists_message(existing: Job) -> str:
        doing = ("would not run it again" if existing.finished else
                 "would not start a new run (an apply would patch the pods of the running one)")
        return (f"job {existing.name} already exists in {existing.namespace} ({existing.phase}, created "
                f"{existing.created or '?'}): submitting it again {doing}. Fix: give the new run another name "
                f"(name: in the spec), or submit with --replace (in Python: replace=True) to delete this one "
                f"(its pods get SIGTERM and time to checkpoint) and start again; it resumes from the newest "
                f"complete checkpoint in {existing.checkpoint_dir or 'its checkpoint directory'}")

    def _refuse_gitops(self, job: Job, verb: str) -> None:
        tracking = job.annotations.get(ARGOCD_TRACKING_ID) or ""
        if tracking:
            raise GitOpsOwned(
                f"job {job.name} is declared in git (Argo CD application {tracking.split(':', 1)[0]}): Argo CD "
                f"would undo a {verb} by hand. Fix: change its file under workloads/declared/ and let Argo CD sync it, "
                "or give your job another name")

    def _delete_and_wait(self, job: Job, timeout_seconds: float, poll_seconds: float) -> None:
        """Foreground deletion (dependents first, the job object last), then wait for the name
        to be free: a create before that would find the old object (409)."""
        resource = TRAINJOBS if job.kind == "TrainJob" else PYTORCHJOBS
        self.kube.delete(resource, job.name, job.namespace, propagation="Foreground")
        deadline = self.clock() + timeout_seconds
        while self._current(job) is not None:
            if self.clock() >= deadline:
                raise TimeoutError(f"job {job.name} is still terminating after {timeout_seconds:.0f} s (its pods are "
                                   f"saving a checkpoint); nothing new was created. Fix: submit again with --replace "
                                   f"once `python -m workloads list --team {job.team}` no longer shows it")
            self.sleep(poll_seconds)

    # -- reading jobs -------------------------------------------------------------------------
    def _raw(self, name: str, team: str) -> dict:
        namespace = team_namespace(team)
        for resource in (PYTORCHJOBS, TRAINJOBS):
            try:
                obj = self.kube.get(resource, name, namespace)
            except KubeError as exc:
                if "resource type" in str(exc):  # Trainer v2 not installed: no TrainJob CRD
                    continue
                raise
            if obj is not None:
                return obj
        past = self.history(team, name=name)
        if past:
            last = past[0]
            raise JobNotFound(f"job {name!r} in namespace {namespace} was {last.message} and is gone from the cluster; "
                              f"its logs: python -m workloads logs {name} --team {team} --stack STACK --attempt N; its "
                              f"checkpoints: python -m workloads checkpoints {name} --team {team} --stack STACK")
        raise JobNotFound(f"no job {name!r} in namespace {namespace} (list them: python -m workloads list --team {team} --all)")

    def get(self, name: str, team: str) -> Job:
        return parse_job(self._raw(name, team))

    def list(self, team: Optional[str] = None, *, include_finished: bool = False) -> list[Job]:
        """The platform's jobs of one team (every team the caller may read without ``team``),
        newest first; finished ones (and cancelled ones, from the history records) only with
        ``include_finished``. An unknown ``team`` raises ``UnknownTeam`` (checked against the
        stack's teams when the client has a stack, else against the cluster's namespaces)."""
        if team:
            self.check_team(team)
        namespace = team_namespace(team) if team else None
        found = []
        for resource in (PYTORCHJOBS, TRAINJOBS):
            try:
                found += [parse_job(o) for o in self.kube.list(resource, namespace, MANAGED_BY)]
            except KubeError as exc:
                if "resource type" not in str(exc):
                    raise
        if include_finished:
            live = {j.uid for j in found}
            found += [j for j in self._history(namespace) if j.uid not in live]
        elif team and not found and self._facts is None and self.stack is None:
            self._check_namespace(team)
        found = [j for j in found if include_finished or not j.finished]
        return sorted(found, key=lambda j: (j.created or "", j.name), reverse=True)

    def history(self, team: str, *, name: Optional[str] = None) -> list[Job]:
        """The team's removed jobs (cancelled: phase ``Cancelled``), newest first."""
        jobs = [j for j in self._history(team_namespace(team)) if name is None or j.name == name]
        return sorted(jobs, key=lambda j: (j.created or "", j.name), reverse=True)

    def _history(self, namespace: Optional[str]) -> list[Job]:
        try:
            records = self.kube.list(CONFIGMAPS, namespace, HISTORY_LABEL)
        except (KubeError, NoClusterAccess):  # a role that may read jobs but not ConfigMaps: no history
            return []
        return [j for j in (job_from_history(o) for o in records) if j is not None]

    def check_team(self, team: str) -> None:
        """``UnknownTeam`` naming the team and the stack's teams, when the stack is known."""
        if self._facts is None and self.stack is None:
            return
        facts = self.facts
        if facts.team(team) is None:
            names = sorted(t.name for t in facts.teams)
            close = difflib.get_close_matches(team, names, n=1)
            raise UnknownTeam(f"--team {team!r}: stack {facts.stack} has no such team (teams: {', '.join(names)})"
                              + (f"; did you mean {close[0]!r}?" if close else ""))

    def _check_namespace(self, team: str) -> None:
        """Without the stack: a team whose namespace does not exist is a typo. A caller who may
        not read namespaces (a team role) learns nothing here, and gets the empty list."""
        namespace = team_namespace(team)
        try:
            exists = self.kube.get(NAMESPACES, namespace) is not None
        except (KubeError, NoClusterAccess):
            return
        if not exists:
            raise UnknownTeam(f"--team {team!r}: the cluster has no namespace {namespace}. Fix: check the team's name "
                              "(give --stack STACK to list the stack's teams)")

    def sweep(self, name: str, team: str, *, tracking_uri: Optional[str] = None,
              metrics: Sequence[str] = ()) -> "SweepResults":
        """One sweep's points (label mlplatform.io/sweep, finished ones included) with each
        point's latest ``metrics`` (default val_loss, loss) from its MLflow run."""
        from jobs.sweep import DEFAULT_RESULT_METRICS, SweepResults, read_sweep_metrics, sweep_jobs

        jobs = tuple(sweep_jobs(self.list(team, include_finished=True), name))
        found, note = read_sweep_metrics(jobs, name, tracking_uri, tuple(metrics) or DEFAULT_RESULT_METRICS)
        return SweepResults(name=name, jobs=jobs, metrics=found, note=note)

    def plan_sweep(self, job_file: Union[str, Path], sweeps: Sequence[str], *, sweep_name: Optional[str] = None,
                   mfu: Optional[float] = None, dry_run: bool = False, out: Any = None,
                   err: Any = None) -> tuple[int, list[dict]]:
        """One job per point of the grid (``sweeps``: ``KEY=V1,V2`` each, jobs/sweep.py), every point
        preflighted and the sweep's cost and quota totals printed to ``out``: (exit code, the
        manifests). Nothing is created; ``submit_sweep`` creates them, all or nothing."""
        import sys
        from types import SimpleNamespace

        from jobs.sweep import submit_sweep

        args = SimpleNamespace(job=str(job_file), sweep=list(sweeps), sweep_name=sweep_name, mfu=mfu, dry_run=dry_run)
        return submit_sweep(args, facts=self.facts, repo_root=str(ROOT), out=out or sys.stdout, err=err or sys.stderr)

    def submit_sweep(self, job_file: Union[str, Path], sweeps: Sequence[str], *, sweep_name: Optional[str] = None,
                     mfu: Optional[float] = None, replace: bool = False, out: Any = None,
                     err: Any = None) -> list[tuple[Job, Optional[Job]]]:
        """``plan_sweep`` then ``create_jobs``: every point's name is checked before the first is
        created. A point that does not preflight raises ``SweepRefused`` (its exit code) and
        creates nothing."""
        code, manifests = self.plan_sweep(job_file, sweeps, sweep_name=sweep_name, mfu=mfu, out=out, err=err)
        if code:
            raise SweepRefused(code)
        return self.create_jobs(manifests, replace=replace)

    def pods(self, job: Job) -> list[dict]:
        return self.kube.list(PODS, job.namespace, pod_selector(job))

    def _pod(self, job: Job, obj: dict, nodes: dict[str, Optional[dict]]) -> Pod:
        container = container_name(job)
        node_name = (obj.get("spec") or {}).get("nodeName")
        if node_name and node_name not in nodes:
            try:
                nodes[node_name] = self.kube.get(NODES, node_name)
            except (KubeError, NoClusterAccess):  # nodes are cluster-scoped: a team role may not read them
                nodes[node_name] = None
        node = nodes.get(node_name) or {}
        node_labels = (node.get("metadata") or {}).get("labels") or {}
        node_gpus = int(((node.get("status") or {}).get("capacity") or {}).get(GPU_RESOURCE, 0) or 0)
        requests = (((obj.get("spec") or {}).get("containers") or [{}])[0].get("resources") or {}).get("requests") or {}
        return Pod(name=obj["metadata"]["name"], node_rank=node_rank(job, obj),
                   phase=(obj.get("status") or {}).get("phase", "Unknown"), node=node_name,
                   instance_type=node_labels.get(INSTANCE_TYPE_LABEL), capacity_type=node_labels.get(CAPACITY_TYPE_LABEL),
                   started_at=_started(obj, container), exit_code=_exit_code(obj, container),
                   deleting=bool(obj["metadata"].get("deletionTimestamp")), gpus=int(requests.get(GPU_RESOURCE, 0) or 0),
                   node_gpus=node_gpus)

    def describe(self, name: str, team: str) -> JobDetail:
        raw = self._raw(name, team)
        job = parse_job(raw)
        notes: list[str] = []
        try:
            workloads = self.kube.list(WORKLOADS, job.namespace, f"{KUEUE_JOB_UID}={job.uid}") if job.uid else []
        except KubeError as exc:
            if "resource type" not in str(exc):
                raise
            workloads = []
            notes.append("Kueue is not installed on this cluster: no admission to show")
        admission = admission_from(workloads[0] if workloads else None)
        nodes: dict[str, Optional[dict]] = {}
        pod_objs = self.pods(job)
        pods = tuple(sorted((self._pod(job, p, nodes) for p in pod_objs), key=lambda p: (p.node_rank, p.name)))
        history: list[AttemptRecord] = []
        steps: list[int] = []
        if job.checkpoint_dir and self._store_or_none() is not None:
            try:
                steps = self.store.complete_steps(job.checkpoint_dir)
                history = self.store.attempts(job.checkpoint_dir)
            except StoreError as exc:
                notes.append(f"{'attempt history' if steps else 'checkpoints and attempt history'} not read: {exc}")
        elif job.checkpoint_dir:
            notes.append("checkpoints and attempt history need the stack (--stack): they are read from its checkpoints bucket")
        if job.checkpoint_dir and (note := self.store_note()) is not None:
            notes.append(note)
        attempts = [Attempt(r.node_rank, r.exit_code, exit_code_meaning(r.exit_code), r.step_at_start, r.step_at_end, "history")
                    for r in sorted(history, key=lambda r: (r.started_at or 0, r.node_rank))]
        # The current pods' attempts, unless their launcher already recorded them.
        recorded_ends = {(r.node_rank, round(r.ended_at or 0)) for r in history}
        for pod in pods:
            ended = _timestamp(next((_ended(o, container_name(job)) for o in pod_objs if o["metadata"]["name"] == pod.name), None))
            if pod.exit_code is None or (pod.node_rank, round(ended or 0)) not in recorded_ends:
                attempts.append(Attempt(pod.node_rank, pod.exit_code, exit_code_meaning(pod.exit_code), None, None, pod.name))
        cost = self._cost(job, pods, pod_objs, history, notes)
        return JobDetail(job, admission, pods, tuple(attempts), tuple(steps), cost, tuple(notes))

    def _store_or_none(self) -> Optional[CheckpointStore]:
        try:
            return self.store
        except ValueError:  # no stack given: describe and cancel work without its bucket
            return None

    def _cost(self, job: Job, pods: tuple[Pod, ...], pod_objs: list[dict], history: list[AttemptRecord],
              notes: list[str]) -> Optional[Cost]:
        """Node hours x price, each pod counted for its share of its node's GPUs: the recorded
        attempts (started_at..ended_at) and the running pods (container start..now). Spot nodes
        at the spot assumption of workloads/prices.py."""
        from workloads.prices import PRICES

        by_rank = {p.node_rank: p for p in pods if p.instance_type}
        usd = hours = 0.0
        unpriced = set()

        def add(pod: Optional[Pod], seconds: float) -> None:
            nonlocal usd, hours
            if pod is None or pod.instance_type not in PRICES:
                unpriced.add(pod.instance_type if pod else "unknown node")
                return
            share = (pod.gpus / pod.node_gpus) if pod.gpus and pod.node_gpus else 1.0
            price = PRICES[pod.instance_type]
            rate = price.spot_usd_per_hour if pod.capacity_type == "spot" else price.on_demand_usd_per_hour
            hours += seconds / 3600 * share
            usd += seconds / 3600 * share * rate

        for record in history:
            if record.started_at and record.ended_at:
                add(by_rank.get(record.node_rank), record.ended_at - record.started_at)
        for pod in pods:
            if pod.exit_code is None and pod.started_at:
                add(pod, max(0.0, self.clock() - (_timestamp(pod.started_at) or self.clock())))
        if unpriced:
            notes.append(f"cost leaves out time on {sorted(unpriced)} (node not readable or not in workloads/prices.py)")
        if not hours and unpriced:
            return None
        return Cost(round(usd, 2), round(hours, 3), "node hours x each pod's share of its node's GPUs x the "
                    "on-demand price (spot: the spot assumption of workloads/prices.py)")

    # -- waiting -------------------------------------------------------------------------------
    def wait(self, name: str, team: str, *, until: tuple[str, ...] = FINISHED, timeout_seconds: float = 3600,
             poll_seconds: float = 10) -> Job:
        """Poll until the job's phase is one of ``until`` (TimeoutError after ``timeout_seconds``)."""
        deadline = self.clock() + timeout_seconds
        while True:
            job = self.get(name, team)
            if job.phase in until:
                return job
            if self.clock() >= deadline:
                raise TimeoutError(f"job {name} is still {job.phase} after {timeout_seconds:.0f} s")
            self.sleep(poll_seconds)

    # -- logs -----------------------------------------------------------------------------------
    def logs(self, name: str, team: str, *, rank: Optional[int] = 0, follow: bool = False,
             poll_seconds: float = 5) -> Iterator[LogLine]:
        """Log lines of one node rank (``rank=None``: every rank, interleaved as they come).
        With ``follow``, a stream that ends (the pod was preempted, killed, replaced) is picked
        up again on the pod that replaces it, until the job finishes: every attempt, every rank.
        Pods deleted before the call (earlier attempts) are gone from the API: ``past_logs``
        reads them from the cluster's container log group."""
        job = self.get(name, team)
        if rank is not None and not 0 <= rank < job.nodes:
            raise ValueError(f"--rank {rank}: job {name} has node ranks 0-{job.nodes - 1}")
        ranks = list(range(job.nodes)) if rank is None else [rank]
        if len(ranks) == 1:
            yield from self._rank_logs(job, ranks[0], follow, poll_seconds)
            return
        lines: "_queue.Queue[Any]" = _queue.Queue()
        done = object()

        def pump(r: int) -> None:
            try:
                for line in self._rank_logs(job, r, follow, poll_seconds):
                    lines.put(line)
            except BaseException as exc:  # surfaced on the caller's thread
                lines.put(exc)
            finally:
                lines.put(done)

        for r in ranks:
            threading.Thread(target=pump, args=(r,), daemon=True).start()
        remaining = len(ranks)
        while remaining:
            item = lines.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item

    def past_logs(self, name: str, team: str, *, attempt: int, rank: int = 0, archive: Any = None) -> list[LogLine]:
        """Attempt ``attempt`` (1: the first) of one node rank, from the cluster's CloudWatch
        container log group (jobs/past_logs.py): the pods of earlier attempts, and of a job that
        was cancelled or has finished, are gone from the API. ``archive``: a ``LogArchive``
        (default: the stack's group, read with your AWS credentials)."""
        from components.container_logs import team_log_group_name
        from jobs.past_logs import LogArchive, LogArchiveError

        job = self._current_or_past(name, team)
        nodes = job.nodes if job is not None else None
        if nodes is not None and not 0 <= rank < nodes:
            raise ValueError(f"--rank {rank}: job {name} has node ranks 0-{nodes - 1}")
        if attempt < 1:
            raise ValueError(f"--attempt {attempt}: attempts are numbered from 1 (the first run of the pod)")
        if archive is None:
            group = getattr(self.facts, "container_log_group", None)
            if not group:
                raise LogArchiveError(f"stack {self.facts.stack} keeps no container logs (monitoring.containerLogs is "
                                      "off): the logs of pods that are gone were not kept")
            # The team's own group (components/container_logs.py): a team's members may read it, and no other.
            archive = LogArchive(team_log_group_name(group, team_namespace(team)), self.facts.region)
        kind = job.kind if job is not None else "PyTorchJob"
        namespace = team_namespace(team)
        since_ms = int(_timestamp(job.created) * 1000) if job is not None and job.created else None
        if kind == "TrainJob":  # JobSet pods: <jobset>-<replicated job>-<job index>-<completion index>-<random>
            pods = archive.attempts(namespace, f"{name}-{TRAINJOB_REPLICATED_JOB}-0-{rank}-", TRAINJOB_CONTAINER,
                                    exact=False, since_ms=since_ms)
        else:  # Training Operator v1.9.4 pod names: <job>-master-0, <job>-worker-<i> (common/util.go:51)
            pod = f"{name}-master-0" if rank == 0 else f"{name}-worker-{rank - 1}"
            pods = archive.attempts(namespace, pod, PYTORCH_CONTAINER, since_ms=since_ms)
        if not 1 <= attempt <= len(pods):
            have = f"attempts 1-{len(pods)}" if pods else "no lines"
            raise ValueError(f"--attempt {attempt}: rank {rank} of job {name} has {have} in CloudWatch log group "
                             f"{getattr(archive, 'group', '?')}" + ("" if job is not None and job.created else
                                                                    " (the job's creation time is unknown: earlier runs "
                                                                    "of the same name count too)"))
        chosen = pods[attempt - 1]
        return [LogLine(rank, chosen.pod_uid or name, attempt, text) for text in chosen.lines]

    def _current_or_past(self, name: str, team: str) -> Optional[Job]:
        """The job, or its history record, or None: CloudWatch is read without the cluster too
        (then without the job's creation time or size)."""
        try:
            return self.get(name, team)
        except JobNotFound:
            past = self.history(team, name=name)
            return past[0] if past else None
        except (NoClusterAccess, KubeError):
            return None

    def _rank_logs(self, job: Job, rank: int, follow: bool, poll_seconds: float) -> Iterator[LogLine]:
        seen: list[str] = []  # pod uids already streamed, in order
        while True:
            pods = [p for p in self.pods(job) if node_rank(job, p) == rank and p["metadata"].get("uid") not in seen
                    and ((p.get("status") or {}).get("phase") not in (None, "Pending"))]
            pods.sort(key=lambda p: p["metadata"].get("creationTimestamp") or "")
            for pod in pods:
                seen.append(pod["metadata"].get("uid"))
                yield from self._pod_logs(job, pod, rank, len(seen), follow, poll_seconds)
            if not follow:
                return
            current = self._current(job)
            if current is None or current.finished:
                # One last look: a pod that ran to the end after the stream closed.
                if not any(p["metadata"].get("uid") not in seen and node_rank(job, p) == rank for p in self.pods(job)):
                    return
                continue
            if not pods:
                self.sleep(poll_seconds)

    def _pod_logs(self, job: Job, pod: dict, rank: int, attempt: int, follow: bool,
                  poll_seconds: float) -> Iterator[LogLine]:
        """One pod's lines. A followed stream can drop while the container still runs (an API
        server or load balancer idle timeout): re-attach, skipping the lines already given
        (`kubectl logs` replays the container's log from its start; after the kubelet rotated the
        file it replays less, and lines since the rotation may be skipped)."""
        name, uid, container = pod["metadata"]["name"], pod["metadata"].get("uid"), container_name(job)
        given = 0
        while True:
            for index, text in enumerate(self.kube.logs(name, job.namespace, container, follow=follow)):
                if index >= given:
                    given += 1
                    yield LogLine(rank, name, attempt, text)
            if not follow or not self._still_running(job, uid, container):
                return
            self.sleep(poll_seconds)

    def _still_running(self, job: Job, uid: Optional[str], container: str) -> bool:
        for pod in self.pods(job):
            if pod["metadata"].get("uid") == uid:
                running = any(st.get("name") == container and "running" in (st.get("state") or {})
                              for st in (pod.get("status") or {}).get("containerStatuses") or [])
                return running and not pod["metadata"].get("deletionTimestamp")
        return False

    def _current(self, job: Job) -> Optional[Job]:
        try:
            return self.get(job.name, job.team)
        except JobNotFound:
            return None

    # -- cancel ---------------------------------------------------------------------------------
    def cancel(self, name: str, team: str, *, wait: bool = False, timeout_seconds: float = 600,
               poll_seconds: float = 5, force: bool = False) -> Cancelled:
        """Stop the job so that its checkpoint lands first, then remove it.

        A foreground deletion: the job object stays (deletionTimestamp, foregroundDeletion
        finalizer) until the garbage collector has deleted its pods, each with its own
        terminationGracePeriodSeconds, which the platform sizes for step + checkpoint + MLflow
        flush (workloads.trainingjob.TimeBudget). The kubelet sends SIGTERM, the launcher
        forwards it, the trainer saves at the step boundary and exits 143. While the job is
        being deleted the Training Operator does not reconcile it, and for a TrainJob neither does
        JobSet reconcile its JobSet, so nothing recreates the pods (tests/jobs/test_lifecycle.py
        quotes the upstream lines). Suspending is no cancel under Kueue: Kueue un-suspends a job
        whose Workload is admitted.
        """
        raw = self._raw(name, team)
        job = parse_job(raw)
        tracking = ((raw["metadata"].get("annotations") or {}).get(ARGOCD_TRACKING_ID) or "")
        if tracking and not force:
            raise GitOpsOwned(
                f"job {name} is declared in git (Argo CD application {tracking.split(':', 1)[0]}): the next sync "
                "would create it again. Fix: delete its file under workloads/declared/ and let Argo CD prune it, "
                "or cancel with --force to stop this run anyway")
        grace = self._grace_seconds(job)
        resource = TRAINJOBS if job.kind == "TrainJob" else PYTORCHJOBS
        recorded = self._record(job, "Cancelled")
        self.kube.delete(resource, name, job.namespace, propagation="Foreground")
        gone = False
        if wait:
            deadline = self.clock() + timeout_seconds
            while self.clock() < deadline:
                if self._current(job) is None:
                    gone = True
                    break
                self.sleep(poll_seconds)
        newest = None
        if gone and job.checkpoint_dir and self._store_or_none() is not None:
            try:
                steps = self.store.complete_steps(job.checkpoint_dir)
                newest = steps[-1] if steps else None
            except StoreError:
                newest = None
        return Cancelled(name, job.namespace, grace, gone, newest, recorded)

    def cancel_sweep(self, sweep: str, team: str, *, wait: bool = False, timeout_seconds: float = 600,
                     poll_seconds: float = 5, force: bool = False) -> list[Cancelled]:
        """``cancel`` every active job of the sweep (label mlplatform.io/sweep). Checked first,
        cancelled after: a sweep with no active job raises ``JobNotFound``, and one with a job
        Argo CD owns raises ``GitOpsOwned`` before anything is deleted (unless ``force``)."""
        from jobs.sweep import sweep_jobs

        jobs = [j for j in sweep_jobs(self.list(team), sweep) if j.phase != "Terminating"]
        if not jobs:
            done = sweep_jobs(self.list(team, include_finished=True), sweep)
            raise JobNotFound(f"sweep {sweep!r} of team {team} has no active job" +
                              (f" ({len(done)} finished or cancelled: python -m workloads list --team {team} --sweep {sweep})"
                               if done else f" (list the team's jobs: python -m workloads list --team {team} --all)"))
        if not force:
            for job in jobs:
                self._refuse_gitops(job, "cancel")
        out = [self.cancel(j.name, team, force=force) for j in jobs]
        if not wait:
            return out
        deadline = self.clock() + timeout_seconds
        gone: set[str] = set()
        while len(gone) < len(jobs) and self.clock() < deadline:
            gone |= {j.name for j in jobs if self._current(j) is None}
            if len(gone) < len(jobs):
                self.sleep(poll_seconds)
        return [Cancelled(c.name, c.namespace, c.grace_seconds, c.name in gone, None, c.recorded) for c in out]

    def _record(self, job: Job, outcome: str) -> bool:
        """Keep the job in the team's history (written before the delete: once the job is gone
        nothing else remembers it). A refused write does not stop the cancel."""
        at = datetime.fromtimestamp(self.clock(), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            self.kube.apply(history_record(job, outcome, at))
        except (KubeError, NoClusterAccess):
            return False
        return True

    def _grace_seconds(self, job: Job) -> Optional[int]:
        pods = self.pods(job)
        values = [(p.get("spec") or {}).get("terminationGracePeriodSeconds") for p in pods]
        return max((v for v in values if v is not None), default=None)

    # -- checkpoints ----------------------------------------------------------------------------
    def checkpoints(self, name: str, team: str, *, verify: Optional[int] = None,
                    checkpoint_dir: Optional[str] = None, image: Optional[str] = None) -> list[Checkpoint]:
        """Complete checkpoint steps of a job, oldest first; ``verify=STEP`` (or -1: the newest)
        runs the restore drill on that step in the team's namespace (``verify_checkpoint_in_cluster``;
        ``image``: the trainer image when the job object is gone). The job
        object may be gone (finished, TTL): its checkpoints stay, found by ``checkpoint_dir``
        (default: the job's own, else the platform's default for the name)."""
        store = self.store
        if store is None:
            raise StoreError(f"stack {self.stack} has no checkpoints bucket")
        if checkpoint_dir is None:
            try:
                checkpoint_dir = self.get(name, team).checkpoint_dir
            except (JobNotFound, KubeError, NoClusterAccess):  # gone, or no cluster: the bucket still has them
                checkpoint_dir = None
        if checkpoint_dir is None:
            from workloads.trainingjob import team_checkpoint_root

            checkpoint_dir = f"{team_checkpoint_root(f'team-{team}')}/{name}"
        steps = store.complete_steps(checkpoint_dir)
        out = [Checkpoint(s, store.uri(checkpoint_dir, s)) for s in steps]
        if verify is not None and steps:
            step = steps[-1] if verify < 0 else verify
            if step not in steps:
                raise ValueError(f"--verify {verify}: not a complete step of {name} (complete: {steps})")
            verdict, detail = self.verify_checkpoint_in_cluster(name, team, step, checkpoint_dir=checkpoint_dir,
                                                                image=image)
            out = [Checkpoint(c.step, c.uri, verdict, detail) if c.step == step else c for c in out]
        return out

    def verify_checkpoint_in_cluster(self, name: str, team: str, step: int, *, checkpoint_dir: str,
                                     image: Optional[str] = None, timeout_seconds: float = 4 * 3600,
                                     poll_seconds: float = 10) -> tuple[str, str]:
        """The restore drill of one step as a Job in the team's namespace, with the team's service
        account, uid and checkpoint key (workloads/checkpoint_drill.py): ("PASS" | "FAIL", detail).
        Nothing of the checkpoint is read on this machine: a team's checkpoint is only ever
        unpickled with that team's rights (review security-4 N1)."""
        from jobs.store import S3Store
        from workloads.checkpoint_drill import JOB_NAME_LABEL, DrillSpec, render_drill, verdict_from_pod

        facts = self.facts
        namespace = team_namespace(team)
        tenant = facts.team(team)
        if tenant is None:
            raise ValueError(f"--team {team!r}: no such team in stack {facts.stack} "
                             f"(teams: {sorted(t.name for t in facts.teams)})")
        if not facts.checkpoints_bucket:
            raise StoreError(f"stack {facts.stack} has no checkpoints bucket: nothing for the drill to download")
        if image is None:
            try:
                image = next(iter(_containers(self._raw(name, team))), {}).get("image")
            except (JobNotFound, KubeError, NoClusterAccess):
                image = None
            if not image:
                raise ValueError(f"job {name} is gone: give the trainer image it ran (--image, "
                                 "e.g. the image of its job spec) for the drill")
        spec = DrillSpec(job=name, step=step, team=team, namespace=namespace,
                         source=S3Store(facts.checkpoints_bucket).uri(checkpoint_dir, step), image=image,
                         service_account=tenant.trainer_service_account or "", uid=tenant.posix_id or 0,
                         local_queue=tenant.local_queue or "", region=facts.region)
        self.kube.apply(render_drill(spec))
        # The verdict is read from the pods of the Job just made and no other: a pod that merely
        # carries the Job's label (a team member may create one, exiting 0) names no controller
        # owner with this Job's uid (the tenant policies refuse a team-made pod owned by a Job).
        drill_job = self.kube.get("jobs.batch", spec.name, namespace) or {}
        drill_uid = (drill_job.get("metadata") or {}).get("uid")
        deadline = self.clock() + timeout_seconds
        while True:
            for pod in self.kube.list(PODS, namespace, selector=f"{JOB_NAME_LABEL}={spec.name}"):
                if not drill_uid or not any(ref.get("uid") == drill_uid and ref.get("controller")
                                            for ref in (pod.get("metadata") or {}).get("ownerReferences") or []):
                    continue
                found = verdict_from_pod(pod, image=spec.image)
                if found is not None:
                    return found
            if self.clock() >= deadline:
                return "FAIL", (f"no verdict within {timeout_seconds:.0f} s (waiting for quota or a node?): "
                                f"kubectl -n {namespace} describe job {spec.name}")
            self.sleep(poll_seconds)
