"""The run recorder: the platform's own record of every training run, kept in the cluster where the
team can read it and no one else writes it.

One ``RunRecord`` (mlplatform.io/v1alpha1, CRD in ``workloads/run_records.py``) per run: a run is
one job object (name + uid; a resubmitted or replaced name is a new run). The recorder runs as a
Deployment in the platform's namespace with its own ServiceAccount; its ClusterRole reads pods,
nodes and the job kinds and writes RunRecords. A team's Role may only read RunRecords in its own
namespace (``workloads.tenancy.TEAM_RULES``), so the record is neither on the team's storage nor
editable by the team: what ``describe``, ``list --all`` and ``history`` show is what happened.

What goes in it, from the recorder's seat:

- the job: kind, uid, creation time, pool, size, checkpoint directory, its ``mlplatform.io/*``
  labels (sweep, point);
- every attempt of every node rank, one per pod uid: the node, its instance type and capacity
  type (node labels ``node.kubernetes.io/instance-type``, ``karpenter.sh/capacity-type``: a team
  role cannot read Nodes, the recorder can), the GPUs the pod requested of the node's, the
  container's start and end, its exit code, and why it ended (``classify``);
- the phase, and once the job object is gone the outcome: Succeeded/Failed (removed by its
  ``ttlSecondsAfterFinished``), Cancelled (``cancel`` annotates the job before deleting it),
  Replaced (``submit --replace`` does the same), or Deleted (anything else: kubectl, Argo CD).

Records carry no ownerReference, so the garbage collector never removes them with the job; the
recorder deletes a record once its run ended ``--retention-days`` ago (a stack setting,
``training.runRecordRetentionDays``).

Cost is derived, not stored: each attempt keeps the USD per hour of its share of its node
(``usdPerHour``: the on-demand price, or the spot assumption, of the instance type, times the
GPUs it requested over the node's), so cost so far is sum(rate x time) at any moment
(``run_cost``), the running attempt counted up to now.

How it watches (Kubernetes API concepts, "Efficient detection of changes"): list, then watch from
the list's resourceVersion, for pods carrying the platform's ``app.kubernetes.io/managed-by``
label and for each job kind; a watch that ends is resumed, a 410 Gone relists. A pod that exits
143 is deleted by the Training Operator within a second: the watch's DELETED event still carries
its last status (the exit code). Records are written in batches every ``--flush-seconds`` and the
whole state is relisted every ``--resync-seconds`` (which also ends runs whose job went while the
recorder was down, and applies the retention).

Standard library only: the Deployment mounts this file from a ConfigMap into the platform's agent
image (python3), as the GPU node readiness agent is.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import queue
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

GROUP, VERSION, KIND, PLURAL = "mlplatform.io", "v1alpha1", "RunRecord", "runrecords"
API_VERSION = f"{GROUP}/{VERSION}"
# Labels of a record: the job's name, and "true" on every record (what a listing selects).
RECORD_LABEL = "mlplatform.io/run-record"
JOB_LABEL = "mlplatform.io/job"
# What the job client writes on a job before it deletes it: why the run ended.
CANCELLED_AT = "mlplatform.io/cancelled-at"
REPLACED_AT = "mlplatform.io/replaced-at"
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "mlplatform"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
# Karpenter v1 taints a node it is about to disrupt (consolidation, drift, spot interruption)
# with karpenter.sh/disrupted:NoSchedule (pkg/apis/v1/taints.go DisruptedNoScheduleTaint).
DISRUPTED_TAINT = "karpenter.sh/disrupted"
GPU_RESOURCE_PREFIX = "nvidia.com/"
# Job kinds: (API path, kind). PyTorchJob: Training Operator v1.9.4; TrainJob: Trainer v2.3.0.
JOB_KINDS = (("/apis/kubeflow.org/v1/pytorchjobs", "PyTorchJob"),
             ("/apis/trainer.kubeflow.org/v1alpha1/trainjobs", "TrainJob"))
# Node rank labels (Training Operator v1.9.4 common_types.go; Kubernetes Indexed Jobs).
V1_REPLICA_TYPE = "training.kubeflow.org/replica-type"
V1_REPLICA_INDEX = "training.kubeflow.org/replica-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
MAX_ATTEMPTS = 500  # a crash loop keeps its newest attempts; the record stays far below etcd's 1.5 MiB
FINISHED = ("Succeeded", "Failed")

# Why an attempt ended.
DONE, PREEMPTION, FAILURE, CANCEL, KILLED, LOST, RUNNING, PENDING = (
    "done", "preemption", "failure", "cancel", "killed", "lost", "running", "pending")


def now_text(now: float) -> str:
    return dt.datetime.fromtimestamp(now, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: Optional[str]) -> Optional[float]:
    if not text:
        return None
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc).timestamp()


def record_name(job_name: str, uid: str) -> str:
    """One record per run: the job's name and the first 8 characters of its uid."""
    return f"{job_name}-{(uid or 'nouid')[:8]}"[:253]


