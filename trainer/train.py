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

import torch
import torch.nn.functional as F

from trainer import distributed
from trainer.branch import current_branch, read_rollback
from trainer.checkpoint import (Checkpointer, ModelAndOptimizer, ModelOnly, background_process_signal, read_marker,
                                resolve_resume)
from trainer.config import TrainerConfig, dump_yaml
from trainer.guards import (NonFiniteSteps, TrainingStopped, apply_optimizer_config, check_resume_compatible,
                            weights_finite)
from trainer.data import DistributedBatches, TokenShards
from trainer.evaluation import evaluator_for
from trainer.metrics import Goodput, Heartbeat, flops_per_token, memory_meter, mfu_meter
from trainer.model import apply_activation_checkpointing, build_model, count_params, model_dims
from trainer.preemption import EXIT_PREEMPTED, PreemptionFlag, is_peer_lost, preemption_budget_seconds, report_exit
from trainer.profiling import profiler_for
from trainer.s3 import NoMirror, mirror_for
from trainer.tracking import BRANCH_POINT_TAG, ROLLBACK_OF_TAG, JsonlTracker, MLflowTracker, NullTracker, Trackers

log = logging.getLogger("trainer")


def cosine_with_warmup(warmup_steps: int, num_steps: int, min_lr_ratio: float):
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, num_steps - warmup_steps)
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return factor


def build_optimizer(model: torch.nn.Module, cfg: TrainerConfig, device: torch.device) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    # Weight decay on matrices only; biases and norms are not decayed (GPT-2 / nanoGPT).
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.optimizer.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    o = cfg.optimizer
    return torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, fused=device.type == "cuda")


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
            backfill=jsonl.rows, branch=branch))
    elif cfg.tracking.enabled:
        log.warning("tracking.enabled but no MLFLOW_TRACKING_URI: metrics go to metrics.jsonl only")
    return Trackers(*trackers)


def export_final_model(cfg: TrainerConfig, step: int, run_id: str | None) -> None:
    """Rank 0, after the final checkpoint is on disk: the Hugging Face export of it, logged
    to MLflow (and registered) when tracking is on. The other ranks wait in teardown's
    barrier meanwhile (seconds for a 124M model)."""
    from trainer.checkpoint import step_dir
    from trainer.export import export_and_log

    out_dir = os.path.join(cfg.export.dir or os.path.join(cfg.checkpoint.dir, "export"), f"step-{step:06d}")
    uri = cfg.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI")
    try:
        export_and_log(step_dir(cfg.checkpoint.dir, step), out_dir, cfg, run_id, uri)
    except Exception:  # noqa: BLE001 - the run is complete and checkpointed; a restart would not help
        # Failing here would make the operator restart a finished job, only to fail again.
        log.exception("export of step %d failed; the final checkpoint is intact: run `python -m trainer export "
                      "--checkpoint %s --out %s` once the cause is fixed", step, step_dir(cfg.checkpoint.dir, step), out_dir)


def main(cfg: TrainerConfig, process_start: float | None = None) -> int:
    """Runs one attempt of the job; returns the process exit code (0, or 143 when preempted)."""
    env = distributed.init(cfg.parallelism)
    logging.basicConfig(level=logging.INFO if env.is_main else logging.WARNING,
                        format=f"%(asctime)s [rank {env.rank}] %(name)s: %(message)s", force=True)
    reason, step, details = "failed", -1, {}
    outcome: dict = {}
    report_exit(env.rank, "running", -1)
    try:
        reason, step = _train(cfg, env, process_start or time.time(), outcome)
    except BaseException as exc:
        preemption = outcome.get("preemption")
        # What the launcher needs to tell a root cause (permanent) from a consequence of a
        # peer's death or of a signal (retryable).
        details = {"exception": type(exc).__name__, "peer_lost": is_peer_lost(exc),
                   "signalled": bool(outcome.get("signalled") or (preemption and preemption.raised)),
                   "child_signal": background_process_signal(exc)}
        _close_after_failure(outcome, exc)
        raise
    finally:
        report_exit(env.rank, reason, outcome.get("step", step), checkpoint_step=outcome.get("checkpoint_step"),
                    **details)
        distributed.teardown(clean=reason != "failed")  # _train returned: its model and optimizer are garbage
    return EXIT_PREEMPTED if reason == "preempted" else 0


