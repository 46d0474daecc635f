"""The training loop. Everything optional was decided when the objects were built, so the
loop reads the same whatever the strategy, precision, checkpoint mode or tracking."""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import math
import os
import platform
import time
from typing import Callable

import torch

from trainer import distributed, reproducibility
from trainer.branch import current_branch, read_rollback
from trainer.checkpoint import Checkpointer, ModelAndOptimizer, ModelOnly, read_marker, resolve_resume
from trainer.checkpoint.spawn import background_process_signal
from trainer.config import TrainerConfig, dump_yaml
from trainer.contract.layout import step_dir_name
from trainer.gpu_faults import gpu_fault
from trainer.guards import (NonFiniteSteps, TrainingStopped, apply_optimizer_config, check_resume_compatible,
                            weights_finite)
from trainer.data import DistributedBatches, TokenShards
from trainer.evaluation import evaluator_for
from trainer.faults import fault_injector
from trainer.health import health_exporter
from trainer.metrics import Goodput, Heartbeat, flops_per_token, memory_meter, mfu_meter
from trainer.model import (apply_activation_checkpointing, build_model, count_params, hf_weight_files, load_hf_weights,
                           loss_function, materialize, model_dims)
from trainer.optim import build_optimizer, cosine_with_warmup
from trainer.preemption import EXIT_PREEMPTED, PreemptionFlag, is_peer_lost, preemption_budget_seconds, report_exit
from trainer.profiling import profiler_for
from trainer.progress import NoWatchdog, ProgressWatchdog
from trainer.s3 import NoMirror, mirror_for
from trainer.tracking import (BRANCH_POINT_TAG, ROLLBACK_OF_TAG, SWEEP_ID_ENV, SWEEP_NAME_ENV, JsonlTracker, MLflowTracker,
                              NullTracker, Trackers)

log = logging.getLogger("trainer")


def job_identity(cfg: TrainerConfig) -> str:
    # Without TRAINER_RUN_ID the checkpoint directory is the job: same directory, same run.
    return cfg.tracking.job_id or "job-" + hashlib.sha256(os.path.abspath(cfg.checkpoint.dir).encode()).hexdigest()[:12]


def mlflow_system_tags() -> dict[str, str]:
    """MLflow's standard system tags (mlflow/utils/mlflow_tags.py, "System tags" in the MLflow
    tracking docs), so the UI links a run to its commit and image like any MLflow run."""
    tags = {"mlflow.source.name": "python -m trainer train", "mlflow.source.type": "JOB"}
    optional = {"mlflow.source.git.commit": "GIT_COMMIT", "mlflow.source.git.repoURL": "GIT_REPO_URL",
                "mlflow.docker.image.uri": "IMAGE_URI", "mlflow.docker.image.id": "IMAGE_DIGEST"}
    tags.update({tag: os.environ[var] for tag, var in optional.items() if os.environ.get(var)})
    return tags


def run_tags(cfg: TrainerConfig, env: distributed.Env, shards: TokenShards) -> dict[str, str]:
    return {
        **mlflow_system_tags(),
        "git_commit": os.environ.get("GIT_COMMIT", "unknown"),
        "image_digest": os.environ.get("IMAGE_DIGEST", "unknown"),
        "dataset_version": os.environ.get("DATASET_VERSION", os.path.basename(os.path.abspath(cfg.data.dir))),
        "dataset_hash": shards.dataset_hash,
        "config_hash": cfg.hash(),
        "world_size": str(env.world_size),
        "torch_version": torch.__version__,
        "cuda_version": str(torch.version.cuda),
        "device": torch.cuda.get_device_name(env.device) if env.device.type == "cuda" else platform.processor() or "cpu",
    }


def build_tracker(cfg: TrainerConfig, env, shards, run_id: str | None, resume_step: int, branch: str = "main",
                  branch_tags: dict | None = None):
    if not env.is_main:
        return NullTracker()
    jsonl = JsonlTracker(os.path.join(cfg.checkpoint.dir, "metrics.jsonl"), resume_step)
    trackers = [jsonl]
    uri = cfg.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI")
    if cfg.tracking.enabled and uri:
        trackers.append(MLflowTracker(
            uri=uri, experiment=cfg.tracking.experiment, job_id=job_identity(cfg), run_name=cfg.tracking.run_name,
            # MLFLOW_RUN_ID (MLflow's own variable) names the run for a first attempt; a resumed
            # attempt keeps the run recorded in its checkpoint.
            run_id=run_id or (os.environ.get("MLFLOW_RUN_ID") if branch == "main" else None) or None,
            params=cfg.flat(), tags={**run_tags(cfg, env, shards), **(branch_tags or {})}, config_yaml=dump_yaml(cfg),
            backfill=jsonl.rows, branch=branch,
            sweep=(os.environ[SWEEP_ID_ENV], os.environ.get(SWEEP_NAME_ENV) or os.environ[SWEEP_ID_ENV])
            if os.environ.get(SWEEP_ID_ENV) else None))
    elif cfg.tracking.enabled:
        log.warning("tracking.enabled but no MLFLOW_TRACKING_URI: metrics go to metrics.jsonl only")
    return Trackers(*trackers)


