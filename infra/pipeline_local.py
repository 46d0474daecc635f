"""`python -m workloads pipeline --local`: a declared pipeline's steps, run on this machine on CPU.

    python -m workloads pipeline workloads/declared/dev/pipelines/tiny-gpt.yaml --stack dev --local \
        --dataset ./my-texts --work-dir runs/pipeline

The commands are the WorkflowTemplate's own (``workloads.pipeline.step_commands`` builds both),
with local paths in place of the FSx ones and ``python`` the current interpreter:

1. prepare   the same ``prepare-data`` command, text files -> token shards (+ validation split)
2. train     the trainer command of the rendered PyTorchJob's Master container, plus the
             pipeline's overrides, under ``trainer.launch`` with one process; ``--override``s
             (tiny by default) shrink the model so it runs on a laptop CPU
3. evaluate  the same ``trainer.evaluate`` command: validation loss of the final checkpoint
4. register  the same ``trainer export`` command: Hugging Face export, registered in MLflow

MLflow is a local sqlite registry in the work directory. Every step runs with the work directory
as its current directory, beside a ``trainer`` link to this checkout's trainer package, as the
image runs from /app: relative config paths in job specs resolve the same way.
Exit code: 0 when a model version was registered with the training run's lineage, else the
failing step's exit code (2 for bad input).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import yaml

from infra.plan import ROOT
from infra.render import RenderError, default_job_renderer, load_config, cpu_node_selector
from workloads import pipeline

# MLflow is the trainer's dependency (not the infra extra's): its helpers live trainer-side.
from trainer.local_registry import create_run, registered_versions  # noqa: E402

# What makes any job spec small enough for a CPU in about a minute (same keys as trainer overrides).
TINY_OVERRIDES = (
    "model.size=tiny", "model.vocab_size=null", "data.seq_len=64", "data.micro_batch_size=8",
    "schedule.num_steps=40", "schedule.warmup_steps=4", "schedule.grad_accum_steps=1",
    "parallelism.strategy=auto", "parallelism.compile=false", "parallelism.mixed_precision=fp32",
    "checkpoint.every_steps=20", "checkpoint.async_mode=off", "tracking.log_every_steps=10",
)


def trainer_command(job: Mapping[str, Any]) -> list[str]:
    """``-m trainer train ...`` of the job's Master container (what torchrun runs in each process)."""
    container = next(c for c in job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
                     if c["name"] == "pytorch")
    args = list(container.get("args", []))
    for index in range(len(args) - 2):
        if args[index:index + 3] == ["-m", "trainer", "train"]:
            return args[index:]
    raise RenderError(f"PyTorchJob {job['metadata']['name']}: the pytorch container does not run `-m trainer train`")


def plain_env(job: Mapping[str, Any]) -> dict[str, str]:
    """The container's literal environment (secret references are the cluster's business)."""
    container = next(c for c in job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
                     if c["name"] == "pytorch")
    return {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e and "$(" not in str(e["value"])}


def _run(step: str, command: Sequence[str], *, cwd: Path, env: Mapping[str, str], log_dir: Path) -> int:
    print(f"[{step}] {' '.join(command)}", flush=True)
    started = time.monotonic()
    with open(log_dir / f"{step}.log", "w") as log:
        code = subprocess.call(list(command), cwd=cwd, env=dict(env), stdout=log, stderr=subprocess.STDOUT)
    print(f"[{step}] exit {code} in {time.monotonic() - started:.1f} s (log {log_dir / f'{step}.log'})", flush=True)
    if code != 0:
        print((log_dir / f"{step}.log").read_text()[-3000:], file=sys.stderr)
    return code


