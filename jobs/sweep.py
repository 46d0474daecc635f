"""Hyperparameter sweeps: one job spec, one job per point of a grid.

    python -m workloads submit SPEC --stack dev --sweep optimizer.lr=1e-4,3e-4 --sweep data.micro_batch_size=4,8

renders the cartesian product of the values (here 4 jobs), each a normal training job of the
team: preflighted like any job, queued through the team's Kueue LocalQueue under its quota (Kueue
admits as many points at once as the quota holds and queues the rest), labelled
``mlplatform.io/sweep: <sweep>`` so that ``list --sweep NAME`` finds them, and tracked as its own
MLflow run under one parent run of the sweep in one experiment: the pods carry
``TRAINER_SWEEP_ID`` / ``TRAINER_SWEEP_NAME``, from which the trainer's tracking finds or creates
the parent run and sets MLflow's ``mlflow.parentRunId`` tag on the point's run
(trainer/tracking.py).

Swept keys are the trainer's config keys (``optimizer.lr``, ``data.micro_batch_size``, ...; a
``trainer.`` prefix is accepted); every value is typed by the trainer's own parser, and every
mistake (unknown key, empty or repeated values, wrong type, platform-owned key, too many points)
is reported at once with the key, the value and the fix.
"""
from __future__ import annotations

import itertools
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

from trainer.tracking import SWEEP_ID_ENV, SWEEP_NAME_ENV  # what the trainer reads (torch-free module)
from workloads.jobspec import MAX_NAME_LENGTH, PLATFORM_OWNED_OVERRIDES, JobSpec
from workloads.problems import InvalidInputError, Problem

SWEEP_LABEL = "mlplatform.io/sweep"
POINT_ANNOTATION = "mlplatform.io/sweep-point"  # the point's values, JSON {key: value}
# The point's MLflow experiment, so `list --sweep` finds its run without reading the pod template.
EXPERIMENT_ANNOTATION = "mlplatform.io/mlflow-experiment"
# What `list --sweep` shows per point by default: the trainer's held-out loss and its training
# loss (trainer/evaluation.py "val_loss", trainer/train.py "loss"), MLflow's latest value of each.
DEFAULT_RESULT_METRICS = ("val_loss", "loss")
MAX_POINTS = 64  # a larger grid is almost always a typo; split it into several sweeps
_KEY = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)+$")


class SweepError(InvalidInputError):
    """Every problem of the --sweep arguments, one per line."""


@dataclass(frozen=True)
class SweepAxis:
    key: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class SweepPoint:
    index: int
    name: str
    values: Mapping[str, str]
    spec: JobSpec = field(compare=False)

    @property
    def overrides(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.values.items()]


def _split(argument: str) -> tuple[str, list[str]]:
    key, _, values = argument.partition("=")
    return key.strip().removeprefix("trainer."), [v.strip() for v in values.split(",")] if values else []


def parse_sweeps(arguments: Sequence[str], spec: JobSpec, *, repo_root: str) -> list[SweepAxis]:
    """The grid of ``--sweep KEY=V1,V2`` arguments, each key and value checked by the trainer's
    parser against the spec's own config; ``SweepError`` lists every problem."""
    problems: list[Problem] = []
    axes: list[SweepAxis] = []
    seen: set[str] = set()
    for argument in arguments:
        where = f"--sweep {argument}"
        if "=" not in argument:
            problems.append(Problem("--sweep", argument, "is not KEY=V1,V2", "write it like optimizer.lr=1e-4,3e-4"))
            continue
        key, values = _split(argument)
        if not _KEY.match(key):
            problems.append(Problem(where, key, "is not a dotted trainer config key", "e.g. optimizer.lr or data.micro_batch_size"))
            continue
        if key in PLATFORM_OWNED_OVERRIDES:
            problems.append(Problem(where, key, "is set by the platform from the job spec, not swept",
                                    "sweep training settings (optimizer.*, schedule.*, data.micro_batch_size, model.*)"))
            continue
        if key in seen:
            problems.append(Problem(where, key, "is swept twice", "give all its values in one --sweep, comma-separated"))
            continue
        seen.add(key)
        empty = [i for i, v in enumerate(values) if not v]
        if not values or empty:
            problems.append(Problem(where, argument, "has an empty value" if values else "has no values",
                                    f"give values comma-separated, without empty items, e.g. {key}=A,B"))
            continue
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            problems.append(Problem(where, repeated, "repeats values (each point would run twice)", "give each value once"))
            continue
        typed = _trainer_problems(spec, key, values, repo_root)
        if typed:
            problems += [Problem(where, value, message, fix) for value, message, fix in typed]
            continue
        axes.append(SweepAxis(key, tuple(values)))
    if not arguments:
        problems.append(Problem("--sweep", None, "no sweep given", "e.g. --sweep optimizer.lr=1e-4,3e-4"))
    points = 1
    for axis in axes:
        points *= len(axis.values)
    if points > MAX_POINTS:
        problems.append(Problem("--sweep", {a.key: len(a.values) for a in axes}, f"makes {points} jobs, more than {MAX_POINTS}",
                                "sweep fewer values, or split the grid into several sweeps"))
    if problems:
        raise SweepError("--sweep", problems)
    return axes