def export_final_model(cfg: TrainerConfig, step: int, run_id: str | None, faults=None) -> None:
    """Rank 0, after the ranks parted (the final checkpoint is durable, every rank reported):
    the Hugging Face export of the final checkpoint, logged to MLflow (and registered) when
    tracking is on. Nothing here can make the attempt a failure: the job is done."""
    from trainer.checkpoint.layout import step_dir
    from trainer.export import export_and_log

    if faults is not None:
        faults.at("export", step)
    out_dir = os.path.join(cfg.export.dir or os.path.join(cfg.checkpoint.dir, "export"), step_dir_name(step))
    uri = cfg.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI")
    try:
        export_and_log(step_dir(cfg.checkpoint.dir, step), out_dir, cfg, run_id, uri)
    except Exception:  # noqa: BLE001 - the run is complete and checkpointed; a restart would not help
        # Failing here would make the operator restart a finished job, only to fail again.
        log.exception("export of step %d failed; the final checkpoint is intact: run `python -m trainer export "
                      "--checkpoint %s --out %s` once the cause is fixed", step, step_dir(cfg.checkpoint.dir, step), out_dir)


@dataclasses.dataclass
class Ending:
    """How an attempt's training ended, and what rank 0 still does once the ranks parted."""
    reason: str  # completed or preempted
    step: int
    checkpoint_step: int | None
    after: Callable[[], None]


class AfterTraining:
    """Rank 0's work after the final checkpoint is durable and every rank has reported: the S3
    uploads, the MLflow run's close, the run id in the marker, the export and registration.

    It runs after the process group is gone, so no other rank waits for it (their barrier was
    the start-up bound: an MLflow close plus an export longer than that made them fail a
    finished job), and each part is caught and logged: the attempt's exit code is decided by
    then (0 done, 143 preempted). Registration is idempotent (trainer/export.py), so a retried
    attempt of a finished job (a preemption during the export) registers nothing twice."""

    def __init__(self, cfg: TrainerConfig, env: distributed.Env, reason: str, step: int, tracker, checkpointer,
                 heartbeat, profile_dir: str | None, mirror_budget_seconds: float | None, faults):
        self.cfg, self.env, self.reason, self.step = cfg, env, reason, step
        self.tracker, self.checkpointer, self.heartbeat = tracker, checkpointer, heartbeat
        self.profile_dir, self.mirror_budget_seconds, self.faults = profile_dir, mirror_budget_seconds, faults

    def __call__(self) -> None:
        parts = [("S3 mirror", lambda: self.checkpointer.close_mirror(self.mirror_budget_seconds))]
        if self.env.is_main:
            parts += [("profile upload", self._log_profile), ("tracker close", self._close_tracker),
                      ("marker annotation", self._annotate)]
            if self.reason == "completed" and self.cfg.export.at_end:
                parts.append(("export", lambda: export_final_model(self.cfg, self.step, self.tracker.run_id,
                                                                   self.faults)))
            parts.append(("heartbeat", lambda: self.heartbeat.beat(self.step)))
        for name, part in parts:
            try:
                part()
            except Exception:  # noqa: BLE001 - the checkpoint is durable; nothing here is the job's failure
                log.exception("%s after step %d failed (the checkpoint of step %s is durable)", name, self.step,
                              self.checkpointer.last_durable_step)

    def _log_profile(self) -> None:
        if self.profile_dir and os.path.isdir(self.profile_dir):
            self.tracker.log_artifact(self.profile_dir, "profile")

    def _close_tracker(self) -> None:
        self.tracker.close(status="FINISHED" if self.reason == "completed" else "SCHEDULED",
                           timeout_seconds=30.0 if self.reason == "completed" else 10.0)

    def _annotate(self) -> None:
        if self.tracker.run_id:  # close() waited for MLflow: the last marker learns its run id if it had none
            self.checkpointer.annotate_newest({"mlflow_run_id": self.tracker.run_id})
            self.checkpointer.wait_sealed()


def main(cfg: TrainerConfig, process_start: float | None = None) -> int:
    """Runs one attempt of the job; returns the process exit code (0, or 143 when preempted)."""
    rank = int(os.environ.get("RANK", 0))
    # The report comes first and everything that can raise (the store connection and the
    # process groups included) runs inside the try: a rank whose peer died during start-up
    # reports a lost peer (retryable) instead of leaving no report (torchrun's 1: permanent).
    report_exit(rank, "running", -1)
    preemption: PreemptionFlag | None = None
    trainer: Trainer | None = None
    try:
        env = distributed.init(cfg.parallelism)
        logging.basicConfig(level=logging.INFO if env.is_main else logging.WARNING,
                            format=f"%(asctime)s [rank {env.rank}] %(name)s: %(message)s", force=True)
        reproducibility.apply(cfg.reproducibility.deterministic, cfg.seed)  # before the first cuBLAS handle (matmul)
        preemption = PreemptionFlag().install()
        trainer = Trainer(cfg, env, process_start or time.time(), preemption)
        ending = trainer.run()
        # Every rank meets here once the final checkpoint is durable (rank 0 sealed it in
        # Trainer.finish), then the group is gone: nothing rank 0 does after it can hold or
        # fail another rank. The trainer goes first: its model and optimizer are garbage.
        trainer = None
        distributed.teardown(clean=True)
    except BaseException as exc:
        # What the launcher needs to tell a root cause (permanent) from a consequence of a
        # peer's death or of a signal (retryable), written before anything else: closing the
        # tracker takes seconds, and an abort meanwhile (NCCL's watchdog) must not lose it.
        step, checkpoint_step, signalled = trainer.progress() if trainer is not None else (-1, None, False)
        report_exit(rank, "failed", step, checkpoint_step=checkpoint_step, exception=type(exc).__name__,
                    peer_lost=is_peer_lost(exc), signalled=bool(signalled or (preemption and preemption.raised)),
                    child_signal=background_process_signal(exc), gpu_fault=gpu_fault(exc))
        if trainer is not None:
            trainer.close_after_failure(exc)
        distributed.teardown(clean=False)
        raise
    report_exit(rank, ending.reason, ending.step, checkpoint_step=ending.checkpoint_step)
    ending.after()
    return EXIT_PREEMPTED if ending.reason == "preempted" else 0


