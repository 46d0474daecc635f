"""The training job spec an ML engineer writes (YAML), as one typed, validated model.

    name: gpt2-pretrain
    team: foundation-models
    image: 111122223333.dkr.ecr.us-west-2.amazonaws.com/mlp-prod/trainer:1.4.0
    trainer: {config: trainer/configs/gpt2-124m.yaml, overrides: [optimizer.lr=6e-4]}
    nodes: 2
    gpusPerNode: 8
    gpuType: h100            # or pool: h100
    spot: true
    dataset: /fsx/datasets/fineweb-edu/v1
    priority: production
    maxRuntime: 72h

Every mistake is reported at once, each with the field, the value and the fix
(``JobSpecError``); nothing is rendered from a spec that has any.
"""
from __future__ import annotations

import difflib
import re
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from trainer.contract.layout import step_dir_name
from workloads.tenancy import DEV_POD_PREFIX
from workloads.fsx import DATASETS_DIR, FSX_MOUNT_PATH, team_subtree_path
from workloads.problems import InvalidInputError, Problem
from workloads.scheduling import Priority, team_namespace

_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Pod names are <name>-worker-<index> and Services <name>-master-0: keep the name short enough
# that both stay within the 63-character DNS label limit.
MAX_NAME_LENGTH = 40
RESERVED_NAME_PREFIX = DEV_POD_PREFIX
_DURATION = re.compile(r"^(\d+h)?(\d+m)?(\d+s)?$")
# A checkpoint of one of the team's jobs (the job name rule above, a trainer step directory).
_INIT_FROM = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?/step-\d{1,9}$")
_OVERRIDE = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)+=.*$")
# Trainer configs a job may name: the repository's (and the image's, at /app/trainer/configs).
TRAINER_CONFIGS_DIR = "trainer/configs"
# Set by the platform from the job spec (or fixed by it): never from a trainer override.
PLATFORM_OWNED_OVERRIDES = ("data.dir", "checkpoint.dir", "checkpoint.s3_uri", "tracking.job_id", "tracking.uri",
                            "tracking.experiment", "checkpoint.initial_load_path")

# An image reference, by the grammar of distribution/reference (v0.5.0 reference.go):
#   reference := name [ ":" tag ] [ "@" digest ];  name := [domain '/'] remote-name
#   domain := host [':' port-number];  domain-component := /([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])/
#   path-component := alpha-numeric [separator alpha-numeric]*;  alpha-numeric := /[a-z0-9]+/
#   separator := /[_.]|__|[-]*/;  tag := /[\w][\w.-]{0,127}/
#   digest := digest-algorithm ":" digest-hex;  digest-hex := /[0-9a-fA-F]{32,}/
# (IPv6 hosts are left out: no registry of this platform uses one.)
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[_.]|__|-+)[a-z0-9]+)*"
_IMAGE_REFERENCE = re.compile(
    rf"^(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}))?$")


class ImageReference(NamedTuple):
    registry: Optional[str]
    repository: str
    tag: Optional[str]
    digest: Optional[str]


def parse_image_reference(value: str) -> ImageReference:
    """The parts of an image reference; ValueError for anything that is not one. As the
    reference library does, the first component is a registry only if it has '.' or ':' or
    is 'localhost'."""
    match = _IMAGE_REFERENCE.match(value or "")
    if not match:
        raise ValueError(value)
    domain, path = match.group("domain"), match.group("path")
    if domain and not ("." in domain or ":" in domain or domain == "localhost"):
        if domain != domain.lower() or not re.fullmatch(_PATH_COMPONENT, domain):
            raise ValueError(value)
        domain, path = None, f"{domain}/{path}"
    if len(path) > 255:
        raise ValueError(value)
    return ImageReference(domain, path, match.group("tag"), match.group("digest"))


def k8s_literal(value: str) -> str:
    """A string the kubelet passes through unchanged in a container's command, args or env.
    The kubelet expands `$(VAR)` there, even a Secret's variable, and reduces `$$` to `$`
    (core/v1 Container.args: "Double $$ are reduced to a single $, which allows for escaping
    the $(VAR_NAME) syntax"); doubling every `$` leaves nothing to expand."""
    return value.replace("$", "$$")


def trainer_value(text: str) -> str:
    """A spec string as the value of a ``key=value`` trainer override that the trainer reads back
    verbatim. The trainer parses each value as YAML (trainer/config.py parse_overrides): a run
    name ``gpt2 #1`` would lose `` #1`` (a comment), ``a: b`` would become a mapping, ``'x'`` lose
    its quotes. Text that YAML reads back as itself is kept; anything else is single-quoted
    (YAML 1.1 §7.3.2: a single-quoted scalar is literal but for ``''``)."""
    try:
        if isinstance(yaml.safe_load(text), str) and yaml.safe_load(text) == text:
            return text
    except yaml.YAMLError:
        pass
    return "'" + text.replace("'", "''") + "'"


