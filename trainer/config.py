"""Typed trainer configuration: YAML file, then environment, then `key=value` overrides.

Every problem is collected and reported at once, so a job fails in one round trip
instead of one error per pod restart.
"""
from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

import yaml


@dataclass
class ModelConfig:
    kind: Literal["gpt", "hf"] = "gpt"
    # A named GPT size (see trainer.model.GPT_SIZES); explicit fields below override it.
    size: str = "tiny"
    num_layers: Optional[int] = None
    num_heads: Optional[int] = None
    embed_dim: Optional[int] = None
    # None: taken from the dataset manifest so the embedding always covers every token.
    vocab_size: Optional[int] = None
    dropout: float = 0.0
    # Local directory of a Hugging Face causal LM (e.g. on FSx); never downloaded.
    hf_path: Optional[str] = None


@dataclass
class DataConfig:
    dir: Optional[str] = None
    seq_len: int = 128
    micro_batch_size: int = 8


@dataclass
class OptimizerConfig:
    lr: float = 6e-4
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    # 0 disables clipping.
    grad_clip_norm: float = 1.0
    # A step with a non-finite loss or gradient norm skips its update; this many in a row
    # stop the run (non-zero exit, nothing saved).
    max_nonfinite_steps: int = 5


@dataclass
class ScheduleConfig:
    num_steps: int = 100
    warmup_steps: int = 10
    # Floor of the cosine decay, as a fraction of optimizer.lr.
    min_lr_ratio: float = 0.1
    grad_accum_steps: int = 1


@dataclass
class ParallelismConfig:
    # auto: DDP when WORLD_SIZE > 1, a plain module otherwise.
    strategy: Literal["auto", "none", "ddp", "fsdp"] = "auto"
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    # auto: bf16 autocast on CUDA, fp32 on CPU.
    mixed_precision: Literal["auto", "bf16", "fp32"] = "auto"
    compile: bool = False
    activation_checkpointing: bool = False


@dataclass
class CheckpointConfig:
    dir: Optional[str] = None
    every_steps: int = 100
    # 0 disables time-based saves.
    every_seconds: float = 0.0
    keep_last: int = 3
    async_mode: Literal["off", "thread", "process"] = "off"
    # auto: newest complete checkpoint in dir (or S3); none: start fresh; else a step-N path.
    resume: str = "auto"
    s3_uri: Optional[str] = None


@dataclass
class TrackingConfig:
    # MLflow is used when enabled and a tracking URI is configured (here or MLFLOW_TRACKING_URI).
    enabled: bool = True
    uri: Optional[str] = None
    experiment: str = "trainer"
    run_name: Optional[str] = None
    # Stable identity of the job (TRAINER_RUN_ID): a restarted pod finds its MLflow run by it.
    job_id: Optional[str] = None
    log_every_steps: int = 10
    # Overrides the per-GPU peak table for MFU (bf16 dense TFLOP/s of one device).
    peak_tflops: Optional[float] = None


