"""`python -m workloads list | describe | logs | cancel | pools | checkpoints | data upload`: a thin layer
over ``jobs.client.JobClient`` and ``jobs.data``.

    python -m workloads list [--team T] [--all] [--stack S]
    python -m workloads describe JOB --team T [--stack S]
    python -m workloads logs JOB --team T [-f] [--rank N | --all]
    python -m workloads logs JOB --team T --stack S --attempt N [--rank N]   # from CloudWatch
    python -m workloads cancel JOB --team T [--wait]
    python -m workloads cancel --sweep NAME --team T [--wait]
    python -m workloads pools --stack S [--team T] [--declared]   # GPU pools, quotas, in use now
    python -m workloads checkpoints JOB --team T --stack S [--verify [STEP] [--image IMAGE]]
    python -m workloads data upload DIR --dataset NAME --team T --stack S

Each failure is one line on stderr and a stable exit code (jobs/exit_codes.py): 2 bad input,
3 a dev pod not admitted, 4 no cluster or bucket access (no kubectl, no kubeconfig, unreachable,
forbidden: with your team's `aws eks update-kubeconfig` line), 6 no such job, 7 a job of that name
exists; kubectl's own messages are never shown raw.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Optional

from jobs.exit_codes import BAD_INPUT as EXIT_SPEC, EXISTS as EXIT_EXISTS, FAILED as EXIT_FAILED, \
    INTERRUPTED as EXIT_INTERRUPTED, NO_CLUSTER as EXIT_NO_CLUSTER, NOT_FOUND as EXIT_NOT_FOUND, OK as EXIT_OK, \
    REFUSED as EXIT_REFUSED


def client_for(args, *, facts=None, **kwargs):
    """The JobClient every command uses: the stack's (or the --facts file's) facts, kubectl with
    $KUBECONFIG (or --kubeconfig/--context where a command has them)."""
    from jobs.client import JobClient

    if facts is None and getattr(args, "facts", None):
        import json
        from pathlib import Path

        from workloads.platform_facts import PlatformFacts

        facts = PlatformFacts.from_dict(json.loads(Path(args.facts).read_text()))
    return JobClient(stack=getattr(args, "stack", None) or (facts.stack if facts else None),
                     offline=getattr(args, "offline", False), facts=facts, **kwargs)



def no_access_message(args, exc: Exception) -> str:
    """The access error in one line, with the team's `aws eks update-kubeconfig` line from the
    stack's facts (jobs/access.py). Best effort: advice never becomes a second failure."""
    from jobs.access import access_error
    from jobs.kube import Forbidden

    facts = identity = None
    if getattr(args, "stack", None) or getattr(args, "facts", None):
        try:
            facts = client_for(args).facts
        except Exception:  # noqa: BLE001 - no facts: the advice names the placeholders instead
            facts = None
    forbidden = isinstance(exc, Forbidden)
    if forbidden:
        try:
            identity = client_for(args, facts=facts).identity()
        except Exception:  # noqa: BLE001 - who the caller is only sharpens the advice
            identity = None
    team = getattr(args, "team", None) or (identity.teams[0] if identity is not None and len(identity.teams) == 1 else None)
    return access_error(str(exc), facts, team, forbidden=forbidden, identity=identity)


