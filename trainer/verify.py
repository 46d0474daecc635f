"""Restore drill: prove that a checkpoint restores before the day it has to.

    python -m trainer verify-checkpoint /fsx/checkpoints/team-a/gpt2          # newest complete step
    python -m trainer verify-checkpoint /fsx/checkpoints/team-a/gpt2/step-001200
    python -m trainer verify-checkpoint s3://<checkpoints bucket>/team-a/gpt2 [--scratch DIR]

What it does, in order (it stops at the first stage that finds a problem and lists every
problem of that stage):

0. Before anything pickled is read: the step's signed manifest (trainer/trust.py; the key from
   TRAINER_CHECKPOINT_KEY_FILE), its ownership, and the digests of `.metadata` and the RNG files.
   Without the key an s3:// source, or a manifest signed in a pod, is refused: a team's
   checkpoint is drilled in its namespace, with its key (`python -m workloads checkpoints JOB
   --team T --stack S --verify` runs this as a Job there). What is read goes through
   trainer/safe_load.py, which runs nothing a checkpoint holds.
1. Finds the newest complete checkpoint (a `step-NNNNNN` directory with `complete.json`).
   From S3 (the layout `trainer.s3.S3Mirror` writes) it downloads that step into a scratch
   directory and checks every object arrived at its listed size. A local directory is read
   in place; nothing is written into it.
2. Checks the files against the marker and the DCP metadata: the marker's step matches the
   directory, `config.yaml` is the config the marker recorded, one RNG file per rank of the
   recorded world size, `.metadata` readable, every tensor's chunks cover the tensor, and every
   byte range the metadata points at lies inside its shard file.
3. Loads the checkpoint into the model and optimizer it was trained with, in several CPU
   processes (gloo, the recorded DDP/FSDP2 strategy; the recorded world size, at most 2) and in
   one process (DCP reshards), and checks that both loads give bit-identical full state, that
   every tensor is finite and that the optimizer state is there. Two processes prove what any
   number would (the load reshards, the collectives run); one per recorded rank would need a
   full copy of the training state per process: 64 GPUs' GPT-2 job, 64 x 2 GB of host memory.
4. Runs one training step from each load on a fixed batch of random tokens: the loss is finite
   and the same in both, and the weights stay finite after the update.
5. Proves it is the trained model, not just a loadable one: evaluates the one-process load on
   the job's own held-out split (`--data-dir`, else the `data.dir` recorded in the checkpoint)
   exactly as the trainer's evaluation did (the same windows, per rank of the recorded world
   size, averaged) and compares with the `val_loss` the job logged at that step in
   `metrics.jsonl` next to the checkpoint. Tolerance: 1e-3 relative when the job evaluated in
   fp32, 2e-2 when it evaluated in bf16 (the drill runs fp32 on CPU; bf16 rounding of a GPT-2
   124M forward moves the loss by well under 1%). Weights that load but were perturbed, or
   come from another step or job, miss it and FAIL. Without the data or a logged `val_loss`
   at that step, the drill says why it skipped this stage.

Prints `VERDICT: PASS` (exit 0) or `VERDICT: FAIL` with the problems (exit 1). A source with no
complete checkpoint, or one that cannot be read, exits 2. Needs CPU memory for one full copy of
the training state per process (parameters, gradients and AdamW moments: 16 bytes/parameter).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from urllib.parse import urlparse

EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
METADATA = ".metadata"
# A fixed, short batch: the step proves the restored state trains, not how well.
STEP_BATCH = 1
STEP_MAX_SEQ_LEN = 256


class SourceError(Exception):
    """Nothing to verify at the source (exit 2)."""


# -- 1. find (and download) the checkpoint ---------------------------------------------------


def locate_local(source: str) -> str:
    from trainer.checkpoint.layout import STEP_DIR, latest_complete, list_steps
    from trainer.contract.layout import MARKER

    if not os.path.isdir(source):
        raise SourceError(f"{source}: no such directory (give a checkpoint directory, a step-NNNNNN "
                          "directory in it, or an s3:// URI)")
    if os.path.isfile(os.path.join(source, MARKER)):
        return source
    if STEP_DIR.match(os.path.basename(source.rstrip("/"))):
        raise SourceError(f"{source}: no {MARKER}: this step directory is not a complete checkpoint "
                          "(a save was cut short); verify the directory above it to pick the newest complete one")
    newest = latest_complete(source)
    if newest is None:
        incomplete = list_steps(source, complete_only=False)
        hint = (f" (incomplete step directories without {MARKER}: {incomplete})" if incomplete else
                " (no step-NNNNNN directories at all: is this checkpoint.dir?)")
        raise SourceError(f"{source}: no complete checkpoint{hint}")
    return newest


def s3_client():
    import boto3

    # Same endpoint override as the trainer's mirror (trainer/s3.py), for S3-compatible stores.
    return boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL_S3") or None)


def download_s3(uri: str, scratch: str, client=None) -> tuple[str, list[str]]:
    """Downloads the newest complete step under `uri` into `scratch`; returns its local path
    and the problems found while downloading (objects that did not arrive whole)."""
    from trainer.contract.layout import MARKER, STEP_DIR

    parsed = urlparse(uri)
    bucket, prefix = parsed.netloc, parsed.path.strip("/")
    if not bucket:
        raise SourceError(f"{uri}: not an s3://bucket/prefix URI")
    client = client or s3_client()
    base = f"{prefix}/" if prefix else ""
    sizes: dict[str, dict[str, int]] = {}
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=base):
            for obj in page.get("Contents", []):
                rest = obj["Key"][len(base):].split("/")
                if len(rest) == 2 and STEP_DIR.match(rest[0]):
                    sizes.setdefault(rest[0], {})[rest[1]] = obj["Size"]
    except Exception as exc:  # credentials, a missing bucket, the network: say which
        raise SourceError(f"{uri}: cannot list the checkpoints ({type(exc).__name__}: {exc})") from exc
    complete = [name for name, files in sizes.items() if MARKER in files]
    if not complete:
        found = sorted(sizes)
        hint = f" (step prefixes without {MARKER}: {found})" if found else " (no step-NNNNNN/ prefixes)"
        raise SourceError(f"{uri}: no complete checkpoint{hint}")
    newest = max(complete, key=lambda n: int(STEP_DIR.match(n).group(1)))
    local = os.path.join(scratch, newest)
    os.makedirs(local, exist_ok=True)
    problems = []
    for name, size in sorted(sizes[newest].items()):
        target = os.path.join(local, name)
        try:
            client.download_file(bucket, f"{base}{newest}/{name}", target)
        except Exception as exc:
            problems.append(f"s3://{bucket}/{base}{newest}/{name}: download failed ({type(exc).__name__}: {exc})")
            continue
        if os.path.getsize(target) != size:
            problems.append(f"{name}: downloaded {os.path.getsize(target)} bytes, S3 lists {size}")
    return local, problems


# -- 2. files against the marker and the DCP metadata ---------------------------------------------


def read_config(path: str):
    """The resolved config saved with the checkpoint: its raw mapping, the typed config (or
    None) and the problems. Field checks only, and no environment overrides: the job's data
    and checkpoint directories need not exist here, and the drill must see what was saved."""
    import yaml

    from trainer.config import ConfigError, build_config

    file = os.path.join(path, "config.yaml")
    with open(file) as f:
        raw = yaml.safe_load(f) or {}
    try:
        return raw, build_config(file, [], environ={}), []
    except ConfigError as exc:
        return raw, None, list(exc.problems)


def check_files(path: str) -> tuple[list[str], dict]:
    """Problems with the files of one step directory, and what the later stages need."""
    from trainer.contract.layout import MARKER, STEP_DIR

    problems: list[str] = []
    facts: dict = {}
    try:
        with open(os.path.join(path, MARKER)) as f:
            marker = json.load(f)
    except (OSError, ValueError) as exc:
        return [f"{MARKER}: unreadable ({exc}); the checkpoint cannot be trusted"], facts
    facts["marker"] = marker
    for key in ("step", "world_size", "config"):
        if key not in marker:
            problems.append(f"{MARKER}: no '{key}' (written by a trainer that predates it, or damaged)")
    match = STEP_DIR.match(os.path.basename(path.rstrip("/")))
    if match and "step" in marker and int(match.group(1)) != marker["step"]:
        problems.append(f"{MARKER}: step {marker['step']} but the directory is {os.path.basename(path)}: "
                        "the marker belongs to another save")
    world_size = marker.get("world_size")
    if not isinstance(world_size, int) or world_size < 1:
        problems.append(f"{MARKER}: world_size={world_size!r}: expected a positive integer")
        world_size = None
    facts["world_size"] = world_size

    if not os.path.isfile(os.path.join(path, "config.yaml")):
        problems.append("config.yaml: missing (every save writes it next to the shards)")
    else:
        try:
            raw, cfg, config_problems = read_config(path)
        except Exception as exc:
            raw, cfg, config_problems = None, None, [f"unparsable ({exc})"]
        problems += [f"config.yaml: {p}" for p in config_problems]
        if raw is not None and "config" in marker and raw != marker["config"]:
            differing = sorted(k for k in set(raw) | set(marker["config"]) if raw.get(k) != marker["config"].get(k))
            problems.append(f"config.yaml differs from the config recorded in {MARKER} (sections {differing})")
        if not config_problems:
            facts["config"] = cfg

    if world_size:
        import torch

        for rank in range(world_size):
            rng = os.path.join(path, f"rng-rank-{rank}.pt")
            if not os.path.isfile(rng):
                problems.append(f"rng-rank-{rank}.pt: missing (the marker records world_size={world_size})")
                continue
            try:
                state = torch.load(rng, weights_only=True)  # tensors only (trainer.checkpoint.rng_state)
                missing = {"python_words", "numpy_keys", "torch"} - set(state)
                if missing:
                    problems.append(f"rng-rank-{rank}.pt: no {sorted(missing)} RNG state")
            except Exception as exc:
                problems.append(f"rng-rank-{rank}.pt: unreadable ({type(exc).__name__}: {exc})")
        extra = sorted(f for f in os.listdir(path) if f.startswith("rng-rank-")
                       and f[len("rng-rank-"):-len(".pt")].isdigit() and int(f[len("rng-rank-"):-len(".pt")]) >= world_size)
        if extra:
            problems.append(f"{extra}: RNG files beyond the recorded world_size={world_size}: files of two saves are mixed")

    problems += check_dcp(path, facts)
    return problems, facts


def check_dcp(path: str, facts: dict) -> list[str]:
    from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata

    from trainer.safe_load import ForbiddenPickle, read_metadata

    if not os.path.isfile(os.path.join(path, METADATA)):
        return [f"{METADATA}: missing: DCP writes it last on the coordinator, so the save never finished"]
    try:
        metadata = read_metadata(path)
    except ForbiddenPickle as exc:
        return [f"{METADATA}: {str(exc).split(': ', 1)[1]}"]
    except Exception as exc:
        return [f"{METADATA}: unreadable ({type(exc).__name__}: {exc})"]
    facts["metadata"] = metadata
    problems: list[str] = []
    storage = metadata.storage_data or {}
    tensors = {k: v for k, v in metadata.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
    if not any(k.startswith("app.model.") for k in tensors):
        problems.append(f"{METADATA}: no model tensors (app.model.*)")
    if not any(k.startswith("app.optim.") for k in metadata.state_dict_metadata):
        problems.append(f"{METADATA}: no optimizer state (app.optim.*)")
    for fqn, meta in sorted(tensors.items()):
        numel = math.prod(meta.size)
        covered = sum(math.prod(chunk.sizes) for chunk in meta.chunks)
        if covered != numel:
            problems.append(f"{fqn}: chunks hold {covered} of {numel} elements")
        for chunk in meta.chunks:
            if MetadataIndex(fqn, chunk.offsets) not in storage:
                problems.append(f"{fqn}: chunk at offset {list(chunk.offsets)} has no storage entry")
    by_file: dict[str, list] = {}
    for index, info in storage.items():
        by_file.setdefault(info.relative_path, []).append((info.offset, index, info))
    for name, items in sorted(by_file.items()):
        full = os.path.join(path, name)
        if not os.path.isfile(full):
            problems.append(f"{name}: shard missing (DCP metadata stores {len(items)} item(s) in it, "
                            f"e.g. {items[0][1].fqn})")
            continue
        size = os.path.getsize(full)
        beyond = sorted((offset + info.length, index.fqn) for offset, index, info in items if offset + info.length > size)
        if beyond:
            problems.append(f"{name}: {size} bytes, but DCP metadata places {len(beyond)} of its {len(items)} item(s) "
                            f"beyond that (up to byte {beyond[-1][0]}, e.g. {beyond[0][1]}): the shard is truncated")
            continue
        problems += check_shard_items(full, name, sorted(items, key=lambda x: x[0]), metadata)
    facts["num_shards"] = len(by_file)
    return problems


def check_shard_items(full: str, name: str, items: list, metadata) -> list[str]:
    """Deserialises every item of one shard as DCP's reader would, and checks each tensor's
    shape and dtype against the metadata and its values for NaN/inf. One damaged byte in a
    header (or a whole block of a file overwritten) shows here, with the tensor it hit."""
    import io

    import torch
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    problems = []
    with open(full, "rb") as f:
        for offset, index, info in items:
            if info.transform_descriptors:  # an extension's encoding (compression...): the load stage reads it
                continue
            f.seek(offset)
            blob = io.BytesIO(f.read(info.length))
            meta = metadata.state_dict_metadata.get(index.fqn)
            where = f"{name}: {index.fqn} (bytes {offset}..{offset + info.length})"
            try:
                if isinstance(meta, TensorStorageMetadata):
                    # DCP reads tensors with weights_only=True (filesystem.py, read_data).
                    tensor = torch.load(blob, map_location="cpu", weights_only=True)
                else:
                    # DCP's load_bytes unpickles these freely; the drill reads them as plain data only.
                    torch.load(blob, weights_only=True)
                    continue
            except Exception as exc:
                problems.append(f"{where}: cannot be deserialised ({type(exc).__name__}: {str(exc)[:120]}): "
                                "the shard is damaged")
                continue
            chunk = next((c for c in meta.chunks if c.offsets == index.offset), None)
            if chunk is not None and list(tensor.shape) != list(chunk.sizes):
                problems.append(f"{where}: shape {list(tensor.shape)}, DCP metadata says {list(chunk.sizes)}")
            elif tensor.dtype != meta.properties.dtype:
                problems.append(f"{where}: dtype {tensor.dtype}, DCP metadata says {meta.properties.dtype}")
            elif tensor.is_floating_point() and not torch.isfinite(tensor).all():
                problems.append(f"{where}: holds NaN or inf")
    return dedupe(problems)


def dedupe(problems: list[str], limit_per_file: int = 3) -> list[str]:
    """One truncated shard holds many tensors: keep the first few lines per file."""
    seen: dict[str, int] = {}
    out = []
    for p in problems:
        head = p.split(":", 1)[0]
        seen[head] = seen.get(head, 0) + 1
        if seen[head] <= limit_per_file:
            out.append(p)
        elif seen[head] == limit_per_file + 1:
            out.append(f"{head}: (more problems in this file left out)")
    return out


# -- 3 and 4. load and step (one worker per rank) -----------------------------------------------------


def tensor_digest(t) -> str:
    import torch

    t = t.detach().cpu().contiguous().reshape(-1)
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def flatten(prefix: str, node, out: dict) -> None:
    import torch

    if isinstance(node, dict):
        for k, v in node.items():
            flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            flatten(f"{prefix}.{i}", v, out)
    elif isinstance(node, torch.Tensor):
        out[prefix] = node


def build_for_checkpoint(path: str, cfg, metadata):
    """The model the checkpoint was trained with: sizes from the config, vocabulary and
    context length from the saved embeddings (the dataset need not be mounted here)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from trainer.model import build_model

    shapes = {k: list(v.size) for k, v in metadata.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
    if cfg.model.kind == "gpt":
        wte, wpe = shapes.get("app.model.wte.weight"), shapes.get("app.model.wpe.weight")
        if not wte or not wpe:
            raise ValueError("no built-in GPT embeddings (app.model.wte.weight, app.model.wpe.weight) in the checkpoint")
        return build_model(cfg.model, wte[0], wpe[0]), wte[0], wpe[0]
    embed = next((s for k, s in shapes.items() if k.startswith("app.model.") and k.endswith("embed_tokens.weight")), None)
    vocab = embed[0] if embed else cfg.model.vocab_size
    return build_model(cfg.model, vocab, cfg.data.seq_len), vocab, cfg.data.seq_len


def heldout_loss(model, cfg, data_dir: str, world_size: int, device) -> tuple[float, int]:
    """The validation loss the trainer's Evaluator computed for this model: the same windows
    (ValidationBatches of every rank of the recorded world size), mean of per-rank means.
    Returns (loss, number of micro-batches)."""
    import torch
    import torch.nn.functional as F

    from trainer.data import TokenShards, ValidationBatches

    val = TokenShards(data_dir, cfg.data.seq_len, split="val")
    if val.num_samples == 0:
        raise ValueError(f"{data_dir} has no validation split with {cfg.data.seq_len + 1}-token windows")
    per_rank = []
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for rank in range(world_size):
                batches = ValidationBatches(val, cfg.data.micro_batch_size, cfg.evaluation.num_batches, rank,
                                            world_size, device)
                total = 0.0
                for inputs, targets in batches:
                    logits = model(inputs)
                    total += float(F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1)).double())
                per_rank.append(total / len(batches))
    finally:
        model.train(was_training)
    return sum(per_rank) / len(per_rank), world_size * cfg.evaluation.num_batches


