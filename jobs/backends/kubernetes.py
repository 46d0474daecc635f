"""The cluster backend of the job client: jobs as Kubernetes objects, read and written with the
team's own identity through a ``KubeApi`` (jobs/kube.py: kubectl in production).

Create and replace, list and history, describe and cost, logs and past logs, cancel, pools and
the team's quota in use, checkpoints and the in-cluster restore drill.
"""
from __future__ import annotations

import queue as _queue
import threading
from concurrent.futures import ThreadPoolExecutor
import time
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any, Callable, Iterator, Optional, Sequence

from jobs.access import Identity, identity_from_review, team_of_role, team_problem
from jobs.context import StackContext
from jobs.kube import (RUNRECORDS, CONFIGMAPS, LOCALQUEUES, NAMESPACES, NODES, PODS, PYTORCHJOBS, TRAINJOBS, WORKLOADS, AlreadyExists,
                       KubeApi, KubeError, NoClusterAccess)
from jobs.records import (Admission, Run, run_from_record, ARGOCD_TRACKING_ID, CAPACITY_TYPE_LABEL, FINISHED, GPU_RESOURCE, HISTORY_LABEL, INSTANCE_TYPE_LABEL,
                          KUEUE_JOB_UID, MANAGED_BY, PYTORCH_CONTAINER, TRAINJOB_CONTAINER, TRAINJOB_REPLICATED_JOB, Attempt,
                          Cancelled, Checkpoint, Cost, GitOpsOwned, Job, JobDetail, JobExists, JobNotFound, LogLine, Pod,
                          PoolsView, TeamQuota, UnknownTeam, _containers, _ended, _local_queue_usage, _timestamp, admission_from,
                          container_name, exit_code_meaning, history_record, job_from_history, node_rank, parse_job,
                          pod_selector, _exit_code, _started)
from jobs.store import AttemptRecord, StoreError
from workloads.run_recorder import CANCELLED_AT, JOB_LABEL as RECORD_JOB_LABEL, RECORD_LABEL, REPLACED_AT
from workloads.scheduling import team_namespace, team_of_namespace


