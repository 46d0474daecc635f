"""`python -m workloads`: training jobs from a job spec.

    python -m workloads preflight JOB.yaml --stack prod          # fits? step time, cost
    python -m workloads submit JOB.yaml --stack prod --dry-run   # print the PyTorchJob
    python -m workloads submit JOB.yaml --stack prod --local     # run its pods on this CPU, tiny
    python -m workloads submit JOB.yaml --stack prod [--replace]  # create it (needs a kubeconfig)
    python -m workloads submit JOB.yaml --stack dev --sweep optimizer.lr=1e-4,3e-4   # one job per point
    python -m workloads submit JOB.yaml --stack dev --rerun [--from-previous]   # a new run: own name, checkpoints, MLflow run
    python -m workloads list [--team TEAM] [--all]               # your team's jobs (--all: finished, cancelled, replaced...)
    python -m workloads describe NAME [--team TEAM] [--stack S]  # admission, attempts, nodes, checkpoints, cost so far (alias: status)
    python -m workloads history [NAME] [--team TEAM]             # every recorded run: outcome, attempts, preemptions, cost
    python -m workloads dev --image IMAGE [--stack S]            # an interactive GPU pod (JupyterLab), port-forwarded here
    python -m workloads endpoints --stack S                      # MLflow (and its login), Argo CD, dashboards (alias: open)
    python -m workloads logs NAME --team TEAM [-f] [--rank N | --all]   # every attempt, every rank
    python -m workloads logs NAME --team TEAM --stack S --attempt N     # a gone pod's lines, from CloudWatch
    python -m workloads pools --stack S [--team TEAM]            # GPU pools, team quotas, what is in use now
    python -m workloads cancel NAME --team TEAM [--wait]         # SIGTERM -> checkpoint -> removed
    python -m workloads cancel --sweep SWEEP --team TEAM         # every active job of a sweep
    python -m workloads checkpoints NAME --team TEAM --stack S [--verify [STEP]]
    python -m workloads data upload DIR --dataset NAME --team TEAM --stack S
    python -m workloads readiness --stack prod --pool h100 --image IMAGE   # the pool's GPU/NCCL check
    python -m workloads facts --stack prod > facts.json   # then --facts facts.json anywhere (GitOps, Argo)
    python -m workloads render --stack dev [--check]     # the stack's GitOps tree (what Argo CD applies)
    python -m workloads pipeline PIPELINE.yaml --stack dev --local --dataset DIR   # a pipeline's steps on CPU

Platform facts come from the stack's offline plan, with deployed names from `pulumi stack
output` when the Pulumi CLI can read them. `--team` defaults to your own (your identity's team
group). Exit codes (jobs/exit_codes.py): 0 done; 2 bad input (the spec file, a field, a flag, a
name the stack does not know, the trainer config; with or without other problems); 3 the spec is
well-formed but the job does not fit (memory, quota, time budget, instance size), or a dev pod was
not admitted; 4 no cluster (or bucket) access; 5 the local run failed; 6 no such job; 7 a job of
that name exists (--rerun, or --replace while it runs). preflight and submit report every problem
of a spec in one run. Every command registers the same way: ``add_parser(sub)`` with ``run``.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
from pathlib import Path
from typing import Optional

import yaml

from jobs import exit_codes

ROOT = Path(__file__).resolve().parent.parent
# Commands whose modules import the stack's program (Pulumi, infra/): name -> (module with
# add_parser, help). Their parser is built only when the command is the one given, so no other
# command pays for importing it.
HEAVY_COMMANDS = {
    "render": ("jobs.render", "write the stack's GitOps tree (what Argo CD applies)"),
    "pipeline": ("jobs.pipeline_local", "run a declared pipeline (prepare -> train -> evaluate -> register)"),
}


def _dump(obj: dict) -> str:
    return yaml.safe_dump(obj, sort_keys=False, width=120)


def _facts(stack: str, use_outputs: bool, facts_file: Optional[str] = None):
    """Platform facts from a JSON file (`python -m workloads facts`), or the stack's plan."""
    if facts_file:
        import json

        from workloads.platform_facts import PlatformFacts

        return PlatformFacts.from_dict(json.loads(Path(facts_file).read_text()))
    # The CLI is an entry point like infra/__main__: it may use the offline plan; the renderer
    # and preflight modules themselves stay free of infra/.
    from jobs.facts import facts_for_stack

    return facts_for_stack(stack, use_outputs=use_outputs)