def load_and_step(path: str, result_file: str, heldout: dict | None = None) -> None:
    """One rank's part of the drill (RANK/WORLD_SIZE/MASTER_* in the environment, or none
    for one process). Writes a JSON result; rank 0's holds the full-state digests."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    from trainer import distributed, safe_load
    from trainer.checkpoint import ModelAndOptimizer
    from trainer.model import apply_activation_checkpointing
    from trainer.optim import build_optimizer

    result: dict = {"problems": []}
    env = None
    try:
        _, cfg, _ = read_config(path)
        # CPU and fp32 wherever the drill runs: a checkpoint holds fp32 state whatever the
        # job's device and precision, and a drill must not need the job's GPUs.
        cfg = dataclasses.replace(cfg, parallelism=dataclasses.replace(
            cfg.parallelism, backend="gloo", mixed_precision="fp32", compile=False))
        env = distributed.init(cfg.parallelism)
        result.update(rank=env.rank, world_size=env.world_size)
        torch.manual_seed(cfg.seed)
        metadata = safe_load.read_metadata(path)
        model, vocab, seq_len = build_for_checkpoint(path, cfg, metadata)
        if cfg.parallelism.activation_checkpointing:
            apply_activation_checkpointing(model)  # as the trainer does: same state-dict keys
        model.to(env.device)
        strategy = distributed.strategy_for(cfg.parallelism, env, False)
        model = strategy.wrap(model, env)
        result["strategy"] = strategy.name
        optimizer = build_optimizer(model, cfg, env.device)
        app = ModelAndOptimizer(model, optimizer)
        try:
            safe_load.load({"app": app}, path, process_group=env.checkpoint_group, no_dist=not env.distributed)
        except BaseException as exc:  # DCP's CheckpointException derives from BaseException
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise RuntimeError(f"loading into the model and optimizer failed: {load_error(exc)}") from exc

        full_model, full_optim = get_state_dict(model, optimizer,
                                                options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        flat: dict = {}
        flatten("model", full_model, flat)
        flatten("optim", full_optim, flat)
        if env.rank == 0:
            result["digests"] = {k: tensor_digest(v) for k, v in sorted(flat.items())}
            result["nonfinite"] = sorted(k for k, v in flat.items() if v.is_floating_point() and not torch.isfinite(v).all())
            steps = {float(v) for k, v in flat.items() if k.startswith("optim.state.") and k.endswith(".step")}
            result["optimizer_steps"] = sorted(steps)
            if not any(k.startswith("optim.state.") for k in flat):
                result["problems"].append("the optimizer state is empty after loading: AdamW moments were not restored")
        del full_model, full_optim, flat

        if heldout and env.world_size == 1:
            try:
                result["heldout_loss"], result["heldout_batches"] = heldout_loss(
                    model, cfg, heldout["data_dir"], heldout["world_size"], env.device)
            except Exception as exc:  # noqa: BLE001 - reported as a skipped stage, with the reason
                result["heldout_error"] = f"{type(exc).__name__}: {exc}"

        gen = torch.Generator().manual_seed(0)
        length = min(seq_len, STEP_MAX_SEQ_LEN)
        tokens = torch.randint(0, vocab, (STEP_BATCH, length + 1), generator=gen).to(env.device)
        model.train()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optimizer.grad_clip_norm or math.inf)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        after = [bool(torch.isfinite(p.full_tensor() if hasattr(p, "full_tensor") else p).all())
                 for p in model.parameters()]
        result["loss"] = float(loss)
        result["weights_finite_after_step"] = all(after)
    except BaseException as exc:
        result["problems"].append(str(exc) if isinstance(exc, RuntimeError) else f"{type(exc).__name__}: {exc}")
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
    finally:
        with open(result_file, "w") as f:
            json.dump(result, f)
        if env is not None and dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


def load_error(exc: BaseException) -> str:
    """DCP's error is every rank's traceback; the reader wants each distinct cause once."""
    failures = getattr(exc, "failures", None)
    if not failures:
        return f"{type(exc).__name__}: {str(exc)[:400]}"
    causes: dict[str, list[int]] = {}
    for rank, wrapped in sorted(failures.items()):
        inner = wrapped[0] if isinstance(wrapped, tuple) else getattr(wrapped, "exc", wrapped)
        causes.setdefault(f"{type(inner).__name__}: {str(inner)[:300]}", []).append(rank)
    return "; ".join(f"{cause} (rank {', '.join(map(str, ranks))})" for cause, ranks in causes.items())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_workers(path: str, world_size: int, workdir: str, timeout_s: float,
                heldout: dict | None = None) -> tuple[list[dict], list[str]]:
    """Runs the drill in `world_size` CPU processes on loopback (gloo), as torchrun would
    place ranks, and returns each rank's result."""
    os.makedirs(workdir, exist_ok=True)
    port = free_port()
    procs = []
    for rank in range(world_size):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("TORCHELASTIC_", "PET_")) and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE",
                                                                             "MASTER_ADDR", "MASTER_PORT")}
        env.setdefault("OMP_NUM_THREADS", "1")
        if world_size > 1:
            env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        out = os.path.join(workdir, f"rank-{rank}.json")
        log = open(os.path.join(workdir, f"rank-{rank}.log"), "w")
        extra = [json.dumps(heldout)] if heldout and world_size == 1 else []
        procs.append((subprocess.Popen([sys.executable, "-m", "trainer.verify", "--worker", path, out, *extra], env=env,
                                       stdout=log, stderr=subprocess.STDOUT), out, log))
    deadline = time.monotonic() + timeout_s
    results, problems = [], []
    for rank, (proc, out, log) in enumerate(procs):
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            problems.append(f"rank {rank} of {world_size}: no result within {timeout_s:.0f} s (a collective hung?)")
        log.close()
        if os.path.isfile(out):
            with open(out) as f:
                results.append(json.load(f))
        elif proc.returncode is not None and not problems:
            with open(log.name) as f:
                tail = f.read()[-800:]
            problems.append(f"rank {rank} of {world_size}: exited {proc.returncode} without a result:\n{tail}")
    return results, problems