# -- the job ------------------------------------------------------------------------------------
def _conditions(obj: Mapping[str, Any]) -> set[str]:
    return {c.get("type") for c in ((obj.get("status") or {}).get("conditions") or []) if c.get("status") == "True"}


def job_phase(job: Mapping[str, Any]) -> str:
    """The phase the job client shows (jobs/records.py ``parse_job``), from the job's conditions."""
    conditions = _conditions(job)
    spec = job.get("spec") or {}
    if job.get("kind") == "TrainJob":
        return ("Succeeded" if "Complete" in conditions else "Failed" if "Failed" in conditions
                else "Queued" if spec.get("suspend") or "Suspended" in conditions else "Running")
    for condition, phase in (("Succeeded", "Succeeded"), ("Failed", "Failed"), ("Suspended", "Queued"),
                             ("Restarting", "Restarting"), ("Running", "Running")):
        if condition in conditions:
            return phase
    return "Pending"


def _containers(job: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = job.get("spec") or {}
    if job.get("kind") == "TrainJob":
        return [spec.get("trainer") or {}]
    return [((r.get("template") or {}).get("spec") or {}).get("containers", [{}])[0]
            for r in (spec.get("pytorchReplicaSpecs") or {}).values()]


def _env(job: Mapping[str, Any], name: str) -> Optional[str]:
    for container in _containers(job):
        for entry in container.get("env") or []:
            if entry.get("name") == name and "value" in entry:
                return str(entry["value"]).replace("$$", "$")  # workloads.jobspec.k8s_literal
    return None


def job_summary(job: Mapping[str, Any], checkpoint_env: str) -> dict[str, Any]:
    meta, spec = job["metadata"], job.get("spec") or {}
    if job.get("kind") == "TrainJob":
        nodes = int((spec.get("trainer") or {}).get("numNodes") or 1)
        gpus = int((spec.get("trainer") or {}).get("numProcPerNode") or 1)
    else:
        nodes = sum(int(r.get("replicas", 1)) for r in (spec.get("pytorchReplicaSpecs") or {}).values())
        gpus = int(spec.get("nprocPerNode") or 1)
    labels = meta.get("labels") or {}
    return {"name": meta["name"], "kind": job.get("kind"), "uid": meta.get("uid", ""),
            "team": labels.get("mlplatform.io/team") or meta["namespace"].removeprefix("team-"),
            "created": meta.get("creationTimestamp"), "pool": labels.get("mlplatform.io/pool"), "nodes": nodes,
            "gpusPerNode": gpus, "checkpointDir": _env(job, checkpoint_env)}


def new_record(job: Mapping[str, Any], checkpoint_env: str, now: float) -> dict[str, Any]:
    meta = job["metadata"]
    kept = {k: v for k, v in (meta.get("labels") or {}).items() if k.startswith("mlplatform.io/")}
    return {"apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": record_name(meta["name"], meta.get("uid", "")), "namespace": meta["namespace"],
                         "labels": {**kept, RECORD_LABEL: "true", JOB_LABEL: meta["name"][:63],
                                    MANAGED_BY: MANAGED_BY_VALUE}},
            "spec": {"job": job_summary(job, checkpoint_env), "labels": kept, "phase": job_phase(job), "outcome": "",
                     "endedAt": None, "attempts": [], "droppedAttempts": 0, "updatedAt": now_text(now)}}


def observe_job(record: dict[str, Any], job: Mapping[str, Any], *, deleted: bool, now: float) -> bool:
    """The job's phase; once it is gone, the run's outcome. True when the record changed."""
    spec = record["spec"]
    before = json.dumps(spec, sort_keys=True)
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    phase = job_phase(job)
    if not spec["outcome"]:
        spec["phase"] = phase
        if phase in FINISHED and not spec.get("endedAt"):
            spec["endedAt"] = _finished_at(job) or now_text(now)
    settle_stragglers(spec)
    if annotations.get(CANCELLED_AT):
        spec["cancelledAt"] = annotations[CANCELLED_AT]
    if annotations.get(REPLACED_AT):
        spec["replacedAt"] = annotations[REPLACED_AT]
    if deleted:
        end_run(record, now)
    return json.dumps(spec, sort_keys=True) != before


