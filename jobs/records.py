"""What the job client returns and how it reads Kubernetes objects: the typed records (frozen
dataclasses), the errors, and the parsers of PyTorchJobs, TrainJobs, pods, Kueue Workloads and the
job history records. Pure functions: no cluster, no stack.

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

import json
import signal as _signal
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Mapping, Optional

from trainer.contract.environment import ENV_CHECKPOINT_DIR
from workloads.scheduling import team_of_namespace

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
FINISHED = ("Succeeded", "Failed", "Cancelled", "Replaced", "Deleted")
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
    source: str  # "record" (the platform's run record), "history" (trainer/retries.py records) or the pod's name
    # From the run record (workloads/run_recorder.py): why it ended (done, preemption, failure,
    # cancel, killed, lost, running), where it ran and when.
    reason: str = ""
    node: Optional[str] = None
    instance_type: Optional[str] = None
    capacity_type: Optional[str] = None
    started_at: Optional[str] = None
    ended_at: Optional[str] = None
    pod_uid: Optional[str] = None


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
    # The resolved job preflight checked (workloads.trainingjob.ResolvedJob; None when it did not
    # resolve): what submit renders, with no second resolution.
    job: Any = field(default=None, repr=False, compare=False)
    problems: tuple[Any, ...] = field(default=(), repr=False, compare=False)  # workloads.problems.Problem


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
    checkpoint_note: str = ""  # why newest_checkpoint is None (store not readable, none complete...)


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
    """A sweep point did not preflight; ``exit_code`` is preflight's, ``plan`` the sweep's plan
    (``plan.lines()``: every point's verdict)."""

    def __init__(self, exit_code: int, plan: Any = None):
        self.exit_code = exit_code
        self.plan = plan
        super().__init__(f"the sweep was refused by preflight (exit {exit_code}); nothing was created")


# -- run records (workloads/run_recorder.py) ------------------------------------------------------
@dataclass(frozen=True)
class Run:
    """One run of a job, as the platform's run recorder kept it: it outlives the job object."""

    job: Job  # phase: the outcome once the job object is gone (Succeeded, Failed, Cancelled, Replaced, Deleted)
    record: str  # the RunRecord's name: <job>-<first 8 characters of the job's uid>
    outcome: str  # "" while the job object exists
    ended_at: Optional[str]
    attempts: tuple[Attempt, ...]
    cost: Optional[Cost]
    dropped_attempts: int = 0


COST_BASIS = ("node hours x each pod's share of its node's GPUs x the on-demand price (spot: the spot assumption of "
              "catalog/prices.py), from the platform's run record")


def _attempt_from_record(row: Mapping[str, Any]) -> Attempt:
    code = row.get("exitCode")
    meaning = exit_code_meaning(code) if row.get("reason") not in ("pending", "lost", "cancel") or code is not None \
        else (row.get("message") or row.get("reason") or "")
    return Attempt(int(row.get("rank") or 0), code, meaning, None, None, "record", reason=str(row.get("reason") or ""),
                   node=row.get("node"), instance_type=row.get("instanceType"), capacity_type=row.get("capacityType"),
                   started_at=row.get("startedAt"), ended_at=row.get("endedAt"), pod_uid=row.get("podUid"))


def run_from_record(obj: Mapping[str, Any], now: float) -> Optional[Run]:
    """The run a RunRecord describes (None: not one, or damaged: history never fails a listing)."""
    from workloads.run_recorder import run_cost

    try:
        meta, spec = obj["metadata"], obj["spec"]
        summary = spec["job"]
        outcome = spec.get("outcome") or ""
        labels = dict(spec.get("labels") or {})
        when = spec.get("removedAt") or spec.get("endedAt")
        message = (f"{outcome.lower()} at {when}" + (f" (finished {spec['endedAt']})" if spec.get("endedAt") and
                                                    spec.get("endedAt") != when else "")) if outcome else ""
        job = Job(name=summary["name"], team=summary.get("team") or team_of_namespace(meta["namespace"]),
                  namespace=meta["namespace"], kind=summary["kind"], phase=outcome or spec.get("phase") or "Pending",
                  created=summary.get("created"), pool=summary.get("pool"), nodes=int(summary.get("nodes") or 1),
                  gpus_per_node=int(summary.get("gpusPerNode") or 1), message=message, uid=summary.get("uid") or "",
                  checkpoint_dir=summary.get("checkpointDir"), labels=labels)
        attempts = tuple(_attempt_from_record(row) for row in spec.get("attempts") or [])
        usd, hours, unpriced = run_cost(obj, now)
        cost = None if unpriced and not usd else Cost(round(usd, 2), round(hours, 3), COST_BASIS)
        return Run(job, meta["name"], outcome, spec.get("endedAt"), attempts, cost, int(spec.get("droppedAttempts") or 0))
    except (KeyError, TypeError, ValueError):
        return None
