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
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence, Union

from jobs.access import Identity
from jobs.backends.kubernetes import KubernetesBackend
from jobs.context import StackContext
from jobs.kube import KubeApi, KubectlApi, NoClusterAccess
# The records and errors the client returns and raises (jobs/records.py), importable from here.
from jobs.records import (  # noqa: F401  (re-exported)
    FINISHED, HISTORY_KEY, HISTORY_LABEL, Admission, Attempt, Cancelled, Checkpoint, Cost, GitOpsOwned, Job, JobDetail,
    JobExists, JobNotFound, LogLine, Pod, PoolsView, PreflightRefused, PreflightResult, Run, Submitted, SweepRefused, TeamQuota,
    UnknownTeam, admission_from, container_name, exit_code_meaning, history_record, history_record_name, job_from_history,
    node_rank, parse_job, pod_selector,
)
from jobs.store import CheckpointStore, StoreError

if TYPE_CHECKING:
    from jobs.devpods import DevPods
    from jobs.sweep import SweepPlan
    from jobs.rerun import Rerun
    from jobs.sweep import SweepResults

ROOT = Path(__file__).resolve().parent.parent
SpecLike = Union[str, Path, Any]


class JobClient:
    """Training jobs of one stack. ``kube`` defaults to kubectl; ``store`` to the stack's
    checkpoints bucket; ``facts`` to the stack's (read lazily: only preflight, submit and
    checkpoints need them). What runs on the cluster is the ``KubernetesBackend``'s
    (jobs/backends/kubernetes.py); this face preflights, renders and hands over."""

    def __init__(self, stack: Optional[str] = None, *, kube: Optional[KubeApi] = None, facts: Any = None,
                 store: Optional[CheckpointStore] = None, offline: bool = False,
                 kubeconfig: Optional[Union[str, Path]] = None, context: Optional[str] = None,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep):
        """``kubeconfig``/``context``: the cluster to talk to (default: $KUBECONFIG, its current
        context); ``kube`` replaces the transport altogether."""
        self.ctx = StackContext(stack, facts=facts, store=store, offline=offline)
        self.cluster = KubernetesBackend(self.ctx, kube if kube is not None else KubectlApi(
            kubeconfig=str(kubeconfig) if kubeconfig is not None else None, context=context), clock=clock, sleep=sleep)
        self.ctx.bucket_lookup = self.cluster.deployed_bucket

    # -- the stack -----------------------------------------------------------------------------
    stack = property(lambda self: self.ctx.stack)
    offline = property(lambda self: self.ctx.offline)
    facts = property(lambda self: self.ctx.facts)
    store = property(lambda self: self.ctx.store)

    @property
    def kube(self) -> KubeApi:
        return self.cluster.kube

    @kube.setter
    def kube(self, value: KubeApi) -> None:
        self.cluster.kube = value

    def store_note(self) -> Optional[str]:
        return self.ctx.store_note()

    def check_team(self, team: str) -> None:
        self.ctx.check_team(team)

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
        ``workloads.problems.InvalidInputError``. Own code (``code``) and ``initFrom`` (against
        the stack's checkpoint store) are checked too (jobs/preflight.py ``check``)."""
        from jobs.preflight import check

        target = str(spec) if isinstance(spec, (str, Path)) else self.load(spec)
        report = check(target, self.facts, repo_root=str(ROOT), mfu=mfu, code=str(code) if code is not None else None,
                       store=self.ctx.store_or_none(), stack=self.stack)
        return PreflightResult(report.ok, report.render(), report.exit_code, report.job.spec if report.job else None,
                               dict(report.figures), report.job, tuple(report.problems))

    def init_from_problems(self, spec) -> list[str]:
        """``initFrom: <job>/step-N`` names a complete checkpoint of the team's job, each problem
        one line (empty when it does, or when the store cannot be read: see ``preflight``)."""
        from jobs.preflight import init_from_check

        store = self.ctx.store_or_none()
        return [] if store is None else [p.render() for p in init_from_check(self.load(spec), store, stack=self.stack)[0]]

    def render(self, spec: SpecLike) -> dict:
        from workloads.trainingjob import render

        return render(self.load(spec), self.facts)

    def submit(self, spec: SpecLike, *, mfu: Optional[float] = None, replace: bool = False,
               code: Optional[Union[str, Path]] = None, checked: Optional[PreflightResult] = None,
               replace_timeout_seconds: float = 900, poll_seconds: float = 5) -> Submitted:
        """Preflight, render, create. Raises ``PreflightRefused`` if it does not fit and
        ``JobExists`` if the team already has a job of that name, unless ``replace``: then that job
        is deleted in the foreground first (its pods get SIGTERM and their grace period to
        checkpoint, as in ``cancel``) and the new one created once it is gone; a finished job is
        never replaced (``rerun``). ``code``: a directory of your own code, packed, pinned by
        digest and uploaded (jobs/usercode.py). ``checked``: this spec's preflight, already run
        (the command line shows it first). What is rendered is the job preflight resolved."""
        import dataclasses

        from workloads.trainingjob import render_resolved

        result = checked if checked is not None else self.preflight(spec, mfu=mfu, code=code)
        if not result.ok or result.spec is None or result.job is None:
            raise PreflightRefused(result)
        job = result.job
        archive = None
        if code is not None:
            from jobs import usercode

            archive = usercode.archive(code)
            # The archive's URI and digest only: pool, team and size stay the ones preflight checked.
            job = dataclasses.replace(job, spec=usercode.pin(job.spec, archive, self.facts.checkpoints_bucket,
                                                             self.facts.stack))
        manifest = render_resolved(job)
        uploaded: list[bool] = []

        def upload() -> None:
            if archive is not None:
                from jobs import usercode

                uploaded.append(usercode.upload(job.spec, archive))

        (created, replaced), = self.create_jobs([manifest], replace=replace, before_write=upload,
                                                 replace_timeout_seconds=replace_timeout_seconds, poll_seconds=poll_seconds)
        return Submitted(created, manifest, replaced=replaced, code_uri=job.spec.code.uri if job.spec.code else None,
                         code_uploaded=bool(uploaded and uploaded[0]))

    def rerun(self, spec: SpecLike, *, suffix: Optional[str] = None, from_previous: bool = False) -> "Rerun":
        """A new run of ``spec`` with its own name, checkpoint directory and MLflow run
        (jobs/rerun.py): ``<name>-r<N>`` over the team's jobs and run records, or
        ``<name>-<suffix>``; ``from_previous``: starting from the previous run's newest complete
        checkpoint. Submit its ``.spec``. Raises ``RerunError`` (one line) for a setting it cannot use."""
        from jobs.rerun import RerunError, plan_rerun

        job_spec = self.load(spec)
        try:
            taken = [j.name for j in self.list(job_spec.team, include_finished=True)]
        except NoClusterAccess as exc:
            if suffix is None:
                raise RerunError("--rerun", True, f"numbering the rerun reads the team's jobs, and {exc}",
                                 "give a suffix (--rerun SUFFIX), or reach the cluster") from None
            taken = []

        def complete_steps(checkpoint_dir: str) -> list[int]:
            store = self.ctx.store_or_none()
            if store is None:
                raise RerunError("--from-previous", True, f"stack {self.stack} has no checkpoint store to read",
                                 "drop --from-previous, or give --stack")
            try:
                return store.complete_steps(checkpoint_dir)
            except StoreError as exc:
                raise RerunError("--from-previous", True, f"the previous run's checkpoints are not readable ({exc})",
                                 "log in to AWS with your team's role, or drop --from-previous") from None

        return plan_rerun(job_spec, taken, suffix=suffix, from_previous=from_previous, complete_steps=complete_steps)

    # -- sweeps -------------------------------------------------------------------------------
    def sweep(self, name: str, team: Optional[str] = None, *, tracking_uri: Optional[str] = None,
              metrics: Sequence[str] = ()) -> "SweepResults":
        """One sweep's points (label mlplatform.io/sweep, finished ones included) with each
        point's latest ``metrics`` (default val_loss, loss) from its MLflow run."""
        from jobs.sweep import DEFAULT_RESULT_METRICS, SweepResults, read_sweep_metrics, sweep_jobs

        jobs = tuple(sweep_jobs(self.list(team, include_finished=True), name))
        found, note = read_sweep_metrics(jobs, name, tracking_uri, tuple(metrics) or DEFAULT_RESULT_METRICS)
        return SweepResults(name=name, jobs=jobs, metrics=found, note=note)

    def plan_sweep(self, job_file: Union[str, Path], sweeps: Sequence[str], *, sweep_name: Optional[str] = None,
                   mfu: Optional[float] = None) -> "SweepPlan":
        """One job per point of the grid (``sweeps``: ``KEY=V1,V2`` each, jobs/sweep.py), each point
        through this client's preflight (initFrom included) and rendered from what it resolved; the
        sweep's cost and quota totals. Nothing is created or printed: ``SweepPlan.lines()`` is what
        the command line prints, ``submit_sweep`` creates the points, all or nothing."""
        from jobs.sweep import plan_sweep

        return plan_sweep(str(job_file), list(sweeps), preflight=lambda spec: self.preflight(spec, mfu=mfu),
                          facts=self.facts, repo_root=str(ROOT), name=sweep_name)

    def submit_sweep(self, job_file: Union[str, Path], sweeps: Sequence[str], *, sweep_name: Optional[str] = None,
                     mfu: Optional[float] = None, replace: bool = False,
                     plan: Optional["SweepPlan"] = None) -> list[tuple[Job, Optional[Job]]]:
        """``plan_sweep`` (or the ``plan`` already made) then ``create_jobs``: every point's name is
        checked before the first is created. A plan with a point that does not preflight raises
        ``SweepRefused`` (its exit code, and the plan) and creates nothing."""
        plan = plan if plan is not None else self.plan_sweep(job_file, sweeps, sweep_name=sweep_name, mfu=mfu)
        if plan.exit_code:
            raise SweepRefused(plan.exit_code, plan)
        return self.create_jobs(list(plan.manifests), replace=replace)

    # -- the cluster ---------------------------------------------------------------------------
    def identity(self) -> Identity:
        """Who the cluster says you are (user, groups, teams): methods given no team use yours."""
        return self.cluster.identity()

    def create_jobs(self, manifests: Sequence[dict], **kwargs: Any) -> list[tuple[Job, Optional[Job]]]:
        return self.cluster.create_jobs(manifests, **kwargs)

    def pools(self, team: Optional[str] = None, *, live: bool = True) -> PoolsView:
        return self.cluster.pools(team, live=live)

    def get(self, name: str, team: Optional[str] = None) -> Job:
        return self.cluster.get(name, team)

    def list(self, team: Optional[str] = None, *, include_finished: bool = False) -> list[Job]:
        return self.cluster.list(team, include_finished=include_finished)

    def history(self, team: Optional[str] = None, *, name: Optional[str] = None) -> list[Job]:
        return self.cluster.history(team, name=name)

    @property
    def dev_pods(self) -> "DevPods":
        """Interactive GPU pods (jobs/devpods.py): ``start(image=...)``, ``list()``, ``stop(name)``."""
        from jobs.devpods import DevPods

        return DevPods(self.cluster)

    def endpoints(self, team: Optional[str] = None) -> list[str]:
        """Where your team's MLflow (and its login), Argo CD and the dashboards are: one line each."""
        from jobs.devpods import endpoints

        return endpoints(self.facts, team or self.cluster.team_for(team))

    def runs(self, team: Optional[str] = None, *, name: Optional[str] = None) -> list[Run]:
        """Every run the platform recorded for the team (of one job name), newest first."""
        return self.cluster.runs(team, name=name)

    def pods(self, job: Job) -> list[dict]:
        return self.cluster.pods(job)

    def describe(self, name: str, team: Optional[str] = None) -> JobDetail:
        return self.cluster.describe(name, team)

    def wait(self, name: str, team: Optional[str] = None, **kwargs: Any) -> Job:
        return self.cluster.wait(name, team, **kwargs)

    def logs(self, name: str, team: Optional[str] = None, **kwargs: Any) -> Iterator[LogLine]:
        return self.cluster.logs(name, team, **kwargs)

    def past_logs(self, name: str, team: Optional[str] = None, **kwargs: Any) -> list[LogLine]:
        return self.cluster.past_logs(name, team, **kwargs)

    def cancel(self, name: str, team: Optional[str] = None, **kwargs: Any) -> Cancelled:
        return self.cluster.cancel(name, team, **kwargs)

    def cancel_sweep(self, sweep: str, team: Optional[str] = None, **kwargs: Any) -> list[Cancelled]:
        return self.cluster.cancel_sweep(sweep, team, **kwargs)

    def checkpoints(self, name: str, team: Optional[str] = None, **kwargs: Any) -> list[Checkpoint]:
        return self.cluster.checkpoints(name, team, **kwargs)

    def verify_checkpoint_in_cluster(self, name: str, team: str, step: int, **kwargs: Any) -> tuple[str, str]:
        return self.cluster.verify_checkpoint_in_cluster(name, team, step, **kwargs)