@dataclass
class TrainerConfig:
    seed: int = 1337
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def flat(self) -> dict[str, Any]:
        """Dotted keys, for MLflow params."""
        out = {}
        for section, values in self.to_dict().items():
            if isinstance(values, dict):
                out.update({f"{section}.{k}": v for k, v in values.items()})
            else:
                out[section] = values
        return out

    def hash(self) -> str:
        """Hash of what determines the training math; paths and tracking are left out
        so moving a checkpoint or renaming an experiment does not look like a new run."""
        d = self.to_dict()
        for volatile in ("checkpoint", "tracking"):
            d.pop(volatile)
        d["data"].pop("dir")
        d["model"].pop("hf_path")
        blob = json.dumps(d, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


# Environment the TrainingJob sets; applied after the file and before CLI overrides.
ENV_OVERRIDES = {
    "TRAINER_CHECKPOINT_DIR": "checkpoint.dir",
    "TRAINER_CHECKPOINT_S3_URI": "checkpoint.s3_uri",
    "TRAINER_RUN_ID": "tracking.job_id",
    "MLFLOW_EXPERIMENT_NAME": "tracking.experiment",
    "MLFLOW_TRACKING_URI": "tracking.uri",
}


class ConfigError(ValueError):
    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__(
            f"{len(problems)} problem(s) in the trainer config:\n" + "\n".join(f"  - {p}" for p in problems)
        )


def _coerce(value: Any, annotation: Any, path: str, problems: list[str]) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union:  # Optional[X]
        if value is None:
            return None
        inner = [a for a in args if a is not type(None)][0]
        return _coerce(value, inner, path, problems)
    if origin is Literal:
        if value not in args:
            problems.append(f"{path}={value!r}: must be one of {', '.join(map(repr, args))}")
        return value
    if annotation is bool:
        if isinstance(value, bool):
            return value
        problems.append(f"{path}={value!r}: must be true or false")
        return value
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        problems.append(f"{path}={value!r}: must be an integer")
        return value
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        problems.append(f"{path}={value!r}: must be a number")
        return value
    if annotation is str:
        if isinstance(value, str):
            return value
        problems.append(f"{path}={value!r}: must be a string")
        return value
    return value


def _build(cls: type, raw: dict[str, Any], prefix: str, problems: list[str]) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in raw.items():
        path = f"{prefix}{key}"
        if key not in hints:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f" (did you mean {prefix}{close[0]}?)" if close else f" (known: {', '.join(names)})"
            problems.append(f"{path}: unknown key{hint}")
            continue
        annotation = hints[key]
        if dataclasses.is_dataclass(annotation):
            if not isinstance(value, dict):
                problems.append(f"{path}={value!r}: must be a mapping of {annotation.__name__} fields")
                continue
            kwargs[key] = _build(annotation, value, f"{path}.", problems)
        else:
            kwargs[key] = _coerce(value, annotation, path, problems)
    return cls(**kwargs)


def _set_dotted(raw: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = raw
    for p in parents:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError([f"{dotted}: {p} is not a section"])
    node[leaf] = value


def parse_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    parsed, problems = [], []
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            problems.append(f"{item!r}: overrides are key=value with a dotted key, e.g. optimizer.lr=3e-4")
            continue
        # YAML typing so `lr=3e-4`, `compile=true` and `hf_path=null` mean what they look like.
        value = yaml.safe_load(text) if text else ""
        if isinstance(value, str) and _looks_like_float(value):
            value = float(value)
        parsed.append((key.strip(), value))
    if problems:
        raise ConfigError(problems)
    return parsed


def _looks_like_float(text: str) -> bool:
    # PyYAML (YAML 1.1) reads "3e-4" as a string; users mean a number.
    try:
        float(text)
        return text.strip().lower() not in ("nan", "inf", "-inf", "infinity")
    except ValueError:
        return False


def load_config(
    path: str | None = None, overrides: list[str] | None = None, environ: dict[str, str] | None = None
) -> TrainerConfig:
    environ = os.environ if environ is None else environ
    raw: dict[str, Any] = {}
    if path:
        with open(path) as f:
            raw = yaml.safe_load(f) or {}
        if not isinstance(raw, dict):
            raise ConfigError([f"{path}: the config file must be a YAML mapping"])
        _floatify(raw)
    for env_name, dotted in ENV_OVERRIDES.items():
        if environ.get(env_name):
            _set_dotted(raw, dotted, environ[env_name])
    for dotted, value in parse_overrides(overrides or []):
        _set_dotted(raw, dotted, value)
    problems: list[str] = []
    cfg = _build(TrainerConfig, raw, "", problems)
    if problems:
        raise ConfigError(problems)
    validate(cfg)
    return cfg


def _floatify(node: dict) -> None:
    for k, v in node.items():
        if isinstance(v, dict):
            _floatify(v)
        elif isinstance(v, str) and _looks_like_float(v):
            node[k] = float(v)


def validate(cfg: TrainerConfig) -> None:
    """Cross-field checks; raises one ConfigError listing every problem with its fix."""
    p: list[str] = []

    def need(ok: bool, msg: str) -> None:
        if not ok:
            p.append(msg)

    m, d, o, s, par, c, t = (cfg.model, cfg.data, cfg.optimizer, cfg.schedule, cfg.parallelism,
                             cfg.checkpoint, cfg.tracking)
    if m.kind == "hf":
        need(bool(m.hf_path), "model.hf_path=None: model.kind=hf needs a local directory with a saved causal LM")
        if m.hf_path:
            need(os.path.isdir(m.hf_path), f"model.hf_path={m.hf_path!r}: directory not found (models are never downloaded at run time)")
    else:
        from trainer.model import GPT_SIZES

        need(m.size in GPT_SIZES, f"model.size={m.size!r}: choose one of {', '.join(GPT_SIZES)}")
        heads = m.num_heads or GPT_SIZES.get(m.size, {}).get("num_heads")
        dim = m.embed_dim or GPT_SIZES.get(m.size, {}).get("embed_dim")
        if heads and dim:
            need(dim % heads == 0, f"model.embed_dim={dim}: must be divisible by model.num_heads={heads}")
    need(0.0 <= m.dropout < 1.0, f"model.dropout={m.dropout}: must be in [0, 1)")
    need(d.dir is not None, "data.dir=None: set it to a directory written by `python -m trainer prepare-data`")
    if d.dir is not None:
        need(os.path.isfile(os.path.join(d.dir, "manifest.json")),
             f"data.dir={d.dir!r}: no manifest.json there; run `python -m trainer prepare-data --output-dir {d.dir}`")
    need(d.seq_len > 0, f"data.seq_len={d.seq_len}: must be > 0")
    need(d.micro_batch_size > 0, f"data.micro_batch_size={d.micro_batch_size}: must be > 0")
    need(o.lr > 0, f"optimizer.lr={o.lr}: must be > 0")
    need(o.weight_decay >= 0, f"optimizer.weight_decay={o.weight_decay}: must be >= 0")
    need(0 <= o.beta1 < 1 and 0 <= o.beta2 < 1, f"optimizer.beta1/beta2={o.beta1}/{o.beta2}: must be in [0, 1)")
    need(o.max_nonfinite_steps >= 1, f"optimizer.max_nonfinite_steps={o.max_nonfinite_steps}: must be >= 1")
    need(o.grad_clip_norm >= 0, f"optimizer.grad_clip_norm={o.grad_clip_norm}: must be >= 0 (0 disables clipping)")
    need(s.num_steps > 0, f"schedule.num_steps={s.num_steps}: must be > 0")
    need(0 <= s.warmup_steps <= s.num_steps, f"schedule.warmup_steps={s.warmup_steps}: must be in [0, schedule.num_steps={s.num_steps}]")
    need(0 <= s.min_lr_ratio <= 1, f"schedule.min_lr_ratio={s.min_lr_ratio}: must be in [0, 1]")
    need(s.grad_accum_steps >= 1, f"schedule.grad_accum_steps={s.grad_accum_steps}: must be >= 1")
    if par.backend == "nccl":
        import torch

        need(torch.cuda.is_available(), "parallelism.backend='nccl': no CUDA device here; use gloo or auto")
    if par.mixed_precision == "bf16":
        import torch

        need(torch.cuda.is_available(), "parallelism.mixed_precision='bf16': bf16 autocast is for CUDA; use auto or fp32 on CPU")
    need(c.dir is not None, "checkpoint.dir=None: set it (or TRAINER_CHECKPOINT_DIR) to the FSx mount, e.g. /fsx/checkpoints/JOB")
    need(c.every_steps > 0, f"checkpoint.every_steps={c.every_steps}: must be > 0")
    need(c.every_seconds >= 0, f"checkpoint.every_seconds={c.every_seconds}: must be >= 0 (0 disables)")
    need(c.keep_last >= 1, f"checkpoint.keep_last={c.keep_last}: must be >= 1")
    if c.s3_uri is not None:
        need(c.s3_uri.startswith("s3://") and len(c.s3_uri) > 5, f"checkpoint.s3_uri={c.s3_uri!r}: must look like s3://bucket/prefix")
    need(t.log_every_steps >= 1, f"tracking.log_every_steps={t.log_every_steps}: must be >= 1")
    if t.peak_tflops is not None:
        need(t.peak_tflops > 0, f"tracking.peak_tflops={t.peak_tflops}: must be > 0")
    if p:
        raise ConfigError(p)


def dump_yaml(cfg: TrainerConfig) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