def _client(args):
    """The job client of the command's stack (jobs/cli.py builds it the same way)."""
    from jobs.cli import client_for

    return client_for(args, facts=_facts(args.stack, not args.offline, args.facts))


def _preflighted(args, *, report_to=None):
    """(client, preflight result, exit code): the job spec (or its rerun) preflighted by the job
    client (initFrom and own code included) and shown; the code is 0 when the job fits, else what
    the command exits with."""
    from jobs.kube import NoClusterAccess
    from jobs.rerun import RerunError
    from workloads.problems import InvalidInputError
    from workloads.jobspec import SpecFileError

    try:
        client = _client(args)
        spec = args.job
        if getattr(args, "rerun", None) is not None:
            # A new run with its own name, checkpoint directory and MLflow run (jobs/rerun.py).
            rerun = client.rerun(args.job, suffix=args.rerun or None, from_previous=args.from_previous)
            print(rerun.describe(), file=report_to or sys.stdout)
            spec = rerun.spec
        # Every mistake of the spec in one run: file, schema, stack facts, trainer config, quota, fit.
        result = client.preflight(spec, mfu=args.mfu, code=getattr(args, "code", None))
    except (SpecFileError, InvalidInputError, FileNotFoundError, RerunError) as exc:  # one line (or every problem)
        print(f"error: {exc}", file=sys.stderr)
        return None, None, exit_codes.BAD_INPUT
    except NoClusterAccess as exc:
        from jobs.cli import no_access_message

        print(f"error: {no_access_message(args, exc)}", file=sys.stderr)
        return None, None, exit_codes.NO_CLUSTER
    print(result.text, file=report_to or sys.stdout)
    return client, result, result.exit_code


def cmd_preflight(args) -> int:
    return _preflighted(args)[2]


def _submit_flags_problem(args) -> Optional[str]:
    """Flags that cannot go together: one line, the fix."""
    if args.faithful and not args.local:
        return "--faithful is a way to run --local (the job's own model on this CPU); add --local"
    if args.replace and (args.dry_run or args.local):
        return "--replace replaces a job on the cluster; --dry-run and --local submit nothing: drop --replace"
    if args.from_previous and args.rerun is None:
        return "--from-previous starts a rerun from the previous run's checkpoint. Fix: add --rerun"
    if args.rerun is not None:
        for flag, given, why in (("--replace", args.replace, "--replace deletes the job of the same name; a rerun takes a new name"),
                                 ("--local", args.local, "--local runs in a fresh directory of its own anyway"),
                                 ("--sweep", args.sweep, "a sweep names its points itself (--sweep-name)")):
            if given:
                return f"--rerun and {flag} do not go together: {why}. Fix: drop one of them"
    if args.sweep and args.local:
        return "--local runs one job: drop --sweep, or set one point's values in trainer.overrides"
    if args.sweep and args.code:
        return ("--sweep renders the built-in trainer's jobs; --code is your own code: submit one job per point, or push "
                "the code into the image")
    return None


