"""Export a checkpoint as a Hugging Face model directory, log it to MLflow, register it.

    python -m trainer export --checkpoint /fsx/ckpt/job/step-019073 --out /fsx/models/gpt2-v1 \
        [--registered-model-name gpt2-124m] [--tracking-uri https://mlflow.example.com]

The directory holds `model.safetensors`, `config.json` (and `generation_config.json`), the
tokenizer when the dataset was tokenised with a local Hugging Face tokenizer, and
`trainer_export.json` (lineage: checkpoint, step, config hash, dataset hash, source run).

- Built-in GPT: converted to transformers' `GPT2LMHeadModel` (same architecture: pre-norm
  blocks, fused QKV, tanh GELU, learned positions, LayerNorm eps 1e-5, tied or untied head).
  GPT-2 stores its linear layers as `Conv1D` with the weight transposed ([in, out]).
  `GPT2LMHeadModel.from_pretrained(dir)` reproduces the trainer's logits.
- Hugging Face models: `save_pretrained` of the trained model.

The end of a completed run does the same from its final checkpoint (`export.at_end`). Reading
the checkpoint (rather than gathering the live model) makes both paths one code path, and DCP
reshards, so a checkpoint written by any number of ranks, DDP or FSDP2, exports alike.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from typing import Any

import torch

from trainer.config import ConfigError, TrainerConfig, _build, yaml_load

log = logging.getLogger(__name__)

EXPORT_FORMAT = "huggingface-transformers"
LINEAGE_FILE = "trainer_export.json"
# MLflow's standard system tags (mlflow/utils/mlflow_tags.py; "System tags" in the MLflow
# tracking docs), copied from the run to the logged model and the registered version.
SYSTEM_TAGS = ("mlflow.source.git.commit", "mlflow.source.git.repoURL", "mlflow.source.name",
               "mlflow.source.type", "mlflow.docker.image.uri", "mlflow.docker.image.id", "mlflow.user")
LINEAGE_TAGS = ("git_commit", "image_digest", "dataset_version", "dataset_hash", "config_hash", "trainer.job_id")


def checkpoint_config(checkpoint_dir: str) -> TrainerConfig:
    """The resolved config the checkpoint was written with (no path checks: data and
    checkpoint directories of the training job need not exist where the export runs)."""
    path = os.path.join(checkpoint_dir, "config.yaml")
    with open(path) as f:
        raw = yaml_load(f) or {}
    problems: list[str] = []
    cfg = _build(TrainerConfig, raw, "", problems)
    if problems:
        raise ConfigError([f"{path}: {p}" for p in problems])
    return cfg


def _tensor_shape(checkpoint_dir: str, key: str) -> list[int] | None:
    from trainer.safe_load import read_metadata

    meta = read_metadata(checkpoint_dir).state_dict_metadata.get(key)
    return list(meta.size) if meta is not None and hasattr(meta, "size") else None


def load_model_from_checkpoint(checkpoint_dir: str, cfg: TrainerConfig) -> torch.nn.Module:
    """Builds the model the checkpoint was trained with and loads its weights (one process,
    no process group; DCP reshards whatever wrote it)."""
    from trainer import safe_load
    from trainer.model import build_model
    from trainer.trust import trust_from_env

    trust_from_env().check(checkpoint_dir)  # before the metadata pickle is read (trainer/trust.py)
    if cfg.model.kind == "gpt":
        wte = _tensor_shape(checkpoint_dir, "app.model.wte.weight")
        wpe = _tensor_shape(checkpoint_dir, "app.model.wpe.weight")
        if wte is None or wpe is None:
            raise ValueError(f"{checkpoint_dir}: no built-in GPT weights (app.model.wte.weight) in the checkpoint")
        model = build_model(cfg.model, wte[0], wpe[0])
    else:
        if not cfg.model.hf_path or not os.path.isdir(cfg.model.hf_path):
            raise ValueError(f"model.hf_path={cfg.model.hf_path!r}: the base model directory is needed to rebuild "
                             "the architecture; mount it where the export runs")
        from transformers import AutoConfig, AutoModelForCausalLM

        from trainer.model import HFCausalLM

        hf_config = AutoConfig.from_pretrained(cfg.model.hf_path, local_files_only=True)
        model = HFCausalLM(AutoModelForCausalLM.from_config(hf_config, torch_dtype=torch.float32))
    state = model.state_dict()
    safe_load.load({"app": {"model": state}}, checkpoint_dir, no_dist=True)
    model.load_state_dict(state)
    return model.eval()


def gpt_to_hf(model: torch.nn.Module, vocab_size: int | None = None):
    """The built-in GPT as a transformers GPT2LMHeadModel with the same weights.

    `vocab_size`: the tokenizer's real vocabulary when the model's is padded (GPT-2's 50257
    trained as 50304 for fast matmuls): the padding rows of the embedding and the head are
    cropped, as llm.c's dev/eval/export_hf.py does ("drop the padding back to GPT2 size"), so
    sampling never emits an id the tokenizer cannot decode."""
    from transformers import GPT2Config, GPT2LMHeadModel

    shape = model.shape
    vocab = shape.vocab_size if vocab_size is None else min(vocab_size, shape.vocab_size)
    config = GPT2Config(
        vocab_size=vocab, n_positions=shape.max_seq_len, n_embd=shape.embed_dim, n_layer=shape.num_layers,
        n_head=shape.num_heads, n_inner=4 * shape.embed_dim, activation_function="gelu_new",  # tanh approximation
        resid_pdrop=shape.dropout, embd_pdrop=shape.dropout, attn_pdrop=shape.dropout, layer_norm_epsilon=1e-5,
        tie_word_embeddings=shape.tie_embeddings, bos_token_id=None, eos_token_id=None)
    hf = GPT2LMHeadModel(config)
    src = {k: v.detach() for k, v in model.state_dict().items()}
    out = {"transformer.wte.weight": src["wte.weight"][:vocab], "transformer.wpe.weight": src["wpe.weight"],
           "transformer.ln_f.weight": src["ln_f.weight"], "transformer.ln_f.bias": src["ln_f.bias"],
           "lm_head.weight": src["lm_head.weight"][:vocab]}
    # Conv1D keeps weight as [in_features, out_features]: the transpose of nn.Linear's.
    linear = {"attn.qkv": "attn.c_attn", "attn.proj": "attn.c_proj", "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj"}
    for i in range(shape.num_layers):
        for norm in ("ln_1", "ln_2"):
            for p in ("weight", "bias"):
                out[f"transformer.h.{i}.{norm}.{p}"] = src[f"blocks.{i}.{norm}.{p}"]
        for ours, theirs in linear.items():
            out[f"transformer.h.{i}.{theirs}.weight"] = src[f"blocks.{i}.{ours}.weight"].t().contiguous()
            out[f"transformer.h.{i}.{theirs}.bias"] = src[f"blocks.{i}.{ours}.bias"]
    missing, unexpected = hf.load_state_dict(out, strict=False)
    # GPT-2's causal-mask buffers are not weights; anything else missing is a mapping bug.
    missing = [k for k in missing if not k.endswith((".attn.bias", ".attn.masked_bias"))]
    if missing or unexpected:
        raise RuntimeError(f"GPT -> GPT2LMHeadModel mapping incomplete: missing {missing}, unexpected {unexpected}")
    if shape.tie_embeddings:
        hf.tie_weights()
    return hf.eval()


def export_checkpoint(checkpoint_dir: str, out_dir: str, cfg: TrainerConfig | None = None) -> dict[str, Any]:
    """Writes the Hugging Face directory; returns the lineage record (also in the directory)."""
    from trainer.checkpoint import read_marker
    from trainer.contract.layout import MARKER
    from trainer.model import GPT

    if not os.path.isfile(os.path.join(checkpoint_dir, MARKER)):
        raise ValueError(f"--checkpoint={checkpoint_dir!r} has no {MARKER}: not a complete checkpoint")
    cfg = cfg or checkpoint_config(checkpoint_dir)
    marker = read_marker(checkpoint_dir)
    model = load_model_from_checkpoint(checkpoint_dir, cfg)
    tmp = out_dir.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    if isinstance(model, GPT):
        hf_model, architecture = gpt_to_hf(model, marker.get("dataset_vocab_size") or _dataset_vocab_size(cfg)), \
            "GPT2LMHeadModel"
    else:
        hf_model, architecture = model.inner, type(model.inner).__name__
    hf_model.save_pretrained(tmp)  # safetensors (transformers >= 5 writes nothing else)
    tokenizer = _copy_tokenizer(cfg, tmp)
    lineage = {
        "format": EXPORT_FORMAT,
        "architecture": architecture,
        "checkpoint": os.path.abspath(checkpoint_dir),
        "step": marker["step"],
        "tokens_seen": marker.get("tokens_seen"),
        "config_hash": marker.get("config_hash"),
        "dataset_hash": marker.get("dataset_hash"),
        "mlflow_run_id": marker.get("mlflow_run_id"),
        "tokenizer": tokenizer,
        "torch_version": torch.__version__,
    }
    with open(os.path.join(tmp, LINEAGE_FILE), "w") as f:
        json.dump(lineage, f, indent=1)
    # Readers never see a half-written export: the directory appears whole or not at all.
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    log.info("exported %s (step %d) as %s to %s", checkpoint_dir, marker["step"], architecture, out_dir)
    return lineage


def _dataset_vocab_size(cfg: TrainerConfig) -> int | None:
    """The tokenizer's vocabulary from the dataset manifest, for checkpoints whose marker
    predates `dataset_vocab_size`; None when the data volume is not mounted here."""
    from trainer.data import read_manifest

    try:
        return int(read_manifest(cfg.data.dir)["vocab_size"]) if cfg.data.dir else None
    except (OSError, ValueError, KeyError):
        return None


def _copy_tokenizer(cfg: TrainerConfig, out_dir: str) -> str:
    from trainer.data import read_manifest

    try:
        name = read_manifest(cfg.data.dir)["tokenizer"] if cfg.data.dir else None
    except (OSError, ValueError, KeyError):  # the data volume need not be mounted where the export runs
        name = None
    if name and os.path.isdir(name):
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(name, local_files_only=True).save_pretrained(out_dir)
        return name
    # Byte-level data (prepare-data without --tokenizer-dir): token id = UTF-8 byte, 256 = end of text.
    return name or "unknown (dataset manifest not reachable)"


EXPORT_KEY_TAG = "trainer.export_key"


def export_key(lineage: dict[str, Any], run_id: str | None) -> str:
    """What makes a logged model and a registered version the same one: the run and the step
    it came from (without a run, the checkpoint directory, which names its step)."""
    return f"run={run_id}/step={lineage['step']}" if run_id else f"checkpoint={lineage['checkpoint']}"


def log_to_mlflow(export_dir: str, lineage: dict[str, Any], *, tracking_uri: str, run_id: str | None,
                  experiment: str, registered_model_name: str | None, client=None) -> dict[str, Any]:
    """Logs the directory as an MLflow LoggedModel of the run (MLflow 3 models API) with the
    run's lineage tags, and registers a version under `registered_model_name` if set.
    Returns {"model_id", "model_uri", "version"}.

    Idempotent, keyed by run and step (`export_key`, a tag on both): a second call for the same
    export (a retried attempt of a finished job, `python -m trainer export` rerun after a cut-off
    one) finds the logged model and the version it made and creates neither again. A logged
    model a kill left unfinished is marked FAILED and logged anew."""
    from mlflow.tracking import MlflowClient

    client = client or MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    run_tags: dict[str, str] = {}
    if run_id:
        run = client.get_run(run_id)
        experiment_id = run.info.experiment_id
        run_tags = run.data.tags
    else:
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    key = export_key(lineage, run_id)
    tags = {k: v for k, v in run_tags.items() if k in SYSTEM_TAGS or k in LINEAGE_TAGS}
    tags.update({"trainer.checkpoint": lineage["checkpoint"], "trainer.step": str(lineage["step"]),
                 "trainer.format": lineage["format"], "trainer.architecture": lineage["architecture"],
                 EXPORT_KEY_TAG: key})
    for key_name in ("config_hash", "dataset_hash"):
        if lineage.get(key_name):
            tags.setdefault(key_name, str(lineage[key_name]))
    name = registered_model_name or "model"
    model = _ready_logged_model(client, experiment_id, key)
    if model is None:
        model = client.create_logged_model(experiment_id, name=name, source_run_id=run_id, tags=tags,
                                           params={"step": str(lineage["step"])}, model_type="causal-lm")
        try:
            client.log_model_artifacts(model.model_id, export_dir)
        except Exception:
            client.finalize_logged_model(model.model_id, "FAILED")
            raise
        client.finalize_logged_model(model.model_id, "READY")
    else:
        log.info("model of %s already logged to MLflow as %s: not logged again", key, model.model_id)
    if run_id and not _run_lists_model(client, run_id, model.model_id):
        from mlflow.entities import LoggedModelOutput

        # As mlflow's own log_model does: the run lists the model among its outputs, at its step.
        client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=int(lineage["step"]))])
    result: dict[str, Any] = {"model_id": model.model_id, "model_uri": f"models:/{model.model_id}", "version": None}
    if registered_model_name:
        from mlflow.exceptions import MlflowException

        try:
            client.create_registered_model(registered_model_name)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        version = _registered_version(client, registered_model_name, key, run_id)
        if version is None:
            # Source is the logged model's artifact location rather than models:/<id>: MLflow's
            # registry stores resolve models:/<id> (and a model id without a run id) through the
            # process-global tracking URI, not this client's (TODO in mlflow 3.17
            # store/model_registry/sqlalchemy_store.py create_model_version).
            logged = client.get_logged_model(model.model_id)
            version = client.create_model_version(registered_model_name, source=logged.artifact_location,
                                                  run_id=run_id, tags=tags, model_id=model.model_id if run_id else None)
            log.info("registered %s version %s", registered_model_name, version.version)
        else:
            log.info("%s is already %s version %s: not registered again", key, registered_model_name, version.version)
        client.set_logged_model_tags(model.model_id, {"mlflow.modelVersions": json.dumps(
            [{"name": version.name, "version": version.version}])})
        result["version"] = version.version
    return result


def _ready_logged_model(client, experiment_id: str, key: str):
    """The READY logged model of this export, if any; unfinished ones (a kill during the upload)
    are marked FAILED, so they are never taken for it."""
    found = client.search_logged_models(experiment_ids=[experiment_id],
                                        filter_string=f"tags.`{EXPORT_KEY_TAG}` = '{_quoted(key)}'")
    ready = None
    for model in found:
        status = str(getattr(model.status, "name", model.status))
        if status.endswith("READY"):
            ready = ready or model
        elif status.endswith("PENDING"):
            client.finalize_logged_model(model.model_id, "FAILED")
    return ready


def _run_lists_model(client, run_id: str, model_id: str) -> bool:
    outputs = getattr(client.get_run(run_id), "outputs", None)
    return any(o.model_id == model_id for o in (getattr(outputs, "model_outputs", None) or []))


def _registered_version(client, name: str, key: str, run_id: str | None):
    query = f"name = '{_quoted(name)}'" + (f" and run_id = '{_quoted(run_id)}'" if run_id else "")
    for version in client.search_model_versions(query):
        if (version.tags or {}).get(EXPORT_KEY_TAG) == key:
            return version
    return None


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def export_and_log(checkpoint_dir: str, out_dir: str, cfg: TrainerConfig, run_id: str | None,
                   tracking_uri: str | None) -> dict[str, Any]:
    """The end-of-run export (rank 0): files always; MLflow when a URI and
    export.log_to_mlflow are set. An MLflow failure is logged, never fails the run (the files
    are on FSx and `python -m trainer export` can log them later)."""
    lineage = export_checkpoint(checkpoint_dir, out_dir, cfg)
    if not (tracking_uri and cfg.tracking.enabled and cfg.export.log_to_mlflow):
        return lineage
    try:
        lineage["mlflow"] = log_to_mlflow(out_dir, lineage, tracking_uri=tracking_uri, run_id=run_id,
                                          experiment=cfg.tracking.experiment,
                                          registered_model_name=cfg.export.registered_model_name)
    except Exception as exc:  # noqa: BLE001 - the model files are written; tracking is best effort here
        log.warning("exported model not logged to MLflow (%s); rerun `python -m trainer export --checkpoint %s "
                    "--out %s` when the server is reachable", str(exc).splitlines()[0][:200], checkpoint_dir, out_dir)
    return lineage


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m trainer export",
                                     description="Hugging Face export of a checkpoint, logged to MLflow")
    parser.add_argument("--checkpoint", required=True, help="a step-N directory with complete.json")
    parser.add_argument("--out", required=True, help="output directory (replaced atomically)")
    parser.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI"),
                        help="MLflow tracking URI (default: MLFLOW_TRACKING_URI; unset: files only)")
    parser.add_argument("--run-id", default=None,
                        help="MLflow run to attach the model to (default: MLFLOW_RUN_ID, else the checkpoint's run)")
    parser.add_argument("--registered-model-name", default=None, help="register a new version under this name")
    parser.add_argument("--experiment", default=None, help="experiment for a new run (default: tracking.experiment)")
    args = parser.parse_args(argv)
    from trainer.checkpoint import read_marker
    from trainer.contract.layout import MARKER
    from trainer.config import tracking_uri_problem

    problems = []
    if not os.path.isfile(os.path.join(args.checkpoint, MARKER)):
        problems.append(f"--checkpoint={args.checkpoint!r}: no {MARKER} there; pass a complete step-N directory")
    if args.tracking_uri and tracking_uri_problem(args.tracking_uri):
        problems.append(f"--tracking-uri={args.tracking_uri!r}: {tracking_uri_problem(args.tracking_uri)}")
    if problems:
        raise ConfigError(problems)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    cfg = checkpoint_config(args.checkpoint)
    lineage = export_checkpoint(args.checkpoint, args.out, cfg)
    if args.tracking_uri:
        run_id = args.run_id or os.environ.get("MLFLOW_RUN_ID") or read_marker(args.checkpoint).get("mlflow_run_id")
        lineage["mlflow"] = log_to_mlflow(args.out, lineage, tracking_uri=args.tracking_uri, run_id=run_id,
                                          experiment=args.experiment or cfg.tracking.experiment,
                                          registered_model_name=args.registered_model_name or cfg.export.registered_model_name)
    print(json.dumps(lineage, indent=1))
    return 0
