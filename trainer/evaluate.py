"""`python -m trainer.evaluate`: validation loss of a run's final checkpoint (the pipeline's evaluate step).

    python -m trainer.evaluate --checkpoint-dir /fsx/pipelines/run/checkpoints \
        --data-dir /fsx/pipelines/run/tokens --output /fsx/pipelines/run/evaluation.json \
        [--final-checkpoint-file /fsx/pipelines/run/final-checkpoint] [--tag key=value ...]

Reads the newest complete checkpoint (a directory with `complete.json`), rebuilds the model
from the checkpoint's own `config.yaml`, loads its weights with DCP in one process (DCP
reshards whatever number of ranks wrote it), and averages the cross-entropy over the held-out
split that `prepare-data --val-fraction` writes (`val_shards` in the manifest). One process,
CPU or one GPU: evaluation of a pipeline's model needs no torchrun.

Writes the result as JSON (checkpoint, step, val_loss, perplexity, dataset hash, MLflow run)
and the checkpoint's path to `--final-checkpoint-file` (the register step exports exactly that
checkpoint). When MLFLOW_TRACKING_URI is set and the checkpoint names its MLflow run, the loss
is logged to that run as `final_val_loss` and the `--tag`s (the pipeline's lineage) are set on it.
Exit codes: 0 done, 1 the checkpoint refused (not proven this team's, or it holds code), 2 bad input (no
checkpoint, no validation split, an unusable key).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import yaml

from trainer.checkpoint import read_marker
from trainer.checkpoint.layout import latest_complete


class EvaluationError(ValueError):
    """Bad input, reported as one line and exit code 2."""


def checkpoint_config(checkpoint: str):
    from trainer.config import TrainerConfig, _build

    with open(os.path.join(checkpoint, "config.yaml")) as f:
        raw = yaml.safe_load(f) or {}
    problems: list[str] = []
    cfg = _build(TrainerConfig, raw, "", problems)
    if problems:
        raise EvaluationError(f"{checkpoint}/config.yaml: {'; '.join(problems)}")
    return cfg


def validation_windows(data_dir: str, seq_len: int) -> list[np.ndarray]:
    """Every (seq_len + 1)-token window of the held-out split, in manifest order."""
    with open(os.path.join(data_dir, "manifest.json")) as f:
        manifest = json.load(f)
    entries = manifest.get("val_shards") or []
    if not entries:
        raise EvaluationError(f"{data_dir}: the dataset has no validation split (val_shards); "
                              "run prepare-data with --val-fraction > 0")
    windows = []
    for entry in entries:
        tokens = np.load(os.path.join(data_dir, entry["file"]), mmap_mode="r")
        for start in range(0, len(tokens) - seq_len, seq_len):
            windows.append(np.asarray(tokens[start:start + seq_len + 1], dtype=np.int64))
    if not windows:
        raise EvaluationError(f"{data_dir}: the validation split is shorter than one {seq_len + 1}-token window")
    return windows


def load_model(checkpoint: str, cfg, vocab_size: int) -> torch.nn.Module:
    from trainer import safe_load
    from trainer.model import build_model
    from trainer.trust import trust_from_env

    trust_from_env().check(checkpoint)  # before the metadata pickle is read (trainer/trust.py)
    model = build_model(cfg.model, vocab_size, cfg.data.seq_len)
    state = model.state_dict()
    # Only the model's keys are requested: the optimizer state in the checkpoint is left on disk.
    safe_load.load({"app": {"model": state}}, checkpoint, no_dist=True)
    model.load_state_dict(state)
    return model.eval()


def evaluate(checkpoint_root: str, data_dir: str, *, max_windows: int = 512, batch_size: int = 8) -> dict[str, Any]:
    checkpoint = latest_complete(checkpoint_root)
    if checkpoint is None:
        raise EvaluationError(f"{checkpoint_root}: no complete checkpoint (step-*/complete.json)")
    cfg = checkpoint_config(checkpoint)
    marker = read_marker(checkpoint)
    with open(os.path.join(data_dir, "manifest.json")) as f:
        manifest = json.load(f)
    windows = validation_windows(data_dir, cfg.data.seq_len)[:max_windows]
    model = load_model(checkpoint, cfg, int(manifest["vocab_size"]))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(windows), batch_size):
            batch = torch.from_numpy(np.stack(windows[start:start + batch_size])).to(device)
            logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1), reduction="sum")
            total += loss.item()
            count += batch[:, 1:].numel()
    val_loss = total / count
    return {
        "checkpoint": os.path.abspath(checkpoint),
        "step": int(marker["step"]),
        "val_loss": val_loss,
        "val_perplexity": math.exp(min(val_loss, 50.0)),
        "num_tokens": count,
        "dataset_hash": manifest.get("hash"),
        "mlflow_run_id": marker.get("mlflow_run_id"),
    }


def log_to_run(result: dict[str, Any], tags: dict[str, str]) -> bool:
    """The loss and the pipeline's tags on the training run; False when there is nowhere to log."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    run_id = os.environ.get("MLFLOW_RUN_ID") or result.get("mlflow_run_id")
    if not uri or not run_id:
        return False
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    client.log_metric(run_id, "final_val_loss", result["val_loss"], step=result["step"])
    for key, value in sorted(tags.items()):
        client.set_tag(run_id, key, value)
    return True


def parse_tags(items: list[str]) -> dict[str, str]:
    tags = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise EvaluationError(f"--tag {item!r}: write key=value")
        tags[key] = value
    return tags


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", required=True, help="the run's checkpoint root (step-* directories)")
    parser.add_argument("--data-dir", required=True, help="token shards with a validation split")
    parser.add_argument("--output", required=True, help="JSON result file")
    parser.add_argument("--final-checkpoint-file", help="also write the evaluated checkpoint's path here")
    parser.add_argument("--max-windows", type=int, default=512)
    parser.add_argument("--tag", action="append", default=[], help="key=value set on the MLflow run (lineage)")
    args = parser.parse_args(argv)
    from trainer.guards import TrainingStopped
    from trainer.trust import CheckpointKeyError

    try:
        tags = parse_tags(args.tag)
        result = evaluate(args.checkpoint_dir, args.data_dir, max_windows=args.max_windows)
    except (EvaluationError, FileNotFoundError, CheckpointKeyError) as exc:
        print(f"evaluate: {exc}", file=sys.stderr)
        return 2
    except TrainingStopped as exc:  # a checkpoint refused (trainer/trust.py, trainer/safe_load.py)
        print(f"evaluate: {exc}", file=sys.stderr)
        return 1
    result["logged_to_mlflow"] = log_to_run(result, tags)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
    if args.final_checkpoint_file:
        with open(args.final_checkpoint_file, "w") as f:
            f.write(result["checkpoint"])
    print(f"step {result['step']}: val_loss {result['val_loss']:.4f} (perplexity {result['val_perplexity']:.2f}) "
          f"over {result['num_tokens']} tokens -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