# -- the verdict --------------------------------------------------------------------------------------


def logged_val_loss(path: str, step: int) -> float | None:
    """The val_loss the job logged at `step`, from metrics.jsonl in the checkpoint directory
    (the newest row of that step: a resumed job re-logs nothing it already logged)."""
    file = os.path.join(os.path.dirname(os.path.abspath(path.rstrip("/"))), "metrics.jsonl")
    value = None
    with contextlib.suppress(OSError):
        with open(file) as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if row.get("step") == step and "val_loss" in row:
                    value = float(row["val_loss"])
    return value


def heldout_tolerance(cfg) -> tuple[float, str]:
    """Relative tolerance between the drill's fp32 CPU evaluation and the job's own."""
    precision = cfg.parallelism.mixed_precision
    if precision == "fp32":
        return 1e-3, "the job evaluated in fp32, as the drill does"
    return 2e-2, f"the job evaluated with mixed_precision={precision} (bf16 when it ran on a GPU), the drill in fp32"


def plan_heldout(path: str, facts: dict, data_dir: str | None) -> tuple[dict | None, str]:
    """What the held-out stage needs, or why it cannot run."""
    cfg, step = facts.get("config"), facts["marker"].get("step")
    data_dir = data_dir or (cfg.data.dir if cfg is not None else None)
    expected = logged_val_loss(path, step)
    if expected is None:
        return None, (f"no val_loss logged at step {step} in metrics.jsonl next to the checkpoint (evaluation.every_steps "
                      "did not fall on this step, or the metrics are elsewhere)")
    if not data_dir or not os.path.isdir(data_dir):
        return None, f"the job's data directory {data_dir!r} is not here: give --data-dir"
    return {"data_dir": data_dir, "world_size": facts["world_size"], "expected": expected}, ""