def _close_after_failure(outcome: dict, exc: BaseException) -> None:
    """The failure path closes the tracker too (status FAILED, a short flush; whatever MLflow
    misses is in metrics.jsonl and is sent by the next attempt) and ends the checkpoint
    writer and the S3 mirror without waiting on peers that may be gone."""
    if "tracker" not in outcome:
        return
    log.error("training failed at step %s: %s", outcome.get("step", "?"), exc)
    with contextlib.suppress(Exception):
        outcome["tracker"].close(status="FAILED", timeout_seconds=5.0)
    with contextlib.suppress(Exception):
        outcome["checkpointer"].abort()


def _train(cfg: TrainerConfig, env: distributed.Env, process_start: float, outcome: dict) -> tuple[str, int]:
    preemption = PreemptionFlag().install()
    outcome["preemption"] = preemption
    shards = TokenShards(cfg.data.dir, cfg.data.seq_len)
    batches = DistributedBatches(shards, cfg.data.micro_batch_size, env.rank, env.world_size, cfg.seed, env.device,
                                 prefetch=cfg.data.prefetch_batches)

    torch.manual_seed(cfg.seed)  # identical initial weights on every rank (FSDP2 relies on it)
    model = build_model(cfg.model, shards.vocab_size, cfg.data.seq_len)
    num_layers, hidden_size = model_dims(model)
    flops = flops_per_token(count_params(model), num_layers, hidden_size, cfg.data.seq_len)
    if cfg.parallelism.activation_checkpointing:
        apply_activation_checkpointing(model)
    model.to(env.device)
    bf16 = cfg.parallelism.mixed_precision == "bf16" or (cfg.parallelism.mixed_precision == "auto" and env.device.type == "cuda")
    strategy = distributed.strategy_for(cfg.parallelism, env, bf16)
    model = strategy.wrap(model, env)
    forward = torch.compile(model) if cfg.parallelism.compile else model
    # FSDP2 casts parameters itself; autocast is for the unsharded strategies.
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if bf16 and strategy.name != "fsdp"
                else contextlib.nullcontext())
    strategy.warm_up(model, torch.zeros((1, cfg.data.seq_len), dtype=torch.long, device=env.device), autocast)
    optimizer = build_optimizer(model, cfg, env.device)
    evaluator = evaluator_for(cfg, model, env, lambda: autocast)
    profiler = profiler_for(cfg.profiler, cfg.checkpoint.dir, env.rank, env.device)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, cosine_with_warmup(cfg.schedule.warmup_steps, cfg.schedule.num_steps, cfg.schedule.min_lr_ratio))
    torch.manual_seed(cfg.seed + env.rank)  # dropout differs per rank, as separate data does

    goodput = Goodput()
    last_stall_seconds = [0.0]
    mirror = mirror_for(cfg.checkpoint.s3_uri) if env.is_main else NoMirror()
    checkpointer = Checkpointer(cfg.checkpoint.dir, env, cfg.checkpoint.keep_last, cfg.checkpoint.async_mode, mirror)
    app = ModelAndOptimizer(model, optimizer)
    heartbeat = Heartbeat(cfg.checkpoint.dir)
    step, tokens_seen, run_id = 0, 0, None
    resume_from = resolve_resume(cfg.checkpoint.dir, cfg.checkpoint.resume, env, mirror)
    branch = current_branch(cfg.checkpoint.dir)
    branch_tags: dict = {}
    if resume_from is None and cfg.checkpoint.initial_load_path:
        _initial_load(cfg, checkpointer, model, optimizer, scheduler)
    if resume_from:
        saved = read_marker(resume_from)
        check_resume_compatible(saved["config"], saved["world_size"], cfg, env.world_size, resume_from)
        meta = checkpointer.load(resume_from, app)
        step, tokens_seen = meta["step"], meta["tokens_seen"]
        # This job's own history (its directory, or a checkpoint it wrote elsewhere): its MLflow
        # run and goodput carry on. Another job's checkpoint never attaches to that job's run.
        own = (os.path.realpath(os.path.dirname(resume_from)) == os.path.realpath(cfg.checkpoint.dir)
               or meta.get("job_id") == job_identity(cfg))
        if own and meta.get("branch", "main") == branch:
            run_id = meta.get("mlflow_run_id")
        elif own:  # the first attempt of a rollback: a new run for the new branch
            record = read_rollback(cfg.checkpoint.dir) or {}
            branch_tags = {BRANCH_POINT_TAG: str(record.get("source_step", step))}
            if record.get("abandoned_mlflow_run_id"):
                branch_tags[ROLLBACK_OF_TAG] = record["abandoned_mlflow_run_id"]
        batches.load_state_dict(meta["data"])
        scheduler.load_state_dict(meta["scheduler"])
        for change in apply_optimizer_config(optimizer, scheduler, cfg, meta["config"]):
            log.warning("%s changed on resume: applied from step %d on (the checkpoint's optimizer state "
                        "carried the old value)", change, step + 1)
        checkpointer.adopt(resume_from)
        if os.path.realpath(os.path.dirname(resume_from)) == os.path.realpath(cfg.checkpoint.dir):
            mirror.ensure(resume_from)  # a shutdown may have cut its upload short
        if own:
            goodput = Goodput(**meta["goodput"])
            goodput.num_restarts += 1
        beat = heartbeat.read()
        if beat and beat["step"] > step:  # the previous attempt died after its last checkpoint
            goodput.num_lost_steps += beat["step"] - step
            lost = max(0.0, beat["time"] - meta["saved_at"])
            goodput.lost_seconds += lost
            goodput.wall_seconds += lost
        if meta["config_hash"] != cfg.hash():
            log.warning("config changed since %s (hash %s -> %s): training continues with the new config",
                        resume_from, meta["config_hash"], cfg.hash())
        log.info("resumed from %s at step %d (restart %d)", resume_from, step, goodput.num_restarts)
    tracker = build_tracker(cfg, env, shards, run_id, step, branch, branch_tags)
    mfu = mfu_meter(env.device, flops, cfg.tracking.peak_tflops)
    memory = memory_meter(env.device)
    config_yaml = dump_yaml(cfg)
    tokens_per_step = cfg.data.seq_len * cfg.data.micro_batch_size * cfg.schedule.grad_accum_steps * env.world_size
    num_accum = cfg.schedule.grad_accum_steps
    max_norm = cfg.optimizer.grad_clip_norm or math.inf  # inf: the norm is measured, nothing is scaled

    attempt_start = time.time()
    goodput.startup_seconds += attempt_start - process_start
    wall_at_attempt_start = goodput.wall_seconds + (attempt_start - process_start)
    last_save_monotonic = time.monotonic()
    pending_losses: list[tuple[int, torch.Tensor]] = []
    interval = {"start": time.perf_counter(), "steps": 0, "data_wait": 0.0, "compute": 0.0}
    nonfinite = NonFiniteSteps(cfg.optimizer.max_nonfinite_steps)
    faults = checkpointer.faults
    reason = "completed"
    outcome["checkpoint_step"] = checkpointer.last_durable_step
    log.info("training %s (%s, world size %d, %s) from step %d to %d", cfg.model.kind, strategy.name,
             env.world_size, env.device, step, cfg.schedule.num_steps)

    def save(step: int, meta_extra: dict) -> float:
        meta = {
            "tokens_seen": tokens_seen,
            "data": batches.state_dict(),
            "scheduler": scheduler.state_dict(),
            "config": cfg.to_dict(),
            "config_hash": cfg.hash(),
            "dataset_hash": shards.dataset_hash,
            "dataset_vocab_size": shards.vocab_size,  # the export crops a padded vocabulary to it
            "mlflow_run_id": tracker.run_id,
            "job_id": job_identity(cfg),
            "branch": branch,
            "world_size": env.world_size,
            "goodput": dataclasses.asdict(goodput),
            **meta_extra,
        }
        # Never a checkpoint of NaN/inf weights: every retry would resume from it.
        finite = not distributed.all_reduce_max(env, [not weights_finite(model)])[0]
        if not finite:
            raise TrainingStopped(f"weights are non-finite at step {step}: not saved; the newest checkpoint "
                                  f"(step {checkpointer.last_durable_step}) stays the one to resume from")
        tracker.sync()  # metrics.jsonl up to this step is durable before the marker can be
        return checkpointer.save(step, app, meta, config_yaml)

    outcome.update(tracker=tracker, checkpointer=checkpointer)
    run_id_noted = False
    while step < cfg.schedule.num_steps:
        checkpointer.poll()
        profiler.before_step(step + 1)
        outcome["checkpoint_step"] = checkpointer.last_durable_step
        step_start = time.perf_counter()
        data_wait = 0.0
        step_loss = torch.zeros((), device=env.device)
        for micro_step in range(num_accum):
            fetch_start = time.perf_counter()
            inputs, targets = batches.next_batch()
            data_wait += time.perf_counter() - fetch_start
            with strategy.grad_sync(model, micro_step == num_accum - 1), autocast:
                logits = forward(inputs)
                loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1)) / num_accum
            if faults.nonfinite(step + 1):
                loss = loss * float("nan")
            loss.backward()
            step_loss += loss.detach()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        # One all-reduce decides for every rank: a signal may reach the ranks at different
        # steps, wall clocks differ, and a NaN may appear on one rank's loss only; yet they
        # must skip, save and stop at the same step. (The finiteness test costs one device
        # sync per step on GPU.)
        time_due = (cfg.checkpoint.every_seconds > 0
                    and time.monotonic() - last_save_monotonic >= cfg.checkpoint.every_seconds)
        local_bad = not bool(torch.isfinite(torch.stack([step_loss.float(), norm.float()])).all().item())
        preempted, save_due_to_time, bad = (bool(v) for v in distributed.all_reduce_max(
            env, [preemption.raised, time_due, local_bad]))
        if bad:
            optimizer.zero_grad(set_to_none=True)  # the update is skipped; the step still counts
        else:
            optimizer.step()
        lr_used = scheduler.get_last_lr()[0]  # the rate this step used: logged for this step
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        tokens_seen += tokens_per_step
        profiler.after_step(step)
        faults.at("after_step", step)
        pending_losses.append((step, step_loss))
        step_seconds = time.perf_counter() - step_start
        goodput.productive_seconds += step_seconds
        interval["steps"] += 1
        interval["data_wait"] += data_wait
        interval["compute"] += step_seconds
        last_step = step == cfg.schedule.num_steps
        save_due = step % cfg.checkpoint.every_steps == 0 or save_due_to_time or preempted or last_step

        # A save logs what is pending first: a kill after the save must not lose the losses
        # of steps the checkpoint covers (they are not recomputed after a resume).
        if step % cfg.tracking.log_every_steps == 0 or save_due or bad:
            elapsed = time.perf_counter() - interval["start"]
            losses = distributed.all_reduce_mean(env, torch.stack([loss for _, loss in pending_losses])).tolist()
            for (s, _), value in zip(pending_losses, losses):
                tracker.log(s, {"loss": value})
            tokens_per_second = interval["steps"] * tokens_per_step / elapsed
            tracker.log(step, {
                "learning_rate": lr_used,
                "grad_norm": norm.item(),
                "tokens_per_second": tokens_per_second,
                "mfu": mfu(tokens_per_second / env.world_size),
                "step_seconds": interval["compute"] / interval["steps"],
                "data_wait_seconds": interval["data_wait"] / interval["steps"],
                "checkpoint_seconds": last_stall_seconds[0],
                "peak_gpu_memory_gib": memory.peak_gib(),
                "tokens_seen": tokens_seen,
                "skipped_updates": nonfinite.num_skipped + (1 if bad else 0),
            })
            if env.is_main:
                heartbeat.beat(step)
                log.info("step %d/%d loss %.4f lr %.2e %.0f tok/s", step, cfg.schedule.num_steps, losses[-1],
                         lr_used, tokens_per_second)
                if tracker.run_id and not run_id_noted:  # markers written before MLflow connected
                    checkpointer.annotate_newest({"mlflow_run_id": tracker.run_id})
                    run_id_noted = True
            pending_losses.clear()
            interval = {"start": time.perf_counter(), "steps": 0, "data_wait": 0.0, "compute": 0.0}
        nonfinite.record(step, not bad, step_loss, norm)  # raises TrainingStopped after K in a row

        # A preempted step saves instead: the signal's time budget is for the checkpoint.
        val_metrics = None if preempted else evaluator.maybe_evaluate(step, last_step)
        if val_metrics is not None:
            tracker.log(step, val_metrics)
            interval["start"] += val_metrics["eval_seconds"]  # tokens/s measures training only
            if env.is_main:
                log.info("step %d val_loss %.4f (%.1f s)", step, val_metrics["val_loss"], val_metrics["eval_seconds"])

        if preempted:
            outcome["signalled"] = True
            _save_on_signal(step, save, checkpointer, preemption, env, goodput, last_stall_seconds,
                            wall_at_attempt_start, attempt_start)
        elif save_due:
            goodput.wall_seconds = wall_at_attempt_start + (time.time() - attempt_start)
            save_start = time.perf_counter()
            stall = save(step, {})
            if last_step:
                checkpointer.wait()  # the process is about to exit: the save must be on disk
                stall = time.perf_counter() - save_start
            goodput.checkpoint_stall_seconds += stall
            last_stall_seconds[0] = stall
            interval["start"] += stall  # tokens/s measures training only, like eval above
            last_save_monotonic = time.monotonic()
            log.info("checkpoint step %d (%.2f s stall)", step, stall)
        outcome["step"] = step
        outcome["checkpoint_step"] = checkpointer.last_durable_step
        if preempted:
            reason = "preempted"
            break

    # After a signal, S3 uploads get what is left of torchrun's shutdown wait, less the
    # MLflow flush (10 s) and a margin; the FSx copy is already durable.
    checkpointer.close(budget_seconds=max(0.0, preemption_budget_seconds() - preemption.seconds_since() - 12.0)
                       if reason == "preempted" else None)
    outcome["checkpoint_step"] = checkpointer.last_durable_step
    batches.close()
    profiler.close()
    if env.is_main and profiler.trace_dir and os.path.isdir(profiler.trace_dir):
        tracker.log_artifact(profiler.trace_dir, "profile")
    goodput.wall_seconds = wall_at_attempt_start + (time.time() - attempt_start)
    summary = {"final_step": step, "tokens_seen": tokens_seen, "reason": reason, **goodput.summary()}
    if reason == "completed":
        tracker.log_summary(summary)
    log.info("%s at step %d: %s", reason, step, summary)
    tracker.close(status="FINISHED" if reason == "completed" else "SCHEDULED",
                  timeout_seconds=30.0 if reason == "completed" else 10.0)
    if reason == "completed" and cfg.export.at_end and env.is_main:
        export_final_model(cfg, step, tracker.run_id)
    if env.is_main:
        heartbeat.beat(step)
    return reason, step


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