def team_writable_roots(namespace: str) -> tuple[str, ...]:
    """Where a team's jobs may write on FSx: its own subtree, the only read-write volume its pods
    mount (workloads.fsx), exported to its prefix of the checkpoints bucket. Its pipelines' work
    directories live inside it (workloads.pipeline.team_work_root)."""
    return (team_subtree_path(namespace),)


def team_readable_roots(namespace: str) -> tuple[str, ...]:
    """What a team's jobs may read: its own space and the shared, read-only datasets."""
    return (f"{FSX_MOUNT_PATH}/{DATASETS_DIR}", *team_writable_roots(namespace))


def path_within(path: str, roots: tuple[str, ...]) -> bool:
    if not path.startswith("/") or ".." in path.split("/") or "//" in path:
        return False
    return any(path == root or path.startswith(root + "/") for root in roots)


def experiment_name(namespace: str, experiment: Optional[str], job_name: str) -> str:
    """The MLflow experiment a job logs to: always under the team's prefix `<namespace>/`,
    the only names its MLflow login may create (docker/mlflow/mlflow_team_auth.py)."""
    name = experiment or job_name
    return name if name.startswith(namespace + "/") else f"{namespace}/{name}"


def registered_model_prefix(namespace: str) -> str:
    """MLflow model names cannot contain '/' (mlflow.utils.validation._validate_model_name)."""
    return f"{namespace}."


class JobSpecError(InvalidInputError):
    """Every problem of one job spec, one per line."""


class Runtime(str, Enum):
    PYTORCHJOB = "pytorchjob"  # kubeflow.org/v1 PyTorchJob (Training Operator 1.9)
    TRAINJOB = "trainjob"  # trainer.kubeflow.org/v1alpha1 TrainJob (Trainer 2.3, torch-distributed runtime)


# The durations a job can have. maxRuntime becomes activeDeadlineSeconds: under MIN_RUNTIME a
# job is killed while its nodes launch and its image pulls (minutes on a GPU node); over
# MAX_RUNTIME it is a service, not a training job, and holds its quota for a month. ttlAfterFinished
# becomes runPolicy.ttlSecondsAfterFinished, an int32 (format: int32 in the pinned PyTorchJob CRD,
# training-operator v1.9.4), so above 2^31-1 s the API server refuses the whole job.
MIN_RUNTIME_SECONDS = 10 * 60
MAX_RUNTIME_SECONDS = 30 * 24 * 3600
MAX_TTL_SECONDS = 2**31 - 1
DURATION_BOUNDS = {
    "max_runtime": (MIN_RUNTIME_SECONDS, MAX_RUNTIME_SECONDS, "a job needs minutes to start, and runs at most 30 days"),
    "ttl_after_finished": (60, MAX_TTL_SECONDS, "ttlSecondsAfterFinished is an int32 of seconds"),
}


def _human(seconds: int) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"


def duration_seconds(text: str) -> int:
    match = _DURATION.match(text or "")
    if not text or not match:
        raise ValueError(text)
    units = {"h": 3600, "m": 60, "s": 1}
    return sum(int(part[:-1]) * units[part[-1]] for part in match.groups() if part)


_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _base_type(annotation: Any) -> Any:
    """int for Optional[int], list[str] stays list[str]."""
    args = [a for a in getattr(annotation, "__args__", ()) if a is not type(None)]
    if getattr(annotation, "__origin__", None) is Union and len(args) == 1:
        return args[0]
    return annotation


def _scalar_problem(value: Any, base: Any) -> Optional[str]:
    """Why a YAML scalar cannot be what the field is: YAML 1.1 (PyYAML) reads unquoted
    yes/no/on/off/true/false as booleans and 1:30 as the base-60 number 90; a control
    character (a newline, NUL) cannot reach the trainer as one argument verbatim."""
    if isinstance(value, bool) and base in (int, float):
        return (f"is the YAML boolean {str(value).lower()} (YAML 1.1 reads yes/no/on/off as booleans), not a number. "
                "FIX: write the number, e.g. 1")
    if isinstance(value, bool) and base is str:
        return (f"is the YAML boolean {str(value).lower()} (YAML 1.1 reads unquoted yes/no/on/off as booleans), not text. "
                'FIX: quote it, e.g. "no"')
    if isinstance(value, str) and base is str and (m := _CONTROL.search(value)):
        return (f"contains the control character {m.group()!r} at position {m.start()}: it cannot reach the pod as one "
                "argument or variable verbatim. FIX: remove it (one line, printable characters)")
    return None


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)

    @field_validator("*", mode="before")
    @classmethod
    def _yaml_scalars(cls, value: Any, info: Any) -> Any:
        base = _base_type(cls.model_fields[info.field_name].annotation)
        if getattr(base, "__origin__", None) is list and _base_type(base.__args__[0]) is str and isinstance(value, list):
            for index, item in enumerate(value):
                if (problem := _scalar_problem(item, str)) is not None:
                    raise ValueError(f"[{index}] {problem}")
            return value
        problem = _scalar_problem(value, base)
        if problem is not None:
            raise ValueError(problem)
        return value