MAX_DRILL_PROCESSES = 2


def drill_world_sizes(world_size: int) -> list[int]:
    """The process counts the drill loads the checkpoint in: resharded to at most
    MAX_DRILL_PROCESSES ranks, and to one."""
    return sorted({min(world_size, MAX_DRILL_PROCESSES), 1}, reverse=True)


def verify(path: str, timeout_s: float = 1800.0, workdir: str | None = None,
           say=print, data_dir: str | None = None, downloaded_from: str | None = None) -> list[str]:
    """Every problem found with the complete checkpoint at `path` (empty: it restores).
    `downloaded_from`: the source `path` was downloaded from, which then needs the team's key."""
    say(f"checkpoint: {path}")
    from trainer.trust import trust_from_env

    trust = trust_from_env(require_key=downloaded_from)
    # Stage 0: nothing pickled is opened unless it is this team's (trainer/trust.py). Damage
    # that leaves only tensors unverified is diagnosed further, but never loaded into a model.
    blocking, untrusted = trust.pickled_problems(path)
    if blocking:
        return ["refused before reading anything pickled from it: " + p for p in blocking] + untrusted
    say(f"  manifest: {'signed with this team key, ' if trust.signed else 'UNSIGNED (no key: digests only), '}"
        f"{'digests differ' if untrusted else 'every digest matches'}")
    problems, facts = check_files(path)
    if problems or untrusted:
        return untrusted + problems
    marker, world_size = facts["marker"], facts["world_size"]
    say(f"  files: marker step {marker['step']}, world size {world_size}, {facts['num_shards']} shard file(s), "
        f"{len(facts['metadata'].state_dict_metadata)} entries in the DCP metadata: ok")
    own_workdir = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="verify-ckpt-work-")
    try:
        loads = {}
        heldout, skipped = plan_heldout(path, facts, data_dir)
        sizes = drill_world_sizes(world_size)
        multi = sizes[0]
        for n in sizes:
            results, run_problems = run_workers(path, n, os.path.join(workdir, f"world-{n}"), timeout_s, heldout)
            label = f"load in {n} process{'es' if n > 1 else ''}"
            problems += [f"{label}: {p}" for r in results for p in r.get("problems", [])]
            problems += [f"{label}: {p}" for p in run_problems]
            rank0 = next((r for r in results if r.get("rank") == 0), None)
            if rank0 is None or "digests" not in rank0 or run_problems:
                if rank0 is None and not run_problems:
                    problems.append(f"{label}: rank 0 wrote no result")
                continue
            if rank0["nonfinite"]:
                problems.append(f"{label}: non-finite values in {rank0['nonfinite'][:5]}")
            if not all(r.get("weights_finite_after_step") for r in results):
                problems.append(f"{label}: weights are non-finite after one step from the checkpoint")
            if not math.isfinite(rank0["loss"]):
                problems.append(f"{label}: the loss of one step is {rank0['loss']}")
            loads[n] = rank0
            say(f"  {label} ({rank0['strategy']}): {len(rank0['digests'])} tensors, optimizer step "
                f"{', '.join(f'{s:g}' for s in rank0['optimizer_steps']) or '-'}, one step loss {rank0['loss']:.4f}")
        if multi in loads and 1 in loads and multi != 1:
            a, b = loads[multi], loads[1]
            if a["digests"].keys() != b["digests"].keys():
                problems.append(f"the {multi}-process and 1-process loads hold different tensors: "
                                f"{sorted(set(a['digests']) ^ set(b['digests']))[:5]}")
            else:
                differ = [k for k in a["digests"] if a["digests"][k] != b["digests"][k]]
                if differ:
                    problems.append(f"the {multi}-process and 1-process loads differ in {len(differ)} tensor(s), "
                                    f"e.g. {differ[:3]}: resharding does not restore the same state")
            if abs(a["loss"] - b["loss"]) > 1e-3 * max(1.0, abs(b["loss"])):
                problems.append(f"one step from the {multi}-process load gives loss {a['loss']:.6f}, from the "
                                f"1-process load {b['loss']:.6f}: the restored models compute different functions")
        if heldout is None:
            say(f"  held-out check: skipped: {skipped}")
        elif 1 in loads:
            problems += compare_heldout(loads[1], heldout, facts["config"], say)
    finally:
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return problems