@dataclasses.dataclass
class StepResult:
    loss: torch.Tensor  # this rank's mean loss over the accumulation steps
    norm: torch.Tensor  # gradient norm before clipping
    lr: float  # the rate this step used
    preempted: bool  # agreed across ranks, like the two flags below
    time_due: bool
    bad: bool  # non-finite loss or gradient on some rank: the update was skipped


class SavePolicy:
    """When to save: every `every_steps`, every `every_seconds` (rank clocks reconciled by the
    step's flag all-reduce), on a signal, and at the last step."""

    def __init__(self, cfg: TrainerConfig):
        self.every_steps, self.every_seconds = cfg.checkpoint.every_steps, cfg.checkpoint.every_seconds
        self.num_steps = cfg.schedule.num_steps
        self.last_save = time.monotonic()

    def time_due(self) -> bool:
        return self.every_seconds > 0 and time.monotonic() - self.last_save >= self.every_seconds

    def due(self, step: int, result: StepResult) -> bool:
        return step % self.every_steps == 0 or result.time_due or result.preempted or step == self.num_steps

    def saved(self) -> None:
        self.last_save = time.monotonic()


class MetricsWindow:
    """The losses not logged yet and the timings of the steps since the last log. Evaluation and
    checkpoint stalls are excluded: tokens/s and MFU measure training only."""

    def __init__(self, env: distributed.Env, tokens_per_step: int):
        self.env, self.tokens_per_step = env, tokens_per_step
        self.pending: list[tuple[int, torch.Tensor]] = []
        self.reset()

    def reset(self) -> None:
        self.start, self.steps, self.data_wait, self.compute = time.perf_counter(), 0, 0.0, 0.0

    def add(self, step: int, loss: torch.Tensor, data_wait: float, seconds: float) -> None:
        self.pending.append((step, loss))
        self.steps, self.data_wait, self.compute = self.steps + 1, self.data_wait + data_wait, self.compute + seconds

    def exclude(self, seconds: float) -> None:
        self.start += seconds

    def flush(self, tracker) -> tuple[float, float, dict]:
        """Logs the pending losses (one all-reduce); returns the last loss, tokens/s and the
        window's averages, and starts a new window."""
        elapsed = time.perf_counter() - self.start
        losses = distributed.all_reduce_mean(self.env, torch.stack([loss for _, loss in self.pending])).tolist()
        for (s, _), value in zip(self.pending, losses):
            tracker.log(s, {"loss": value})
        averages = {"step_seconds": self.compute / self.steps, "data_wait_seconds": self.data_wait / self.steps}
        tokens_per_second = self.steps * self.tokens_per_step / elapsed
        self.pending.clear()
        self.reset()
        return losses[-1], tokens_per_second, averages