def _trainer_problems(spec: JobSpec, key: str, values: list[str], repo_root: str) -> list[tuple[Any, str, str]]:
    """(value, message, fix) for a key the trainer does not know, or values its parser refuses."""
    import os

    from trainer.config import ConfigError, build_config

    path = os.path.join(repo_root, spec.trainer.config)
    if not os.path.isfile(path):
        return []  # preflight reports the missing config (with the spec's other problems)
    found = []
    for value in values:
        try:
            build_config(path, [*spec.trainer.overrides, f"{key}={value}"], environ={})
        except ConfigError as exc:
            from jobs.preflight import _trainer_problem

            mine = [_trainer_problem(p, spec.trainer.config) for p in exc.problems if p.startswith(key)]
            if any(p.message == "is not a trainer config key" for p in mine):
                return [(key, "is not a trainer config key", mine[0].fix)]
            found += [(value, p.message, f"give {key} values of the right type") for p in mine]
    return found


def sweep_name(spec: JobSpec, name: Optional[str] = None) -> str:
    return name or spec.name


def sweep_name_problem(name: str) -> Optional[str]:
    """The sweep's name becomes a label value, the points' job names and an environment value
    of every pod: a job name (DNS label), or why not."""
    from workloads.jobspec import MAX_NAME_LENGTH, _DNS_1035

    if _DNS_1035.match(name) and len(name) <= MAX_NAME_LENGTH:
        return None
    return (f"is not a DNS label of at most {MAX_NAME_LENGTH} characters (it names the points' jobs and labels them). "
            "Fix: lowercase letters, digits and '-', starting with a letter, e.g. lr-sweep")


def point_name(base: str, index: int, count: int) -> str:
    """`<base>-<index>`, the base cut so the name stays a job name (MAX_NAME_LENGTH)."""
    suffix = f"-{index:0{len(str(count - 1))}d}"
    return base[: MAX_NAME_LENGTH - len(suffix)].rstrip("-") + suffix


def expand(spec: JobSpec, axes: Sequence[SweepAxis], *, name: Optional[str] = None) -> list[SweepPoint]:
    """One job spec per point of the cartesian product, in a stable order. Every point logs to
    the sweep's experiment and checkpoints in a directory of its own."""
    sweep = sweep_name(spec, name)
    grid = list(itertools.product(*[[(a.key, v) for v in a.values] for a in axes]))
    points = []
    for index, combination in enumerate(grid):
        values = dict(combination)
        job = point_name(sweep, index, len(grid))
        swept = set(values)
        overrides = [o for o in spec.trainer.overrides if o.partition("=")[0] not in swept] + [f"{k}={v}" for k, v in values.items()]
        points.append(SweepPoint(index, job, values, spec.model_copy(update={
            "name": job,
            "trainer": spec.trainer.model_copy(update={"overrides": overrides}),
            "experiment": spec.experiment or sweep,
            "run_name": job,
            "checkpoint_dir": f"{spec.checkpoint_dir}/{job}" if spec.checkpoint_dir else None,
        })))
    return points