def _save_on_signal(step, save, checkpointer, preemption, env, goodput, last_stall_seconds, wall_at_attempt_start,
                    attempt_start) -> None:
    """The fastest way to a durable checkpoint inside the time left after the signal.

    With no save in flight: a synchronous save of this step. With an async save of an
    older step in flight, finishing it is always the quickest durable checkpoint (it is
    part written); a second, full save of this step is added only when the time left
    (torchrun's SIGTERM-to-SIGKILL wait, less the exit margin) covers the measured write
    time with room to spare. Every rank takes the same decision (one all-reduce)."""
    started = time.perf_counter()
    # Agreed before any other collective: each rank's `pending_step` is cleared by its own
    # poll(), and ranks poll at different moments, so a rank-local check could send one rank
    # to the finiteness all-reduce and another to the `skip` one (a hang, or a false
    # "non-finite" stop). Waiting on a save that is already done returns at once.
    in_flight = int(distributed.all_reduce_max(env, [-1 if checkpointer.pending_step is None
                                                     else checkpointer.pending_step])[0])
    in_flight = None if in_flight < 0 else in_flight
    if in_flight is not None and in_flight < step:
        checkpointer.wait()
        budget = preemption_budget_seconds()
        left = budget - preemption.seconds_since()
        estimate = checkpointer.last_write_seconds or 0.0
        skip = not (left > 2.0 * estimate + 1.0)
        skip = bool(distributed.all_reduce_max(env, [skip])[0])
        log.warning("%s with the save of step %d in flight: waited %.1f s for it; %.0f s of %.0f s left, a full "
                    "save takes ~%.1f s: %s", preemption.signal_name or "another rank's signal", in_flight, time.perf_counter() - started, left,
                    budget, estimate, f"stopping at step {in_flight} ({step - in_flight} steps to recompute)"
                    if skip else f"saving step {step} too")
        if skip:
            stall = time.perf_counter() - started
            goodput.checkpoint_stall_seconds += stall
            last_stall_seconds[0] = stall
            return
    goodput.wall_seconds = wall_at_attempt_start + (time.time() - attempt_start)
    save(step, {})
    checkpointer.wait()  # the process is about to exit: the save must be on disk
    stall = time.perf_counter() - started
    goodput.checkpoint_stall_seconds += stall
    last_stall_seconds[0] = stall
    # A rank whose node was not the one reclaimed learns of the stop only through the
    # all-reduced flag: it has no signal of its own, and still exits 143.
    log.info("checkpoint step %d (%.2f s from the step boundary) after %s, %.1f s after the signal", step, stall,
             preemption.signal_name or "another rank's signal", preemption.seconds_since())
