"""`python -m workloads`: training jobs from a job spec.

    python -m workloads preflight JOB.yaml --stack prod          # fits? step time, cost
    python -m workloads submit JOB.yaml --stack prod --dry-run   # print the PyTorchJob
    python -m workloads submit JOB.yaml --stack prod --local     # run its pods on this CPU, tiny
    python -m workloads submit JOB.yaml --stack prod             # kubectl apply (needs a kubeconfig)
    python -m workloads status NAME --team TEAM                  # kubectl: the job, its Kueue workload, its pods
    python -m workloads logs NAME --team TEAM [--worker N] [-f]
    python -m workloads readiness --stack prod --pool h100 --image IMAGE   # the pool's GPU/NCCL check
    python -m workloads facts --stack prod > facts.json   # then --facts facts.json anywhere (GitOps, Argo)
    python -m workloads render --stack dev [--check]     # the stack's GitOps tree (what Argo CD applies)
    python -m workloads pipeline PIPELINE.yaml --stack dev --local --dataset DIR   # a pipeline's steps on CPU

Platform facts come from the stack's offline plan, with deployed names from `pulumi stack
output` when the Pulumi CLI can read them. Exit codes: 0 done, 2 bad job spec or stack,
3 preflight refused, 4 no cluster access, 5 the local run failed; otherwise kubectl's.
"""
from __future__ import annotations

import argparse
import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import yaml

EXIT_SPEC = 2
EXIT_REFUSED = 3
EXIT_NO_CLUSTER = 4
EXIT_LOCAL_FAILED = 5
ROOT = Path(__file__).resolve().parent.parent


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
    from infra.facts import facts_for_stack

    return facts_for_stack(stack, use_outputs=use_outputs)


def kubeconfig_available(environ: Optional[dict] = None) -> bool:
    environ = os.environ if environ is None else environ
    paths = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p] or [str(Path.home() / ".kube" / "config")]
    return shutil.which("kubectl") is not None and any(Path(p).is_file() for p in paths)


def apply_command() -> list[str]:
    return ["kubectl", "apply", "--server-side", "--field-manager=mlplatform-submit", "-f", "-"]


def status_commands(name: str, namespace: str, kind: str = "pytorchjob") -> list[list[str]]:
    return [
        ["kubectl", "get", kind, name, "-n", namespace, "-o", "wide"],
        # Kueue's view: admitted or pending, and why.
        ["kubectl", "get", "workloads.kueue.x-k8s.io", "-n", namespace, "-o", "wide"],
        ["kubectl", "get", "pods", "-n", namespace, "-l", f"training.kubeflow.org/job-name={name}", "-o", "wide"],
    ]


def logs_command(name: str, namespace: str, *, worker: Optional[int], follow: bool) -> list[str]:
    pod = f"{name}-worker-{worker}" if worker is not None else f"{name}-master-0"
    return ["kubectl", "logs", "-n", namespace, pod, "-c", "pytorch", *(["-f"] if follow else [])]


def _run(commands: list[list[str]]) -> int:
    if shutil.which("kubectl") is None:
        print("error: kubectl is not installed (https://kubernetes.io/docs/tasks/tools/)", file=sys.stderr)
        return EXIT_NO_CLUSTER
    code = 0
    for command in commands:
        print("$ " + " ".join(command), flush=True)
        code = subprocess.run(command).returncode or code
    return code