def guarded(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """One line and an exit code for every way the cluster or the bucket can be out of reach."""

    def wrapper(args: argparse.Namespace) -> int:
        from jobs.client import JobExists, JobNotFound
        from jobs.kube import KubeError, NoClusterAccess
        from jobs.store import StoreError
        from workloads.problems import InvalidInputError

        try:
            return run(args)
        except NoClusterAccess as exc:
            print(f"error: {no_access_message(args, exc)}", file=sys.stderr)
            return EXIT_NO_CLUSTER
        except JobNotFound as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_NOT_FOUND
        except JobExists as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_EXISTS
        except TimeoutError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_FAILED
        except StoreError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_NO_CLUSTER
        except (KubeError, ValueError, InvalidInputError, FileNotFoundError) as exc:
            print(f"error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}" if not isinstance(exc, InvalidInputError)
                  else f"error: {exc}", file=sys.stderr)
            return EXIT_SPEC
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED

    return wrapper


# -- list ----------------------------------------------------------------------------------
def cmd_list(args) -> int:
    if args.sweep:
        from jobs.sweep import DEFAULT_RESULT_METRICS

        results = client_for(args).sweep(args.sweep, args.team, tracking_uri=args.tracking_uri,
                                      metrics=args.metric or DEFAULT_RESULT_METRICS)
        print(results.table(sort_by=args.sort_by))
        if results.note:
            print(results.note)
        return EXIT_OK
    jobs = client_for(args).list(args.team, include_finished=args.all)
    if not jobs:
        print(f"no {'' if args.all else 'active '}jobs{' of team ' + args.team if args.team else ''}"
              f"{'' if args.all else ' (--all shows finished and cancelled ones too)'}")
        return EXIT_OK
    rows = [("NAME", "TEAM", "KIND", "PHASE", "NODES x GPUS", "POOL", "CREATED")]
    rows += [(j.name, j.team, j.kind, j.phase, f"{j.nodes} x {j.gpus_per_node}", j.pool or "-", j.created or "-") for j in jobs]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return EXIT_OK


# -- describe ------------------------------------------------------------------------------
def render_detail(detail) -> str:
    job = detail.job
    out = [f"{job.kind} {job.namespace}/{job.name}: {job.phase}" + (f" ({job.message})" if job.message else ""),
           f"  size: {job.nodes} node(s) x {job.gpus_per_node} GPU(s), pool {job.pool or '-'}, created {job.created or '-'}",
           f"  Kueue: {detail.admission.reason}" + (f" [Workload {detail.admission.workload}]" if detail.admission.workload else "")]
    out.append("  pods:" if detail.pods else "  pods: none (queued, finished, or between attempts)")
    for pod in detail.pods:
        where = f"{pod.node} ({pod.instance_type or '?'}, {pod.capacity_type or '?'})" if pod.node else "not scheduled"
        state = pod.phase + (", terminating" if pod.deleting else "")
        code = f", exit {pod.exit_code}: {_meaning(pod.exit_code)}" if pod.exit_code is not None else ""
        out.append(f"    rank {pod.node_rank}  {pod.name}  {state} on {where}{code}")
    out.append("  attempts:" if detail.attempts else "  attempts: none recorded yet")
    for n, attempt in enumerate(detail.attempts, 1):
        out.append(f"    {n}. {render_attempt(attempt)}")
    out.append(f"  checkpoints: {', '.join(str(s) for s in detail.checkpoint_steps) or 'none complete yet'}")
    if detail.cost is not None:
        out.append(f"  cost so far: ${detail.cost.usd:,.2f} ({detail.cost.node_hours:.2f} node-hours; {detail.cost.basis})")
    out += [f"  note: {n}" for n in detail.notes]
    return "\n".join(out)


def render_attempt(attempt) -> str:
    """One attempt: rank, exit code and what it means, why it ended, where and when it ran."""
    steps = ""
    if attempt.step_at_start is not None or attempt.step_at_end is not None:
        steps = f", checkpoint step {attempt.step_at_start} -> {attempt.step_at_end}"
    if attempt.exit_code is not None:
        code = f"exit {attempt.exit_code}"
    else:
        code = {"pending": "not started", "lost": "no exit code", "cancel": "stopped"}.get(attempt.reason, "running")
    reason = f" [{attempt.reason}]" if attempt.reason and attempt.reason not in ("running", "pending") else ""
    where = ""
    if attempt.node or attempt.instance_type:
        where = f" on {attempt.instance_type or '?'} {attempt.capacity_type or '?'} ({attempt.node or '?'})"
    when = ""
    if attempt.started_at:
        when = f", {attempt.started_at} -> {attempt.ended_at or 'now'}"
    return f"rank {attempt.node_rank}: {code} ({attempt.meaning}){reason}{where}{when}{steps}"


def _meaning(code: Optional[int]) -> str:
    from jobs.client import exit_code_meaning

    return exit_code_meaning(code)


def cmd_describe(args) -> int:
    print(render_detail(client_for(args).describe(args.name, args.team)))
    return EXIT_OK


# -- history -------------------------------------------------------------------------------
def cmd_history(args) -> int:
    """Every run the platform recorded for the team (the gone ones too): outcome, attempts, cost."""
    runs = client_for(args).runs(args.team, name=args.name)
    if not runs:
        print("no run recorded" + (f" of job {args.name}" if args.name else "")
              + " (the platform's run recorder keeps them; list --all shows the jobs that still exist)")
        return EXIT_OK
    rows = [("RUN", "NAME", "OUTCOME", "ATTEMPTS", "PREEMPTED", "NODE-HOURS", "COST", "CREATED", "ENDED")]
    for run in runs:
        preempted = sum(1 for a in run.attempts if a.reason == "preemption")
        rows.append((run.record, run.job.name, run.job.phase, str(len(run.attempts) + run.dropped_attempts), str(preempted),
                     f"{run.cost.node_hours:.2f}" if run.cost else "?", f"${run.cost.usd:,.2f}" if run.cost else "?",
                     run.job.created or "-", run.ended_at or "-"))
    print("\n".join(_table(rows)))
    return EXIT_OK


# -- logs ----------------------------------------------------------------------------------
def cmd_logs(args) -> int:
    rank = None if args.all else (args.worker + 1 if args.worker is not None else args.rank)
    if args.attempt is not None:
        if args.follow or rank is None:
            raise ValueError(f"--attempt {args.attempt} reads one finished attempt of one rank: drop "
                             f"{'-f' if args.follow else '--all'} (give --rank N)")
        for line in client_for(args).past_logs(args.name, args.team, attempt=args.attempt, rank=rank):
            print(line.text, flush=True)
        return EXIT_OK
    prefix = args.all
    last = None
    for line in client_for(args).logs(args.name, args.team, rank=rank, follow=args.follow):
        if not prefix and last not in (None, line.pod):
            print(f"--- {line.pod} (attempt {line.attempt}) ---", flush=True)
        last = line.pod
        print(str(line) if prefix else line.text, flush=True)
    return EXIT_OK


# -- cancel --------------------------------------------------------------------------------
def cmd_cancel(args) -> int:
    if (args.name is None) == (args.sweep is None):
        raise ValueError("cancel takes a job name or --sweep NAME (every active job of the sweep), not "
                         + ("both" if args.name else "neither"))
    if args.sweep is not None:
        return _cancel_sweep(args)
    result = client_for(args).cancel(args.name, args.team, wait=args.wait, timeout_seconds=args.timeout, force=args.force)
    grace = f"{result.grace_seconds} s" if result.grace_seconds is not None else "their grace period"
    print(f"cancelling {result.namespace}/{result.name}: its pods get SIGTERM and {grace} to save a checkpoint "
          "and exit 143; then the job is removed" + (" (list --all keeps it as Cancelled)" if result.recorded else ""))
    if not result.recorded:
        print(f"note: its history record (ConfigMap {result.namespace}/job-history-{result.name}-...) could not be written: "
              "list --all will not show it once it is gone", file=sys.stderr)
    if args.wait:
        if result.gone:
            newest = (result.newest_checkpoint if result.newest_checkpoint is not None
                      else f"unknown ({result.checkpoint_note or 'not read'})")
            print(f"removed; newest complete checkpoint: {newest}")
        else:
            print(f"still terminating after {args.timeout:.0f} s", file=sys.stderr)
            return EXIT_FAILED
    return EXIT_OK


def _cancel_sweep(args) -> int:
    results = client_for(args).cancel_sweep(args.sweep, args.team, wait=args.wait, timeout_seconds=args.timeout,
                                         force=args.force)
    for result in results:
        print(f"cancelling {result.namespace}/{result.name}: SIGTERM, checkpoint, exit 143; then removed")
    print(f"sweep {args.sweep}: {len(results)} job(s) cancelled" + (" (list --all keeps them as Cancelled)"
                                                                      if all(r.recorded for r in results) else ""))
    if args.wait and not all(r.gone for r in results):
        print(f"still terminating after {args.timeout:.0f} s: {', '.join(r.name for r in results if not r.gone)}",
              file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


# -- dev pods and endpoints ----------------------------------------------------------------


def cmd_dev(args) -> int:
    """An interactive GPU pod (jobs/devpods.py): start it, list them, stop one."""
    import subprocess

    from jobs.devpods import DevPodRefused

    client = client_for(args)
    pods = client.dev_pods
    if args.list:
        found = pods.list(args.team)
        if not found:
            print("no dev pods (start one: python -m workloads dev --image IMAGE)")
        rows = [("NAME", "OWNER", "POOL", "PHASE", "KUEUE")] + [(d.name, d.owner, d.pool, d.phase, d.reason) for d in found]
        if found:
            print("\n".join(_table(rows)))
        return EXIT_OK
    if args.stop:
        pods.stop(args.stop, args.team)
        print(f"stopping {args.stop}: its pod gets SIGTERM; the slice is free once it is gone")
        return EXIT_OK
    if not args.image:
        raise ValueError("--image is required: the image with your libraries and JupyterLab. Fix: build your training "
                         "image's dev variant (docker build -f trainer/Dockerfile.dev --build-arg TRAINER_IMAGE=<image> "
                         "-t <image>-dev .) and give --image <image>-dev")
    try:
        dev = pods.start(image=args.image, team=args.team, pool=args.pool, idle=args.idle, max_life=args.max,
                         wait_seconds=args.wait)
        print(f"dev pod {dev.namespace}/{dev.name} on {dev.pool}: {dev.reason}; it stops after {args.idle} unused, at "
              f"most after {args.max} (python -m workloads dev --stop {dev.name})", flush=True)
        dev = pods.wait_running(dev, wait_seconds=args.start_timeout)
    except DevPodRefused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    if dev.phase != "Running":
        print(f"its pod is {dev.phase} after {args.start_timeout:.0f} s (a node is starting?); forward later: "
              f"{' '.join(dev.forward_command(args.port))}")
        return EXIT_OK
    print(f"notebook: {dev.url(args.port)}")
    argv = client.kube.port_forward_argv(dev.namespace, dev.pod, args.port, 8888) if hasattr(
        client.kube, "port_forward_argv") else dev.forward_command(args.port)
    if args.no_forward:
        print(f"forward it: {' '.join(argv)}")
        return EXIT_OK
    print(f"forwarding 127.0.0.1:{args.port} to {dev.pod} (Ctrl-C ends the forward; the pod stays until idle)", flush=True)
    return subprocess.call(argv)


def cmd_endpoints(args) -> int:
    client = client_for(args)
    team = args.team or client.cluster.team_for(None)
    client.check_team(team)
    print("\n".join(client.endpoints(team)))
    return EXIT_OK


# -- pools ---------------------------------------------------------------------------------
def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def cmd_pools(args) -> int:
    client = client_for(args)
    view = client.pools(args.team, live=not args.declared)
    facts = client.facts
    print(f"GPU pools of stack {facts.stack} (Karpenter NodePools; MAX GPUS: the NodePool's limit)")
    rows = [("POOL", "GPU", "GPUS/NODE", "INSTANCE TYPES", "CAPACITY", "MAX GPUS", "SHARING", "KUEUE FLAVOR")]
    rows += [(p.name, p.gpu_type, str(p.gpus_per_node), ",".join(p.instance_types) or "-", ",".join(p.capacity_types) or "-",
              str(p.max_gpus or "-"), p.sharing if p.sharing == "none" else f"{p.sharing} ({', '.join(f'{k}: {v}' for k, v in p.slices_per_node.items())})",
              p.kueue_flavor or "-") for p in view.pools]
    print("\n".join(_table(rows)))
    print()
    source = "LocalQueue status, now" if view.live else "not read"
    print(f"team quotas (Kueue ClusterQueue nominal GPUs per pool, slices on a shared pool; BORROW: up to what the cohort holds; IN USE: {source})")
    rows = [("TEAM", "POOL", "NOMINAL", "BORROW", "IN USE", "PENDING JOBS")]
    for q in view.quotas:
        rows.append((q.team, q.pool, str(q.nominal_gpus), f"yes (to {q.cohort_gpus})" if q.borrowing else "no",
                     "?" if q.in_use_gpus is None else str(q.in_use_gpus), "?" if q.pending_jobs is None else str(q.pending_jobs)))
    print("\n".join(_table(rows)))
    if view.note:
        print(f"note: {view.note}")
    return EXIT_OK


# -- checkpoints ---------------------------------------------------------------------------
def cmd_checkpoints(args) -> int:
    client = client_for(args)
    found = client.checkpoints(args.name, args.team, verify=args.verify, image=args.image)
    if not found:
        note = client.store_note()
        print(f"no complete checkpoint of {args.name} yet" + (f" ({note})" if note else ""))
        return EXIT_OK
    for checkpoint in found:
        verdict = f"  VERDICT: {checkpoint.verdict}" if checkpoint.verdict else ""
        print(f"step {checkpoint.step:>8}  {checkpoint.uri}{verdict}")
        if checkpoint.verdict == "FAIL" and checkpoint.detail:
            print("\n".join("    " + line for line in checkpoint.detail.splitlines()))
    failed = any(c.verdict == "FAIL" for c in found)
    return EXIT_FAILED if failed else EXIT_OK


# -- data upload ---------------------------------------------------------------------------
def cmd_data(args) -> int:
    from jobs.data import upload_dataset

    client = client_for(args)
    facts = client.facts
    result = upload_dataset(args.dir, dataset=args.dataset, team=args.team, facts=facts, progress=not args.quiet,
                            use_outputs=not args.offline)
    print(f"dataset {result.dataset} version {result.version}: {result.files} file(s), {result.bytes:,} bytes "
          f"{'uploaded' if result.uploaded else 'already there'} to {result.s3_uri}")
    print(f"on FSx (through the /datasets association): {result.fsx_path}  (use it as the job spec's dataset)")
    return EXIT_OK


def _team_arg(p, required=False):
    p.add_argument("--team", required=required, help="the job's team (namespace team-<team>); default: your own, "
                   "from your identity (the team group your team role's access entry carries)")


def _stack_args(p, required=False):
    p.add_argument("--stack", required=required, help="the stack: its teams (--team is checked), checkpoints bucket "
                   "and container log group (attempt history, past logs)")
    p.add_argument("--offline", action="store_true", help="do not ask `pulumi stack output` for deployed names")
    p.add_argument("--facts", help="read the platform facts from this JSON file (written by `facts`)")


def add_parsers(sub) -> None:
    """Every lifecycle command: ``add_parser`` with its ``run`` (the entry point's way too)."""
    _reading_parsers(sub)
    _acting_parsers(sub)
    _interactive_parsers(sub)
    _platform_parsers(sub)


def _reading_parsers(sub) -> None:
    """list, describe (status), history."""
    p = sub.add_parser("list", help="your team's jobs (a platform engineer's: every team's): phase, size, pool")
    _team_arg(p)
    _stack_args(p)
    p.add_argument("--all", action="store_true", help="finished and cancelled jobs too")
    p.add_argument("--sweep", metavar="NAME", help="one sweep's points (label mlplatform.io/sweep), finished ones included")
    p.add_argument("--metric", action="append", metavar="NAME",
                   help="--sweep: a metric of each point's MLflow run to show (repeatable; default val_loss, loss)")
    p.add_argument("--sort-by", metavar="METRIC", help="--sweep: sort the points by this metric, ascending (default: the first)")
    p.add_argument("--tracking-uri", help="--sweep: MLflow's URI (default $MLFLOW_TRACKING_URI)")
    p.set_defaults(run=guarded(cmd_list))

    # `status` is the same command (it used to shell out to kubectl; one path now, through JobClient).
    p = sub.add_parser("describe", aliases=["status"],
                       help="a job's phase, Kueue admission, pods, attempts, checkpoints, cost so far")
    p.add_argument("name")
    _team_arg(p)
    _stack_args(p)
    p.set_defaults(run=guarded(cmd_describe))

    p = sub.add_parser("history", help="every run the platform recorded for your team (gone jobs too): outcome, "
                                       "attempts, preemptions, node-hours, cost")
    p.add_argument("name", nargs="?", help="one job name's runs (default: every job's)")
    _team_arg(p)
    _stack_args(p)
    p.set_defaults(run=guarded(cmd_history))


def _acting_parsers(sub) -> None:
    """logs, cancel."""
    p = sub.add_parser("logs", help="a job's logs, every attempt (-f follows restarts), one rank or all")
    p.add_argument("name")
    _team_arg(p)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--rank", type=int, default=0, help="node rank (0: the master / first node)")
    which.add_argument("--all", action="store_true", help="every rank, each line prefixed")
    which.add_argument("--worker", type=int, default=None, help="worker N of a PyTorchJob (= --rank N+1)")
    p.add_argument("-f", "--follow", action="store_true", help="stream, and pick up replacement pods until the job ends")
    p.add_argument("--attempt", type=int, metavar="N",
                   help="attempt N (1: the first) of the rank, from the cluster's CloudWatch container log group: "
                        "pods of earlier attempts and of cancelled or finished jobs are gone from the cluster "
                        "(needs --stack and AWS credentials)")
    _stack_args(p)
    p.set_defaults(run=guarded(cmd_logs))

    p = sub.add_parser("cancel", help="stop a job (or a whole sweep) gracefully (checkpoint first), then remove it")
    p.add_argument("name", nargs="?")
    p.add_argument("--sweep", metavar="NAME", help="every active job of this sweep (label mlplatform.io/sweep), in one command")
    _team_arg(p)
    _stack_args(p)
    p.add_argument("--wait", action="store_true", help="wait until its pods are gone and print the newest checkpoint")
    p.add_argument("--timeout", type=float, default=600, help="--wait: seconds")
    p.add_argument("--force", action="store_true", help="cancel a job declared in git too (Argo CD recreates it on its next sync)")
    p.set_defaults(run=guarded(cmd_cancel))


def _interactive_parsers(sub) -> None:
    """dev (notebook), endpoints (open)."""
    p = sub.add_parser("dev", aliases=["notebook"],
                       help="an interactive GPU pod: JupyterLab on a slice of a shared or MIG pool, your team's mounts "
                            "and identity, admitted by the team's queue, port-forwarded here; stops when idle")
    _team_arg(p)
    _stack_args(p)
    p.add_argument("--image", help="the image (your training image's dev variant: trainer/Dockerfile.dev)")
    p.add_argument("--pool", help="a shared or MIG pool (default: the first your team has quota on)")
    p.add_argument("--idle", default="1h", help="stop after this long unused: no kernel, terminal or request (default 1h)")
    p.add_argument("--max", default="8h", help="stop after this long whatever happens (default 8h)")
    p.add_argument("--wait", type=float, default=120, help="seconds Kueue has to admit it; then it is deleted (exit 3)")
    p.add_argument("--start-timeout", type=float, default=600, help="seconds for its pod to start (a node may launch)")
    p.add_argument("--port", type=int, default=8888, help="the local port of the forward")
    p.add_argument("--no-forward", action="store_true", help="print the port-forward command instead of running it")
    p.add_argument("--list", action="store_true", help="your team's dev pods")
    p.add_argument("--stop", metavar="NAME", help="stop a dev pod")
    p.set_defaults(run=guarded(cmd_dev))

    p = sub.add_parser("endpoints", aliases=["open"],
                       help="where your team's MLflow is and where its login lives, Argo CD, the dashboards")
    _team_arg(p)
    _stack_args(p)
    p.set_defaults(run=guarded(cmd_endpoints))


def _platform_parsers(sub) -> None:
    """pools, checkpoints, data upload."""
    p = sub.add_parser("pools", help="the stack's GPU pools and each team's Kueue quota, with what it uses now")
    p.add_argument("--team", help="one team (default: every team)")
    _stack_args(p)  # --stack or --facts: without either, one line saying so
    p.add_argument("--declared", action="store_true", help="the stack's declared quotas only: do not read the cluster")
    p.set_defaults(run=guarded(cmd_pools))

    p = sub.add_parser("checkpoints", help="a job's complete checkpoints (from the checkpoints bucket)")
    p.add_argument("name")
    _team_arg(p)
    _stack_args(p)
    p.add_argument("--verify", nargs="?", type=int, const=-1, default=None, metavar="STEP",
                   help="run the restore drill (trainer verify-checkpoint) on STEP (default: the newest) as a Job in "
                        "the team's namespace, with the team's role and key; prints its verdict")
    p.add_argument("--image", help="--verify: the trainer image for the drill (default: the job's own)")
    p.set_defaults(run=guarded(cmd_checkpoints))

    data = sub.add_parser("data", help="datasets: upload a directory to the team's prefix",
                          epilog="upload DIR --dataset NAME --team TEAM [--stack STACK | --facts FILE] [--offline] [--quiet]")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    p = data_sub.add_parser("upload", help="upload DIR as a dataset version (content digest), visible on FSx")
    p.add_argument("dir")
    p.add_argument("--dataset", required=True, help="dataset name (lowercase letters, digits, '-')")
    _team_arg(p, required=True)
    _stack_args(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=guarded(cmd_data))
