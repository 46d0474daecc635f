"""`python -m workloads`: training jobs from a job spec.

    python -m workloads preflight JOB.yaml --stack prod          # fits? step time, cost
    python -m workloads submit JOB.yaml --stack prod --dry-run   # print the PyTorchJob
    python -m workloads submit JOB.yaml --stack prod --local     # run its pods on this CPU, tiny
    python -m workloads submit JOB.yaml --stack prod [--replace]  # create it (needs a kubeconfig)
    python -m workloads submit JOB.yaml --stack dev --sweep optimizer.lr=1e-4,3e-4   # one job per point
    python -m workloads list [--team TEAM] [--all]               # the platform's jobs (--all: finished, cancelled)
    python -m workloads describe NAME --team TEAM [--stack S]    # admission, attempts, checkpoints, cost so far (alias: status)
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
output` when the Pulumi CLI can read them. Exit codes: 0 done; 2 bad input (the spec file, a
field, a name the stack does not know, the trainer config; with or without other problems);
3 the spec is well-formed but the job does not fit (memory, quota, time budget, instance size);
4 no cluster (or bucket) access; 5 the local run failed; 6 no such job; 7 a job of that name
exists (submit refuses it: --replace, or another name); otherwise kubectl's.
preflight and submit report every problem of a spec in one run.
"""
from __future__ import annotations

import argparse
import importlib
import shutil
import sys
from pathlib import Path
from typing import Optional

import yaml

EXIT_SPEC = 2
EXIT_REFUSED = 3
EXIT_NO_CLUSTER = 4
EXIT_LOCAL_FAILED = 5
EXIT_NOT_FOUND = 6
EXIT_EXISTS = 7
ROOT = Path(__file__).resolve().parent.parent


