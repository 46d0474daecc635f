"""Typed trainer configuration: YAML file, then environment, then `key=value` overrides.

Every problem is collected and reported at once, so a job fails in one round trip
instead of one error per pod restart.
"""
from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

import yaml


@dataclass
class ModelConfig:
    kind: Literal["gpt", "hf"] = "gpt"
    # A named GPT size (see trainer.model_facts.GPT_SIZES); explicit fields below override it.
    size: str = "tiny"
    num_layers: Optional[int] = None
    num_heads: Optional[int] = None
    embed_dim: Optional[int] = None
    # None: taken from the dataset manifest so the embedding always covers every token.
    vocab_size: Optional[int] = None
    dropout: float = 0.0
    # Share the token embedding with the output projection (GPT-2); built-in GPT only.
    tie_embeddings: bool = True
    # Local directory of a Hugging Face causal LM (e.g. on FSx); never downloaded.
    hf_path: Optional[str] = None


@dataclass
class DataConfig:
    dir: Optional[str] = None
    seq_len: int = 128
    micro_batch_size: int = 8
    # Micro-batches read ahead by a background thread (0: read on the loop's thread).
    prefetch_batches: int = 2


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
    # Bound on start-up: connecting to the rendezvous store, creating the process groups and
    # every collective until this attempt's first step is done (compiles, loads, warm-up).
    # A peer that died or never came fails the survivors (exit 141, retryable) after this long
    # instead of torch's 10 minutes (torchtitan's comm.init_timeout_seconds is 300 too).
    init_timeout_seconds: float = 300.0
    # After the first step: a dead or stuck peer inside a collective (on GPU: NCCL's watchdog
    # aborts the rank) ends the attempt after this long (torchtitan's train_timeout_seconds: 100).
    collective_timeout_seconds: float = 100.0
    # After the first step: a rank that finishes no step (nor evaluation, nor save) for this
    # long ends itself (SIGKILL: retryable), after logging every thread's stack. Its peers give
    # up after collective_timeout_seconds, but a rank frozen outside a collective (a deadlock
    # in host code, a hung read) has nothing to time out and would keep its pod, and with it
    # the job's rendezvous, until maxRuntime.
    progress_timeout_seconds: float = 600.0


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
    # Retryable failures (exit 128-255 but 143) in a row without a new checkpoint before the
    # launcher refuses to start another attempt (exit 1). The Training Operator ignores
    # backoffLimit under restartPolicy ExitCode (see trainer/retries.py); 0 disables the bound.
    max_attempts_without_progress: int = 3
    # Start a new job from another job's checkpoint (torchtitan's initial_load_path): used only
    # while checkpoint.dir holds no checkpoint of its own. Weights, and the optimizer state
    # unless initial_load_model_only; step, schedule, data cursor, goodput and MLflow run start
    # fresh. (checkpoint.resume=<that path> instead continues that job's history.)
    initial_load_path: Optional[str] = None
    initial_load_model_only: bool = True


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
class EvaluationConfig:
    # Validation loss on the split `prepare-data` holds out (--val-fraction): every N steps
    # (0: only at the end) and at the end; never changes the training RNG or data cursor.
    every_steps: int = 0
    at_end: bool = True
    # Micro-batches per rank and evaluation (the same windows every time, so points compare).
    num_batches: int = 8


@dataclass
class ExportConfig:
    # A Hugging Face directory (safetensors + config.json) of the final model at the end of
    # a completed run; `python -m trainer export` does the same from any checkpoint.
    at_end: bool = True
    # Default: <checkpoint.dir>/export/step-N.
    dir: Optional[str] = None
    # Logged to MLflow as a model of the run when tracking is on.
    log_to_mlflow: bool = True
    # Also registered in the MLflow Model Registry under this name: one version per run and
    # step (a retried attempt of a finished job finds it and registers nothing again).
    registered_model_name: Optional[str] = None


@dataclass
class ProfilerConfig:
    # torch.profiler trace of steps [start_step, start_step + num_steps) (0: off), written
    # under <checkpoint.dir>/profile/ and logged to MLflow as an artifact.
    start_step: int = 0
    num_steps: int = 3
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False