def _preflighted(args, *, report_to=None):
    """(spec, facts, exit code): the job spec and platform facts, preflighted and shown; the code
    is 0 when the job fits, else what the command exits with."""
    from workloads.problems import InvalidInputError
    from workloads.jobspec import load_job_spec
    from workloads.preflight import preflight

    try:
        spec = load_job_spec(args.job)
        facts = _facts(args.stack, not args.offline, args.facts)
    except (InvalidInputError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None, None, EXIT_SPEC
    report = preflight(spec, facts, repo_root=str(ROOT), mfu=args.mfu)
    print(report.render(), file=report_to or sys.stdout)
    return spec, facts, 0 if report.ok else EXIT_REFUSED


def cmd_preflight(args) -> int:
    return _preflighted(args)[2]


def cmd_submit(args) -> int:
    from workloads.trainingjob import render

    # With --dry-run stdout carries the manifest alone.
    spec, facts, code = _preflighted(args, report_to=sys.stderr if args.dry_run else sys.stdout)
    if code:
        return code
    manifest = render(spec, facts)
    if args.dry_run:
        print(_dump(manifest))
        return 0
    if args.local:
        return _submit_local(manifest, args)
    if not kubeconfig_available():
        print("error: no kubectl or kubeconfig: run with --dry-run or --local, or write the cluster's kubeconfig "
              f"(pulumi stack output kubeconfig --show-secrets --stack {args.stack} > kubeconfig; export KUBECONFIG=$PWD/kubeconfig)",
              file=sys.stderr)
        return EXIT_NO_CLUSTER
    print("$ " + " ".join(apply_command()), flush=True)
    return subprocess.run(apply_command(), input=_dump(manifest), text=True).returncode


def _submit_local(manifest: dict, args) -> int:
    import secrets

    from workloads.local import LocalOverrides, LocalRunError, run_local, shrink
    from workloads.trainingjob import CHECKPOINT_KEY_ITEM, CHECKPOINT_KEY_SECRET

    workdir = Path(args.workdir or f"runs/jobs/{manifest['metadata']['name']}").resolve()
    if workdir.exists():
        shutil.rmtree(workdir)  # a local run starts from nothing; a stale checkpoint would be resumed
    workdir.mkdir(parents=True)
    overrides = LocalOverrides(num_steps=args.steps, checkpoint_every_steps=max(1, args.steps // 4))
    small = shrink(manifest, overrides)
    secret = {"MLFLOW_TRACKING_URI": "" if args.no_tracking else f"sqlite:///{workdir}/mlflow.db",
              "MLFLOW_TRACKING_USERNAME": "", "MLFLOW_TRACKING_PASSWORD": ""}
    secret_names = {e["valueFrom"]["secretKeyRef"]["name"] for e in _containers_env(small) if "valueFrom" in e
                    and "secretKeyRef" in e["valueFrom"]}
    print(f"local run in {workdir}: MLflow {secret['MLFLOW_TRACKING_URI'] or 'off'}, {args.steps} steps, "
          f"SIGTERM to one pod at step {args.interrupt_at_step or 'never'}")
    try:
        # A fresh checkpoint signing key stands in for the team's (trainer/trust.py).
        local_secrets = {**{name: secret for name in secret_names},
                         CHECKPOINT_KEY_SECRET: {CHECKPOINT_KEY_ITEM: secrets.token_hex(32)}}
        result = run_local(small, workdir=workdir, secrets=local_secrets,
                           interrupt_at_step=args.interrupt_at_step, timeout_seconds=args.timeout)
    except LocalRunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_LOCAL_FAILED
    print(f"complete checkpoints: {result.steps}; attempts: {[a.exit_codes for a in result.attempts]}")
    return 0 if result.succeeded else EXIT_LOCAL_FAILED


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

    submit = sub.add_parser("submit", help="preflight, render, then print / run locally / apply")
    submit.add_argument("job")
    stack_args(submit)
    mode = submit.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the rendered job")
    mode.add_argument("--local", action="store_true", help="run the rendered pods as CPU processes, tiny")
    submit.add_argument("--mfu", type=float, default=None)
    submit.add_argument("--steps", type=int, default=40, help="--local: training steps")
    submit.add_argument("--interrupt-at-step", type=int, default=None, help="--local: SIGTERM one pod at this step")
    submit.add_argument("--workdir", help="--local: where the FSx stand-in, logs and MLflow go (default runs/jobs/NAME)")
    submit.add_argument("--no-tracking", action="store_true", help="--local: no local MLflow store")
    submit.add_argument("--timeout", type=float, default=900, help="--local: seconds per attempt")

    status = sub.add_parser("status", help="kubectl: the job, its Kueue workload and pods")
    status.add_argument("name")
    status.add_argument("--team", required=True)
    status.add_argument("--kind", default="pytorchjob", choices=["pytorchjob", "trainjob"])

    logs = sub.add_parser("logs", help="kubectl logs of the master (or a worker)")
    logs.add_argument("name")
    logs.add_argument("--team", required=True)
    logs.add_argument("--worker", type=int, default=None)
    logs.add_argument("-f", "--follow", action="store_true")

    ready = sub.add_parser("readiness", help="print the readiness job of a GPU pool (nvidia-smi + 2-node all-reduce)")
    stack_args(ready)
    ready.add_argument("--pool", help="one pool (default: every pool)")
    ready.add_argument("--image", required=True, help="the trainer image (it runs trainer.nccl_check)")

    facts = sub.add_parser("facts", help="print the platform facts jobs are rendered against, as JSON")
    stack_args(facts)

    # The GitOps commands live in infra/ (they read the stack configuration); each registers its
    # subcommand with add_parser(sub) and sets `run` (args -> exit code).
    for module in ("infra.render", "infra.pipeline_local"):
        importlib.import_module(module).add_parser(sub)

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
    if args.command in ("status", "logs"):
        from workloads.scheduling import team_namespace

        namespace = team_namespace(args.team)
        if args.command == "status":
            return _run(status_commands(args.name, namespace, args.kind))
        return _run([logs_command(args.name, namespace, worker=args.worker, follow=args.follow)])
    return cmd_readiness(args)


if __name__ == "__main__":
    sys.exit(main())