# Commands whose modules import the stack's program: name -> (module with add_parser, help).
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
    """(client, preflight result, exit code): the job spec preflighted by the job client (the
    same checks as JobClient.preflight, initFrom included) and shown; the code is 0 when the job
    fits, else what the command exits with."""
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
    except SpecFileError as exc:  # nothing in the file can be checked: one line
        print(f"error: {exc}", file=sys.stderr)
        return None, None, EXIT_SPEC
    except (InvalidInputError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None, None, EXIT_SPEC
    except RerunError as exc:  # one line: the flag, the value, the fix
        print(f"error: {exc}", file=sys.stderr)
        return None, None, EXIT_SPEC
    except NoClusterAccess as exc:
        from jobs.cli import no_access_message

        print(f"error: {no_access_message(args, exc)}", file=sys.stderr)
        return None, None, EXIT_NO_CLUSTER
    print(result.text, file=report_to or sys.stdout)
    return client, result, result.exit_code


def cmd_preflight(args) -> int:
    return _preflighted(args)[2]


def cmd_submit(args) -> int:
    from jobs.kube import no_access_reason

    if args.faithful and not args.local:
        print("error: --faithful is a way to run --local (the job's own model on this CPU); add --local", file=sys.stderr)
        return EXIT_SPEC
    if args.replace and (args.dry_run or args.local):
        print("error: --replace replaces a job on the cluster; --dry-run and --local submit nothing: drop --replace",
              file=sys.stderr)
        return EXIT_SPEC
    if problem := _rerun_flags_problem(args):
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_SPEC
    if getattr(args, "sweep", None):
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
            return EXIT_NO_CLUSTER
        return _create(client, result, args)
    spec, archive = result.spec, None
    if args.code:
        # Your code as an archive pinned by digest (jobs/usercode.py).
        from jobs import usercode
        from workloads.problems import InvalidInputError

        try:
            archive = usercode.archive(args.code)
            spec = usercode.pin(spec, archive, client.facts.checkpoints_bucket, client.facts.stack)
        except InvalidInputError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_SPEC
        print(f"code           {args.code}: {len(archive.files)} file(s), {archive.size_bytes:,} bytes, sha256 "
              f"{archive.sha256} -> {spec.code.uri}", file=out)
    manifest = client.render(spec)
    if args.dry_run:
        print(_dump(manifest))
        return 0
    return _submit_local(manifest, args, spec=spec, archive=archive)


def _rerun_flags_problem(args) -> Optional[str]:
    """--rerun and --from-previous with the flags they cannot go with: one line, the fix."""
    if args.from_previous and args.rerun is None:
        return "--from-previous starts a rerun from the previous run's checkpoint. Fix: add --rerun"
    if args.rerun is None:
        return None
    for flag, given in (("--replace", args.replace), ("--local", args.local), ("--sweep", getattr(args, "sweep", None))):
        if given:
            why = {"--replace": "--replace deletes the job of the same name; a rerun takes a new name",
                   "--local": "--local runs in a fresh directory of its own anyway",
                   "--sweep": "a sweep names its points itself (--sweep-name)"}[flag]
            return f"--rerun and {flag} do not go together: {why}. Fix: drop one of them"
    return None


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
        return 0

    return guarded(create)(args)


def _submit_sweep(args) -> int:
    """`submit --sweep`: one job per point of the grid (jobs/sweep.py), each preflighted."""
    from jobs.cli import guarded
    from jobs.kube import no_access_reason
    from workloads.problems import InvalidInputError

    if args.local:
        print("error: --local runs one job: drop --sweep, or set one point's values in trainer.overrides", file=sys.stderr)
        return EXIT_SPEC
    if args.code:
        print("error: --sweep renders the built-in trainer's jobs; --code is your own code: submit one job per "
              "point, or push the code into the image", file=sys.stderr)
        return EXIT_SPEC
    try:
        client = _client(args)
    except (InvalidInputError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_SPEC
    code, manifests = client.plan_sweep(args.job, args.sweep, sweep_name=args.sweep_name, mfu=args.mfu,
                                        dry_run=args.dry_run, out=sys.stderr if args.dry_run else sys.stdout,
                                        err=sys.stderr)
    if code:
        return code
    if args.dry_run:
        print(yaml.safe_dump_all(manifests, sort_keys=False, width=120))
        return 0
    if reason := no_access_reason():
        from jobs.access import access_fix

        team = manifests[0]["metadata"]["namespace"].removeprefix("team-") if manifests else None
        print(f"error: {reason}: run with --dry-run, or {access_fix(client.facts, team)}", file=sys.stderr)
        return EXIT_NO_CLUSTER

    def create(_args) -> int:
        # Every point's name is checked before the first is created: all or nothing.
        for job, replaced in client.create_jobs(manifests, replace=args.replace):
            print(f"submitted {job.kind} {job.namespace}/{job.name}: {job.phase}"
                  + (f" (replaced the {replaced.phase} one)" if replaced else ""))
        return 0

    return guarded(create)(args)


def _submit_local(manifest: dict, args, *, spec=None, archive=None) -> int:
    import secrets

    from jobs.local import LocalOverrides, LocalRunError, replacements, run_local, shrink
    from workloads.trainingjob import CHECKPOINT_KEY_ITEM, CHECKPOINT_KEY_SECRET

    workdir = Path(args.workdir or f"runs/jobs/{manifest['metadata']['name']}").resolve()
    # The job's own model on a CPU is slow: a faithful run proves a couple of steps by default.
    args.steps = args.steps or (2 if args.faithful else 40)
    overrides = LocalOverrides(num_steps=args.steps, checkpoint_every_steps=max(1, args.steps // 4), faithful=args.faithful)
    if args.faithful and spec is not None and spec.trainer is not None:
        if (refusal := _faithful_refusal(spec, len(manifest_replicas(manifest)))) is not None:
            print(refusal, file=sys.stderr)
            return EXIT_REFUSED
    if workdir.exists():
        shutil.rmtree(workdir)  # a local run starts from nothing; a stale checkpoint would be resumed
    workdir.mkdir(parents=True)
    # Said before the run, so a green local run is never mistaken for the job's own config.
    print("local run replaces" + (" (--faithful: the job's own model and config)" if args.faithful else "") + ":")
    for line in replacements(manifest, overrides, dataset=spec.dataset if spec else "the dataset"):
        print(f"  {line}")
    s3_root = workdir / "s3"
    if archive is not None:
        from jobs import usercode

        target = usercode.local_object_path(spec.code.uri, s3_root)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(archive.data)
    small = shrink(manifest, overrides)
    secret = {"MLFLOW_TRACKING_URI": "" if args.no_tracking else f"sqlite:///{workdir}/mlflow.db",
              "MLFLOW_TRACKING_USERNAME": "", "MLFLOW_TRACKING_PASSWORD": ""}
    secret_names = {e["valueFrom"]["secretKeyRef"]["name"] for e in _containers_env(small) if "valueFrom" in e
                    and "secretKeyRef" in e["valueFrom"]}
    print(f"local run in {workdir}: MLflow {secret['MLFLOW_TRACKING_URI'] or 'off'}, "
          f"{f'{args.steps} steps' if spec is None or spec.trainer else 'the steps your code takes'}, "
          f"SIGTERM to one pod at step {args.interrupt_at_step or 'never'}")
    try:
        # A fresh checkpoint signing key stands in for the team's (trainer/trust.py).
        local_secrets = {**{name: secret for name in secret_names},
                         CHECKPOINT_KEY_SECRET: {CHECKPOINT_KEY_ITEM: secrets.token_hex(32)}}
        result = run_local(small, workdir=workdir, secrets=local_secrets, s3_root=s3_root,
                           interrupt_at_step=args.interrupt_at_step, timeout_seconds=args.timeout)
    except LocalRunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_LOCAL_FAILED
    print(f"complete checkpoints: {result.steps}; attempts: {[a.exit_codes for a in result.attempts]}")
    return 0 if result.succeeded else EXIT_LOCAL_FAILED


def manifest_replicas(manifest: dict) -> list:
    from jobs.local import replicas

    return replicas(manifest)


def _faithful_refusal(spec, ranks: int) -> Optional[str]:
    """Why the job's own model cannot run on this host (--faithful), or None."""
    from trainer.config import build_config
    from jobs.local import faithful_memory_problem, host_available_bytes
    from jobs.preflight import CUDA_RESERVE_GIB, GIB, memory_per_gpu, trainer_shape

    cfg = build_config(str(ROOT / spec.trainer.config), list(spec.trainer.overrides), environ={})
    if cfg.model.hf_path:
        return (f"--faithful: the model is model.hf_path={cfg.model.hf_path}, on the cluster's FSx, not on this machine. "
                "Fix: run --local without --faithful, or use a model the trainer builds from its config")
    shape, problems = trainer_shape(spec, str(ROOT))
    if shape is None:
        return f"--faithful: cannot size the model ({'; '.join(p.render() for p in problems)})"
    per_rank = memory_per_gpu(shape, ranks)["total"] - CUDA_RESERVE_GIB * GIB
    return faithful_memory_problem(per_rank * ranks, host_available_bytes() * 0.8,
                                   f"{shape.parameters / 1e6:,.0f}M parameters x {ranks} CPU rank(s), micro-batch "
                                   f"{shape.micro_batch_size} x {shape.seq_len} tokens")


def _containers_env(manifest: dict) -> list[dict]:
    if manifest["kind"] == "PyTorchJob":
        return [e for s in manifest["spec"]["pytorchReplicaSpecs"].values() for e in s["template"]["spec"]["containers"][0]["env"]]
    return list(manifest["spec"]["trainer"]["env"])


def cmd_readiness(args) -> int:
    from workloads.readiness import readiness_job, readiness_namespace

    from workloads.problems import InvalidInputError

    try:
        facts = _facts(args.stack, not args.offline, args.facts)
    except (InvalidInputError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_SPEC
    pools = [p for p in facts.pools if args.pool in (None, p.name)]
    if not pools:
        print(f"error: no GPU pool {args.pool!r} in stack {args.stack}; pools: {[p.name for p in facts.pools]}", file=sys.stderr)
        return EXIT_SPEC
    print(yaml.safe_dump_all([readiness_namespace(), *(readiness_job(p, image=args.image) for p in pools)], sort_keys=False))
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workloads", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def stack_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--stack", required=True, help="stack whose platform the job runs on (Pulumi.<stack>.yaml)")
        p.add_argument("--offline", action="store_true", help="do not ask `pulumi stack output` for deployed names")
        p.add_argument("--facts", help="read the platform facts from this JSON file (written by `facts`) instead of the plan")

    pre = sub.add_parser("preflight", help="does the job fit; step time and cost")
    pre.add_argument("job")
    stack_args(pre)
    pre.add_argument("--mfu", type=float, default=None,
                     help="model FLOPs utilisation assumed for the step time (default: the one make gpu-check measured "
                          "on the pool's GPU type, else 0.35)")
    pre.add_argument("--code", metavar="DIR", help="your code's directory (as for submit --code): the script is checked "
                                                    "to be there and to parse")

    submit = sub.add_parser("submit", help="preflight, render, then print / run locally / apply")
    submit.add_argument("job")
    stack_args(submit)
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

    ready = sub.add_parser("readiness", help="print the readiness job of a GPU pool (nvidia-smi + 2-node all-reduce)")
    stack_args(ready)
    ready.add_argument("--pool", help="one pool (default: every pool)")
    ready.add_argument("--image", required=True, help="the trainer image (it runs trainer.nccl_check)")

    facts = sub.add_parser("facts", help="print the platform facts jobs are rendered against, as JSON")
    stack_args(facts)

    # The GitOps commands read the stack's program (Pulumi, infra/): their module registers its
    # parser (add_parser(sub), `run`: args -> exit code) only when the command is the one given,
    # so no other command pays for importing it.
    chosen = next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), None)
    for name, (module, help_text) in HEAVY_COMMANDS.items():
        if chosen == name:
            importlib.import_module(module).add_parser(sub)
        else:
            sub.add_parser(name, help=help_text)
    # The job lifecycle (list, describe, logs, cancel, checkpoints, data upload) is the jobs
    # package's: a thin layer over jobs.client.JobClient.
    from jobs.cli import add_parsers as add_lifecycle_parsers

    add_lifecycle_parsers(sub)

    args = parser.parse_args(argv)
    if hasattr(args, "run"):
        return args.run(args)
    if args.command == "facts":
        import json

        print(json.dumps(_facts(args.stack, not args.offline, args.facts).to_dict(), indent=1, sort_keys=True))
        return 0
    if args.command == "preflight":
        return cmd_preflight(args)
    if args.command == "submit":
        return cmd_submit(args)
    return cmd_readiness(args)


if __name__ == "__main__":
    sys.exit(main())