def compare_heldout(load: dict, heldout: dict, cfg, say) -> list[str]:
    if "heldout_loss" not in load:
        return [f"held-out evaluation on {heldout['data_dir']} failed: {load.get('heldout_error', 'no result')}"]
    tolerance, why = heldout_tolerance(cfg)
    got, expected = load["heldout_loss"], heldout["expected"]
    off = abs(got - expected) / max(abs(expected), 1e-12)
    say(f"  held-out check: val_loss {got:.6f} on {load['heldout_batches']} micro-batches of {heldout['data_dir']}; "
        f"the job logged {expected:.6f} at this step; relative difference {off:.2e} (tolerance {tolerance:g}: {why})")
    if not off <= tolerance:
        return [f"the restored model's held-out val_loss is {got:.6f} but the job logged {expected:.6f} at this step "
                f"(relative difference {off:.2e} > {tolerance:g}): the checkpoint loads but is not the model that "
                "was trained to this step"]
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer verify-checkpoint",
        description="Restore drill: download the newest complete checkpoint, check every shard against the "
                    "marker and the DCP metadata, load it for the recorded world size and for one process, run "
                    "one step, print a verdict (exit 0 PASS, 1 FAIL, 2 nothing to verify).")
    parser.add_argument("source", help="checkpoint.dir, one step-NNNNNN directory in it, or s3://bucket/prefix "
                                       "(checkpoint.s3_uri)")
    parser.add_argument("--scratch", help="where an s3:// checkpoint is downloaded (default: a temporary "
                                          "directory, removed afterwards)")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per load (default 1800)")
    parser.add_argument("--data-dir", help="the job's prepared data (default: data.dir recorded in the checkpoint); "
                                           "its held-out split is evaluated and compared with the logged val_loss")
    args = parser.parse_args(argv)
    from trainer.trust import CheckpointKeyError

    scratch, own_scratch = args.scratch, False
    try:
        if args.source.startswith("s3://"):
            if scratch is None:
                scratch, own_scratch = tempfile.mkdtemp(prefix="verify-ckpt-"), True
            print(f"downloading the newest complete checkpoint under {args.source} into {scratch}")
            path, problems = download_s3(args.source, scratch)
        else:
            path, problems = locate_local(args.source), []
        if not problems:
            problems = verify(path, data_dir=args.data_dir,
                              downloaded_from=args.source if args.source.startswith("s3://") else None)
    except (SourceError, CheckpointKeyError) as exc:
        print(f"verify-checkpoint: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if own_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    if problems:
        print("VERDICT: FAIL: the checkpoint would not restore:", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        return EXIT_FAIL
    print("VERDICT: PASS: the checkpoint restores for its world size and for one process, and trains one step")
    return EXIT_PASS


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        load_and_step(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]) if len(sys.argv) > 4 else None)
        sys.exit(0)
    sys.exit(main())
