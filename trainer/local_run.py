"""The README's main command: the whole spot-interruption story on a laptop, in < 3 minutes.

prepare-data on Python's own sources -> tiny GPT, 2 CPU ranks under torchrun (through the
container's launcher) -> local MLflow (sqlite + local artifacts) -> SIGTERM half way ->
exit 143 -> automatic resume -> summary and a loss-curve PNG. Everything under --output-dir.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

from trainer.contract.layout import complete_steps, step_dir_name
from trainer.preemption import EXIT_PREEMPTED

CORPUS_MODULES = ["argparse", "textwrap", "string", "functools", "dataclasses", "json.decoder", "logging"]
NUM_STEPS = 300
CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "tiny.yaml")


def corpus() -> list[str]:
    import importlib

    return [importlib.import_module(m).__file__ for m in CORPUS_MODULES]


def logged_steps(metrics_path: str) -> int:
    if not os.path.exists(metrics_path):
        return 0
    last = 0
    with open(metrics_path) as f:
        for line in f:
            try:
                last = max(last, json.loads(line)["step"])
            except ValueError:
                pass
    return last


def launch(out: str, env: dict, log_name: str, interrupt_at_step: int | None) -> int:
    cmd = [sys.executable, "-m", "trainer.launch", "--standalone", "--nproc-per-node=2",
           "-m", "trainer", "train", "--config", CONFIG,
           f"data.dir={out}/data", f"checkpoint.dir={out}/checkpoints", f"schedule.num_steps={NUM_STEPS}",
           "checkpoint.every_steps=50", "tracking.log_every_steps=10", "tracking.experiment=trainer-local"]
    with open(os.path.join(out, log_name), "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        while interrupt_at_step is not None and proc.poll() is None:
            if logged_steps(os.path.join(out, "checkpoints", "metrics.jsonl")) >= interrupt_at_step:
                print(f"  sending SIGTERM to the launcher at step >= {interrupt_at_step} (as Kubernetes would)")
                proc.send_signal(signal.SIGTERM)
                break
            time.sleep(0.05)
        return proc.wait()


def plot(metrics_path: str, png: str, interrupted_at: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in open(metrics_path) if '"loss"' in line]
    steps, losses = [r["step"] for r in rows], [r["loss"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, losses, lw=1)
    ax.axvline(interrupted_at, color="red", ls="--", label=f"SIGTERM, resumed from step {interrupted_at}")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/byte)")
    ax.set_title("tiny GPT, 2 CPU ranks, interrupted and resumed")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.local_run", description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default="runs/local")
    out = os.path.abspath(parser.parse_args(argv).output_dir)
    if os.path.exists(os.path.join(out, "checkpoints")):
        import shutil

        shutil.rmtree(out)  # a demo starts from nothing; a stale checkpoint would be resumed
    os.makedirs(out, exist_ok=True)
    started = time.time()

    from trainer.prepare import prepare

    print(f"[1/4] prepare-data: {len(CORPUS_MODULES)} modules of Python's standard library, byte-level tokens")
    manifest = prepare(corpus(), os.path.join(out, "data"), show_progress=True)
    print(f"  {manifest['num_tokens']:,} tokens, hash {manifest['hash']}")

    mlflow_uri = f"sqlite:///{out}/mlflow.db"
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_uri)
    # Created here so artifacts land under the output dir, not in the current directory.
    if client.get_experiment_by_name("trainer-local") is None:
        client.create_experiment("trainer-local", artifact_location=f"file://{out}/mlartifacts")
    repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_uri, "TRAINER_RUN_ID": "local-demo",
           "DATASET_VERSION": "python-stdlib", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": repo_root + os.pathsep + os.environ.get("PYTHONPATH", "")}

    print(f"[2/4] torchrun, 2 CPU ranks, {NUM_STEPS} steps; SIGTERM at about step {NUM_STEPS // 2}")
    code = launch(out, env, "attempt-1.log", interrupt_at_step=NUM_STEPS // 2)
    steps_after_first = complete_steps(os.path.join(out, "checkpoints"))
    interrupted_at = steps_after_first[-1] if steps_after_first else 0
    print(f"  launcher exit code {code} (expected {EXIT_PREEMPTED}); newest complete checkpoint: step {interrupted_at}")
    if code != EXIT_PREEMPTED:
        print(f"FAILED: see {out}/attempt-1.log")
        return 1

    print("[3/4] the pod is recreated: same command, `resume: auto` picks the newest complete checkpoint")
    code = launch(out, env, "attempt-2.log", interrupt_at_step=None)
    print(f"  launcher exit code {code}")
    if code != 0:
        print(f"FAILED: see {out}/attempt-2.log")
        return 1

    print("[4/4] summary")
    ckpt = os.path.join(out, "checkpoints")
    summary = json.load(open(os.path.join(ckpt, "summary.json")))
    png = os.path.join(out, "loss.png")
    plot(os.path.join(ckpt, "metrics.jsonl"), png, interrupted_at)
    runs = client.search_runs([client.get_experiment_by_name("trainer-local").experiment_id],
                              filter_string="tags.`trainer.job_id` = 'local-demo'")
    run = runs[0]
    loss_steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
    losses = [json.loads(line)["loss"] for line in open(os.path.join(ckpt, "metrics.jsonl")) if '"loss"' in line]
    report = {
        "steps": summary["final_step"],
        "interrupted_and_resumed_at_step": interrupted_at,
        "restarts": summary["num_restarts"],
        "checkpoints_kept": [step_dir_name(s) for s in complete_steps(ckpt)],
        "goodput": round(summary["goodput"], 3),
        "mlflow_runs_for_job": len(runs),
        "mlflow_run_id": run.info.run_id,
        "mlflow_loss_points": len(loss_steps),
        "mlflow_loss_steps_unique_and_ordered": loss_steps == sorted(set(loss_steps)),
        "wall_seconds": round(time.time() - started, 1),
    }
    print(f"  loss {losses[0]:.3f} -> {losses[-1]:.3f} over {summary['final_step']} steps")
    for k, v in report.items():
        print(f"  {k}: {v}")
    print(f"  loss curve:   {png}")
    print(f"  checkpoints:  {ckpt}")
    print(f"  MLflow UI:    mlflow ui --backend-store-uri {mlflow_uri}  (experiment trainer-local)")
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    healthy = (len(runs) == 1 and report["mlflow_loss_steps_unique_and_ordered"]
               and loss_steps == list(range(1, NUM_STEPS + 1)) and summary["num_restarts"] == 1)
    print("OK" if healthy else "FAILED: the MLflow run is not one run with every step once")
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