def _label(manifest: dict[str, Any], sweep: str, point: SweepPoint, identity: str) -> dict[str, Any]:
    metadata = manifest["metadata"]
    metadata.setdefault("labels", {})[SWEEP_LABEL] = sweep
    metadata.setdefault("annotations", {})[POINT_ANNOTATION] = json.dumps(dict(point.values), sort_keys=True)
    metadata["annotations"][EXPERIMENT_ANNOTATION] = point.spec.experiment_name
    env = [{"name": SWEEP_ID_ENV, "value": identity}, {"name": SWEEP_NAME_ENV, "value": sweep}]
    if manifest["kind"] == "PyTorchJob":
        for replica in manifest["spec"]["pytorchReplicaSpecs"].values():
            replica["template"]["metadata"].setdefault("labels", {})[SWEEP_LABEL] = sweep
            for container in replica["template"]["spec"]["containers"]:
                container["env"] = [*container.get("env", []), *env]
    else:  # TrainJob: the trainer's env and the runtime patch's pod labels
        manifest["spec"]["trainer"]["env"] = [*manifest["spec"]["trainer"].get("env", []), *env]
        for patch in manifest["spec"].get("runtimePatches", []):
            for job in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
                job["template"]["spec"]["template"]["metadata"].setdefault("labels", {})[SWEEP_LABEL] = sweep
    return manifest


def render_sweep(points: Sequence[SweepPoint], facts: Any, *, sweep: str) -> list[dict[str, Any]]:
    """The job objects of every point, labelled and given the sweep's identity."""
    from workloads.trainingjob import render

    manifests = []
    for point in points:
        manifests.append(_label(render(point.spec, facts), sweep, point, sweep_id(point.spec.namespace, sweep)))
    return manifests


# -- the results table (`list --sweep NAME`) ----------------------------------------------------------
def _get(job: Any, name: str, default: Any = None) -> Any:
    if isinstance(job, Mapping):
        return job.get(name, default)
    return getattr(job, name, default)


def _metadata(job: Any) -> tuple[str, Mapping[str, str], Mapping[str, str]]:
    """(name, labels, annotations) of a job object (the client's typed job, or a Kubernetes object)."""
    metadata = _get(job, "metadata")
    if isinstance(metadata, Mapping):
        return str(metadata.get("name", "")), metadata.get("labels") or {}, metadata.get("annotations") or {}
    return str(_get(job, "name", "")), _get(job, "labels", None) or {}, _get(job, "annotations", None) or {}


def _phase(job: Any) -> str:
    phase = _get(job, "phase")
    if phase:
        return str(getattr(phase, "value", phase))
    conditions = ((_get(job, "status") or {}).get("conditions") or []) if isinstance(_get(job, "status"), Mapping) else []
    true = [c.get("type", "") for c in conditions if str(c.get("status")) == "True"]
    return true[-1] if true else "Pending"


def sweep_jobs(jobs: Iterable[Any], sweep: str) -> list[Any]:
    return [j for j in jobs if _metadata(j)[1].get(SWEEP_LABEL) == sweep]


def sweep_id(namespace: str, sweep: str) -> str:
    """The sweep's identity in MLflow (tag trainer.sweep_id of every point's run and the parent)."""
    return f"{namespace}.{sweep}"