def settle_stragglers(spec: dict[str, Any]) -> None:
    """Attempts that ended when, or after, the job finished were not preempted: the Training
    Operator deletes the pods still running once the job has succeeded or failed (training-operator
    v1.9.4 pkg/controller.v1/common/job.go: ``if util.IsFinished(jobStatus)`` then
    ``deletePodsAndServices``, which with ``cleanPodPolicy: Running`` deletes the Running ones), so
    a worker still shutting down when rank 0 completes exits 143 on that SIGTERM. The pod's end and
    the job's condition arrive on separate watches, in either order; this runs on both."""
    finished_at = parse_time(spec.get("endedAt")) if spec.get("phase") in FINISHED else None
    if finished_at is None:
        return
    for attempt in spec["attempts"]:
        ended_at = parse_time(attempt.get("endedAt"))
        if ended_at is None or ended_at < finished_at or attempt.get("reason") not in (PREEMPTION, KILLED, LOST):
            continue
        if spec["phase"] == "Succeeded":
            attempt["reason"] = DONE
            attempt["message"] = "stopped once the job had succeeded (the Training Operator's cleanPodPolicy: Running)"
        else:
            attempt["reason"] = FAILURE
            attempt["message"] = "stopped once the job had failed (the Training Operator's cleanPodPolicy: Running)"


def _finished_at(job: Mapping[str, Any]) -> Optional[str]:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") in ("Succeeded", "Failed", "Complete") and condition.get("status") == "True":
            return condition.get("lastTransitionTime")
    return None


def end_run(record: dict[str, Any], now: float, *, last_seen: Optional[str] = None) -> None:
    """The job object is gone: the outcome, and the end of every attempt still open (at
    ``last_seen``, the last time the recorder saw it running, when it went unwatched: cost so
    far never counts time nobody saw)."""
    spec = record["spec"]
    if spec["outcome"]:
        return
    if spec["phase"] in FINISHED:
        outcome = spec["phase"]  # removed after it finished (ttlSecondsAfterFinished) or by hand
    elif spec.get("replacedAt"):
        outcome = "Replaced"
    elif spec.get("cancelledAt"):
        outcome = "Cancelled"
    else:
        outcome = "Deleted"
    spec["outcome"] = outcome
    spec["endedAt"] = spec.get("endedAt") or now_text(now)
    spec["removedAt"] = now_text(now)
    for attempt in spec["attempts"]:
        if attempt.get("endedAt") is None and attempt.get("reason") in (RUNNING, PENDING):
            attempt["endedAt"] = (last_seen or now_text(now)) if attempt.get("startedAt") else None
            attempt["reason"] = CANCEL if outcome in ("Cancelled", "Replaced", "Deleted") else LOST
            attempt["message"] = f"the job was {outcome.lower()} while this attempt ran"


# -- attempts ---------------------------------------------------------------------------------
def node_rank(pod: Mapping[str, Any]) -> int:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if COMPLETION_INDEX in labels:
        return int(labels[COMPLETION_INDEX])
    if str(labels.get(V1_REPLICA_TYPE, "")).lower() == "master":
        return 0
    return int(labels.get(V1_REPLICA_INDEX, 0)) + 1


def _container_status(pod: Mapping[str, Any], containers: Sequence[str]) -> Mapping[str, Any]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") in containers:
            return status
    return {}


def _gpus(pod: Mapping[str, Any]) -> int:
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        for name, value in ((container.get("resources") or {}).get("requests") or {}).items():
            if name.startswith(GPU_RESOURCE_PREFIX):
                total += int(str(value))
    return total


def _node_gpus(node: Optional[Mapping[str, Any]]) -> int:
    capacity = ((node or {}).get("status") or {}).get("capacity") or {}
    return sum(int(str(v)) for k, v in capacity.items() if k.startswith(GPU_RESOURCE_PREFIX))


def node_disrupted(node: Optional[Mapping[str, Any]]) -> bool:
    """Karpenter is taking the node away (spot interruption, consolidation, drift, expiry), or it is gone."""
    if node is None:
        return True
    if (node.get("metadata") or {}).get("deletionTimestamp"):
        return True
    return any(t.get("key") == DISRUPTED_TAINT for t in (node.get("spec") or {}).get("taints") or [])