@dataclass
class ReproducibilityConfig:
    # Bitwise-repeatable runs on one device type (trainer/reproducibility.py): deterministic
    # algorithms, cuBLAS workspace config, no cuDNN/inductor autotuning that varies. Slower;
    # for debugging and resume checks (torchtitan's `debug.deterministic`).
    deterministic: bool = False


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
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    reproducibility: ReproducibilityConfig = field(default_factory=ReproducibilityConfig)

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
        # Evaluation, export and profiling only observe the run (evaluation restores the RNG).
        # Deterministic mode picks other kernels for the same maths: a run may resume with it
        # switched on to check itself (and existing config hashes stay as they were).
        for volatile in ("checkpoint", "tracking", "evaluation", "export", "profiler", "reproducibility"):
            d.pop(volatile)
        d["data"].pop("dir")
        d["data"].pop("prefetch_batches")
        d["parallelism"].pop("init_timeout_seconds")  # how long to wait for peers, not the maths
        d["parallelism"].pop("collective_timeout_seconds")
        d["parallelism"].pop("progress_timeout_seconds")
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


class PlainScalar(str):
    """An unquoted YAML scalar, kept as its text until the field it lands in gives it a type.

    PyYAML implements YAML 1.1, where `off`, `no`, `on`, `y` are booleans and `3e-4` is a
    string: `checkpoint.async_mode=off` arrived as False and was refused. Typing by the target
    field instead means `off` is the string "off" for an enum, `3e-4` a float for a float, and
    `007` stays "007" for a string field.
    """


class _FieldTypedLoader(yaml.SafeLoader):
    pass