class Trainer:
    """One attempt of the job: built in __init__ (model, optimizer, data, resume), then `run()`.

    The loop in `run()` calls small parts: `train_step` (the maths), `SavePolicy`,
    `MetricsWindow` and `log_metrics`, `evaluate`, `save_regular` / `save_on_signal` (the
    preemption path), with goodput, the non-finite guard and fault hooks behind them."""

    def __init__(self, cfg: TrainerConfig, env: distributed.Env, process_start: float, preemption: PreemptionFlag):
        self.cfg, self.env = cfg, env
        self.preemption = preemption
        # What the failure path reports (`progress`): the last step the loop finished, and
        # whether the agreed flag stopped this rank (it may have had no signal of its own).
        self.finished_step, self.signalled, self.running = -1, False, False
        self.shards = TokenShards(cfg.data.dir, cfg.data.seq_len)
        self.batches = DistributedBatches(self.shards, cfg.data.micro_batch_size, env.rank, env.world_size, cfg.seed,
                                          env.device, prefetch=cfg.data.prefetch_batches)
        self.build_model()
        self.optimizer = build_optimizer(self.model, cfg, env.device)
        self.evaluator = evaluator_for(cfg, self.model, env, lambda: self.autocast, self.strategy.blocks_compiled)
        self.profiler = profiler_for(cfg.profiler, cfg.checkpoint.dir, env.rank, env.device)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, cosine_with_warmup(cfg.schedule.warmup_steps, cfg.schedule.num_steps, cfg.schedule.min_lr_ratio))
        torch.manual_seed(cfg.seed + env.rank)  # dropout differs per rank, as separate data does

        self.goodput = Goodput()
        self.last_stall_seconds = 0.0
        self.mirror = mirror_for(cfg.checkpoint.s3_uri) if env.is_main else NoMirror()
        self.faults = fault_injector(env)
        self.checkpointer = Checkpointer(cfg.checkpoint.dir, env, cfg.checkpoint.keep_last, cfg.checkpoint.async_mode,
                                         self.mirror, faults=self.faults)
        self.app = ModelAndOptimizer(self.model, self.optimizer)
        self.checkpointer.prepare_staging(self.app)  # host staging buffers allocated before the first save
        self.heartbeat = Heartbeat(cfg.checkpoint.dir)
        self.health = health_exporter(env.is_main, job_identity(cfg), cfg.checkpoint.every_steps)
        self.step, self.tokens_seen = 0, 0
        run_id, branch_tags = self.restore()
        self.tracker = build_tracker(cfg, env, self.shards, run_id, self.step, self.branch, branch_tags)
        self.mfu = mfu_meter(env.device, self.flops, cfg.tracking.peak_tflops)
        self.memory = memory_meter(env.device)
        self.config_yaml = dump_yaml(cfg)
        self.tokens_per_step = cfg.data.seq_len * cfg.data.micro_batch_size * cfg.schedule.grad_accum_steps * env.world_size
        self.max_norm = cfg.optimizer.grad_clip_norm or math.inf  # inf: the norm is measured, nothing is scaled

        self.attempt_start = time.time()
        self.goodput.startup_seconds += self.attempt_start - process_start
        self.wall_at_attempt_start = self.goodput.wall_seconds + (self.attempt_start - process_start)
        self.policy = SavePolicy(cfg)
        self.window = MetricsWindow(env, self.tokens_per_step)
        self.nonfinite = NonFiniteSteps(cfg.optimizer.max_nonfinite_steps)
        self.run_id_noted = False
        self.watchdog = NoWatchdog()  # armed after the first step (start-up has its own bound)

    # --- set-up -------------------------------------------------------------------------------
    def build_model(self) -> None:
        """The one place where the model is built, wrapped for the parallelism strategy and
        compiled; `self.model` is the wrapped module, `self.loss_fn` what the step calls."""
        cfg, env = self.cfg, self.env
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank (FSDP2 relies on it)
        # A Hugging Face model is built empty (meta device), sharded, then filled from rank 0's
        # read of its files: never whole in fp32 on every rank and GPU first.
        empty = cfg.model.kind == "hf" and bool(hf_weight_files(cfg.model.hf_path))
        model = build_model(cfg.model, self.shards.vocab_size, cfg.data.seq_len, empty=empty)
        num_layers, hidden_size = model_dims(model)
        self.flops = flops_per_token(count_params(model), num_layers, hidden_size, cfg.data.seq_len)
        if cfg.parallelism.activation_checkpointing:
            apply_activation_checkpointing(model)
        bf16 = cfg.parallelism.mixed_precision == "bf16" or (cfg.parallelism.mixed_precision == "auto"
                                                             and env.device.type == "cuda")
        self.strategy = distributed.strategy_for(cfg.parallelism, env, bf16)
        if not empty:
            model.to(env.device)
            self.model = self.strategy.wrap(model, env)
        elif self.strategy.name == "fsdp":
            self.model = self.strategy.wrap(model, env)  # shards of meta parameters
            materialize(self.model, env.device)
            load_hf_weights(self.model, cfg.model.hf_path, env.is_main, env.distributed)
        else:
            materialize(model, env.device)
            load_hf_weights(model, cfg.model.hf_path, env.is_main, env.distributed)
            self.model = self.strategy.wrap(model, env)
        # The loss is inside the compiled region (trainer.model.loss_function): no eager fp32
        # logits, no eager log-softmax over [B*T, vocab].
        self.loss_fn = loss_function(self.model, cfg.parallelism.compile, self.strategy.blocks_compiled)
        # FSDP2 casts parameters itself; autocast is for the unsharded strategies.
        self.autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if bf16 and self.strategy.name != "fsdp"
                         else contextlib.nullcontext())
        self.strategy.warm_up(self.model, torch.zeros((1, cfg.data.seq_len), dtype=torch.long, device=env.device),
                              self.autocast)

    def restore(self) -> tuple[str | None, dict]:
        """Resume (this job's checkpoint, a rollback, another job's) or an initial load; returns
        the MLflow run to reattach to and the tags of a new branch run."""
        cfg, env, checkpointer = self.cfg, self.env, self.checkpointer
        resume_from = resolve_resume(cfg.checkpoint.dir, cfg.checkpoint.resume, env, self.mirror)
        self.branch = current_branch(cfg.checkpoint.dir)  # after resolve_resume: a rollback starts one
        if resume_from is None:
            if cfg.checkpoint.initial_load_path:
                _initial_load(cfg, checkpointer, self.model, self.optimizer, self.scheduler)
            return None, {}
        run_id, branch_tags = None, {}
        saved = read_marker(resume_from)
        check_resume_compatible(saved["config"], saved["world_size"], cfg, env.world_size, resume_from)
        meta = checkpointer.load(resume_from, self.app)
        self.step, self.tokens_seen = meta["step"], meta["tokens_seen"]
        # This job's own history (its directory, or a checkpoint it wrote elsewhere): its MLflow
        # run and goodput carry on. Another job's checkpoint never attaches to that job's run.
        in_dir = os.path.realpath(os.path.dirname(resume_from)) == os.path.realpath(cfg.checkpoint.dir)
        own = in_dir or meta.get("job_id") == job_identity(cfg)
        if own and meta.get("branch", "main") == self.branch:
            run_id = meta.get("mlflow_run_id")
        elif own:  # the first attempt of a rollback: a new run for the new branch
            record = read_rollback(cfg.checkpoint.dir) or {}
            branch_tags = {BRANCH_POINT_TAG: str(record.get("source_step", self.step))}
            if record.get("abandoned_mlflow_run_id"):
                branch_tags[ROLLBACK_OF_TAG] = record["abandoned_mlflow_run_id"]
        self.batches.load_state_dict(meta["data"])
        self.scheduler.load_state_dict(meta["scheduler"])
        for change in apply_optimizer_config(self.optimizer, self.scheduler, cfg, meta["config"]):
            log.warning("%s changed on resume: applied from step %d on (the checkpoint's optimizer state "
                        "carried the old value)", change, self.step + 1)
        checkpointer.adopt(resume_from)
        if in_dir:
            self.mirror.ensure(resume_from)  # a shutdown may have cut its upload short
        if own:
            self.goodput = Goodput(**meta["goodput"])
            self.goodput.num_restarts += 1
        beat = self.heartbeat.read()
        if beat and beat["step"] > self.step:  # the previous attempt died after its last checkpoint
            self.goodput.num_lost_steps += beat["step"] - self.step
            lost = max(0.0, beat["time"] - meta["saved_at"])
            self.goodput.lost_seconds += lost
            self.goodput.wall_seconds += lost
        if meta["config_hash"] != cfg.hash():
            log.warning("config changed since %s (hash %s -> %s): training continues with the new config",
                        resume_from, meta["config_hash"], cfg.hash())
        log.info("resumed from %s at step %d (restart %d)", resume_from, self.step, self.goodput.num_restarts)
        return run_id, branch_tags

    # --- the loop -----------------------------------------------------------------------------
    def run(self) -> Ending:
        try:
            return self._run()
        finally:
            self.watchdog.stop()  # a failure too: the process (a test's, in-process) may live on

    def _run(self) -> Ending:
        cfg, checkpointer = self.cfg, self.checkpointer
        self.running = True  # from here on, the failure path closes the tracker and the writers
        log.info("training %s (%s, world size %d, %s) from step %d to %d", cfg.model.kind, self.strategy.name,
                 self.env.world_size, self.env.device, self.step, cfg.schedule.num_steps)
        first_step = self.step + 1
        self.evaluate_skipped()
        while self.step < cfg.schedule.num_steps:
            self.watchdog.beat()
            self.finalize_saves()
            self.profiler.before_step(self.step + 1)
            result = self.train_step()
            if self.step == first_step:  # start-up is over: a dead peer now costs the steady-state bound
                distributed.set_collective_timeout(self.env, cfg.parallelism.collective_timeout_seconds)
                self.watchdog = ProgressWatchdog(cfg.parallelism.progress_timeout_seconds, self.env.rank)
            self.watchdog.beat()
            last_step = self.step == cfg.schedule.num_steps
            save_due = self.policy.due(self.step, result)
            # A save logs what is pending first: a kill after the save must not lose the losses
            # of steps the checkpoint covers (they are not recomputed after a resume). The step's
            # own row (learning rate, gradient norm, throughput) is logged at steps that do not
            # depend on interruptions, so a resumed run logs it where an uninterrupted one does:
            # not at a save a signal or the clock asked for.
            row_due = (self.step % cfg.tracking.log_every_steps == 0 or self.step % cfg.checkpoint.every_steps == 0
                       or last_step or result.bad)
            if row_due or save_due:
                self.log_metrics(result, row=row_due)
            self.nonfinite.record(self.step, not result.bad, result.loss, result.norm)  # raises after K in a row
            if result.preempted:  # saves instead of evaluating: the time left is the checkpoint's
                self.signalled = True
                self.save_on_signal()
                self.finished_step = self.step
                return self.finish("preempted")
            self.evaluate(last_step)
            self.watchdog.beat()
            if save_due and self.settle_previous_save():
                # The signal came while the previous write was still finishing: this step is the
                # preemption checkpoint (the path that never depends on the background writer).
                self.signalled = True
                self.save_on_signal()
                self.finished_step = self.step
                return self.finish("preempted")
            if save_due:
                self.save_regular(last_step)
            self.finished_step = self.step
        return self.finish("completed")

    def train_step(self) -> StepResult:
        cfg, env, model, optimizer = self.cfg, self.env, self.model, self.optimizer
        num_accum = cfg.schedule.grad_accum_steps
        step_start = time.perf_counter()
        data_wait = 0.0
        step_loss = torch.zeros((), device=env.device)
        for micro_step in range(num_accum):
            fetch_start = time.perf_counter()
            inputs, targets = self.batches.next_batch()
            data_wait += time.perf_counter() - fetch_start
            with self.strategy.grad_sync(model, micro_step == num_accum - 1), self.autocast:
                loss = self.loss_fn(inputs, targets) / num_accum
            if self.faults.nonfinite(self.step + 1):
                loss = loss * float("nan")
            loss.backward()
            step_loss += loss.detach()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), self.max_norm)
        norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        # One all-reduce decides for every rank (skip, save, stop): see agree_on_step.
        preempted, time_due, bad = distributed.agree_on_step(env, step_loss, norm, self.preemption.raised,
                                                             self.policy.time_due())
        if bad:
            optimizer.zero_grad(set_to_none=True)  # the update is skipped; the step still counts
        else:
            optimizer.step()
        lr_used = self.scheduler.get_last_lr()[0]  # the rate this step used: logged for this step
        self.scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens_seen += self.tokens_per_step
        self.profiler.after_step(self.step)
        self.faults.at("after_step", self.step)
        if self.faults.gpu_error(self.step):
            raise RuntimeError("CUDA error: uncorrectable ECC error encountered (fault injection)")
        step_seconds = time.perf_counter() - step_start
        self.goodput.productive_seconds += step_seconds
        self.window.add(self.step, step_loss, data_wait, step_seconds)
        return StepResult(step_loss, norm, lr_used, preempted, time_due, bad)

    # --- what the loop calls ------------------------------------------------------------------
    def log_metrics(self, result: StepResult, row: bool = True) -> None:
        """Logs the pending losses; with `row`, this step's row of the other metrics too."""
        last_loss, tokens_per_second, averages = self.window.flush(self.tracker)
        if not row:
            return
        self.tracker.log(self.step, {
            "learning_rate": result.lr,
            "grad_norm": result.norm.item(),
            "tokens_per_second": tokens_per_second,
            "mfu": self.mfu(tokens_per_second / self.env.world_size),
            **averages,
            "checkpoint_seconds": self.last_stall_seconds,
            "peak_gpu_memory_gib": self.memory.peak_gib(),
            "tokens_seen": self.tokens_seen,
            "skipped_updates": self.nonfinite.num_skipped + (1 if result.bad else 0),
        })
        if self.env.is_main:
            self.heartbeat.beat(self.step)
            self.health.update(step=self.step, loss=last_loss, tokens_per_second=tokens_per_second,
                               mfu=self.mfu(tokens_per_second / self.env.world_size),
                               step_seconds=averages["step_seconds"], goodput=self.goodput.summary()["goodput"],
                               checkpoint_step=self.checkpointer.last_durable_step)
            log.info("step %d/%d loss %.4f lr %.2e %.0f tok/s", self.step, self.cfg.schedule.num_steps, last_loss,
                     result.lr, tokens_per_second)
            if self.tracker.run_id and not self.run_id_noted:  # markers written before MLflow connected
                self.checkpointer.annotate_newest({"mlflow_run_id": self.tracker.run_id})
                self.run_id_noted = True

    def evaluate(self, last_step: bool) -> None:
        val_metrics = self.evaluator.maybe_evaluate(self.step, last_step)
        if val_metrics is None:
            return
        self.tracker.log(self.step, val_metrics)
        self.window.exclude(val_metrics["eval_seconds"])
        if self.env.is_main:
            log.info("step %d val_loss %.4f (%.1f s)", self.step, val_metrics["val_loss"], val_metrics["eval_seconds"])

    def evaluate_skipped(self) -> None:
        """A preempted step saves instead of evaluating (the time left is the checkpoint's). The
        attempt that resumes from it evaluates that step first, on the same weights, so the
        validation loss an uninterrupted run logs there is logged all the same. Rank 0 knows
        what was logged; every rank evaluates (one all-reduce decides)."""
        if self.step == 0:
            return
        due = self.evaluator.due(self.step, self.step == self.cfg.schedule.num_steps)
        missing = self.env.is_main and due and not self.tracker.logged(self.step, "val_loss")
        if distributed.all_reduce_max(self.env, [missing])[0]:
            self.evaluate(self.step == self.cfg.schedule.num_steps)

    def save(self, step: int, meta_extra: dict, synchronous: bool = False) -> float:
        cfg, env = self.cfg, self.env
        meta = {
            "tokens_seen": self.tokens_seen,
            "data": self.batches.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "config": cfg.to_dict(),
            "config_hash": cfg.hash(),
            "dataset_hash": self.shards.dataset_hash,
            "dataset_vocab_size": self.shards.vocab_size,  # the export crops a padded vocabulary to it
            "mlflow_run_id": self.tracker.run_id,
            "job_id": job_identity(cfg),
            "branch": self.branch,
            "world_size": env.world_size,
            "goodput": dataclasses.asdict(self.goodput),
            **meta_extra,
        }
        # Never a checkpoint of NaN/inf weights: every retry would resume from it.
        finite = not distributed.all_reduce_max(env, [not weights_finite(self.model)])[0]
        if not finite:
            raise TrainingStopped(f"weights are non-finite at step {step}: not saved; the newest checkpoint "
                                  f"(step {self.checkpointer.last_durable_step}) stays the one to resume from")
        # metrics.jsonl up to this step is made durable before the marker, by the sealer.
        return self.checkpointer.save(step, self.app, meta, self.config_yaml, before_marker=self.tracker.sync,
                                      synchronous=synchronous)

    def settle_previous_save(self) -> bool:
        """Before a regular save: the write in flight must be done (one write at a time: staging
        buffers are reused). Waiting for it here, and not inside the checkpointer, keeps the loop
        answering a signal: a background writer that is slow, stopped or killed meanwhile would
        otherwise hold the loop past the grace period, or end the job with "Checkpoint
        background process is dead" instead of a preemption checkpoint. Returns True when a
        signal reached any rank meanwhile. One all-reduce per round: every rank decides alike."""
        checkpointer, env = self.checkpointer, self.env
        started = time.perf_counter()
        while True:
            preempted, failed, running = distributed.all_reduce_max(
                env, [self.preemption.raised, checkpointer.write_failed(), not checkpointer.write_done()])
            if preempted or failed or not running:
                break
            time.sleep(0.05)
        waited = time.perf_counter() - started
        self.goodput.checkpoint_stall_seconds += waited
        self.window.exclude(waited)
        return bool(preempted)

    def save_regular(self, last_step: bool) -> None:
        self.goodput.wall_seconds = self.wall_at_attempt_start + (time.time() - self.attempt_start)
        save_start = time.perf_counter()
        self.save(self.step, {})
        if last_step:
            self.checkpointer.wait()  # the process is about to exit: the save must be on disk
        # Everything the save put on the loop's thread: the finiteness check and its all-reduce
        # and the checkpointer's own part (state dict, copy launches, sync; the whole write in
        # sync mode). Sealing (hashes, fsyncs, retention) is the sealer thread's.
        stall = time.perf_counter() - save_start
        self.goodput.checkpoint_stall_seconds += stall
        self.last_stall_seconds = stall
        self.window.exclude(stall)
        self.policy.saved()
        log.info("checkpoint step %d (%.2f s stall)", self.step, stall)

    def finalize_saves(self) -> None:
        """The checkpointer's step-boundary work: a finished write is handed to rank 0's sealer
        thread (µs); counted as a stall like the save itself."""
        started = time.perf_counter()
        self.checkpointer.poll()
        finalize = time.perf_counter() - started
        self.goodput.checkpoint_stall_seconds += finalize
        self.window.exclude(finalize)

    def save_on_signal(self) -> None:
        """The fastest way to a durable checkpoint inside the time left after the signal.

        With no save in flight: a synchronous save of this step (it never depends on a background
        writer: a background process killed meanwhile cannot cost the checkpoint). With an async
        save of an older step in flight, finishing it is always the quickest durable checkpoint
        (it is part written); a second, full save of this step is added only when the time left
        (torchrun's SIGTERM-to-SIGKILL wait, less the exit margin) covers the measured write time
        with room to spare. If that save fails on any rank (its background process died, a write
        raised, or it is not done within half the time left), every rank gives it up and saves
        this step synchronously instead. Every rank takes the same decisions (all-reduces)."""
        step, checkpointer, env, goodput = self.step, self.checkpointer, self.env, self.goodput
        preemption = self.preemption
        started = time.perf_counter()
        # Agreed before any other collective: each rank's `pending_step` is cleared by its own
        # poll(), and ranks poll at different moments, so a rank-local check could send one rank
        # to the finiteness all-reduce and another to the `skip` one (a hang, or a false
        # "non-finite" stop). Waiting on a save that is already done returns at once.
        in_flight = int(distributed.all_reduce_max(env, [-1 if checkpointer.pending_step is None
                                                         else checkpointer.pending_step])[0])
        in_flight = None if in_flight < 0 else in_flight
        budget = preemption_budget_seconds()
        if in_flight is not None and in_flight < step:
            deadline = time.monotonic() + max(1.0, (budget - preemption.seconds_since()) / 2)
            landed = _settle_in_flight(checkpointer, env, deadline)
            if landed:
                checkpointer.wait()
                left = budget - preemption.seconds_since()
                estimate = checkpointer.last_write_seconds or 0.0
                skip = not (left > 2.0 * estimate + 1.0)
                skip = bool(distributed.all_reduce_max(env, [skip])[0])
                log.warning("%s with the save of step %d in flight: waited %.1f s for it; %.0f s of %.0f s left, a full "
                            "save takes ~%.1f s: %s", preemption.signal_name or "another rank's signal", in_flight,
                            time.perf_counter() - started, left, budget, estimate,
                            f"stopping at step {in_flight} ({step - in_flight} steps to recompute)"
                            if skip else f"saving step {step} too")
                if skip:
                    stall = time.perf_counter() - started
                    goodput.checkpoint_stall_seconds += stall
                    self.last_stall_seconds = stall
                    return
            else:
                cause = checkpointer.write_cause()
                checkpointer.abandon_write()
                log.warning("%s with the save of step %d in flight: it did not land on every rank (%s on this rank); "
                            "saving step %d synchronously instead, %.1f s after the signal, %.0f s of %.0f s left",
                            preemption.signal_name or "another rank's signal", in_flight, cause, step,
                            preemption.seconds_since(), budget - preemption.seconds_since(), budget)
        goodput.wall_seconds = self.wall_at_attempt_start + (time.time() - self.attempt_start)
        self.save(step, {}, synchronous=True)
        checkpointer.wait()  # the process is about to exit: the save must be on disk
        stall = time.perf_counter() - started
        goodput.checkpoint_stall_seconds += stall
        self.last_stall_seconds = stall
        # A rank whose node was not the one reclaimed learns of the stop only through the
        # all-reduced flag: it has no signal of its own, and still exits 143.
        log.info("checkpoint step %d (%.2f s from the step boundary) after %s, %.1f s after the signal", step, stall,
                 preemption.signal_name or "another rank's signal", preemption.seconds_since())

    def progress(self) -> tuple[int, int | None, bool]:
        """For the failure report: the last finished step, the newest durable checkpoint, and
        whether the agreed stop flag had reached this rank."""
        return self.finished_step, self.checkpointer.last_durable_step, self.signalled

    def close_after_failure(self, exc: BaseException) -> None:
        """The failure path closes the tracker too (status FAILED, a short flush; whatever MLflow
        misses is in metrics.jsonl and is sent by the next attempt) and ends the checkpoint
        writer and the S3 mirror without waiting on peers that may be gone."""
        if not self.running:
            return
        log.error("training failed at step %s: %s", self.finished_step, exc)
        with contextlib.suppress(Exception):
            self.tracker.close(status="FAILED", timeout_seconds=5.0)
        with contextlib.suppress(Exception):
            self.checkpointer.abort()

    def finish(self, reason: str) -> Ending:
        """The final checkpoint durable on every rank (sealed, on rank 0), the loop's helpers
        closed; what is left for rank 0 once the ranks parted is in the returned `Ending`."""
        cfg, env, tracker, goodput = self.cfg, self.env, self.tracker, self.goodput
        self.watchdog.stop()  # what follows is bounded by the start-up bound (teardown's barrier)
        self.checkpointer.close()
        self.batches.close()
        self.profiler.close()
        self.health.close()
        goodput.wall_seconds = self.wall_at_attempt_start + (time.time() - self.attempt_start)
        summary = {"final_step": self.step, "tokens_seen": self.tokens_seen, "reason": reason, **goodput.summary()}
        if reason == "completed":
            tracker.log_summary(summary)
        log.info("%s at step %d: %s", reason, self.step, summary)
        # The other ranks wait in teardown's barrier for rank 0's seal of the final checkpoint:
        # the start-up bound again, not the steady-state one.
        distributed.set_collective_timeout(env, cfg.parallelism.init_timeout_seconds)
        # After a signal, S3 uploads get what is left of torchrun's shutdown wait, less the
        # MLflow flush (10 s) and a margin; the FSx copy is already durable.
        budget = (max(0.0, preemption_budget_seconds() - self.preemption.seconds_since() - 12.0)
                  if reason == "preempted" else None)
        after = AfterTraining(cfg, env, reason, self.step, tracker, self.checkpointer, self.heartbeat,
                              self.profiler.trace_dir if env.is_main else None, budget, self.faults)
        return Ending(reason, self.step, self.checkpointer.last_durable_step, after)