def sweep_metrics(jobs: Iterable[Any], sweep: str, client: Any,
                  metric_names: Sequence[str] = DEFAULT_RESULT_METRICS) -> dict[str, dict[str, float]]:
    """Each point's latest value of ``metric_names`` from its MLflow run: the runs of the sweep's
    experiment tagged with its sweep id, the parent run left out, matched to a job by run name
    (``submit --sweep`` names each point's run after its job). ``client``: an MlflowClient."""
    from trainer.tracking import SWEEP_PARENT_TAG, SWEEP_TAG

    wanted: dict[tuple[str, str], set[str]] = {}  # (experiment, sweep id) -> job names
    for job in sweep_jobs(jobs, sweep):
        name, _, annotations = _metadata(job)
        experiment = annotations.get(EXPERIMENT_ANNOTATION)
        namespace = _get(job, "namespace") or (_get(job, "metadata") or {}).get("namespace")
        if experiment and namespace:
            wanted.setdefault((experiment, sweep_id(namespace, sweep)), set()).add(name)
    found: dict[str, dict[str, float]] = {}
    for (experiment_name, identity), names in wanted.items():
        experiment = client.get_experiment_by_name(experiment_name)
        if experiment is None:
            continue
        runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{SWEEP_TAG}` = '{identity}'",
                                  max_results=1000, order_by=["attributes.start_time ASC"])
        for run in runs:  # oldest first: a later run of the same point (a re-submit) wins
            if run.data.tags.get(SWEEP_PARENT_TAG) == "true" or run.info.run_name not in names:
                continue
            found[run.info.run_name] = {m: run.data.metrics[m] for m in metric_names if m in run.data.metrics}
    return found


def read_sweep_metrics(jobs: Sequence[Any], sweep: str, tracking_uri: Optional[str],
                       metric_names: Sequence[str] = DEFAULT_RESULT_METRICS) -> tuple[dict[str, dict[str, float]], str]:
    """``sweep_metrics`` from the MLflow at ``tracking_uri`` (default MLflow's own
    ``MLFLOW_TRACKING_URI``; credentials from MLflow's variables), and a one-line note when the
    results cannot be read (no URI, no mlflow package, the server down): the table still prints."""
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        return {}, ("results: set MLFLOW_TRACKING_URI (and MLFLOW_TRACKING_USERNAME/PASSWORD) or pass --tracking-uri "
                    "to show each point's " + ", ".join(metric_names))
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        return {}, "results: the mlflow package is not installed here (pip install 'ml-training-platform[trainer]')"
    # MLflow retries an unreachable server with backoff for minutes by default; a listing should
    # say so in seconds (the user's own settings win).
    fast = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
    added = [k for k in fast if k not in os.environ]
    os.environ.update({k: fast[k] for k in added})
    try:
        return sweep_metrics(jobs, sweep, MlflowClient(tracking_uri=uri), metric_names), ""
    except Exception as exc:  # noqa: BLE001 - any MLflow/HTTP failure is one line; the table is still useful
        return {}, f"results: MLflow at {uri} could not be read ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
    finally:
        for key in added:
            os.environ.pop(key, None)


@dataclass(frozen=True)
class SweepResults:
    """One sweep: its jobs (finished ones included), each point's metrics by job name, and a note
    when the metrics could not be read."""
    name: str
    jobs: tuple[Any, ...]
    metrics: Mapping[str, Mapping[str, float]]
    note: str = ""

    def table(self, sort_by: Optional[str] = None) -> str:
        return results_table(self.jobs, self.name, metrics=self.metrics, sort_by=sort_by)


def results_table(jobs: Iterable[Any], sweep: str, *, metrics: Optional[Mapping[str, Mapping[str, float]]] = None,
                  sort_by: Optional[str] = None) -> str:
    """A plain-text table of one sweep: a row per point (job, phase, swept values, metrics).

    ``jobs`` are job objects as the job client returns them (attributes ``name``, ``labels``,
    ``annotations``, ``phase``) or Kubernetes objects; ``metrics`` maps a job name to its
    final metrics (e.g. from its MLflow run: {"val_loss": 3.21}). Rows are sorted by ``sort_by``
    (a metric, ascending; default the first metric), points without it last."""
    rows = []
    keys: list[str] = []
    metric_names: list[str] = []
    for job in sweep_jobs(jobs, sweep):
        name, _, annotations = _metadata(job)
        try:
            values = json.loads(annotations.get(POINT_ANNOTATION, "{}"))
        except ValueError:
            values = {}
        keys += [k for k in values if k not in keys]
        found = dict((metrics or {}).get(name, {}) or _get(job, "metrics", None) or {})
        metric_names += [m for m in found if m not in metric_names]
        rows.append((name, _phase(job), values, found))
    if not rows:
        return f"no jobs of sweep {sweep!r}"
    order = sort_by or (metric_names[0] if metric_names else None)
    rows.sort(key=lambda r: (order is None or order not in r[3], r[3].get(order, 0.0) if order else 0.0, r[0]))
    header = ["job", "phase", *keys, *metric_names]
    table = [header] + [[name, phase, *(str(values.get(k, "")) for k in keys),
                         *(f"{found[m]:.4g}" if isinstance(found.get(m), (int, float)) else "" for m in metric_names)]
                        for name, phase, values, found in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in table]
    return "\n".join([f"sweep {sweep}: {len(rows)} job(s)" + (f", sorted by {order}" if order else ""), *lines])


# -- the whole sweep's cost and quota --------------------------------------------------------------
def _usd(value: float) -> str:
    return f"${value:,.2f}" if value < 100 else f"${value:,.0f}"


def _point_cost(figures: Mapping[str, Any]) -> str:
    if "cost_on_demand_usd" not in figures:
        return "cost not estimated"
    spot = figures.get("cost_spot_usd")
    return f"on-demand {_usd(figures['cost_on_demand_usd'])}" + (f", spot ~{_usd(spot)}" if spot is not None else "")


def sweep_totals(figures: Sequence[Mapping[str, Any]], facts: Any, team: str) -> list[str]:
    """The sweep as one bill and one queue: the points' preflight figures summed (USD, GPU-hours,
    GPUs at once), and what the team's Kueue quota on the pool admits at once (every point is
    created together: what the nominal quota does not hold waits in the LocalQueue, or borrows
    idle GPUs of the cohort while the team may borrow; preflight's own quota rules, summed)."""
    if not figures:
        return []
    count = len(figures)
    world = int(figures[0].get("world_size") or 0)
    gpus = sum(int(f.get("world_size") or 0) for f in figures)
    gpu_hours = sum(int(f.get("world_size") or 0) * float(f.get("run_hours") or 0) for f in figures)
    priced = [f for f in figures if "cost_on_demand_usd" in f]
    cost = f"on-demand {_usd(sum(f['cost_on_demand_usd'] for f in priced))}"
    if priced and all("cost_spot_usd" in f for f in priced):
        cost += f", spot ~{_usd(sum(f['cost_spot_usd'] for f in priced))}"
    if len(priced) < count:
        cost += f" ({count - len(priced)} point(s) not priced)"
    lines = [f"sweep total    {count} job(s) x {world} GPU(s) = {gpus} GPUs at once; {gpu_hours:,.2f} GPU-hours; {cost}"]
    pool = facts.pool(str(figures[0].get("pool") or ""))
    tenant = facts.team(team)
    if pool is None or tenant is None or not world:
        return lines
    flavor = pool.kueue_flavor or ""
    quota = int(tenant.gpu_quota.get(flavor, 0))
    cohort = sum(int(t.gpu_quota.get(flavor, 0)) for t in facts.teams)
    ceiling = cohort if tenant.borrowing else quota
    longest = max(float(f.get("run_hours") or 0) for f in figures)
    head = f"sweep quota    team {team} has {quota} nominal GPUs on pool {pool.name}"
    head += f" (may borrow up to the cohort's {cohort})" if tenant.borrowing else " (may not borrow)"
    if gpus <= quota:
        return lines + [f"{head}: all {count} run at once"]
    own, most = quota // world, ceiling // world
    if most == 0:
        return lines + [f"{head}: no point can ever be admitted ({world} GPUs each). Fix: fewer GPUs per point, or a "
                        "larger quota"]
    waves = -(-count // max(own, 1))
    waiting = count - own
    text = (f"{head}: the sweep will queue. {own} run at once on the team's quota, the other {waiting} wait in "
            f"Kueue until GPUs free up")
    if most > own:
        text += f" (up to {min(most, count)} at once while the cohort's GPUs are idle)"
    if own:
        text += f"; ~{waves} wave(s) x {longest:.2f} h = ~{waves * longest:.2f} h on the team's own quota"
    return lines + [text]


# -- `submit --sweep`: the plan ----------------------------------------------------------------------
@dataclass(frozen=True)
class PointPlan:
    point: SweepPoint
    result: Any  # jobs.records.PreflightResult: the client's preflight of the point (initFrom included)


@dataclass(frozen=True)
class SweepPlan:
    """Every point preflighted and, when all fit, rendered from what preflight resolved; the
    sweep's totals. Pure data: ``lines()`` is what ``submit --sweep`` prints."""

    name: str
    spec: Optional[JobSpec]
    points: tuple[PointPlan, ...] = ()
    exit_code: int = 0  # 0 every point fits; 2 bad input (spec, --sweep values, a point); 3 a point does not fit
    error: str = ""  # a refusal before any point: the spec or the sweep values
    totals: tuple[str, ...] = ()
    manifests: tuple[dict[str, Any], ...] = ()

    def lines(self, *, dry_run: bool = False) -> list[str]:
        """The report: one line per point, its problems under it; the totals; what happens next."""
        if self.error:
            return [self.error]
        out = []
        for plan in self.points:
            figures, values = plan.result.figures, ", ".join(plan.point.overrides)
            if plan.result.ok:
                out.append(f"{plan.point.name} ({values}): OK on {figures.get('instance_type')}, "
                           f"~{figures.get('run_hours', 0):.1f} h, {_point_cost(figures)}")
                continue
            problems = plan.result.problems
            out.append(f"{plan.point.name} ({values}): {plan.result.text.splitlines()[-len(problems) - 1]}")
            out += [f"  - [{p.kind}] {p.render()}" for p in problems]
        if self.exit_code:
            return out
        out += list(self.totals)
        assert self.spec is not None
        if dry_run:
            out.append(f"sweep {self.name}: {len(self.points)} job(s) for {self.spec.namespace} rendered below; nothing "
                       "submitted (--dry-run)")
        else:
            out.append(f"sweep {self.name}: {len(self.points)} job(s) in {self.spec.namespace}, queued by Kueue under the "
                       f"team's quota; see them with: python -m workloads list --sweep {self.name} --team {self.spec.team}")
        return out


def plan_sweep(job_file: str, sweeps: Sequence[str], *, preflight: Any, facts: Any, repo_root: str,
               name: Optional[str] = None) -> SweepPlan:
    """One job per point of the grid, each through ``preflight`` (``JobClient.preflight``: the same
    checks as one job, initFrom included): every problem at once, each under its job's name. The
    points are rendered from the jobs preflight resolved (no second resolution)."""
    from jobs.preflight import EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT
    from workloads.jobspec import SpecFileError
    from workloads.trainingjob import render_resolved

    try:
        base = preflight(job_file)
    except SpecFileError as exc:
        return SweepPlan("", None, exit_code=EXIT_BAD_INPUT, error=f"error: {exc}")
    if base.spec is None:
        return SweepPlan("", None, exit_code=base.exit_code or EXIT_BAD_INPUT, error=base.text)
    spec = base.spec
    try:
        axes = parse_sweeps(sweeps, spec, repo_root=repo_root)
    except SweepError as exc:
        return SweepPlan("", spec, exit_code=EXIT_BAD_INPUT, error=f"error: {exc}")
    sweep = sweep_name(spec, name)
    if (problem := sweep_name_problem(sweep)) is not None:
        return SweepPlan(sweep, spec, exit_code=EXIT_BAD_INPUT, error=f"error: --sweep-name {sweep!r}: {problem}")
    points = tuple(PointPlan(point, preflight(point.spec)) for point in expand(spec, axes, name=sweep))
    worst = 0
    for plan in points:
        code = plan.result.exit_code
        if code:
            worst = EXIT_BAD_INPUT if EXIT_BAD_INPUT in (worst, code) else max(worst, code)
    if worst:
        return SweepPlan(sweep, spec, points, worst if worst in (EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT) else EXIT_BAD_INPUT)
    identity = sweep_id(spec.namespace, sweep)
    manifests = tuple(_label(render_resolved(p.result.job), sweep, p.point, identity) for p in points)
    return SweepPlan(sweep, spec, points, 0, "", tuple(sweep_totals([p.result.figures for p in points], facts, spec.team)),
                     manifests)
