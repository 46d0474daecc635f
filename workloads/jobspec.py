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

from workloads.fsx import DATASETS_DIR, FSX_MOUNT_PATH, team_subtree_path
from workloads.problems import InvalidInputError, Problem
from workloads.scheduling import Priority, team_namespace

_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Pod names are <name>-worker-<index> and Services <name>-master-0: keep the name short enough
# that both stay within the 63-character DNS label limit.
MAX_NAME_LENGTH = 40
_DURATION = re.compile(r"^(\d+h)?(\d+m)?(\d+s)?$")
_OVERRIDE = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)+=.*$")
# Set by the platform from the job spec (or fixed by it): never from a trainer override.
PLATFORM_OWNED_OVERRIDES = ("data.dir", "checkpoint.dir", "checkpoint.s3_uri", "tracking.job_id", "tracking.uri",
                            "tracking.experiment")

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


def duration_seconds(text: str) -> int:
    match = _DURATION.match(text or "")
    if not text or not match:
        raise ValueError(text)
    units = {"h": 3600, "m": 60, "s": 1}
    return sum(int(part[:-1]) * units[part[-1]] for part in match.groups() if part)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)


class TrainerSpec(_Model):
    config: str = Field(description="Trainer config file, relative to the image's /app (and to the repository root locally).")
    overrides: list[str] = Field(default_factory=list, description="Dotted key=value overrides, e.g. optimizer.lr=3e-4.")

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
            fixes.append("use dataset / checkpointDir / s3Mirror / experiment instead")
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


class TimeBudgetSpec(_Model):
    """How long the trainer needs between SIGTERM and a clean exit (see docs/trainer.md)."""

    max_step_seconds: int = Field(10, ge=1, le=60, description="Longest training step: the signal is acted on at a step boundary.")
    checkpoint_seconds: int = Field(45, ge=1, le=3600, description="Time to save one checkpoint (measure it: checkpoint_seconds metric).")


class JobSpec(_Model):
    name: str = Field(description="Job name (DNS label, at most 40 characters).")
    team: str = Field(description="Team; the job runs in namespace team-<team>.")
    image: str = Field(description="Trainer image, tag or digest (digest in prod).")
    trainer: TrainerSpec
    nodes: int = Field(ge=1, le=128)
    gpus_per_node: int = Field(ge=1, le=16)
    pool: Optional[str] = Field(None, description="GPU pool name; or give gpuType.")
    gpu_type: Optional[str] = Field(None, description="GPU type (h100, a100...); the pool offering it is chosen.")
    spot: bool = Field(True, description="May run on spot capacity (interruptible, resumed from checkpoints).")
    dataset: str = Field(description=f"Token shards on FSx, under {FSX_MOUNT_PATH}.")
    checkpoint_dir: Optional[str] = Field(None, description=f"Default {FSX_MOUNT_PATH}/checkpoints/team-<team>/<name>.")
    s3_mirror: bool = Field(False, description="Also mirror complete checkpoints to the team's prefix of the checkpoints bucket.")
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

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _DNS_1035.match(value) or len(value) > MAX_NAME_LENGTH:
            raise ValueError(f"is not a DNS label of at most {MAX_NAME_LENGTH} characters. "
                             "FIX: use lowercase letters, digits and '-', starting with a letter")
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

    @field_validator("max_runtime", "ttl_after_finished")
    @classmethod
    def _duration(cls, value: str) -> str:
        try:
            if duration_seconds(value) <= 0:
                raise ValueError(value)
        except ValueError:
            raise ValueError("is not a duration. FIX: write hours/minutes/seconds, e.g. 72h or 1h30m") from None
        return value

    @model_validator(mode="after")
    def _pool_or_type(self) -> "JobSpec":
        if (self.pool is None) == (self.gpu_type is None):
            raise ValueError("give exactly one of pool and gpuType. FIX: e.g. gpuType: h100, or pool: h100")
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
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def max_runtime_seconds(self) -> int:
        return duration_seconds(self.max_runtime)

    @property
    def ttl_seconds(self) -> int:
        return duration_seconds(self.ttl_after_finished)


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
    for override in spec.trainer.overrides:
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
    kind = error["type"]
    if _FIX in message:
        message, fix = message.split(_FIX, 1)
    elif kind == "extra_forbidden":
        known = list(JobSpec.model_fields) + [f.alias for f in JobSpec.model_fields.values() if f.alias]
        close = difflib.get_close_matches(loc[-1], [to_camel(k) for k in JobSpec.model_fields], n=1)
        message, fix = "is not a job spec field", (f"did you mean {close[0]!r}?" if close else "remove it")
        del known
    elif kind == "missing":
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
        if len(given) != 1 and not any(p.path == "pool/gpuType" for p in problems):
            problems.append(Problem("pool/gpuType", {k: raw.get(k) for k in given} or None,
                                    "give exactly one of pool and gpuType", "e.g. gpuType: h100, or pool: h100"))
        raise JobSpecError(source, problems) from None


def load_job_spec(path: Union[str, Path]) -> JobSpec:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise JobSpecError(str(path), [Problem("<file>", str(path), "does not exist", "give the path of a job spec YAML")]) from None
    except yaml.YAMLError as exc:
        raise JobSpecError(str(path), [Problem("<file>", str(path), f"is not valid YAML ({exc})", "fix the YAML syntax")]) from None
    return parse_job_spec(raw, source=str(path))