def classify(exit_code: Optional[int], *, job_deleting: bool, job_suspended: bool, node_going: bool) -> tuple[str, str]:
    """(reason, message) of an attempt that ended. The launcher's exit codes (trainer/launch.py):
    0 done; 1-127 permanent (the Training Operator fails the job under restartPolicy ExitCode);
    143 SIGTERM after a checkpoint; 137 SIGKILL; no exit code: the pod went before its container
    ended (its node was lost, or it was deleted)."""
    if exit_code == 0:
        return DONE, "exit 0"
    if job_deleting:
        return CANCEL, "the job was being deleted (cancel, replace or kubectl delete)"
    if exit_code is not None and 0 < exit_code < 128:
        return FAILURE, f"exit {exit_code}: a permanent error (the job fails)"
    if job_suspended:
        return PREEMPTION, "Kueue suspended the job (preempted by a higher priority or reclaimed quota)"
    if node_going:
        return PREEMPTION, "its node was taken away (spot interruption, consolidation, drift or expiry)"
    if exit_code == 143:
        return PREEMPTION, "SIGTERM (drain or eviction): checkpointed and retried"
    if exit_code == 137:
        return KILLED, "SIGKILL (out of memory, or the grace period ran out): retried from the last checkpoint"
    if exit_code is None:
        return LOST, "the pod went without an exit code (its node was lost)"
    return PREEMPTION, f"exit {exit_code}: retried"


def usd_per_hour(prices: Mapping[str, Mapping[str, float]], instance_type: Optional[str], capacity_type: Optional[str],
                 gpus: int, node_gpus: int) -> Optional[float]:
    """The price of the pod's share of its node: its GPUs over the node's (a whole node when either is unknown)."""
    price = prices.get(instance_type or "")
    if price is None:
        return None
    rate = price["spot"] if capacity_type == "spot" else price["onDemand"]
    share = (gpus / node_gpus) if gpus and node_gpus else 1.0
    return round(rate * min(share, 1.0), 6)


def observe_pod(record: dict[str, Any], pod: Mapping[str, Any], *, deleted: bool, node: Optional[Mapping[str, Any]],
                node_read: bool, prices: Mapping[str, Mapping[str, float]], containers: Sequence[str],
                job: Optional[Mapping[str, Any]], now: float) -> bool:
    """Fold one pod's state into its attempt (created on first sight). ``node``: the pod's node
    (None: not scheduled, or gone when ``node_read``). True when the record changed."""
    spec = record["spec"]
    meta = pod.get("metadata") or {}
    uid = meta.get("uid", "")
    attempts = spec["attempts"]
    attempt = next((a for a in attempts if a.get("podUid") == uid), None)
    before = json.dumps(attempt, sort_keys=True) if attempt else None
    if attempt is None:
        attempt = {"rank": node_rank(pod), "pod": meta.get("name", ""), "podUid": uid, "node": None, "instanceType": None,
                   "capacityType": None, "gpus": _gpus(pod), "nodeGpus": 0, "usdPerHour": None, "startedAt": None,
                   "endedAt": None, "exitCode": None, "reason": PENDING, "message": ""}
        attempts.append(attempt)
        if len(attempts) > MAX_ATTEMPTS:
            spec["droppedAttempts"] = int(spec.get("droppedAttempts") or 0) + len(attempts) - MAX_ATTEMPTS
            del attempts[:len(attempts) - MAX_ATTEMPTS]
    node_name = (pod.get("spec") or {}).get("nodeName")
    if node_name and attempt["node"] is None:
        attempt["node"] = node_name
    if node_name and node is not None and attempt["instanceType"] is None:
        labels = (node.get("metadata") or {}).get("labels") or {}
        attempt["instanceType"] = labels.get(INSTANCE_TYPE_LABEL)
        attempt["capacityType"] = labels.get(CAPACITY_TYPE_LABEL)
        attempt["nodeGpus"] = _node_gpus(node)
        attempt["usdPerHour"] = usd_per_hour(prices, attempt["instanceType"], attempt["capacityType"], attempt["gpus"],
                                             attempt["nodeGpus"])
    status = _container_status(pod, containers)
    state = status.get("state") or {}
    running, terminated = state.get("running"), state.get("terminated")
    if attempt["startedAt"] is None:
        attempt["startedAt"] = (running or terminated or {}).get("startedAt")
    if attempt["endedAt"] is None:
        job_meta = (job or {}).get("metadata") or {}
        deleting = job is None or bool(job_meta.get("deletionTimestamp"))
        suspended = job is not None and job_phase(job) == "Queued"
        going = node_disrupted(node) if node_name and node_read else False
        if terminated:
            code = terminated.get("exitCode")
            attempt["exitCode"] = int(code) if code is not None else None
            attempt["endedAt"] = terminated.get("finishedAt") or now_text(now)
            attempt["reason"], attempt["message"] = classify(attempt["exitCode"], job_deleting=deleting,
                                                             job_suspended=suspended, node_going=going)
        elif deleted:
            attempt["endedAt"] = now_text(now) if attempt["startedAt"] else None
            attempt["reason"], attempt["message"] = classify(None, job_deleting=deleting, job_suspended=suspended,
                                                             node_going=going or not attempt["startedAt"])
            if not attempt["startedAt"]:
                attempt["message"] = "deleted before its container started"
        elif running:
            attempt["reason"] = RUNNING
    settle_stragglers(spec)
    # Oldest first; attempts that have not started yet last (a stable sort keeps their order).
    attempts.sort(key=lambda a: (a.get("startedAt") is None, a.get("startedAt") or "", a["rank"]))
    return json.dumps(attempt, sort_keys=True) != before