def _initial_load(cfg: TrainerConfig, checkpointer, model, optimizer, scheduler) -> None:
    """torchtitan's initial_load_path: weights (and optionally the optimizer state) of another
    job's checkpoint; step 0, a fresh schedule, data cursor, goodput and MLflow run."""
    path = cfg.checkpoint.initial_load_path
    model_only = cfg.checkpoint.initial_load_model_only
    saved = checkpointer.load_initial(path, ModelOnly(model) if model_only else ModelAndOptimizer(model, optimizer))
    if not model_only:
        # The loaded param groups carry the source's learning rate at its last step: this job's
        # schedule starts at its own step 0.
        for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
            group["lr"] = lr
    log.info("initial load from %s (step %d of job %s): %s; step, schedule and data start fresh", path,
             saved["step"], saved.get("job_id", "?"), "weights only" if model_only else "weights and optimizer state")


def _settle_in_flight(checkpointer, env, deadline: float) -> bool:
    """Waits for the write in flight on every rank; True once it is written on all of them,
    False as soon as it failed on one (a write raised, its background process is gone) or the
    deadline passed with a write that can be given up (a background process's; a thread
    cannot be stopped, so thread mode waits, bounded by the checkpoint group's timeout).
    One all-reduce per round: every rank returns the same answer."""
    while True:
        expired = time.monotonic() > deadline and checkpointer.write_abandonable
        failed = checkpointer.write_failed() or expired
        running = not checkpointer.write_done() and not expired
        any_failed, any_running = distributed.all_reduce_max(env, [failed, running])
        if any_failed:
            return False
        if not any_running:
            return True
        time.sleep(0.05)