def run_local(declaration_path: Path, stack: str, *, dataset: str, work_dir: Path, overrides: Sequence[str],
              root: Path = ROOT, job_renderer=None) -> dict[str, Any]:
    source = str(declaration_path)
    declaration = pipeline.parse_declaration(yaml.safe_load(declaration_path.read_text()), source=source)
    config = load_config(stack, root)
    renderer = job_renderer or default_job_renderer(stack, root)
    job = renderer(root / declaration.job_spec)
    spec = pipeline.pipeline_spec(declaration, job, fsx_claim="local", tracking_secret=None,
                                  cpu_node_selector=cpu_node_selector(config))
    pipeline.workflow_template(spec)  # the cluster's template must render from the same inputs

    work_dir = work_dir.resolve()
    run_name = f"{declaration.name}-local"
    paths = pipeline.StepPaths(str(work_dir / run_name))
    run_dir = Path(paths.work_dir)
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    link = run_dir / "trainer"
    if not link.exists():
        link.symlink_to(root / "trainer", target_is_directory=True)
    mlflow_uri = f"sqlite:///{run_dir}/mlflow.db"
    env = {**os.environ, **plain_env(job), "MLFLOW_TRACKING_URI": mlflow_uri, "PYTHONPATH": str(root),
           "TRAINER_RUN_ID": run_name, "OMP_NUM_THREADS": "1"}
    dataset_path = str(Path(dataset).resolve())

    def commands(final_checkpoint: str) -> dict[str, list[str]]:
        return pipeline.step_commands(paths=paths, dataset=dataset_path, model_name=declaration.model_name,
                                      run_name=run_name, pipeline=declaration.name, job_spec=declaration.job_spec,
                                      final_checkpoint=final_checkpoint, python=sys.executable)

    result: dict[str, Any] = {"run_dir": str(run_dir), "mlflow_uri": mlflow_uri, "exit_codes": {}}
    # In the cluster the MLflow server is up before the job and the trainer records its run in
    # every checkpoint. A fresh sqlite file needs seconds of migrations, longer than a tiny run
    # takes to its first checkpoint: the run is created here and named to every step through
    # MLFLOW_RUN_ID, which the trainer, evaluate and export all honour.
    env["MLFLOW_RUN_ID"] = create_run(mlflow_uri, run_dir, env.get("MLFLOW_EXPERIMENT_NAME") or declaration.name,
                                      run_name)
    result["mlflow_run_id"] = env["MLFLOW_RUN_ID"]

    def step(name: str, command: Sequence[str]) -> bool:
        code = _run(name, command, cwd=run_dir, env=env, log_dir=logs)
        result["exit_codes"][name] = code
        return code == 0

    if not step("prepare", commands("")["prepare"]):
        return result
    train = [sys.executable, "-m", "trainer.launch", "--standalone", "--nproc-per-node=1",
             *trainer_command(job), *pipeline.train_overrides(paths, run_name), *overrides]
    if not step("train", train):
        return result
    if not step("evaluate", commands("")["evaluate"]):
        return result
    final_checkpoint = Path(paths.final_checkpoint_file).read_text().strip()
    result["evaluation"] = json.loads(Path(paths.evaluation).read_text())
    if not step("register", commands(final_checkpoint)["register"]):
        return result
    result["registered"] = registered_versions(mlflow_uri, declaration.model_name)
    return result


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("pipeline", help="run a declared pipeline (prepare -> train -> evaluate -> register)",
                            description=__doc__.splitlines()[0])
    parser.add_argument("declaration", help="pipeline declaration, e.g. workloads/declared/dev/pipelines/NAME.yaml")
    parser.add_argument("--stack", required=True)
    parser.add_argument("--local", action="store_true", required=True,
                        help="run the steps here on CPU (on the cluster, submit the WorkflowTemplate with argo submit)")
    parser.add_argument("--dataset", required=True, help="local text files (directory or glob) in place of the FSx path")
    parser.add_argument("--work-dir", default="runs/pipeline")
    parser.add_argument("--override", action="append", default=None,
                        help=f"trainer override for the train step (default: {' '.join(TINY_OVERRIDES)})")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    overrides = args.override if args.override is not None else list(TINY_OVERRIDES)
    try:
        result = run_local(Path(args.declaration), args.stack, dataset=args.dataset, work_dir=Path(args.work_dir),
                           overrides=overrides)
    except (RenderError, ValueError, FileNotFoundError) as exc:
        print(f"pipeline: {exc}", file=sys.stderr)
        return 2
    failed = [(s, c) for s, c in result["exit_codes"].items() if c != 0]
    if failed:
        return failed[0][1]
    versions = result.get("registered") or []
    if not versions:
        print("pipeline: register finished but no model version is in the registry", file=sys.stderr)
        return 1
    latest = versions[-1]
    print(f"pipeline: val_loss {result['evaluation']['val_loss']:.4f} at step {result['evaluation']['step']}; "
          f"registered version {latest['version']} from run {latest['run_id']} in {result['mlflow_uri']}")
    return 0