def run_cost(record: Mapping[str, Any], now: float) -> tuple[float, float, list[str]]:
    """(USD, node-hours, instance types without a price) of a run so far: each attempt's share of
    its node's price over its time (the running ones up to ``now``)."""
    usd = hours = 0.0
    unpriced: set[str] = set()
    for attempt in (record.get("spec") or {}).get("attempts") or []:
        start = parse_time(attempt.get("startedAt"))
        if start is None:
            continue
        end = parse_time(attempt.get("endedAt")) or now
        share = (attempt["gpus"] / attempt["nodeGpus"]) if attempt.get("gpus") and attempt.get("nodeGpus") else 1.0
        seconds = max(0.0, end - start)
        hours += seconds / 3600 * min(share, 1.0)
        if attempt.get("usdPerHour") is None:
            unpriced.add(attempt.get("instanceType") or "an unknown node")
        else:
            usd += seconds / 3600 * float(attempt["usdPerHour"])
    return usd, hours, sorted(unpriced)


def expired(record: Mapping[str, Any], now: float, retention_seconds: float) -> bool:
    spec = record.get("spec") or {}
    ended = parse_time(spec.get("removedAt") or spec.get("endedAt")) if spec.get("outcome") else None
    return ended is not None and now - ended > retention_seconds


# -- the Kubernetes API (in-cluster) ------------------------------------------------------------
class ApiError(RuntimeError):
    def __init__(self, code: int, message: str):
        super().__init__(f"HTTP {code}: {message}")
        self.code = code