class TrainerSpec(_Model):
    config: str = Field(description="Trainer config file, relative to the image's /app (and to the repository root locally).")
    overrides: list[str] = Field(default_factory=list, description="Dotted key=value overrides, e.g. optimizer.lr=3e-4.")

    @field_validator("config")
    @classmethod
    def _config_in_repository(cls, value: str) -> str:
        # The pod runs `--config <path>` from the image's /app; preflight reads the same path of
        # this checkout: only the repository's trainer configs are both.
        parts = value.split("/")
        if (value.startswith("/") or ".." in parts or "" in parts or "\\" in value
                or not value.startswith(TRAINER_CONFIGS_DIR + "/") or not value.endswith((".yaml", ".yml"))):
            raise ValueError(f"is not a trainer config of the repository. FIX: use a YAML file under "
                             f"{TRAINER_CONFIGS_DIR}/ (relative, no '..'), e.g. {TRAINER_CONFIGS_DIR}/gpt2-124m.yaml")
        return value

    @field_validator("overrides", mode="before")
    @classmethod
    def _mapping_to_list(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return [f"{k}={_yaml_scalar(v)}" for k, v in value.items()]
        return value

    @field_validator("overrides")
    @classmethod
    def _overrides(cls, value: list[str]) -> list[str]:
        messages, fixes = [], []
        bad = [o for o in value if not _OVERRIDE.match(o)]
        if bad:
            messages.append(f"{bad} are not dotted key=value overrides")
            fixes.append("write them like optimizer.lr=3e-4")
        owned = [o for o in value if o.split("=", 1)[0] in PLATFORM_OWNED_OVERRIDES]
        if owned:
            messages.append(f"{owned} are set by the platform from the job spec (the tracking server is the "
                            "platform's: the team's MLflow login is sent nowhere else)")
            fixes.append("use dataset / checkpointDir / s3Mirror / experiment / initFrom instead")
        if messages:
            raise ValueError(f"{'; '.join(messages)}. FIX: {'; '.join(fixes)}")
        return value


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


class ModelSpec(_Model):
    """Only for preflight: the model's size when the trainer config cannot tell (HF models)."""

    parameters: float = Field(gt=0, description="Trainable parameters, e.g. 8e9.")
    num_layers: Optional[int] = Field(None, ge=1)
    hidden_size: Optional[int] = Field(None, ge=1)
    # The tokenizer's vocabulary: the output head writes tokens x vocabulary logits, so Llama 3's
    # 128,256 (its config.json "vocab_size") costs 2.5x GPT-2's padded 50,304.
    vocab_size: Optional[int] = Field(None, ge=1, description="The model's vocabulary (its tokenizer's; "
                                      "config.json vocab_size), e.g. 128256 for Llama 3.")


class TimeBudgetSpec(_Model):
    """How long the trainer needs between SIGTERM and a clean exit (see docs/trainer.md)."""

    max_step_seconds: int = Field(10, ge=1, le=60, description="Longest training step: the signal is acted on at a step boundary.")
    checkpoint_seconds: int = Field(45, ge=1, le=3600, description="Time to save one checkpoint (measure it: checkpoint_seconds metric).")


# -- own code (issue 22 item 1) ----------------------------------------------------------------
# The platform's launcher owns torchrun: the user gives what torchrun runs, never torchrun itself.
_PLATFORM_LAUNCHERS = ("torchrun", "python -m torch.distributed.run", "accelerate", "deepspeed", "trainer.launch")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_S3_URI = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(?P<key>[A-Za-z0-9!_.*'()/-]+)$")


class CodeSpec(_Model):
    """A code archive in the team's S3 prefix, pinned by its SHA-256 (written by `submit --code DIR`).
    The launcher downloads it, refuses it unless the digest matches, and runs the command in it."""

    uri: str = Field(description="s3://<checkpoints bucket>/team-<team>/code/<name>/<sha256>.tar.gz")
    sha256: str = Field(description="SHA-256 of the archive, 64 lowercase hex digits.")

    @field_validator("uri")
    @classmethod
    def _uri(cls, value: str) -> str:
        if not _S3_URI.match(value or ""):
            raise ValueError("is not an s3://bucket/key URI. FIX: let `submit --code DIR` upload and pin it")
        return value

    @field_validator("sha256")
    @classmethod
    def _sha256(cls, value: str) -> str:
        if not _SHA256.match(value or ""):
            raise ValueError("is not a SHA-256 digest (64 lowercase hex digits). FIX: let `submit --code DIR` pin it")
        return value


def own_code_problems(raw: Any) -> list[tuple[str, Any, str, str]]:
    """(field, value, message, fix) for the own-code fields of a parsed spec's raw mapping."""
    out = []
    given = [k for k in ("trainer", "command", "script") if raw.get(k) is not None]
    if len(given) != 1:
        out.append(("trainer/command/script", given or None, "give exactly one of trainer (the built-in trainer), "
                    "command or script (your own code)", "e.g. script: train.py with args: [...], or trainer: {config: ...}"))
    if raw.get("args") and raw.get("script") is None:
        out.append(("args", raw.get("args"), "are the arguments of script", "give script:, or put them in command"))
    if raw.get("code") is not None and raw.get("trainer") is not None:
        out.append(("code", raw.get("code"), "is your own code's archive; the built-in trainer runs from the image",
                    "remove code, or give command/script"))
    return out


class PodResourcesSpec(_Model):
    """Overrides of the pod's size; by default it is the GPUs' share of the smallest instance of
    the pool that fits (workloads/nodefit.py). A larger request makes Karpenter launch a larger
    (dearer) instance; preflight names it and its price."""

    cpu_per_gpu: Optional[float] = Field(None, gt=0, le=96, description="vCPUs per GPU, e.g. 8.")
    memory_gib_per_gpu: Optional[float] = Field(None, gt=0, le=1024, description="GiB of memory per GPU, e.g. 60.")
    shm_gib: Optional[int] = Field(None, ge=1, le=512, description="/dev/shm in GiB (counts against the pod's memory).")


class JobSpec(_Model):
    name: str = Field(description="Job name (DNS label, at most 40 characters).")
    team: str = Field(description="Team; the job runs in namespace team-<team>.")
    image: str = Field(description="Trainer image, tag or digest (digest in prod).")
    trainer: Optional[TrainerSpec] = Field(None, description="The built-in trainer (or command / script: your own code).")
    command: Optional[list[str]] = Field(None, description="Your own code: what torchrun runs on every rank, e.g. "
                                         "[python, -m, mypkg.train, --lr, '3e-4'] (the platform's launcher runs torchrun).")
    script: Optional[str] = Field(None, description="Your own code: a Python file, relative to the code root (the "
                                  "archive of --code, else the image's /app).")
    args: list[str] = Field(default_factory=list, description="Arguments of script.")
    code: Optional[CodeSpec] = Field(None, description="The code archive (set by submit --code DIR); without it the "
                                     "code is in the image.")
    nodes: int = Field(ge=1, le=128)
    gpus_per_node: int = Field(ge=1, le=16)
    pool: Optional[str] = Field(None, description="GPU pool name; or give gpuType.")
    gpu_type: Optional[str] = Field(None, description="GPU type (h100, a100...); the pool offering it is chosen.")
    spot: bool = Field(True, description="May run on spot capacity (interruptible, resumed from checkpoints).")
    dataset: str = Field(description=f"Token shards on FSx, under {FSX_MOUNT_PATH}.")
    checkpoint_dir: Optional[str] = Field(None, description=f"Default {FSX_MOUNT_PATH}/checkpoints/team-<team>/<name>.")
    s3_mirror: Optional[bool] = Field(None, description=(
        "Also mirror complete checkpoints to the team's prefix of the checkpoints bucket. Default: on where checkpoints "
        "live on EFS (datasets storage s3-mountpoint: nothing else makes them readable from outside the cluster), off "
        "on FSx for Lustre (its /checkpoints association exports them)."))
    run_name: Optional[str] = None
    experiment: Optional[str] = Field(None, description="MLflow experiment, created under the team's prefix "
                                      "<namespace>/ (default: <namespace>/<name>).")
    priority: Optional[Priority] = Field(None, description="production | research | default; default: the team's.")
    max_runtime: str = Field("24h", description="Wall-clock limit of the whole job (activeDeadlineSeconds), e.g. 72h.")
    backoff_limit: int = Field(20, ge=0, le=1000, description=("runPolicy.backoffLimit. The Training Operator does not enforce it under restartPolicy ExitCode "
                                                                    "(kubeflow/trainer#2045); the trainer's bound is checkpoint.max_attempts_without_progress "
                                                                    "in trainer.overrides (default 3)."))
    ttl_after_finished: str = Field("168h", description="How long a finished job's objects stay (ttlSecondsAfterFinished).")
    runtime: Runtime = Field(Runtime.PYTORCHJOB, description="pytorchjob | trainjob.")
    model: Optional[ModelSpec] = None
    time_budget: TimeBudgetSpec = Field(default_factory=TimeBudgetSpec)
    init_from: Optional[str] = Field(None, description="Fine-tune from another job of the team: <job>/step-N, loaded as "
                                     "the trainer's initial weights (checkpoint.initial_load_path), not resumed.")
    # GPU sharing (workloads.gpu_sharing): ``gpu: {type: a100, slice: 1g.10gb}`` asks for one MIG
    # slice; ``shared: true`` for one time-slice of a shared pool's GPU. One pod, one device.
    slice: Optional[str] = Field(None, pattern=r"^[0-9]+g\.[0-9]+gb$",
                                 description="MIG profile of one slice, e.g. 1g.10gb (or gpu: {type, slice}); nodes 1, gpusPerNode 1.")
    shared: bool = Field(False, description="One time-slice of a shared GPU (nvidia.com/gpu.shared); nodes 1, gpusPerNode 1.")

    @model_validator(mode="before")
    @classmethod
    def _gpu_mapping(cls, raw: Any) -> Any:
        """``gpu: {type: a100, slice: 1g.10gb}`` is gpuType + slice."""
        if isinstance(raw, dict) and isinstance(raw.get("gpu"), dict):
            raw = dict(raw)
            gpu = dict(raw.pop("gpu"))
            if "type" in gpu:
                raw["gpuType"] = gpu.pop("type")
            if "slice" in gpu:
                raw["slice"] = gpu.pop("slice")
            if gpu:
                raw["gpu"] = gpu  # what is left is reported as unknown
        return raw


    resources: Optional[PodResourcesSpec] = Field(None, description="Pod size overrides (default: sized from the "
                                                  "smallest instance of the pool that fits).")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _DNS_1035.match(value) or len(value) > MAX_NAME_LENGTH:
            raise ValueError(f"is not a DNS label of at most {MAX_NAME_LENGTH} characters. "
                             "FIX: use lowercase letters, digits and '-', starting with a letter")
        if value.startswith(RESERVED_NAME_PREFIX):
            raise ValueError(f"starts with {RESERVED_NAME_PREFIX}, which names interactive dev pods (the only pods a "
                             "team may port-forward to). FIX: name the job otherwise")
        return value

    @field_validator("team")
    @classmethod
    def _team(cls, value: str) -> str:
        if not _DNS_1035.match(value):
            raise ValueError("is not a team name. FIX: use the team's name from the stack's scheduling.teams")
        return value

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        try:
            reference = parse_image_reference(value)
        except ValueError:
            raise ValueError("is not an image reference (registry/repository:tag or @digest; lowercase repository, "
                             "no spaces, quotes, '$' or options). FIX: e.g. REPO/trainer:1.4.0 or "
                             "REPO/trainer@sha256:<64 hex>") from None
        if reference.tag is None and reference.digest is None:
            raise ValueError("has no tag or digest. FIX: pin it, e.g. REPO/trainer:1.4.0 or REPO/trainer@sha256:...")
        if reference.tag == "latest" and reference.digest is None:
            raise ValueError("uses :latest, which changes under a running job. FIX: pin a tag or a digest")
        return value

    @field_validator("dataset", "checkpoint_dir")
    @classmethod
    def _on_fsx(cls, value: Optional[str]) -> Optional[str]:
        if value is None:
            return value
        if not value.startswith(FSX_MOUNT_PATH + "/") or ".." in value.split("/"):
            raise ValueError(f"is not a path on the FSx mount. FIX: use an absolute path under {FSX_MOUNT_PATH}/")
        return value.rstrip("/")

    @field_validator("max_runtime", "ttl_after_finished", mode="before")
    @classmethod
    def _duration_text(cls, value: Any) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            raise ValueError(f"is the number {value}, not a duration (YAML 1.1 reads 1:30 as 90, base 60). "
                             "FIX: write the duration with its units, e.g. 1h30m or 72h")
        return value

    @field_validator("max_runtime", "ttl_after_finished")
    @classmethod
    def _duration(cls, value: str, info: Any) -> str:
        try:
            seconds = duration_seconds(value)
            if seconds <= 0:
                raise ValueError(value)
        except ValueError:
            raise ValueError("is not a duration. FIX: write hours/minutes/seconds, e.g. 72h or 1h30m") from None
        low, high, why = DURATION_BOUNDS[info.field_name]
        if not low <= seconds <= high:
            raise ValueError(f"is {seconds:,} s, outside {_human(low)}..{_human(high)} ({why}). "
                             f"FIX: a duration between {_human(low)} and {_human(high)}")
        return value

    @field_validator("init_from")
    @classmethod
    def _init_from(cls, value: Optional[str]) -> Optional[str]:
        if value is None:
            return value
        if _INIT_FROM.match(value):
            return value
        if value.count("/") >= 2 or value.startswith(("/", "s3:")):
            raise ValueError("names a path or another namespace: initFrom takes a checkpoint of your own team's jobs "
                             "(another team's checkpoints are not readable by your pods). FIX: write <job>/step-N")
        raise ValueError("is not <job>/step-N. FIX: e.g. initFrom: gpt2-pretrain/step-2000 (list them: "
                         "python -m workloads checkpoints JOB --team TEAM --stack STACK)")

    @model_validator(mode="after")
    def _init_from_other_job(self) -> "JobSpec":
        if self.init_from and self.trainer is None:
            raise ValueError(f"initFrom ({self.init_from}) is the built-in trainer's initial load; your own code "
                             "loads what it likes. FIX: remove initFrom and read the checkpoint in your script "
                             "(trainer.contract.job() names the checkpoint root)")
        if self.init_from and self.init_from.split("/", 1)[0] == self.name:
            raise ValueError(f"names this job's own checkpoint ({self.init_from}): a job resumes its own "
                             "checkpoints by itself. FIX: remove initFrom, or give the new job another name")
        return self

    @field_validator("command")
    @classmethod
    def _command(cls, value: Optional[list[str]]) -> Optional[list[str]]:
        if value is None:
            return value
        if not value or any(not isinstance(a, str) or not a for a in value):
            raise ValueError("is not a list of non-empty strings. FIX: e.g. [python, train.py, --lr, '3e-4']")
        head = " ".join(value[:4])
        for launcher in _PLATFORM_LAUNCHERS:
            if head == launcher or head.startswith(launcher + " ") or value[0].endswith("/" + launcher.split()[0]):
                raise ValueError(f"starts {launcher!r}: the platform's launcher runs torchrun itself (rendezvous, "
                                 "time budget, exit codes). FIX: give what torchrun should run, e.g. [python, train.py, ...]")
        if value[0] in ("python", "python3") and (len(value) < 2 or (value[1] != "-m" and not value[1].endswith(".py"))):
            raise ValueError("runs python without a script or module. FIX: [python, train.py, ...] or [python, -m, pkg.train, ...]")
        return value

    @field_validator("script")
    @classmethod
    def _script(cls, value: Optional[str]) -> Optional[str]:
        if value is None:
            return value
        if value.startswith("/") or ".." in value.split("/") or not value.endswith(".py") or "$" in value:
            raise ValueError("is not a .py path relative to the code root. FIX: e.g. script: train.py")
        return value

    @model_validator(mode="after")
    def _one_entrypoint(self) -> "JobSpec":
        problems = own_code_problems({"trainer": self.trainer, "command": self.command, "script": self.script,
                                      "args": self.args, "code": self.code})
        if problems:
            path, _, message, fix = problems[0]
            raise ValueError(f"{path}: {message}. FIX: {fix}")
        return self

    @property
    def own_code(self) -> bool:
        """Your own code (command / script) rather than the built-in trainer."""
        return self.trainer is None

    @model_validator(mode="after")
    def _pool_or_type(self) -> "JobSpec":
        if (self.pool is None) == (self.gpu_type is None):
            raise ValueError("give exactly one of pool and gpuType. FIX: e.g. gpuType: h100, or pool: h100")
        return self

    @model_validator(mode="after")
    def _one_slice_one_pod(self) -> "JobSpec":
        if self.slice and self.shared:
            raise ValueError("give either gpu.slice (a MIG slice) or shared: true (a time-slice), not both. "
                             "FIX: keep the one the pool offers")
        if (self.slice or self.shared) and (self.nodes != 1 or self.gpus_per_node != 1):
            raise ValueError(f"a GPU slice is one device for one pod: nodes {self.nodes} and gpusPerNode {self.gpus_per_node} "
                             "cannot share a GPU (multi-node and multi-GPU jobs take whole GPUs). "
                             "FIX: set nodes: 1 and gpusPerNode: 1, or drop slice/shared")
        return self

    # -- derived -------------------------------------------------------------------------
    @property
    def namespace(self) -> str:
        return team_namespace(self.team)

    @property
    def experiment_name(self) -> str:
        return experiment_name(self.namespace, self.experiment, self.name)

    @property
    def checkpoint_path(self) -> str:
        return self.checkpoint_dir or f"{FSX_MOUNT_PATH}/checkpoints/{self.namespace}/{self.name}"

    @property
    def init_from_path(self) -> Optional[str]:
        return init_from_path(self)

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def slice_resource(self) -> Optional[str]:
        """The extended resource of the slice asked for, or None for whole GPUs."""
        if self.slice:
            return f"nvidia.com/mig-{self.slice}"
        return "nvidia.com/gpu.shared" if self.shared else None

    @property
    def max_runtime_seconds(self) -> int:
        return duration_seconds(self.max_runtime)

    @property
    def ttl_seconds(self) -> int:
        return duration_seconds(self.ttl_after_finished)


def init_from_path(spec: "JobSpec") -> Optional[str]:
    """Where ``initFrom: <job>/step-N`` is inside the pods: that job's default checkpoint
    directory in the team's own subtree (so a reference can never leave the team), and the
    step directory the trainer writes (trainer/contract/layout.py step_dir_name)."""
    if not spec.init_from:
        return None
    job, _, step = spec.init_from.partition("/")
    return f"{FSX_MOUNT_PATH}/checkpoints/{spec.namespace}/{job}/{step_dir_name(int(step.removeprefix('step-')))}"


# -- the team's own space -------------------------------------------------------------------
_EXPERIMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,200}$")
# Trainer overrides that name a path: (what the path is for, may it be written).
PATH_OVERRIDES = {"export.dir": True, "checkpoint.resume": True, "model.hf_path": False}


def team_space_problems(spec: "JobSpec") -> list[Problem]:
    """Every path and name of the spec that would leave the team's own space (another team's
    checkpoints, experiment or models), each with the field that names it."""
    ns = spec.namespace
    problems = []
    readable, writable = team_readable_roots(ns), team_writable_roots(ns)
    if not path_within(spec.dataset, readable):
        problems.append(Problem("dataset", spec.dataset, "is outside the team's readable space",
                                f"use a path under one of {list(readable)}"))
    for override in (spec.trainer.overrides if spec.trainer else ()):
        key, _, value = override.partition("=")
        if key in PATH_OVERRIDES:
            if key == "checkpoint.resume" and value in ("auto", "none"):
                continue
            roots = writable if PATH_OVERRIDES[key] else readable
            if not path_within(value, roots):
                problems.append(Problem(f"trainer.overrides[{key}]", value, "is outside the team's own space",
                                        f"use a path under one of {list(roots)}"))
        if key == "export.registered_model_name" and value not in ("", "null"):
            prefix = registered_model_prefix(ns)
            if not value.startswith(prefix) or len(value) == len(prefix):
                problems.append(Problem(f"trainer.overrides[{key}]", value,
                                        "is not under the team's model prefix (names are global in MLflow: another "
                                        "team's name would be squatted or refused)", f"name it {prefix}<model>"))
    if spec.experiment is not None:
        first = spec.experiment.split("/", 1)[0]
        if not _EXPERIMENT.match(spec.experiment) or ".." in spec.experiment.split("/"):
            problems.append(Problem("experiment", spec.experiment, "is not an experiment name",
                                    "use letters, digits, '.', '_', '-' and '/'"))
        elif "/" in spec.experiment and first != ns:
            problems.append(Problem("experiment", spec.experiment, f"is under {first}/, not the team's prefix {ns}/",
                                    f"name it {ns}/<experiment> or just <experiment>"))
    return problems


# -- loading -----------------------------------------------------------------------------
_FIX = ". FIX: "


def did_you_mean(word: str, known: list[str]) -> Optional[str]:
    """A "did you mean" for a misspelt key: the closest known one, or one it abbreviates
    (`gpus` -> `gpusPerNode`)."""
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    if not close:
        lowered = word.lower().replace("_", "")
        close = [k for k in known if len(lowered) >= 3 and k.lower().startswith(lowered)][:1]
    return f"did you mean {close[0]!r}?" if close else None


def _model_at(loc: list[str]) -> type[BaseModel]:
    """The pydantic model of the mapping at ``loc`` (for the fields a misspelt key could mean)."""
    model: type[BaseModel] = JobSpec
    for part in loc:
        field = next((f for n, f in model.model_fields.items() if part in (n, f.alias)), None)
        inner = getattr(field, "annotation", None) if field else None
        candidates = [inner, *getattr(inner, "__args__", ())]
        inner = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if inner is None:
            return model
        model = inner
    return model


def _problem_from_error(error: dict[str, Any], raw: Any) -> Problem:
    loc = [str(part) for part in error["loc"]]
    path = ".".join(p if not p.isdigit() else f"[{p}]" for p in loc).replace(".[", "[") or "<root>"
    value: Any = raw
    for part in error["loc"]:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and isinstance(part, int) and part < len(value):
            value = value[part]
        else:
            value = error.get("input")
            break
    message = str(error["msg"]).removeprefix("Value error, ")
    if not loc and "pool and gpuType" in message:
        path = "pool/gpuType"
    if not loc and message.startswith("names this job's own checkpoint"):
        path, value = "initFrom", raw.get("initFrom", raw.get("init_from")) if isinstance(raw, dict) else None
    kind = error["type"]
    if _FIX in message:
        message, fix = message.split(_FIX, 1)
    elif kind == "extra_forbidden":
        model = _model_at(loc[:-1])
        message, fix = ("is not a job spec field" if model is JobSpec else f"is not a field of {'.'.join(loc[:-1])}",
                        did_you_mean(loc[-1], [to_camel(k) for k in model.model_fields]) or
                        f"remove it (fields: {', '.join(to_camel(k) for k in model.model_fields)})")
    elif kind == "missing":
        value = None  # the parent's whole mapping is no help
        message, fix = "is required", "add it (see examples/jobs/)"
    elif kind in ("enum", "literal_error"):
        fix = "use one of the listed values"
    elif kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        bound = {"greater_than_equal": ">=", "less_than_equal": "<=", "greater_than": ">", "less_than": "<"}[kind]
        fix = f"use a value {bound} {next(iter((error.get('ctx') or {}).values()), '')}"
    else:
        fix = "correct the value"
    return Problem(path, value, message, fix)


def parse_job_spec(raw: Any, *, source: str = "job spec") -> JobSpec:
    if not isinstance(raw, dict):
        raise JobSpecError(source, [Problem("<root>", raw, "a job spec is a YAML mapping", "see examples/jobs/")])
    try:
        return JobSpec.model_validate(raw)
    except ValidationError as exc:
        problems = [_problem_from_error(e, raw) for e in exc.errors()]
        # The whole-spec rule runs only once every field parsed: check it here too, so a bad
        # field never hides it.
        given = [k for k in ("pool", "gpuType", "gpu_type") if raw.get(k) is not None]
        if isinstance(raw.get("gpu"), dict) and raw["gpu"].get("type") is not None:
            given.append("gpu.type")
        if len(given) != 1 and not any(p.path == "pool/gpuType" for p in problems):
            problems.append(Problem("pool/gpuType", {k: raw.get(k) for k in given} or None,
                                    "give exactly one of pool and gpuType", "e.g. gpuType: h100, or pool: h100"))
        # Likewise the own-code rule (trainer / command / script), each of its problems once.
        own = own_code_problems(raw)
        problems = [p for p in problems if not any(str(p.message).startswith(o[0] + ":") for o in own)]
        problems += [Problem(*p) for p in own]
        raise JobSpecError(source, problems) from None


class SpecFileError(JobSpecError):
    """The file itself is not a job spec (missing, a directory, binary, not UTF-8, not YAML):
    nothing in it can be checked. ``str()`` is one line."""

    def __init__(self, path: str, message: str, fix: str):
        self.line = f"{path}: {message}. Fix: {fix}"
        super().__init__(path, [Problem("<file>", path, message, fix)])
        self.args = (self.line,)

    def __str__(self) -> str:
        return self.line


def _duplicate_keys(node: Any, path: str = "") -> list[tuple[str, int, int]]:
    """(dotted path, first line, repeated line) of every key given twice in one mapping of the
    composed YAML: PyYAML's loader silently keeps the last one."""
    found: list[tuple[str, int, int]] = []
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            line = key_node.start_mark.line + 1
            if key is not None and key != "<<":
                if key in seen:
                    found.append((f"{path}{key}", seen[key], line))
                else:
                    seen[key] = line
            found += _duplicate_keys(value_node, f"{path}{key}." if key is not None else path)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            found += _duplicate_keys(item, f"{path.rstrip('.')}[{index}].")
    return found


MAX_SPEC_BYTES = 1 << 20
# A job spec is a few dozen values; aliases may repeat a node, but an expansion this large is
# an alias bomb (each level of `&a [*b, *b, ...]` multiplies it), not a spec.
MAX_SPEC_NODES = 10_000


def _alias_problem(root: Any) -> Optional[str]:
    """Why the composed YAML cannot be turned into values: an anchor used inside itself (PyYAML
    builds a list that contains itself, and validating it recurses without end) or an expansion
    past MAX_SPEC_NODES. None when it is a tree of reasonable size."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()

    def size(node: Any) -> int:
        key = id(node)
        if key in on_path:
            raise _Recursive(node)
        if key in sizes:
            return sizes[key]
        on_path.add(key)
        children = ([n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode)
                    else list(node.value) if isinstance(node, yaml.SequenceNode) else [])
        total = 1
        for child in children:
            total += size(child)
            if total > MAX_SPEC_NODES:
                break
        on_path.discard(key)
        sizes[key] = total
        return total

    try:
        if size(root) > MAX_SPEC_NODES:
            return f"expands to more than {MAX_SPEC_NODES:,} values through its aliases (*name)"
    except _Recursive as exc:
        return f"has an anchor used inside itself at line {exc.node.start_mark.line + 1} (a value that contains itself)"
    return None


class _Recursive(Exception):
    def __init__(self, node: Any):
        super().__init__()
        self.node = node


def read_job_spec_file(path: Union[str, Path]) -> tuple[Any, list[Problem]]:
    """The YAML document of a job spec file and the problems of the file itself that still let
    the rest be checked (duplicate keys). Raises ``SpecFileError`` when nothing can be read."""
    path = Path(path)
    name = str(path)
    if not path.exists():
        raise SpecFileError(name, "does not exist", "give the path of a job spec YAML file (see examples/jobs/)")
    if path.is_dir():
        raise SpecFileError(name, "is a directory, not a job spec file", "give the path of one YAML file in it")
    try:
        data = path.read_bytes()[: MAX_SPEC_BYTES + 1]
    except OSError as exc:
        raise SpecFileError(name, f"cannot be read ({exc.strerror})", "check the path and its permissions") from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecFileError(name, f"is larger than {MAX_SPEC_BYTES // 1024} KiB: not a job spec", "give the job spec YAML")
    if b"\0" in data:
        raise SpecFileError(name, "is a binary file, not YAML", "give the job spec YAML (a text file)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecFileError(name, f"is not UTF-8 text (byte {exc.start})", "save the file as UTF-8") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None and (alias := _alias_problem(node)) is not None:
            raise SpecFileError(name, alias, "write the values out, or use each anchor only outside itself")
        duplicates = _duplicate_keys(node)
        raw = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecFileError(name, f"is not valid YAML{where} ({problem})", "fix the YAML syntax there") from None
    finally:
        loader.dispose()
    problems = [Problem(key, f"lines {first} and {again}", "is given twice; YAML would silently keep the second",
                        "keep one of them") for key, first, again in duplicates]
    return raw, problems


def load_job_spec(path: Union[str, Path]) -> JobSpec:
    raw, problems = read_job_spec_file(path)
    try:
        spec = parse_job_spec(raw, source=str(path))
    except JobSpecError as exc:
        raise JobSpecError(str(path), [*problems, *exc.problems]) from None
    if problems:
        raise JobSpecError(str(path), problems)
    return spec