def cmd_submit(args) -> int:
    from jobs.kube import no_access_reason

    if problem := _submit_flags_problem(args):
        print(f"error: {problem}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    if args.sweep:
        return _submit_sweep(args)
    # With --dry-run stdout carries the manifest alone.
    out = sys.stderr if args.dry_run else sys.stdout
    client, result, code = _preflighted(args, report_to=out)
    if code:
        return code
    if not (args.dry_run or args.local):
        if reason := no_access_reason():
            from jobs.access import access_fix

            print(f"error: {reason}: run with --dry-run or --local, or {access_fix(client.facts, result.spec.team)}",
                  file=sys.stderr)
            return exit_codes.NO_CLUSTER
        return _create(client, result, args)
    job, archive = result.job, None
    if args.code:
        # Your code as an archive pinned by digest (jobs/usercode.py).
        from jobs import usercode
        from workloads.problems import InvalidInputError

        try:
            archive = usercode.archive(args.code)
            job = dataclasses.replace(job, spec=usercode.pin(job.spec, archive, client.facts.checkpoints_bucket,
                                                             client.facts.stack))
        except InvalidInputError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return exit_codes.BAD_INPUT
        print(f"code           {args.code}: {len(archive.files)} file(s), {archive.size_bytes:,} bytes, sha256 "
              f"{archive.sha256} -> {job.spec.code.uri}", file=out)
    from workloads.trainingjob import render_resolved

    manifest = render_resolved(job)  # what preflight resolved: no second resolution
    if args.dry_run:
        print(_dump(manifest))
        return exit_codes.OK
    from jobs.backends.local import LocalBackend, LocalOptions

    return LocalBackend().run(manifest, spec=job.spec, archive=archive, options=LocalOptions(
        workdir=args.workdir, steps=args.steps, interrupt_at_step=args.interrupt_at_step, no_tracking=args.no_tracking,
        timeout_seconds=args.timeout, faithful=args.faithful))


def _create(client, result, args) -> int:
    """JobClient.submit (create, never apply: a taken name is refused), its failures one line each."""
    from jobs.cli import guarded

    def create(_args) -> int:
        submitted = client.submit(result.spec, replace=args.replace, code=args.code, checked=result)
        if submitted.code_uri:
            print(f"code           {args.code}: {'uploaded to' if submitted.code_uploaded else 'already at'} "
                  f"{submitted.code_uri}", flush=True)
        if submitted.replaced is not None:
            print(f"replaced {submitted.replaced.kind} {submitted.replaced.namespace}/{submitted.replaced.name} "
                  f"({submitted.replaced.phase}): deleted, its pods stopped")
        job = submitted.job
        print(f"submitted {job.kind} {job.namespace}/{job.name}: {job.phase}. Follow it: python -m workloads describe "
              f"{job.name} --team {job.team} --stack {args.stack}; python -m workloads logs {job.name} --team {job.team} -f")
        return exit_codes.OK

    return guarded(create)(args)


def _submit_sweep(args) -> int:
    """`submit --sweep`: the client's plan (every point preflighted, jobs/sweep.py), printed; then
    the points created together, or none."""
    from jobs.cli import guarded
    from jobs.kube import no_access_reason
    from workloads.problems import InvalidInputError

    try:
        client = _client(args)
        plan = client.plan_sweep(args.job, args.sweep, sweep_name=args.sweep_name, mfu=args.mfu)
    except (InvalidInputError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    report = sys.stderr if args.dry_run or plan.error else sys.stdout
    print("\n".join(plan.lines(dry_run=args.dry_run)), file=report)
    if plan.exit_code:
        return plan.exit_code
    if args.dry_run:
        print(yaml.safe_dump_all(list(plan.manifests), sort_keys=False, width=120))
        return exit_codes.OK
    if reason := no_access_reason():
        from jobs.access import access_fix

        print(f"error: {reason}: run with --dry-run, or {access_fix(client.facts, plan.spec.team)}", file=sys.stderr)
        return exit_codes.NO_CLUSTER

    def create(_args) -> int:
        # Every point's name is checked before the first is created: all or nothing.
        for job, replaced in client.submit_sweep(args.job, args.sweep, replace=args.replace, plan=plan):
            print(f"submitted {job.kind} {job.namespace}/{job.name}: {job.phase}"
                  + (f" (replaced the {replaced.phase} one)" if replaced else ""))
        return exit_codes.OK

    return guarded(create)(args)


def cmd_readiness(args) -> int:
    from workloads.problems import InvalidInputError
    from workloads.readiness import readiness_job, readiness_namespace

    try:
        facts = _facts(args.stack, not args.offline, args.facts)
    except (InvalidInputError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    pools = [p for p in facts.pools if args.pool in (None, p.name)]
    if not pools:
        print(f"error: no GPU pool {args.pool!r} in stack {args.stack}; pools: {[p.name for p in facts.pools]}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    print(yaml.safe_dump_all([readiness_namespace(), *(readiness_job(p, image=args.image) for p in pools)], sort_keys=False))
    return exit_codes.OK


def cmd_facts(args) -> int:
    import json

    print(json.dumps(_facts(args.stack, not args.offline, args.facts).to_dict(), indent=1, sort_keys=True))
    return exit_codes.OK


def _stack_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stack", required=True, help="stack whose platform the job runs on (Pulumi.<stack>.yaml)")
    p.add_argument("--offline", action="store_true", help="do not ask `pulumi stack output` for deployed names")
    p.add_argument("--facts", help="read the platform facts from this JSON file (written by `facts`) instead of the plan")


def add_parsers(sub) -> None:
    """preflight, submit, readiness, facts: each ``add_parser`` with its ``run``."""
    pre = sub.add_parser("preflight", help="does the job fit; step time and cost")
    pre.add_argument("job")
    _stack_args(pre)
    pre.add_argument("--mfu", type=float, default=None,
                     help="model FLOPs utilisation assumed for the step time (default: the one make gpu-check measured "
                          "on the pool's GPU type, else 0.35)")
    pre.add_argument("--code", metavar="DIR", help="your code's directory (as for submit --code): the script is checked "
                                                    "to be there and to parse")
    pre.set_defaults(run=cmd_preflight)

    submit = sub.add_parser("submit", help="preflight, render, then print / run locally / apply")
    submit.add_argument("job")
    _stack_args(submit)
    mode = submit.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the rendered job")
    mode.add_argument("--local", action="store_true", help="run the rendered pods as CPU processes, tiny")
    submit.add_argument("--mfu", type=float, default=None)
    submit.add_argument("--steps", type=int, default=None, help="--local: training steps (default 40; 2 with --faithful)")
    submit.add_argument("--interrupt-at-step", type=int, default=None, help="--local: SIGTERM one pod at this step")
    submit.add_argument("--workdir", help="--local: where the FSx stand-in, logs and MLflow go (default runs/jobs/NAME)")
    submit.add_argument("--no-tracking", action="store_true", help="--local: no local MLflow store")
    submit.add_argument("--timeout", type=float, default=900, help="--local: seconds per attempt")
    submit.add_argument("--faithful", action="store_true",
                        help="--local: keep the job's own model and trainer config (only the steps shrink); refused "
                             "when it would not fit in this host's memory")
    submit.add_argument("--code", metavar="DIR",
                        help="your code: DIR is packed, uploaded to the team's S3 prefix and pinned by its SHA-256 "
                             "(the pod refuses any other bytes); script/command in the spec are relative to DIR")
    submit.add_argument("--sweep", action="append", metavar="KEY=V1,V2",
                        help="one job per point of the grid of these trainer config values (repeat for more keys: "
                             "the cartesian product), e.g. --sweep optimizer.lr=1e-4,3e-4")
    submit.add_argument("--replace", action="store_true",
                        help="the team already has a job of this name: delete it first (its pods get SIGTERM and time "
                             "to checkpoint; the new run resumes from its newest checkpoint), then create this one")
    submit.add_argument("--rerun", nargs="?", const="", default=None, metavar="SUFFIX",
                        help="a new run of this spec with its own name (NAME-r<N>, or NAME-SUFFIX), checkpoint directory "
                             "and MLflow run (in the same experiment); a finished job's name is never run again")
    submit.add_argument("--from-previous", action="store_true",
                        help="--rerun: start from the previous run's newest complete checkpoint (initFrom)")
    submit.add_argument("--sweep-name", help="--sweep: the sweep's name (label mlplatform.io/sweep, MLflow parent run); "
                                             "default the job name")

    submit.set_defaults(run=cmd_submit)

    ready = sub.add_parser("readiness", help="print the readiness job of a GPU pool (nvidia-smi + 2-node all-reduce)")
    _stack_args(ready)
    ready.add_argument("--pool", help="one pool (default: every pool)")
    ready.add_argument("--image", required=True, help="the trainer image (it runs trainer.nccl_check)")
    ready.set_defaults(run=cmd_readiness)

    facts = sub.add_parser("facts", help="print the platform facts jobs are rendered against, as JSON")
    _stack_args(facts)
    facts.set_defaults(run=cmd_facts)


def main(argv: Optional[list[str]] = None) -> int:
    from jobs import cli

    parser = argparse.ArgumentParser(prog="python -m workloads", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_parsers(sub)
    chosen = next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), None)
    for name, (module, help_text) in HEAVY_COMMANDS.items():
        if chosen == name:
            importlib.import_module(module).add_parser(sub)
        else:
            sub.add_parser(name, help=help_text)
    # The job lifecycle (list, describe, history, logs, cancel, dev, endpoints, pools,
    # checkpoints, data upload): a thin layer over jobs.client.JobClient.
    cli.add_parsers(sub)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