class KubeApi:
    TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    CA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"

    def __init__(self, base_url: Optional[str] = None, token_path: str = TOKEN, context: Optional[ssl.SSLContext] = None):
        if base_url is None:
            host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            base_url = f"https://{host}:{port}"
            context = context or ssl.create_default_context(cafile=self.CA)
        self.base, self.token_path, self.context = base_url, token_path, context

    def _request(self, method: str, path: str, body: Any = None, content_type: str = "application/json"
                 ) -> urllib.request.Request:
        with open(self.token_path, encoding="utf-8") as f:  # re-read: projected tokens rotate
            token = f.read().strip()
        data = None if body is None else json.dumps(body).encode()
        return urllib.request.Request(self.base + path, data=data, method=method, headers={
            "Authorization": f"Bearer {token}", "Content-Type": content_type, "Accept": "application/json"})

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        try:
            with urllib.request.urlopen(self._request(method, path, body, content_type), context=self.context,
                                        timeout=30) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            raise ApiError(error.code, error.read().decode(errors="replace")[:300]) from None

    def watch(self, path: str, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        separator = "&" if "?" in path else "?"
        query = urllib.parse.urlencode({"watch": "true", "resourceVersion": resource_version,
                                        "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout_s)})
        try:
            with urllib.request.urlopen(self._request("GET", f"{path}{separator}{query}"), context=self.context,
                                        timeout=timeout_s + 30) as response:
                for line in response:
                    if line.strip():
                        yield json.loads(line)
        except urllib.error.HTTPError as error:
            raise ApiError(error.code, error.read().decode(errors="replace")[:300]) from None


def records_path(namespace: Optional[str] = None) -> str:
    return f"/apis/{GROUP}/{VERSION}" + (f"/namespaces/{namespace}" if namespace else "") + f"/{PLURAL}"


def log(**fields: Any) -> None:
    print(json.dumps({"time": dt.datetime.now(dt.timezone.utc).isoformat(), **fields}, sort_keys=True), flush=True)


# -- the recorder -------------------------------------------------------------------------------
class Recorder:
    """The recorder's state and its reconcile steps (``run`` drives them from watches)."""

    def __init__(self, api: KubeApi, *, prices: Mapping[str, Mapping[str, float]], containers: Sequence[str],
                 checkpoint_env: str, retention_seconds: float, clock: Callable[[], float] = time.time):
        self.api, self.prices, self.containers = api, prices, tuple(containers)
        self.checkpoint_env, self.retention_seconds, self.clock = checkpoint_env, retention_seconds, clock
        self.records: dict[tuple[str, str], dict[str, Any]] = {}  # (namespace, record name)
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}  # (namespace, job name) -> the current job object
        self.nodes: dict[str, Optional[dict[str, Any]]] = {}
        self.dirty: set[tuple[str, str]] = set()
        self.kinds = [path for path, _ in JOB_KINDS]

    # reading
    def _list(self, path: str, selector: Optional[str] = None) -> tuple[list[dict[str, Any]], str]:
        query = f"?{urllib.parse.urlencode({'labelSelector': selector})}" if selector else ""
        answer = self.api.call("GET", path + query)
        return answer.get("items") or [], (answer.get("metadata") or {}).get("resourceVersion", "")

    def node(self, name: str, *, fresh: bool = False) -> tuple[Optional[dict[str, Any]], bool]:
        """(the node, whether it was read): None and True when it is gone."""
        if fresh or name not in self.nodes:
            try:
                self.nodes[name] = self.api.call("GET", f"/api/v1/nodes/{name}")
            except ApiError as error:
                if error.code != 404:
                    return self.nodes.get(name), False
                self.nodes[name] = None
        return self.nodes[name], True

    def _record_for_job(self, job: Mapping[str, Any]) -> dict[str, Any]:
        meta = job["metadata"]
        key = (meta["namespace"], record_name(meta["name"], meta.get("uid", "")))
        if key not in self.records:
            self.records[key] = new_record(job, self.checkpoint_env, self.clock())
            self.dirty.add(key)
        return self.records[key]

    # events
    def on_job(self, kind: str, event_type: str, job: dict[str, Any]) -> None:
        job = {**job, "kind": job.get("kind") or kind}
        meta = job["metadata"]
        if (meta.get("labels") or {}).get(MANAGED_BY) != MANAGED_BY_VALUE:
            return
        key = (meta["namespace"], meta["name"])
        deleted = event_type == "DELETED"
        current = self.jobs.get(key)
        if deleted:
            if current is not None and current["metadata"].get("uid") == meta.get("uid"):
                del self.jobs[key]
        elif current is None or current["metadata"].get("uid") == meta.get("uid") or \
                (meta.get("creationTimestamp") or "") >= (current["metadata"].get("creationTimestamp") or ""):
            self.jobs[key] = job
        record = self._record_for_job(job)
        if observe_job(record, job, deleted=deleted, now=self.clock()):
            self.dirty.add((meta["namespace"], record["metadata"]["name"]))

    def _job_of_pod(self, pod: Mapping[str, Any]) -> Optional[dict[str, Any]]:
        meta = pod.get("metadata") or {}
        name = (meta.get("labels") or {}).get(JOB_LABEL)
        job = self.jobs.get((meta.get("namespace", ""), name or ""))
        if job is None:
            return None
        # A pod of an earlier run of the name (replaced while its pods ended) is not this run's.
        owners = {o.get("uid") for o in meta.get("ownerReferences") or [] if o.get("kind") == job.get("kind")}
        if owners and job["metadata"].get("uid") not in owners:
            return None
        return job

    def _record_of_pod(self, pod: Mapping[str, Any], job: Optional[Mapping[str, Any]]) -> Optional[dict[str, Any]]:
        meta = pod.get("metadata") or {}
        if job is not None:
            return self._record_for_job(job)
        # The job is gone: the newest record of that name that saw the pod, or that owns it.
        name = (meta.get("labels") or {}).get(JOB_LABEL)
        owners = {o.get("uid", "")[:8] for o in meta.get("ownerReferences") or []}
        candidates = [r for (ns, _), r in self.records.items() if ns == meta.get("namespace")
                      and r["spec"]["job"]["name"] == name]
        for record in candidates:
            if any(a.get("podUid") == meta.get("uid") for a in record["spec"]["attempts"]) or \
                    record["spec"]["job"]["uid"][:8] in owners:
                return record
        return None

    def _fetch_job(self, namespace: str, name: str) -> None:
        """A pod seen before its job (two watches, no order between them): read the job now."""
        for path, kind in JOB_KINDS:
            if path not in self.kinds:
                continue
            group_version, plural = path.rsplit("/", 1)
            try:
                job = self.api.call("GET", f"{group_version}/namespaces/{namespace}/{plural}/{name}")
            except ApiError:
                continue
            self.on_job(kind, "ADDED", job)
            return

    def on_pod(self, event_type: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        name = (meta.get("labels") or {}).get(JOB_LABEL)
        if not name:
            return
        job = self._job_of_pod(pod)
        record = self._record_of_pod(pod, job)
        if job is None and record is None:
            self._fetch_job(meta.get("namespace", ""), name)
            job = self._job_of_pod(pod)
            record = self._record_of_pod(pod, job)
        if record is None:
            return
        node_name = (pod.get("spec") or {}).get("nodeName")
        ended = event_type == "DELETED" or "terminated" in (_container_status(pod, self.containers).get("state") or {})
        node, read = self.node(node_name, fresh=ended) if node_name else (None, False)
        if observe_pod(record, pod, deleted=event_type == "DELETED", node=node, node_read=read, prices=self.prices,
                       containers=self.containers, job=job, now=self.clock()):
            self.dirty.add((meta.get("namespace", ""), record["metadata"]["name"]))

    # writing
    def flush(self) -> int:
        written = 0
        for key in sorted(self.dirty):
            record = self.records.get(key)
            if record is None:
                continue
            record["spec"]["updatedAt"] = now_text(self.clock())
            namespace, name = key
            body = {k: v for k, v in record.items() if k != "status"}
            try:
                if record["metadata"].get("resourceVersion"):
                    stored = self.api.call("PUT", f"{records_path(namespace)}/{name}", body)
                else:
                    stored = self.api.call("POST", records_path(namespace), body)
            except ApiError as error:
                if error.code == 409:  # created or changed meanwhile: take its version, write ours next time
                    try:
                        current = self.api.call("GET", f"{records_path(namespace)}/{name}")
                        record["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                    except ApiError:
                        pass
                    continue
                if error.code == 404:  # the namespace went: nothing to keep it in
                    self.records.pop(key, None)
                    self.dirty.discard(key)
                    continue
                log(event="write-failed", record=f"{namespace}/{name}", error=str(error))
                continue
            record["metadata"]["resourceVersion"] = stored["metadata"]["resourceVersion"]
            self.dirty.discard(key)
            written += 1
        return written

    # relisting
    def resync(self) -> dict[str, str]:
        """Relist everything; returns the resourceVersion to watch each path from."""
        now = self.clock()
        versions: dict[str, str] = {}
        stored, _ = self._list(records_path(), f"{RECORD_LABEL}=true")
        for record in stored:
            key = (record["metadata"]["namespace"], record["metadata"]["name"])
            if key not in self.dirty:
                self.records[key] = record
        live: set[tuple[str, str]] = set()
        jobs: dict[tuple[str, str], dict[str, Any]] = {}
        for path, kind in JOB_KINDS:
            if path not in self.kinds:
                continue
            try:
                items, versions[path] = self._list(path, f"{MANAGED_BY}={MANAGED_BY_VALUE}")
            except ApiError as error:
                if error.code == 404:  # the kind is not installed (Trainer v2 is optional)
                    self.kinds.remove(path)
                    continue
                raise
            for job in items:
                job = {**job, "kind": kind}
                jobs[(job["metadata"]["namespace"], job["metadata"]["name"])] = job
                live.add((job["metadata"]["namespace"], record_name(job["metadata"]["name"], job["metadata"].get("uid", ""))))
        self.jobs = jobs
        for job in jobs.values():
            self.on_job(job["kind"], "MODIFIED", job)
        pods, versions["/api/v1/pods"] = self._list("/api/v1/pods", f"{MANAGED_BY}={MANAGED_BY_VALUE}")
        seen_pods = set()
        for pod in pods:
            seen_pods.add(pod["metadata"].get("uid"))
            self.on_pod("MODIFIED", pod)
        for key, record in list(self.records.items()):
            spec = record["spec"]
            if key not in live and not spec["outcome"]:
                end_run(record, now, last_seen=spec.get("updatedAt"))  # the job went while the recorder was not watching
                self.dirty.add(key)
            elif key in live:
                for attempt in spec["attempts"]:
                    if attempt.get("endedAt") is None and attempt.get("reason") in (RUNNING, PENDING) \
                            and attempt.get("podUid") not in seen_pods:
                        attempt["endedAt"] = spec.get("updatedAt") if attempt.get("startedAt") else None
                        attempt["reason"], attempt["message"] = LOST, "its pod went while the recorder was not watching"
                        self.dirty.add(key)
            if expired(record, now, self.retention_seconds):
                try:
                    self.api.call("DELETE", f"{records_path(key[0])}/{key[1]}")
                except ApiError as error:
                    if error.code != 404:
                        log(event="delete-failed", record=f"{key[0]}/{key[1]}", error=str(error))
                        continue
                self.records.pop(key, None)
                self.dirty.discard(key)
                log(event="expired", record=f"{key[0]}/{key[1]}")
        return versions


def _watch_into(api: KubeApi, path: str, selector: str, version: str, events: "queue.Queue[Any]",
                stop: threading.Event, timeout_s: int) -> None:
    """One watch, resumed until ``stop``; a 410 (or any failure) asks the main loop to relist."""
    query = f"{path}?{urllib.parse.urlencode({'labelSelector': selector})}"
    while not stop.is_set():
        try:
            for event in api.watch(query, version, timeout_s):
                if stop.is_set():
                    return
                kind = event.get("type")
                obj = event.get("object") or {}
                version = (obj.get("metadata") or {}).get("resourceVersion", version)
                if kind == "ERROR":
                    raise ApiError(int(obj.get("code") or 500), str(obj.get("message")))
                if kind != "BOOKMARK":
                    events.put((path, kind, obj))
        except Exception as error:  # noqa: BLE001 - any failure: relist, then watch again
            events.put((path, "RELIST", {"error": str(error)}))
            return


def run(api: KubeApi, recorder: Recorder, *, flush_seconds: float, resync_seconds: float, watch_timeout_s: int = 300,
        stop: Optional[threading.Event] = None) -> None:
    stop = stop or threading.Event()
    while not stop.is_set():
        versions = recorder.resync()
        recorder.flush()
        events: "queue.Queue[Any]" = queue.Queue()
        watch_stop = threading.Event()
        selector = f"{MANAGED_BY}={MANAGED_BY_VALUE}"
        for path, version in versions.items():
            threading.Thread(target=_watch_into, args=(api, path, selector, version, events, watch_stop, watch_timeout_s),
                             daemon=True).start()
        relist_at = time.monotonic() + resync_seconds
        next_flush = time.monotonic() + flush_seconds
        while not stop.is_set() and time.monotonic() < relist_at:
            try:
                path, kind, obj = events.get(timeout=max(0.05, next_flush - time.monotonic()))
            except queue.Empty:
                path = kind = None
            if kind == "RELIST":
                log(event="relist", reason=obj.get("error"))
                break
            if kind is not None:
                if path == "/api/v1/pods":
                    recorder.on_pod(kind, obj)
                else:
                    recorder.on_job(dict(JOB_KINDS)[path], kind, obj)
            if time.monotonic() >= next_flush:
                recorder.flush()
                next_flush = time.monotonic() + flush_seconds
        watch_stop.set()
        recorder.flush()


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="run_recorder")
    parser.add_argument("--prices", required=True, help="JSON: instance type -> {onDemand, spot} USD per hour")
    parser.add_argument("--containers", required=True, help="the trainer containers' names, comma-separated")
    parser.add_argument("--checkpoint-env", required=True, help="the environment variable naming a job's checkpoint directory")
    parser.add_argument("--retention-days", type=float, required=True)
    parser.add_argument("--flush-seconds", type=float, default=2.0)
    parser.add_argument("--resync-seconds", type=float, default=300.0)
    args = parser.parse_args(argv)
    with open(args.prices, encoding="utf-8") as f:
        prices = json.load(f)
    api = KubeApi()
    recorder = Recorder(api, prices=prices, containers=args.containers.split(","), checkpoint_env=args.checkpoint_env,
                        retention_seconds=args.retention_days * 86400)
    log(event="start", retention_days=args.retention_days)
    run(api, recorder, flush_seconds=args.flush_seconds, resync_seconds=args.resync_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
