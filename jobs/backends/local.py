"""The local backend of the job client: a job's rendered pods as CPU processes on this machine
(`submit --local`), shrunk to a few steps, with stand-ins for the FSx mount, S3, MLflow and the
team's checkpoint key (the pod runner is jobs/local.py). What runs is the manifest the cluster
would get, from the job preflight resolved.
"""
from __future__ import annotations

import secrets
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, TextIO

from jobs import exit_codes

ROOT = Path(__file__).resolve().parent.parent.parent


@dataclass(frozen=True)
class LocalOptions:
    """workdir: where the FSx stand-in, logs and MLflow go (default runs/jobs/<job>). steps: training
    steps (default 40, 2 with ``faithful``: the job's own model and config). interrupt_at_step:
    SIGTERM one pod there. timeout_seconds: per attempt."""

    workdir: Optional[str] = None
    steps: Optional[int] = None
    interrupt_at_step: Optional[int] = None
    no_tracking: bool = False
    timeout_seconds: float = 900
    faithful: bool = False


def containers_env(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    if manifest["kind"] == "PyTorchJob":
        return [e for s in manifest["spec"]["pytorchReplicaSpecs"].values() for e in s["template"]["spec"]["containers"][0]["env"]]
    return list(manifest["spec"]["trainer"]["env"])


def faithful_refusal(spec: Any, ranks: int) -> Optional[str]:
    """Why the job's own model cannot run on this host (--faithful), or None."""
    from jobs.local import faithful_memory_problem, host_available_bytes
    from jobs.preflight import CUDA_RESERVE_GIB, GIB, memory_per_gpu, trainer_shape
    from trainer.config import build_config

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


class LocalBackend:
    """Runs a rendered job here; reports to ``out``/``err`` as it goes (what `submit --local` prints)."""

    def __init__(self, out: Optional[TextIO] = None, err: Optional[TextIO] = None):
        self._out, self._err = out, err

    @property
    def out(self) -> TextIO:
        return self._out or sys.stdout  # the stream at the time of writing (a test may capture it)

    @property
    def err(self) -> TextIO:
        return self._err or sys.stderr

    def run(self, manifest: dict[str, Any], *, spec: Any = None, archive: Any = None,
            options: LocalOptions = LocalOptions()) -> int:
        """The exit code of the command: 0 the run succeeded, 3 refused (--faithful does not fit
        here), 5 it failed."""
        from jobs.local import LocalOverrides, LocalRunError, replacements, replicas, run_local, shrink
        from workloads.trainingjob import CHECKPOINT_KEY_ITEM, CHECKPOINT_KEY_SECRET

        out, err = self.out, self.err
        workdir = Path(options.workdir or f"runs/jobs/{manifest['metadata']['name']}").resolve()
        # The job's own model on a CPU is slow: a faithful run proves a couple of steps by default.
        steps = options.steps or (2 if options.faithful else 40)
        overrides = LocalOverrides(num_steps=steps, checkpoint_every_steps=max(1, steps // 4), faithful=options.faithful)
        if options.faithful and spec is not None and spec.trainer is not None:
            if (refusal := faithful_refusal(spec, len(replicas(manifest)))) is not None:
                print(refusal, file=err)
                return exit_codes.REFUSED
        if workdir.exists():
            shutil.rmtree(workdir)  # a local run starts from nothing; a stale checkpoint would be resumed
        workdir.mkdir(parents=True)
        # Said before the run, so a green local run is never mistaken for the job's own config.
        print("local run replaces" + (" (--faithful: the job's own model and config)" if options.faithful else "") + ":",
              file=out)
        for line in replacements(manifest, overrides, dataset=spec.dataset if spec else "the dataset"):
            print(f"  {line}", file=out)
        s3_root = workdir / "s3"
        if archive is not None:
            from jobs import usercode

            target = usercode.local_object_path(spec.code.uri, s3_root)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.data)
        small = shrink(manifest, overrides)
        secret = {"MLFLOW_TRACKING_URI": "" if options.no_tracking else f"sqlite:///{workdir}/mlflow.db",
                  "MLFLOW_TRACKING_USERNAME": "", "MLFLOW_TRACKING_PASSWORD": ""}
        secret_names = {e["valueFrom"]["secretKeyRef"]["name"] for e in containers_env(small) if "valueFrom" in e
                        and "secretKeyRef" in e["valueFrom"]}
        print(f"local run in {workdir}: MLflow {secret['MLFLOW_TRACKING_URI'] or 'off'}, "
              f"{f'{steps} steps' if spec is None or spec.trainer else 'the steps your code takes'}, "
              f"SIGTERM to one pod at step {options.interrupt_at_step or 'never'}", file=out)
        try:
            # A fresh checkpoint signing key stands in for the team's (trainer/trust.py).
            local_secrets = {**{name: secret for name in secret_names},
                             CHECKPOINT_KEY_SECRET: {CHECKPOINT_KEY_ITEM: secrets.token_hex(32)}}
            result = run_local(small, workdir=workdir, secrets=local_secrets, s3_root=s3_root,
                               interrupt_at_step=options.interrupt_at_step, timeout_seconds=options.timeout_seconds)
        except LocalRunError as exc:
            print(f"error: {exc}", file=err)
            return exit_codes.LOCAL_FAILED
        print(f"complete checkpoints: {result.steps}; attempts: {[a.exit_codes for a in result.attempts]}", file=out)
        return exit_codes.OK if result.succeeded else exit_codes.LOCAL_FAILED
