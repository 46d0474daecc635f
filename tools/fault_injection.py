"""Seeded fault injection for the trainer: kill it every way a cluster can, restart it as the
operator would, and check that the result is the uninterrupted run's, bit for bit.

    python tools/fault_injection.py --seed 7 --num-faults 10 --steps 80 [--nproc 3] [--async-mode thread|process]
        [--workdir DIR]

One baseline run (no faults), then a faulted run of the same job: every attempt is one pod
(`python -m trainer.launch`, torchrun, N CPU ranks) that gets at most one fault, chosen from
the seed:

  pod_sigterm   SIGTERM to the launcher (the kubelet's spot drain) at a random step
  pod_sigkill   SIGKILL to the launcher and every process under it (node lost, grace exceeded)
  rank_sigkill  SIGKILL of one random rank after a random step (OOM killer)
  rank_sigterm  SIGTERM to one random rank only
  in_save       SIGKILL of a random rank between its checkpoint write and the marker
  in_retention  SIGKILL of rank 0 while it deletes an old checkpoint

After each attempt the exit code must be what the operator retries (128-255) or 0 when the
job is done; 1-127 (permanent) fails the check at once. At the end: the final model and
optimizer equal the baseline's bitwise, and every computed metric (all but the measured ones,
trainer.metrics.MEASURED_METRICS: loss, learning rate, gradient norm, tokens seen, skipped
updates, validation loss) is logged once per step with the baseline's exact values, in
metrics.jsonl and in MLflow (sqlite). Exit 0 when every check holds; a JSON report is printed
either way.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

TINY_CONFIG = os.path.join(REPO, "trainer", "configs", "tiny.yaml")
KINDS = ["pod_sigterm", "pod_sigkill", "rank_sigkill", "rank_sigterm", "in_save", "in_retention"]


def overrides(data_dir: str, ckpt: str, steps: int, every: int, keep: int, async_mode: str) -> list[str]:
    values = {
        # Validation at every save: its loss is a computed metric, compared like the others.
        "evaluation.every_steps": every, "evaluation.num_batches": 2,
        "data.dir": data_dir, "checkpoint.dir": ckpt, "data.seq_len": 32, "data.micro_batch_size": 4,
        "schedule.num_steps": steps, "schedule.warmup_steps": 5, "schedule.grad_accum_steps": 2,
        "checkpoint.every_steps": every, "checkpoint.keep_last": keep,
        "checkpoint.async_mode": f"\"{async_mode}\"",  # quoted: YAML reads a bare off as false
        # Logging less often than saving: a save must flush the pending losses itself.
        "tracking.log_every_steps": 3, "model.dropout": 0.1, "tracking.experiment": "fault-injection",
        # Faults are injected on purpose, several in a row may land before a new checkpoint:
        # the launcher's retry bound (trainer/retries.py) would rightly stop such a job.
        "checkpoint.max_attempts_without_progress": 0,
    }
    return [f"{k}={v}" for k, v in values.items()]


def launcher_cmd(nproc: int, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "trainer.launch", f"--nproc-per-node={nproc}", "--standalone",
            "-m", "trainer", "train", "--config", TINY_CONFIG, *args]


def base_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for k in ("MLFLOW_TRACKING_URI", "TRAINER_FAULTS"):
        env.pop(k, None)
    env.update({"PYTHONPATH": REPO, "OMP_NUM_THREADS": "1", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "20"})
    env.update(extra)
    return env


def logged_steps(ckpt: str) -> int:
    path = os.path.join(ckpt, "metrics.jsonl")
    best = 0
    try:
        with open(path) as f:
            for line in f:
                try:
                    best = max(best, json.loads(line)["step"])
                except (ValueError, KeyError):
                    pass
    except OSError:
        pass
    return best


def descendants(root_pid: int) -> list[int]:
    """Every process under root_pid (the 'pod'), from /proc: only what this tool started."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, stack = [], [root_pid]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def run_attempt(cmd, env, ckpt, signal_at_step=None, pod_signal=None, timeout=300.0) -> tuple[int, str]:
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if signal_at_step is not None:
        deadline = time.time() + timeout
        while proc.poll() is None and time.time() < deadline:
            if logged_steps(ckpt) >= signal_at_step:
                if pod_signal == signal.SIGKILL:
                    for pid in descendants(proc.pid):
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                proc.send_signal(pod_signal)
                break
            time.sleep(0.02)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in descendants(proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.kill()
        out, _ = proc.communicate()
        return -999, out
    code = proc.returncode
    # A container killed by a signal reports 128+N to the operator.
    return (128 - code if code < 0 else code), out


def newest_checkpoint_step(ckpt: str) -> int:
    from trainer.checkpoint.layout import list_steps

    steps = list_steps(ckpt)
    return steps[-1] if steps else 0


def plan_fault(rng: random.Random, kind: str, progress: int, steps: int, every: int, keep: int, nproc: int):
    """(TRAINER_FAULTS spec or None, external signal step or None, external signal or None, label)."""
    lo = progress + 2
    if lo >= steps:
        return None, None, None, "none (too close to the end)"
    at = rng.randint(lo, steps - 1)
    rank = rng.randrange(nproc)
    if kind == "pod_sigterm":
        return None, at, signal.SIGTERM, f"pod SIGTERM at step {at}"
    if kind == "pod_sigkill":
        return None, at, signal.SIGKILL, f"pod SIGKILL at step {at}"
    if kind == "rank_sigkill":
        return f"after_step@{at}:{rank}:KILL", None, None, f"SIGKILL rank {rank} after step {at}"
    if kind == "rank_sigterm":
        return f"after_step@{at}:{rank}:TERM", None, None, f"SIGTERM rank {rank} after step {at}"
    saves = [s for s in range(every, steps, every) if s > progress]
    if kind == "in_save" and saves:
        step = rng.choice(saves)
        return f"in_save@{step}:{rank}:KILL", None, None, f"SIGKILL rank {rank} inside the save of step {step}"
    prunable = [s for s in saves if s + every * keep <= steps]
    if kind == "in_retention" and prunable:
        step = rng.choice(prunable)
        return f"in_retention@{step}:0:KILL", None, None, f"SIGKILL rank 0 while deleting step {step}"
    return f"after_step@{at}:{rank}:KILL", None, None, f"SIGKILL rank {rank} after step {at} (fallback)"


def read_losses(ckpt: str) -> tuple[dict[int, float], list[int]]:
    rows = []
    with open(os.path.join(ckpt, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    steps = [r["step"] for r in rows if "loss" in r]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}, steps


def read_computed_metrics(ckpt: str) -> tuple[dict[str, dict[int, float]], list[str]]:
    """Every computed metric of metrics.jsonl (measured ones left out): {name: {step: value}},
    and the problems found reading them (a metric logged twice for one step)."""
    from trainer.metrics import MEASURED_METRICS

    with open(os.path.join(ckpt, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    metrics: dict[str, dict[int, float]] = {}
    problems = []
    for row in rows:
        for name, value in row.items():
            if name == "step" or name in MEASURED_METRICS or value is None:
                continue
            if row["step"] in metrics.setdefault(name, {}):
                problems.append(f"metrics.jsonl logs {name} twice at step {row['step']}")
            metrics[name][row["step"]] = value
    return metrics, problems


def compare_metrics(base: dict[str, dict[int, float]], got: dict[str, dict[int, float]], where: str) -> list[str]:
    """Problems where `got` is not `base` exactly: a metric or a step missing or extra, a value
    one bit off."""
    problems = []
    for name in sorted(set(base) | set(got)):
        b, g = base.get(name, {}), got.get(name, {})
        if sorted(b) != sorted(g):
            problems.append(f"{where}: {name} logged at steps {sorted(set(g) ^ set(b))[:10]} in one run only")
        off = [s for s in sorted(set(b) & set(g)) if b[s] != g[s]]
        if off:
            problems.append(f"{where}: {name} differs from the baseline at steps {off[:10]} "
                            f"(e.g. {b[off[0]]!r} vs {g[off[0]]!r})")
    return problems


def flat_tensors(step_directory: str, scratch: str) -> dict:
    """Every tensor of a DCP checkpoint directory (model and optimizer), by dotted name."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = os.path.join(scratch, f"flat-{os.path.basename(step_directory)}-{time.time_ns()}.pt")
    dcp_to_torch_save(step_directory, out)
    flat = {}

    def walk(prefix, node):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(node, torch.Tensor):
            flat[prefix] = node

    walk("", torch.load(out, weights_only=False))
    return flat


def final_tensors(ckpt: str, steps: int, scratch: str) -> dict:
    from trainer.checkpoint.layout import step_dir

    return flat_tensors(step_dir(ckpt, steps), scratch)


def run(seed: int, num_faults: int, steps: int, nproc: int, workdir: str, data_dir: str | None = None,
        every: int = 5, keep: int = 2, log=print, async_mode: str = "thread") -> dict:
    import torch

    rng = random.Random(seed)
    if data_dir is None:
        from trainer.prepare import prepare
        import argparse as corpus_a, string as corpus_s, textwrap as corpus_t

        data_dir = os.path.join(workdir, "data")
        prepare([corpus_a.__file__, corpus_t.__file__, corpus_s.__file__], data_dir, show_progress=False)
    baseline, faulted = os.path.join(workdir, "baseline"), os.path.join(workdir, "faulted")
    report: dict = {"seed": seed, "steps": steps, "nproc": nproc, "attempts": [], "problems": []}

    code, out = run_attempt(launcher_cmd(nproc, overrides(data_dir, baseline, steps, every, keep, "off")),
                            base_env(), baseline)
    if code != 0:
        report["problems"].append(f"baseline exited {code}: {out[-2000:]}")
        return report

    mlflow_uri = f"sqlite:///{os.path.join(workdir, 'mlflow.db')}"
    from mlflow.tracking import MlflowClient

    # The sqlite file stands in for the MLflow server, whose database schema exists before any
    # job runs. Created here, not by the first trainer attempt: a kill in the middle of that
    # schema migration breaks the file for good (which a real server never exposes to a job).
    MlflowClient(tracking_uri=mlflow_uri).create_experiment("fault-injection")
    env = base_env(MLFLOW_TRACKING_URI=mlflow_uri, TRAINER_RUN_ID=f"fault-injection-{seed}")
    cmd = launcher_cmd(nproc, overrides(data_dir, faulted, steps, every, keep, async_mode))
    faults_left = num_faults
    for attempt in range(num_faults * 2 + 4):
        progress = newest_checkpoint_step(faulted)
        spec = at = sig = None
        label = "none"
        if faults_left > 0:
            kind = rng.choice(KINDS)
            spec, at, sig, label = plan_fault(rng, kind, progress, steps, every, keep, nproc)
            faults_left -= 1
        attempt_env = dict(env, TRAINER_FAULTS=spec) if spec else env
        started = time.time()
        code, out = run_attempt(cmd, attempt_env, faulted, signal_at_step=at, pod_signal=sig)
        entry = {"attempt": attempt, "fault": label, "resumed_from": progress, "exit": code,
                 "seconds": round(time.time() - started, 1)}
        report["attempts"].append(entry)
        with open(os.path.join(workdir, f"attempt-{attempt}.log"), "w") as f:
            f.write(out)
        log(json.dumps(entry))
        if code == 0:
            break
        if not 128 <= code <= 255:
            report["problems"].append(f"attempt {attempt} ({label}) exited {code}, which the operator treats as "
                                      f"permanent:\n{out[-4000:]}")
            return report
    else:
        report["problems"].append("the job did not finish within the attempts allowed")
        return report

    base_losses, _ = read_losses(baseline)
    got_losses, got_steps = read_losses(faulted)
    if sorted(got_steps) != list(range(1, steps + 1)):
        report["problems"].append(f"metrics.jsonl steps are not 1..{steps} once each: {got_steps}")
    base_metrics, problems = read_computed_metrics(baseline)
    got_metrics, more = read_computed_metrics(faulted)
    report["problems"] += problems + more + compare_metrics(base_metrics, got_metrics, "metrics.jsonl")
    report["metrics_compared"] = sorted(base_metrics)
    a, b = final_tensors(baseline, steps, workdir), final_tensors(faulted, steps, workdir)
    different = sorted(k for k in a if k not in b or not torch.equal(a[k], b[k]))
    if a.keys() != b.keys() or different:
        report["problems"].append(f"final model/optimizer differ from the baseline: {different[:10]}")
    report["num_tensors_compared"] = len(a)

    client = MlflowClient(tracking_uri=mlflow_uri)
    experiment = client.get_experiment_by_name("fault-injection")
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    if len(runs) != 1:
        report["problems"].append(f"expected one MLflow run, found {len(runs)}")
    else:
        run_id = runs[0].info.run_id
        logged = {name: {m.step: m.value for m in client.get_metric_history(run_id, name)}
                  for name in runs[0].data.metrics if name in base_metrics}
        counts = {name: len(client.get_metric_history(run_id, name)) for name in logged}
        twice = [name for name in logged if counts[name] != len(logged[name])]
        if twice:
            report["problems"].append(f"MLflow holds a step twice for {twice}")
        report["problems"] += compare_metrics(base_metrics, logged, "MLflow")
        if runs[0].info.status != "FINISHED":
            report["problems"].append(f"MLflow run status {runs[0].info.status}, expected FINISHED")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--num-faults", type=int, default=8)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--nproc", type=int, default=3, help="ranks (3+: a summation order that resumes must keep)")
    parser.add_argument("--async-mode", choices=["thread", "process"], default="thread",
                        help="the faulted run's checkpoint.async_mode (the baseline saves synchronously)")
    parser.add_argument("--workdir", help="default: a new temporary directory (kept)")
    args = parser.parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="fault-injection-")
    os.makedirs(workdir, exist_ok=True)
    report = run(args.seed, args.num_faults, args.steps, args.nproc, workdir,
                 log=lambda line: print(line, file=sys.stderr, flush=True), async_mode=args.async_mode)
    report["workdir"] = workdir
    print(json.dumps(report, indent=1))
    return 0 if not report["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