# Only null stays implicitly typed; every other plain scalar is text, typed by its field.
_FieldTypedLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag == "tag:yaml.org,2002:null"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _construct_str(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> str:
    text = loader.construct_scalar(node)
    # A quoted scalar is a string on purpose ("off" in quotes is never a boolean).
    return PlainScalar(text) if node.style is None else str(text)


_FieldTypedLoader.add_constructor("tag:yaml.org,2002:str", _construct_str)

_TRUE = ("true", "yes", "on")  # YAML 1.1 spellings still mean a boolean where a boolean is expected
_FALSE = ("false", "no", "off")


def yaml_load(text_or_stream) -> Any:
    return yaml.load(text_or_stream, Loader=_FieldTypedLoader)


def _parse_number(text: str) -> float | None:
    cleaned = text.strip().lower().replace("_", "")
    yaml_special = {".inf": math.inf, "+.inf": math.inf, "-.inf": -math.inf, ".nan": math.nan}
    if cleaned in yaml_special:
        return yaml_special[cleaned]
    try:
        return float(cleaned)
    except ValueError:
        return None


def _coerce(value: Any, annotation: Any, path: str, problems: list[str]) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    plain = isinstance(value, PlainScalar)
    if origin is typing.Union:  # Optional[X]
        if value is None:
            return None
        inner = [a for a in args if a is not type(None)][0]
        return _coerce(value, inner, path, problems)
    if origin is Literal:
        text = str(value) if plain else value
        if text not in args:
            problems.append(f"{path}={text!r}: must be one of {', '.join(map(repr, args))}")
        return text
    if annotation is bool:
        if plain and value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        if isinstance(value, bool):
            return value
        problems.append(f"{path}={str(value) if plain else value!r}: must be true or false")
        return value
    if annotation is int:
        if plain:
            try:
                return int(value.replace("_", ""))
            except ValueError:
                number = _parse_number(value)
                if number is not None and math.isfinite(number) and number == int(number):
                    return int(number)  # 1e6 steps
                problems.append(f"{path}={str(value)!r}: must be an integer")
                return value
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        problems.append(f"{path}={value!r}: must be an integer")
        return value
    if annotation is float:
        number = _parse_number(value) if plain else (
            float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None)
        if number is None:
            problems.append(f"{path}={str(value) if plain else value!r}: must be a number")
            return value
        if not math.isfinite(number):
            problems.append(f"{path}={str(value) if plain else value!r}: must be a finite number, not infinity or NaN")
        return number
    if annotation is str:
        if isinstance(value, str):
            return str(value)
        problems.append(f"{path}={value!r}: must be a string (quote it)")
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
        # Typed later by the field it sets: `lr=3e-4`, `compile=true`, `async_mode=off`,
        # `hf_path=null` mean what they look like.
        try:
            value = yaml_load(text) if text else ""
        except yaml.YAMLError as exc:
            problems.append(f"{item!r}: the value is not valid YAML ({str(exc).splitlines()[0]}); quote it")
            continue
        parsed.append((key.strip(), value))
    if problems:
        raise ConfigError(problems)
    return parsed


def build_config(
    path: str | None = None, overrides: list[str] | None = None, environ: dict[str, str] | None = None
) -> TrainerConfig:
    """The typed config of a file + environment + overrides, field checks only (no cross-field
    rules): what the job preflight reads before the pod's runtime settings exist."""
    environ = os.environ if environ is None else environ
    raw: dict[str, Any] = {}
    if path:
        raw = _read_config_file(path)
    for env_name, dotted in ENV_OVERRIDES.items():
        if environ.get(env_name):
            _set_dotted(raw, dotted, environ[env_name])
    for dotted, value in parse_overrides(overrides or []):
        _set_dotted(raw, dotted, value)
    problems: list[str] = []
    cfg = _build(TrainerConfig, raw, "", problems)
    problems += credential_redirect_problems(cfg, environ)
    if problems:
        raise ConfigError(problems)
    return cfg


def credential_redirect_problems(cfg: "TrainerConfig", environ) -> list[str]:
    """MLflow sends MLFLOW_TRACKING_USERNAME/PASSWORD (the team's login, from its Secret) to
    whatever tracking URI the run uses: with a login present, only the platform's URI (the
    Secret's MLFLOW_TRACKING_URI) is allowed, whatever a config file or an override says."""
    platform_uri = environ.get("MLFLOW_TRACKING_URI")
    has_login = environ.get("MLFLOW_TRACKING_USERNAME") or environ.get("MLFLOW_TRACKING_PASSWORD")
    if has_login and cfg is not None and cfg.tracking.uri and cfg.tracking.uri != platform_uri:
        return [f"tracking.uri={cfg.tracking.uri!r}: the team's MLflow login goes only to the platform's tracking server "
                f"(MLFLOW_TRACKING_URI={platform_uri!r}); remove tracking.uri from the config and overrides"]
    return []


def load_config(
    path: str | None = None, overrides: list[str] | None = None, environ: dict[str, str] | None = None
) -> TrainerConfig:
    cfg = build_config(path, overrides, environ)
    validate(cfg)
    return cfg


def _read_config_file(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            raw = yaml_load(f)
    except FileNotFoundError:
        raise ConfigError([f"--config={path!r}: file not found; pass the path of a YAML config such as "
                           "trainer/configs/tiny.yaml"]) from None
    except IsADirectoryError:
        raise ConfigError([f"--config={path!r}: is a directory; pass a YAML file"]) from None
    except OSError as exc:
        raise ConfigError([f"--config={path!r}: cannot be read ({exc.strerror}); check the path and permissions"]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError([f"--config={path!r}: not valid YAML{where} ({problem}); fix the syntax there"]) from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError([f"--config={path!r}: the config file must be a YAML mapping of sections "
                           f"(model:, data:, ...), not a {type(raw).__name__}"])
    return raw


def validate(cfg: TrainerConfig, *, device_checks: bool = True) -> None:
    """Cross-field checks; raises one ConfigError listing every problem with its fix.
    ``device_checks=False`` leaves out what only the pod's devices can answer (a CUDA device for
    nccl and bf16): a job spec's preflight on a laptop neither needs nor imports torch for them."""
    d, par = cfg.data, cfg.parallelism
    p = [*_model_problems(cfg.model), *_data_problems(d), *_optimizer_problems(cfg.optimizer),
         *_schedule_problems(cfg.schedule), *(_device_problems(par) if device_checks else []),
         *_checkpoint_problems(cfg.checkpoint), *_tracking_problems(cfg.tracking), *_timeout_problems(par),
         *_unmet((d.prefetch_batches >= 0,
                  f"data.prefetch_batches={d.prefetch_batches}: must be >= 0 (0 reads on the loop's thread)")),
         *_evaluation_export_profiler_problems(cfg.evaluation, cfg.export, cfg.profiler),
         # Programmatic configs skip the parser's finiteness check; floats are checked here too.
         *_nonfinite_problems((cfg.model, cfg.optimizer, cfg.schedule, cfg.checkpoint, cfg.tracking))]
    if p:
        raise ConfigError(p)


def _unmet(*checks: tuple[bool, str]) -> list[str]:
    """The message of each check that does not hold."""
    return [message for ok, message in checks if not ok]


def _model_problems(m: ModelConfig) -> list[str]:
    if m.kind == "hf":
        p = _unmet((bool(m.hf_path), "model.hf_path=None: model.kind=hf needs a local directory with a saved causal LM"))
        if m.hf_path:
            p += _unmet((os.path.isdir(m.hf_path),
                         f"model.hf_path={m.hf_path!r}: directory not found (models are never downloaded at run time)"))
    else:
        from trainer.model_facts import GPT_SIZES

        p = _unmet((m.size in GPT_SIZES, f"model.size={m.size!r}: choose one of {', '.join(GPT_SIZES)}"))
        heads = m.num_heads or GPT_SIZES.get(m.size, {}).get("num_heads")
        dim = m.embed_dim or GPT_SIZES.get(m.size, {}).get("embed_dim")
        if heads and dim:
            p += _unmet((dim % heads == 0, f"model.embed_dim={dim}: must be divisible by model.num_heads={heads}"))
    return p + _unmet((0.0 <= m.dropout < 1.0, f"model.dropout={m.dropout}: must be in [0, 1)"))


def _data_problems(d: DataConfig) -> list[str]:
    p = _unmet((d.dir is not None, "data.dir=None: set it to a directory written by `python -m trainer prepare-data`"))
    if d.dir is not None:
        p += _unmet((os.path.isfile(os.path.join(d.dir, "manifest.json")),
                     f"data.dir={d.dir!r}: no manifest.json there; run `python -m trainer prepare-data --output-dir {d.dir}`"))
    return p + _unmet((d.seq_len > 0, f"data.seq_len={d.seq_len}: must be > 0"),
                      (d.micro_batch_size > 0, f"data.micro_batch_size={d.micro_batch_size}: must be > 0"))


def _optimizer_problems(o: OptimizerConfig) -> list[str]:
    return _unmet(
        (o.lr > 0, f"optimizer.lr={o.lr}: must be > 0"),
        (o.weight_decay >= 0, f"optimizer.weight_decay={o.weight_decay}: must be >= 0"),
        (0 <= o.beta1 < 1 and 0 <= o.beta2 < 1, f"optimizer.beta1/beta2={o.beta1}/{o.beta2}: must be in [0, 1)"),
        (o.max_nonfinite_steps >= 1, f"optimizer.max_nonfinite_steps={o.max_nonfinite_steps}: must be >= 1"),
        (o.grad_clip_norm >= 0, f"optimizer.grad_clip_norm={o.grad_clip_norm}: must be >= 0 (0 disables clipping)"))


def _schedule_problems(s: ScheduleConfig) -> list[str]:
    return _unmet(
        (s.num_steps > 0, f"schedule.num_steps={s.num_steps}: must be > 0"),
        (0 <= s.warmup_steps <= s.num_steps,
         f"schedule.warmup_steps={s.warmup_steps}: must be in [0, schedule.num_steps={s.num_steps}]"),
        (0 <= s.min_lr_ratio <= 1, f"schedule.min_lr_ratio={s.min_lr_ratio}: must be in [0, 1]"),
        (s.grad_accum_steps >= 1, f"schedule.grad_accum_steps={s.grad_accum_steps}: must be >= 1"))


def _device_problems(par: ParallelismConfig) -> list[str]:
    """What only the pod's devices can answer: nccl and bf16 need CUDA."""
    p: list[str] = []
    if par.backend == "nccl":
        import torch

        p += _unmet((torch.cuda.is_available(), "parallelism.backend='nccl': no CUDA device here; use gloo or auto"))
    if par.mixed_precision == "bf16":
        import torch

        p += _unmet((torch.cuda.is_available(),
                     "parallelism.mixed_precision='bf16': bf16 autocast is for CUDA; use auto or fp32 on CPU"))
    return p


def _checkpoint_problems(c: CheckpointConfig) -> list[str]:
    p = _unmet(
        (c.dir is not None, "checkpoint.dir=None: set it (or TRAINER_CHECKPOINT_DIR) to the FSx mount, e.g. /fsx/checkpoints/JOB"),
        (c.every_steps > 0, f"checkpoint.every_steps={c.every_steps}: must be > 0"),
        (c.every_seconds >= 0, f"checkpoint.every_seconds={c.every_seconds}: must be >= 0 (0 disables)"),
        (c.keep_last >= 1, f"checkpoint.keep_last={c.keep_last}: must be >= 1"),
        (c.max_attempts_without_progress >= 0,
         f"checkpoint.max_attempts_without_progress={c.max_attempts_without_progress}: must be >= 0 (0: unbounded)"))
    if c.s3_uri is not None:
        p += _unmet((c.s3_uri.startswith("s3://") and len(c.s3_uri) > 5,
                     f"checkpoint.s3_uri={c.s3_uri!r}: must look like s3://bucket/prefix"))
    return p


def _tracking_problems(t: TrackingConfig) -> list[str]:
    p = _unmet((t.log_every_steps >= 1, f"tracking.log_every_steps={t.log_every_steps}: must be >= 1"))
    if t.peak_tflops is not None:
        p += _unmet((t.peak_tflops > 0, f"tracking.peak_tflops={t.peak_tflops}: must be > 0"))
    if t.uri:
        problem = tracking_uri_problem(t.uri)
        p += _unmet((problem is None, f"tracking.uri={t.uri!r} (or MLFLOW_TRACKING_URI): {problem}"))
    return p


def _timeout_problems(par: ParallelismConfig) -> list[str]:
    return _unmet(
        (par.init_timeout_seconds > 0, f"parallelism.init_timeout_seconds={par.init_timeout_seconds}: must be > 0"),
        (par.collective_timeout_seconds > 0,
         f"parallelism.collective_timeout_seconds={par.collective_timeout_seconds}: must be > 0"),
        (par.progress_timeout_seconds > par.collective_timeout_seconds,
         f"parallelism.progress_timeout_seconds={par.progress_timeout_seconds}: must exceed "
         f"parallelism.collective_timeout_seconds={par.collective_timeout_seconds} (a frozen peer must fail the "
         "others' collectives first)"))


def _evaluation_export_profiler_problems(e: EvaluationConfig, x: ExportConfig, pr: ProfilerConfig) -> list[str]:
    p = _unmet((e.every_steps >= 0, f"evaluation.every_steps={e.every_steps}: must be >= 0 (0: only at the end)"),
               (e.num_batches >= 1, f"evaluation.num_batches={e.num_batches}: must be >= 1"))
    if x.registered_model_name is not None:
        p += _unmet((bool(x.registered_model_name.strip()) and "/" not in x.registered_model_name
                     and ":" not in x.registered_model_name,
                     f"export.registered_model_name={x.registered_model_name!r}: must be a non-empty name without '/' or ':'"))
    return p + _unmet((pr.start_step >= 0, f"profiler.start_step={pr.start_step}: must be >= 0 (0 disables profiling)"),
                      (pr.num_steps >= 1, f"profiler.num_steps={pr.num_steps}: must be >= 1"))


def _nonfinite_problems(sections: tuple[Any, ...]) -> list[str]:
    return [f"{type(section).__name__}.{f.name}={getattr(section, f.name)}: must be a finite number"
            for section in sections for f in dataclasses.fields(section)
            if isinstance(getattr(section, f.name), float) and not math.isfinite(getattr(section, f.name))]


TRACKING_SCHEMES = ("http", "https", "file", "sqlite")


def tracking_uri_problem(uri: str) -> str | None:
    """MLflow would accept more (a bare path, databricks, postgresql); the trainer talks to a
    tracking server over http(s), or to a local file/sqlite store in tests and demos."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return ("has no scheme; use http(s)://host:port for the tracking server, or file:///path or "
                "sqlite:///path.db locally")
    if scheme.lower() not in TRACKING_SCHEMES:
        return f"scheme {scheme!r} is not supported; use one of {', '.join(s + '://' for s in TRACKING_SCHEMES)}"
    if scheme.lower() in ("http", "https") and not rest.split("/")[0]:
        return "has no host; use http(s)://host:port"
    if scheme.lower() in ("file", "sqlite") and not rest.strip("/"):
        return f"has no path; use {scheme}:///absolute/path"
    return None


def dump_yaml(cfg: TrainerConfig) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
