"""`python -m workloads pipeline --local`: a declared pipeline's steps, run on this machine on CPU.

    python -m workloads pipeline workloads/declared/dev/pipelines/shakespeare-gpt.yaml --stack dev --local \
        --dataset ./my-texts --work-dir runs/pipeline

Everything comes from the WorkflowTemplate that ``render`` writes for the cluster, run the way
the cluster would run it, with ``<work-dir>/<run>/fsx`` standing in for the FSx volume:

1. prepare   the template's ``prepare-data`` command (``workloads.pipeline.step_commands``),
             text files -> token shards with a validation split
2. train     the PyTorchJob embedded in the template's train step, ``{{workflow.name}}``
             substituted as Argo does, made tiny by ``jobs.local.shrink`` and run by
             ``jobs.local.run_local``: each pod's exact command, arguments and environment
             (the operator's rendezvous variables on loopback, Secrets from a local stand-in),
             retryable exits retried as ``restartPolicy: ExitCode`` would
3. evaluate  the template's ``trainer.evaluate`` command: validation loss of the final checkpoint
4. register  the template's ``trainer export`` command, with the checkpoint evaluate wrote

MLflow is a sqlite registry in the run directory, given to the pods through their tracking
Secret as the cluster's MLflow is. Exit code: 0 when a model version was registered from the
training run, else the failing step's exit code (2 for bad input).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import secrets as secrets_module
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import yaml

from components.tracking import K8S_SECRET_NAME
from infra.plan import ROOT
from jobs.render import RenderError, cpu_node_selector, default_job_renderer, load_config
from workloads import pipeline
from workloads.jobspec import FSX_MOUNT_PATH
from jobs.local import LocalOverrides, LocalRunError, remap, run_local as run_pods, shrink
from workloads.trainingjob import CHECKPOINT_KEY_ITEM, CHECKPOINT_KEY_SECRET
from trainer.contract.environment import ENV_CHECKPOINT_KEY_FILE

# MLflow is the trainer's dependency (not the infra extra's): its helpers live trainer-side.
from trainer.local_registry import create_experiment, create_run, registered_versions  # noqa: E402

FAILED_TRAIN_EXIT = 5


def _run(step: str, command: Sequence[str], *, cwd: Path, env: Mapping[str, str], log_dir: Path) -> int:
    print(f"[{step}] {' '.join(command)}", flush=True)
    started = time.monotonic()
    with open(log_dir / f"{step}.log", "w") as log:
        code = subprocess.call(list(command), cwd=cwd, env=dict(env), stdout=log, stderr=subprocess.STDOUT)
    print(f"[{step}] exit {code} in {time.monotonic() - started:.1f} s (log {log_dir / f'{step}.log'})", flush=True)
    if code != 0:
        print((log_dir / f"{step}.log").read_text()[-3000:], file=sys.stderr)
    return code


def local_train_job(template: Mapping[str, Any], run_name: str, steps: int) -> dict[str, Any]:
    """The train step's PyTorchJob as Argo would create it for this run, shrunk for a CPU."""
    train = next(t for t in template["spec"]["templates"] if t["name"] == "train")
    job = yaml.safe_load(train["resource"]["manifest"].replace("{{workflow.name}}", run_name))
    return shrink(job, LocalOverrides(num_steps=steps, checkpoint_every_steps=max(1, steps // 2)))


def _checkpoint_key(run_dir: Path) -> tuple[str, Path]:
    """A fresh key stands in for the team's checkpoint signing key (trainer/trust.py): the train
    pods sign with it, and evaluate and register (which mount it in the cluster) verify with it."""
    checkpoint_key = secrets_module.token_hex(32)
    key_file = run_dir / "checkpoint-key"
    key_file.write_text(checkpoint_key)
    key_file.chmod(0o600)
    return checkpoint_key, key_file


def _train(job: dict[str, Any], pipeline_name: str, *, steps: int, run_name: str, run_dir: Path, mlflow_uri: str,
           checkpoint_key: str) -> tuple[str, int]:
    """The train step's pods, run here: the MLflow run they report to and their exit code."""
    container_env = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0].get("env", [])
    experiment = next((e["value"] for e in container_env if e["name"] == "MLFLOW_EXPERIMENT_NAME"), pipeline_name)
    # The pods run from the repository (the image's /app): the experiment is created here first,
    # so its artifacts land in the run directory. The run is created here too and named to the
    # pods by MLFLOW_RUN_ID, which the trainer honours for a first attempt: its tracker connects
    # in the background, and a tiny run on a cold sqlite store ends before it has, which would
    # leave the checkpoints without their run (in the cluster the server is up and jobs run for
    # hours, so the trainer creates the run itself).
    run_id = create_run(mlflow_uri, create_experiment(mlflow_uri, experiment, run_dir / "mlruns"), run_name)
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        for container in replica["template"]["spec"]["containers"]:
            container.setdefault("env", []).append({"name": "MLFLOW_RUN_ID", "value": run_id})
    secrets = {K8S_SECRET_NAME: {"MLFLOW_TRACKING_URI": mlflow_uri, "MLFLOW_TRACKING_USERNAME": "local",
                                 "MLFLOW_TRACKING_PASSWORD": "local"},
               CHECKPOINT_KEY_SECRET: {CHECKPOINT_KEY_ITEM: checkpoint_key}}
    print(f"[train] PyTorchJob {job['metadata']['name']} ({steps} steps), pods run locally", flush=True)
    try:
        pods = run_pods(job, workdir=run_dir, secrets=secrets, timeout_seconds=900,
                        say=lambda line: print(f"[train] {line}", flush=True))
    except LocalRunError as exc:
        print(f"[train] {exc}", file=sys.stderr)
        pods = None
    return run_id, 0 if pods is not None and pods.succeeded else FAILED_TRAIN_EXIT


def run_local(declaration_path: Path, stack: str, *, dataset: str, work_dir: Path, steps: int = 40,
              root: Path = ROOT, job_renderer=None) -> dict[str, Any]:
    source = str(declaration_path)
    declaration = pipeline.parse_declaration(yaml.safe_load(declaration_path.read_text()), source=source)
    if (problem := dataset_problem(dataset)) is not None:
        raise ValueError(problem)  # before the plan and any step: a missing corpus was a traceback in prepare's log
    config = load_config(stack, root)
    renderer = job_renderer or default_job_renderer(stack, root)
    spec = pipeline.pipeline_spec(declaration, renderer(root / declaration.job_spec), fsx_claim="local",
                                  tracking_secret=K8S_SECRET_NAME, cpu_node_selector=cpu_node_selector(config))
    template = pipeline.workflow_template(spec)

    run_name = f"{declaration.name}-local"
    run_dir = work_dir.resolve() / run_name
    fsx = run_dir / "fsx"  # the FSx stand-in (jobs.local maps the pods' mount here too)
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    # The cluster's paths for this run, on the stand-in.
    paths = pipeline.StepPaths(remap(pipeline.cluster_paths(spec).work_dir.replace("{{workflow.name}}", run_name),
                                     FSX_MOUNT_PATH, str(fsx)))
    mlflow_uri = f"sqlite:///{run_dir}/mlflow.db"
    checkpoint_key, key_file = _checkpoint_key(run_dir)
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_uri, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1",
           ENV_CHECKPOINT_KEY_FILE: str(key_file)}
    dataset_path = str(Path(dataset).resolve())
    result: dict[str, Any] = {"run_dir": str(run_dir), "mlflow_uri": mlflow_uri, "exit_codes": {}}

    def commands(final_checkpoint: str) -> dict[str, list[str]]:
        return pipeline.step_commands(paths=paths, dataset=dataset_path, model_name=declaration.model_name,
                                      run_name=run_name, pipeline=declaration.name, job_spec=declaration.job_spec,
                                      final_checkpoint=final_checkpoint, python=sys.executable)

    def step(name: str, command: Sequence[str]) -> bool:
        code = _run(name, command, cwd=run_dir, env=env, log_dir=logs)
        result["exit_codes"][name] = code
        return code == 0

    if not step("prepare", commands("")["prepare"]):
        return result

    result["mlflow_run_id"], result["exit_codes"]["train"] = _train(
        local_train_job(template, run_name, steps), declaration.name, steps=steps, run_name=run_name,
        run_dir=run_dir, mlflow_uri=mlflow_uri, checkpoint_key=checkpoint_key)
    if result["exit_codes"]["train"] != 0:
        return result

    if not step("evaluate", commands("")["evaluate"]):
        return result
    result["evaluation"] = json.loads(Path(paths.evaluation).read_text())
    final_checkpoint = Path(paths.final_checkpoint_file).read_text().strip()
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
                        help="run the steps here on CPU (on the cluster: argo submit --from workflowtemplate/NAME)")
    parser.add_argument("--dataset", required=True, help="local text files (directory or glob) in place of the FSx path")
    parser.add_argument("--work-dir", default="runs/pipeline")
    parser.add_argument("--steps", type=int, default=40, help="training steps of the tiny local run")
    parser.set_defaults(run=run)


DATASET_FIX = ("give a directory of text files (plain text or Markdown; .jsonl/.json with a 'text' field per line), "
               "e.g. mkdir texts && cp my-books/*.txt texts/, or a glob in quotes such as 'books/*.txt'")


def dataset_problem(dataset: str) -> Optional[str]:
    """Why ``--dataset`` holds nothing the prepare step can read (trainer/prepare.py input_files
    takes a directory, read recursively, or a glob), or None; checked before any step runs."""
    path = Path(dataset)
    if path.is_dir():
        if not any(p.is_file() for p in path.rglob("*")):
            return f"--dataset {dataset}: the directory {path.resolve()} holds no file. Fix: {DATASET_FIX}"
        return None
    if path.is_file() or glob.glob(dataset):
        return None
    return f"--dataset {dataset}: no such directory or file ({path.resolve()}). Fix: {DATASET_FIX}"


def run(args: argparse.Namespace) -> int:
    try:
        result = run_local(Path(args.declaration), args.stack, dataset=args.dataset, work_dir=Path(args.work_dir),
                           steps=args.steps)
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