class KubernetesBackend:
    """Jobs on the cluster ``kube`` reaches, for the stack of ``ctx``."""

    def __init__(self, ctx: StackContext, kube: KubeApi, *, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep):
        self.ctx = ctx
        self.kube = kube
        self.clock = clock
        self.sleep = sleep
        self._identity: Optional[Identity] = None

    # -- who the caller is -----------------------------------------------------------------------
    def identity(self) -> Identity:
        """The caller as the API server authenticated them (``kubectl auth whoami``), read once."""
        if self._identity is None:
            whoami = getattr(self.kube, "whoami", None)
            try:
                # A transport without whoami, or a server without SelfSubjectReview: unknown.
                self._identity = identity_from_review(whoami()) if whoami is not None else Identity("", ())
            except KubeError:
                self._identity = Identity("", ())
        return self._identity

    def deployed_bucket(self) -> Optional[str]:
        """The checkpoints bucket's deployed name, from the caller's team namespace's platform
        ConfigMap (workloads/trainingjob.py); None when it cannot be read."""
        from workloads.trainingjob import PLATFORM_BUCKET_KEY, PLATFORM_CONFIGMAP

        try:
            teams = self.identity().teams
            namespaces = [team_namespace(teams[0])] if len(teams) == 1 else [t.namespace for t in self.ctx.facts.teams]
            for namespace in namespaces:
                found = self.kube.get(CONFIGMAPS, PLATFORM_CONFIGMAP, namespace)
                if found and (found.get("data") or {}).get(PLATFORM_BUCKET_KEY):
                    return found["data"][PLATFORM_BUCKET_KEY]
        except (KubeError, NoClusterAccess, ValueError):
            return None
        return None

    def team_for(self, team: Optional[str]) -> str:
        """``team``, or the caller's own team: the one team group their identity carries (or the
        team whose IAM role they assumed). ``UnknownTeam`` with the fix when neither says."""
        if team:
            return team
        me = self.identity()
        teams = list(me.teams)
        if not teams and self.ctx.knows_stack and (by_role := team_of_role(self.ctx.facts, me.username)):
            teams = [by_role]
        if len(teams) == 1:
            return teams[0]
        raise UnknownTeam(team_problem(teams, me.username))

    # -- pools and quotas --------------------------------------------------------------------
    def pools(self, team: Optional[str] = None, *, live: bool = True) -> PoolsView:
        """The stack's GPU pools and each team's Kueue quota on them; with ``live``, what each
        team's LocalQueue reports in use now (a cluster that cannot be read leaves the declared
        figures, and ``note`` says why)."""
        facts = self.ctx.facts
        if team:
            self.ctx.check_team(team)
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
            if job.finished:
                raise JobExists(self._finished_message(job), job)
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
        if existing.finished:
            return KubernetesBackend._finished_message(existing)
        return (f"job {existing.name} already exists in {existing.namespace} ({existing.phase}, created "
                f"{existing.created or '?'}): submitting it again would not start a new run (an apply would patch the "
                f"pods of the running one). Fix: submit with --rerun (a new run with its own name, checkpoint directory "
                f"and MLflow run), or with --replace (in Python: replace=True) to delete this one (its pods get SIGTERM "
                f"and time to checkpoint) and start again; it resumes from the newest complete checkpoint in "
                f"{existing.checkpoint_dir or 'its checkpoint directory'}")

    @staticmethod
    def _finished_message(existing: Job) -> str:
        """A finished job's name: a replace would resume its last checkpoint and train nothing."""
        return (f"job {existing.name} in {existing.namespace} has finished ({existing.phase}, created "
                f"{existing.created or '?'}): running it again under its name would resume its newest checkpoint "
                f"and train nothing more, so --replace is refused. Fix: submit with --rerun (a new run "
                f"{existing.name}-r<N> with its own checkpoint directory and MLflow run; add --from-previous to start "
                f"from this run's newest checkpoint), in Python JobClient.rerun(spec)")

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
        self._mark(job, REPLACED_AT)  # the run record's outcome: Replaced
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
                              f"its logs: python -m workloads logs {name} --team {team} --stack {self.ctx.stack or 'STACK'} "
                              f"--attempt N; its checkpoints: python -m workloads checkpoints {name} --team {team} "
                              f"--stack {self.ctx.stack or 'STACK'}")
        raise JobNotFound(f"no job {name!r} in namespace {namespace} (list them: python -m workloads list --team {team} --all)")

    def get(self, name: str, team: Optional[str] = None) -> Job:
        team = self.team_for(team)
        return parse_job(self._raw(name, team))

    def list(self, team: Optional[str] = None, *, include_finished: bool = False) -> list[Job]:
        """The platform's jobs of one team (every team the caller may read without ``team``),
        newest first; finished ones (and cancelled ones, from the history records) only with
        ``include_finished``. An unknown ``team`` raises ``UnknownTeam`` (checked against the
        stack's teams when the client has a stack, else against the cluster's namespaces). Without
        ``team``, a team member (one team group in their identity) gets their own team's jobs; a
        platform engineer (no team group) every team's."""
        if not team:
            teams = self.identity().teams
            team = teams[0] if len(teams) == 1 else None
        if team:
            self.ctx.check_team(team)
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
        elif team and not found and not self.ctx.knows_stack:
            self._check_namespace(team)
        found = [j for j in found if include_finished or not j.finished]
        return sorted(found, key=lambda j: (j.created or "", j.name), reverse=True)

    def history(self, team: Optional[str] = None, *, name: Optional[str] = None) -> list[Job]:
        """The team's removed jobs (phase: their outcome: Succeeded, Failed, Cancelled, Replaced,
        Deleted), newest first."""
        team = self.team_for(team)
        jobs = [j for j in self._history(team_namespace(team)) if name is None or j.name == name]
        return sorted(jobs, key=lambda j: (j.created or "", j.name), reverse=True)

    def runs(self, team: Optional[str] = None, *, name: Optional[str] = None) -> list[Run]:
        """Every run the platform's run recorder kept for the team (of one job name), newest first:
        the job objects that exist and those that are gone, each with its attempts and cost."""
        team = self.team_for(team)
        return self._runs(team_namespace(team), name)

    def _runs(self, namespace: Optional[str], name: Optional[str] = None) -> list[Run]:
        selector = f"{RECORD_LABEL}=true" + (f",{RECORD_JOB_LABEL}={name}" if name else "")
        try:
            records = self.kube.list(RUNRECORDS, namespace, selector)
        except (KubeError, NoClusterAccess):  # no run recorder on this cluster, or a role without the read
            return []
        now = self.clock()
        runs = [r for r in (run_from_record(o, now) for o in records) if r is not None]
        return sorted(runs, key=lambda r: (r.job.created or "", r.job.name), reverse=True)

    def _history(self, namespace: Optional[str]) -> list[Job]:
        """Gone jobs: the run records' (the platform's), then the client's own cancel notes
        (ConfigMaps a team writes; read for runs the recorder did not see)."""
        gone = [r.job for r in self._runs(namespace) if r.outcome]
        try:
            notes = self.kube.list(CONFIGMAPS, namespace, HISTORY_LABEL)
        except (KubeError, NoClusterAccess):  # a role that may read jobs but not ConfigMaps
            notes = []
        recorded = {j.uid for j in gone}
        return gone + [j for j in (job_from_history(o) for o in notes) if j is not None and j.uid not in recorded]


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

    def describe(self, name: str, team: Optional[str] = None) -> JobDetail:
        """The job now (admission, pods, attempts, checkpoints, cost so far); a job whose object
        is gone, from its newest run record."""
        team = self.team_for(team)
        try:
            raw = self._raw(name, team)
        except JobNotFound:
            runs = self._runs(team_namespace(team), name)
            if not runs:
                raise
            return self._gone_detail(runs[0])
        job = parse_job(raw)
        notes: list[str] = []

        def job_workloads() -> list[dict]:
            try:
                return self.kube.list(WORKLOADS, job.namespace, f"{KUEUE_JOB_UID}={job.uid}") if job.uid else []
            except KubeError as exc:
                if "resource type" not in str(exc):
                    raise
                notes.append("Kueue is not installed on this cluster: no admission to show")
                return []

        # Three independent reads, each a round trip to the API server: at once, not one after another.
        with ThreadPoolExecutor(max_workers=3) as pool:
            runs_read = pool.submit(self._runs, job.namespace, name)
            workloads_read = pool.submit(job_workloads)
            pods_read = pool.submit(self.pods, job)
            run = next((r for r in runs_read.result() if r.job.uid == job.uid), None)
            workloads = workloads_read.result()
            pod_objs = pods_read.result()
        admission = admission_from(workloads[0] if workloads else None)
        nodes: dict[str, Optional[dict]] = {}
        pods = tuple(sorted((self._with_record(self._pod(job, p, nodes), p, run) for p in pod_objs),
                            key=lambda p: (p.node_rank, p.name)))
        history: list[AttemptRecord] = []
        steps: list[int] = []
        recorded = run is not None and bool(run.attempts)  # attempts come from the run record
        if job.checkpoint_dir and self.ctx.store_or_none() is not None:
            try:
                steps = self.ctx.store.complete_steps(job.checkpoint_dir)
            except StoreError as exc:
                notes.append(f"checkpoints not read: {exc}")
            try:
                history = self.ctx.store.attempts(job.checkpoint_dir)
            except StoreError as exc:
                if not recorded:  # the launcher's own history only adds checkpoint steps to the record's
                    notes.append(f"attempt history not read: {exc}")
        elif job.checkpoint_dir:
            notes.append("checkpoints need the stack (--stack): they are read from its checkpoints bucket")
        if job.checkpoint_dir and (note := self.ctx.store_note()) is not None:
            notes.append(note)
        if run is not None and run.attempts:
            # The platform's record: every attempt, the preempted and replaced pods' too, with the
            # checkpoint steps of the launcher's own history where it can be read.
            attempts = [_with_steps(a, history) for a in run.attempts]
            cost = run.cost
            if run.dropped_attempts:
                notes.append(f"the run record keeps the newest {len(run.attempts)} attempts ({run.dropped_attempts} older not kept)")
        else:
            attempts = [Attempt(r.node_rank, r.exit_code, exit_code_meaning(r.exit_code), r.step_at_start, r.step_at_end,
                                "history") for r in sorted(history, key=lambda r: (r.started_at or 0, r.node_rank))]
            # The current pods' attempts, unless their launcher already recorded them.
            recorded_ends = {(r.node_rank, round(r.ended_at or 0)) for r in history}
            for pod in pods:
                ended = _timestamp(next((_ended(o, container_name(job)) for o in pod_objs if o["metadata"]["name"] == pod.name), None))
                if pod.exit_code is None or (pod.node_rank, round(ended or 0)) not in recorded_ends:
                    attempts.append(Attempt(pod.node_rank, pod.exit_code, exit_code_meaning(pod.exit_code), None, None, pod.name))
            cost = self._cost(job, pods, pod_objs, history, notes)
        return JobDetail(job, admission, pods, tuple(attempts), tuple(steps), cost, tuple(notes))

    @staticmethod
    def _with_record(pod: Pod, obj: dict, run: Optional[Run]) -> Pod:
        """A pod whose node the caller may not read (a team role): its node's instance and
        capacity type from the run record, which the platform's recorder read."""
        if pod.instance_type or run is None:
            return pod
        uid = obj["metadata"].get("uid")
        match = next((a for a in run.attempts if a.pod_uid == uid and a.instance_type), None) or next(
            (a for a in run.attempts if pod.node and a.node == pod.node and a.instance_type), None)
        if match is None:
            return pod
        return replace(pod, instance_type=match.instance_type, capacity_type=match.capacity_type)

    def _gone_detail(self, run: Run) -> JobDetail:
        """A job whose object is gone (cancelled, replaced, removed after it finished, deleted),
        from its run record: attempts, cost, and where its logs and checkpoints are."""
        job = run.job
        notes = [f"the job object is gone from the cluster ({job.phase.lower()}); this is the platform's run record "
                 f"{run.record}. Its logs: python -m workloads logs {job.name} --team {job.team} --stack "
                 f"{self.ctx.stack or 'STACK'} --attempt N --rank R"]
        steps: list[int] = []
        if job.checkpoint_dir and self.ctx.store_or_none() is not None:
            try:
                steps = self.ctx.store.complete_steps(job.checkpoint_dir)
            except StoreError as exc:
                notes.append(f"checkpoints not read: {exc}")
        return JobDetail(job, Admission(None, False, f"none: the job is {job.phase.lower()}"), (), run.attempts,
                         tuple(steps), run.cost, tuple(notes))


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
    def wait(self, name: str, team: Optional[str] = None, *, until: tuple[str, ...] = FINISHED, timeout_seconds: float = 3600,
             poll_seconds: float = 10) -> Job:
        """Poll until the job's phase is one of ``until`` (TimeoutError after ``timeout_seconds``)."""
        team = self.team_for(team)
        deadline = self.clock() + timeout_seconds
        while True:
            job = self.get(name, team)
            if job.phase in until:
                return job
            if self.clock() >= deadline:
                raise TimeoutError(f"job {name} is still {job.phase} after {timeout_seconds:.0f} s")
            self.sleep(poll_seconds)

    # -- logs -----------------------------------------------------------------------------------
    def logs(self, name: str, team: Optional[str] = None, *, rank: Optional[int] = 0, follow: bool = False,
             poll_seconds: float = 5) -> Iterator[LogLine]:
        """Log lines of one node rank (``rank=None``: every rank, interleaved as they come).
        With ``follow``, a stream that ends (the pod was preempted, killed, replaced) is picked
        up again on the pod that replaces it, until the job finishes: every attempt, every rank.
        Pods deleted before the call (earlier attempts) are gone from the API: ``past_logs``
        reads them from the cluster's container log group."""
        team = self.team_for(team)
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

    def past_logs(self, name: str, team: Optional[str] = None, *, attempt: int, rank: int = 0, archive: Any = None) -> list[LogLine]:
        """Attempt ``attempt`` (1: the first) of one node rank, from the cluster's CloudWatch
        container log group (jobs/past_logs.py): the pods of earlier attempts, and of a job that
        was cancelled or has finished, are gone from the API. ``archive``: a ``LogArchive``
        (default: the stack's group, read with your AWS credentials)."""
        team = self.team_for(team)
        from components.container_logs import team_log_group_name
        from jobs.past_logs import LogArchive, LogArchiveError

        job = self._current_or_past(name, team)
        nodes = job.nodes if job is not None else None
        if nodes is not None and not 0 <= rank < nodes:
            raise ValueError(f"--rank {rank}: job {name} has node ranks 0-{nodes - 1}")
        if attempt < 1:
            raise ValueError(f"--attempt {attempt}: attempts are numbered from 1 (the first run of the pod)")
        if archive is None:
            group = getattr(self.ctx.facts, "container_log_group", None)
            if not group:
                raise LogArchiveError(f"stack {self.ctx.facts.stack} keeps no container logs (monitoring.containerLogs is "
                                      "off): the logs of pods that are gone were not kept")
            # The team's own group (components/container_logs.py): a team's members may read it, and no other.
            archive = LogArchive(team_log_group_name(group, team_namespace(team)), self.ctx.facts.region)
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
    def cancel(self, name: str, team: Optional[str] = None, *, wait: bool = False, timeout_seconds: float = 600,
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
        team = self.team_for(team)
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
        marked = self._mark(job, CANCELLED_AT)  # the run record's outcome: Cancelled
        recorded = self._record(job, "Cancelled") or marked
        self.kube.delete(resource, name, job.namespace, propagation="Foreground")
        gone = False
        if wait:
            deadline = self.clock() + timeout_seconds
            while self.clock() < deadline:
                if self._current(job) is None:
                    gone = True
                    break
                self.sleep(poll_seconds)
        newest, why = None, ""
        if gone and job.checkpoint_dir and self.ctx.store_or_none() is not None:
            try:
                steps = self.ctx.store.complete_steps(job.checkpoint_dir)
                newest = steps[-1] if steps else None
                why = "" if steps else "none complete"
            except StoreError as exc:
                why = str(exc).splitlines()[0] if str(exc) else "the checkpoint store is not readable"
            why = why if why or newest is not None else ""
            if newest is None and (note := self.ctx.store_note()):
                why = f"{why}; {note}" if why else note
        elif gone:
            why = "give --stack to read the stack's checkpoint store" if not self.ctx.knows_stack else "no checkpoint store"
        return Cancelled(name, job.namespace, grace, gone, newest, recorded, why)

    def cancel_sweep(self, sweep: str, team: Optional[str] = None, *, wait: bool = False, timeout_seconds: float = 600,
                     poll_seconds: float = 5, force: bool = False) -> list[Cancelled]:
        """``cancel`` every active job of the sweep (label mlplatform.io/sweep). Checked first,
        cancelled after: a sweep with no active job raises ``JobNotFound``, and one with a job
        Argo CD owns raises ``GitOpsOwned`` before anything is deleted (unless ``force``)."""
        team = self.team_for(team)
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

    def _mark(self, job: Job, annotation: str) -> bool:
        """Say on the job, before it is deleted, why its run ends (the run recorder reads it)."""
        at = datetime.fromtimestamp(self.clock(), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        resource = TRAINJOBS if job.kind == "TrainJob" else PYTORCHJOBS
        try:
            self.kube.patch(resource, job.name, job.namespace, {"metadata": {"annotations": {annotation: at}}})
        except (KubeError, NoClusterAccess):
            return False
        return True

    def _grace_seconds(self, job: Job) -> Optional[int]:
        pods = self.pods(job)
        values = [(p.get("spec") or {}).get("terminationGracePeriodSeconds") for p in pods]
        return max((v for v in values if v is not None), default=None)

    # -- checkpoints ----------------------------------------------------------------------------
    def checkpoints(self, name: str, team: Optional[str] = None, *, verify: Optional[int] = None,
                    checkpoint_dir: Optional[str] = None, image: Optional[str] = None) -> list[Checkpoint]:
        """Complete checkpoint steps of a job, oldest first; ``verify=STEP`` (or -1: the newest)
        runs the restore drill on that step in the team's namespace (``verify_checkpoint_in_cluster``;
        ``image``: the trainer image when the job object is gone). The job
        object may be gone (finished, TTL): its checkpoints stay, found by ``checkpoint_dir``
        (default: the job's own, else the platform's default for the name)."""
        team = self.team_for(team)
        store = self.ctx.store
        if store is None:
            raise StoreError(f"stack {self.ctx.stack} has no checkpoints bucket")
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
        unpickled with that team's rights."""
        from jobs.store import S3Store
        from workloads.checkpoint_drill import JOB_NAME_LABEL, DrillSpec, render_drill, verdict_from_pod

        facts = self.ctx.facts
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


def _with_steps(attempt: Attempt, history: list[AttemptRecord]) -> Attempt:
    """A recorded attempt with the checkpoint steps the launcher wrote for it (same rank, ended
    within a few seconds of it), when that history could be read."""
    ended = _timestamp(attempt.ended_at)
    for row in history:
        if row.node_rank == attempt.node_rank and ended is not None and row.ended_at and abs(row.ended_at - ended) < 30:
            return replace(attempt, step_at_start=row.step_at_start, step_at_end=row.step_at_end)
    return attempt
