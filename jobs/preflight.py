"""Will this job fit, how long will a step take, what will it cost? One screen, before any GPU.

Checks, each with its arithmetic in the message:

- GPUs per node: what the pool's instances offer (``trainingjob.resolve``).
- Memory per GPU: training state = parameters x 16 bytes (fp32 weights 4 + fp32 gradients 4 +
  AdamW first and second moments 8; bf16 autocast keeps fp32 master weights), divided by the
  world size under FSDP (DDP replicates it), plus activations (per layer s*b*h*34 bytes in bf16,
  Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", with
  fused attention; s*b*h*2 with activation checkpointing), fp32 logits and their gradient
  (s*b*V*8), and a fixed 2 GiB for the CUDA context and NCCL buffers; against 95% of the GPU's memory.
  Gradients stay sharded under FSDP during accumulation (the trainer reduce-scatters every
  micro-step), and a Hugging Face model is built on the meta device and filled shard by shard:
  neither adds a whole-model term.
- Host memory per node: checkpoint staging, a full copy of each rank's saved state (fp32 weights
  and AdamW's two moments, 12 bytes per parameter, / world size under FSDP) per GPU: in /dev/shm
  for ``checkpoint.async_mode: process`` (against the pod's /dev/shm), pinned for ``thread``
  (against the pod's memory, with a Hugging Face model's weights that rank 0 reads once, 4 bytes
  per parameter at most).
- World size vs the team's Kueue quota on the pool, and the pool's NodePool limit.
- Step time from FLOPs per token (6N + 12*L*h*s, as trainer/metrics.py) at an assumed MFU,
  run time for ``schedule.num_steps``, and its cost on-demand and on spot from workloads/prices.py.
- Checkpoint time: the whole state over the FSx write throughput, against the time budget.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Optional


from trainer.contract.memory import TRAINING_STATE_BYTES_PER_PARAMETER as BYTES_PER_PARAMETER
from trainer.model_facts import GPT_SIZES, peak_tflops_for_gpu_type
from trainer.model_facts import flops_per_token as model_flops_per_token
from workloads.problems import BAD_INPUT, DOES_NOT_FIT, Problem
from workloads import gpu_measurements
from workloads.gpu_catalog import GPU_TYPES
from workloads.jobspec import (JobSpec, JobSpecError, TRAINER_CONFIGS_DIR, did_you_mean, parse_job_spec, read_job_spec_file,
                               registered_model_prefix)
from workloads.platform_facts import PlatformFacts
from workloads.prices import PRICES, PRICES_AS_OF, SOURCE_URL, SPOT_DISCOUNT
from workloads.trainingjob import ResolvedJob, candidate_pools, resolve_with_problems

EXIT_BAD_INPUT = 2
EXIT_DOES_NOT_FIT = 3

ACTIVATION_BYTES_PER_TOKEN_PER_HIDDEN_PER_LAYER = 34
CHECKPOINTED_ACTIVATION_BYTES = 2
CUDA_RESERVE_GIB = 2.0
USABLE_MEMORY_FRACTION = 0.95
DEFAULT_MFU = 0.35  # a well-tuned dense GPT on H100/A100 reaches 35-50%; 35% is the planning figure
DEFAULT_VOCAB = 50304
GIB = 1024**3



@dataclass(frozen=True)
class ModelShape:
    parameters: float
    num_layers: Optional[int]
    hidden_size: Optional[int]
    vocab_size: int
    seq_len: int
    micro_batch_size: int
    grad_accum_steps: int
    num_steps: int
    strategy: str
    activation_checkpointing: bool
    source: str
    checkpoint_async_mode: str = "off"
    model_kind: str = "gpt"


@dataclass
class Preflight:
    job: Optional[ResolvedJob]
    lines: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def exit_code(self) -> int:
        """0 fits; 2 any bad input (the fit of a wrong spec means little); 3 well-formed but does not fit."""
        if not self.problems:
            return 0
        return EXIT_BAD_INPUT if any(p.kind == BAD_INPUT for p in self.problems) else EXIT_DOES_NOT_FIT

    def render(self) -> str:
        out = list(self.lines)
        out += [f"  ! {w}" for w in self.warnings]
        if self.problems:
            counts = {kind: sum(1 for p in self.problems if p.kind == kind) for kind in (BAD_INPUT, DOES_NOT_FIT)}
            out.append(f"REFUSED: {len(self.problems)} problem(s) ("
                       + ", ".join(f"{n} {kind}" for kind, n in counts.items() if n) + ")")
            out += [f"  - [{p.kind}] {p.render()}" for p in self.problems]
        else:
            out.append("OK: the job fits")
        return "\n".join(out)


def _capacity(job: ResolvedJob) -> str:
    others = [c for c in job.pool.capacity_types if c != "spot"]
    if not job.interruptible:
        return "/".join(others)
    return "spot or " + "/".join(others) if others else "spot only"


def _hourly(instance_type: str) -> tuple[float, str]:
    found = PRICES.get(instance_type)
    return (found.on_demand_usd_per_hour if found else float("inf"), instance_type)


def _usd(amount: float) -> str:
    """Dollars, with cents below $100 (a short run must not read as free)."""
    return f"${amount:,.2f}" if amount < 100 else f"${amount:,.0f}"


def _size_source(job: ResolvedJob) -> str:
    size = job.size
    if size.source == "spec":
        return "from the spec's resources"
    share = (f"{job.spec.gpus_per_node} of {job.pool.gpus_per_node} GPUs' share of " if job.spec.gpus_per_node < job.pool.gpus_per_node
             else "")
    text = f"{share}{size.instance_type}'s allocatable after kubelet reserve and DaemonSets"
    if size.source == "Kueue share":
        text += f", capped at the team's Kueue share ({job.pool.cpu_per_gpu:g} CPU, {job.pool.memory_gib_per_gpu:g} GiB per GPU)"
    return text + "; override with resources.cpuPerGpu / memoryGibPerGpu / shmGib"


# Trainer checks that only the pod can make (the laptop has no FSx, no model directory, no GPU).
_POD_ONLY_TRAINER_CHECKS = ("data.dir=", "model.hf_path=", "parallelism.backend='nccl'", "parallelism.mixed_precision='bf16'",
                            "checkpoint.dir=")
_TRAINER_PROBLEM = re.compile(r"^(?P<key>[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*)(?:/[a-z0-9_]+)?(?:=(?P<value>.*?))?: (?P<message>.*)$")


# Names other trainers use for the trainer's keys (for "did you mean").
_TRAINER_SYNONYMS = {"learning_rate": "lr", "batch_size": "micro_batch_size", "per_device_train_batch_size": "micro_batch_size",
                     "max_steps": "num_steps", "steps": "num_steps", "gradient_accumulation_steps": "grad_accum_steps",
                     "warmup": "warmup_steps", "max_grad_norm": "grad_clip_norm", "block_size": "seq_len",
                     "seq_length": "seq_len", "max_seq_len": "seq_len"}


def _trainer_problem(text: str, config: str) -> Problem:
    """A trainer ConfigError line (`key=value: message`) as a job spec problem."""
    match = _TRAINER_PROBLEM.match(text)
    if not match:
        return Problem("trainer.overrides", None, text, "fix the override (dotted key=value, e.g. optimizer.lr=3e-4)")
    key, value, message = match.group("key"), match.group("value"), match.group("message")
    hint = re.search(r"\(did you mean ([a-z0-9_.]+)\?\)", message)
    if hint:
        return Problem(f"trainer[{key}]", value, "is not a trainer config key", f"did you mean {hint.group(1)}?")
    known = re.search(r"\(known: (.*)\)$", message)
    if known:
        names = [n.strip() for n in known.group(1).split(",")]
        section, _, leaf = key.rpartition(".")
        meant = _TRAINER_SYNONYMS.get(leaf)
        hint = (f"did you mean {section + '.' if section else ''}{meant}?" if meant in names
                else did_you_mean(leaf, names))
        return Problem(f"trainer[{key}]", value, "is not a trainer config key",
                       hint or f"use one of {known.group(1)}")
    return Problem(f"trainer[{key}]", value, message, f"set {key} in trainer.overrides (or in {config})")


def trainer_config(spec_trainer: Any, repo_root: str, *, dataset: Optional[str] = None,
                   checkpoint_dir: Optional[str] = None) -> tuple[Any, list[Problem]]:
    """The trainer's config of a job (file + overrides), checked by the trainer's own parser and
    cross-field rules (trainer.config.validate), as the pod will run it; (config or None, problems).
    Checks that need the pod (data and model on FSx, a GPU) are left to the pod."""
    from trainer.config import ConfigError, build_config, validate

    config = spec_trainer.config
    root = os.path.realpath(os.path.join(repo_root, TRAINER_CONFIGS_DIR))
    path = os.path.realpath(os.path.join(repo_root, config))
    if os.path.commonpath([root, path]) != root:
        return None, [Problem("trainer.config", config, f"resolves outside the repository's {TRAINER_CONFIGS_DIR}/ "
                              "(a link out of it)", f"use a config file under {TRAINER_CONFIGS_DIR}/")]
    if not os.path.isfile(path):
        configs = sorted(f"{TRAINER_CONFIGS_DIR}/{n}" for n in os.listdir(root) if n.endswith((".yaml", ".yml")))
        return None, [Problem("trainer.config", config, "no such trainer config in this checkout",
                              did_you_mean(config, configs) or f"use one of {configs}")]
    overrides = list(spec_trainer.overrides)
    # What the platform sets in the pod (trainingjob.trainer_args / trainer_env).
    platform = [*( [f"data.dir={dataset}"] if dataset else []), *([f"checkpoint.dir={checkpoint_dir}"] if checkpoint_dir else [])]
    given = dict(o.partition("=")[::2] for o in overrides)
    problems: list[Problem] = []
    try:
        cfg = build_config(path, platform + overrides, environ={})
    except ConfigError as exc:
        problems = [_trainer_problem(text, config) for text in exc.problems]
        # Build once more without the refused keys, so the cross-field rules still run on the
        # rest (an unknown key must not hide a micro-batch of 0).
        refused = {p.path.removeprefix("trainer[").rstrip("]") for p in problems}
        problems = [dataclasses.replace(p, value=given.get(p.path.removeprefix("trainer[").rstrip("]"), p.value))
                    if p.value is None else p for p in problems]
        try:
            cfg = build_config(path, platform + [o for o in overrides if o.partition("=")[0] not in refused], environ={})
        except ConfigError:
            return None, problems
    try:
        validate(cfg, device_checks=False)  # the pod's CUDA device is the pod's to check (no torch here)
    except ConfigError as exc:
        problems += [_trainer_problem(text, config) for text in exc.problems if not text.startswith(_POD_ONLY_TRAINER_CHECKS)]
    return (None if problems else cfg), problems


def trainer_shape(spec: JobSpec, repo_root: str) -> tuple[Optional[ModelShape], list[Problem]]:
    """The model and batch from the trainer config file + overrides (the trainer's own parser and
    validation), and every problem the trainer would find with them."""
    if spec.trainer is None:
        # Your own code: preflight cannot read its model or batch (the memory and step-time
        # arithmetic needs them); the placement, quota and time budget still hold.
        return None, []
    cfg, problems = trainer_config(spec.trainer, repo_root, dataset=spec.dataset, checkpoint_dir=spec.checkpoint_path)
    if cfg is None:
        return None, problems
    # Not a reason to skip the arithmetic: reported beside it.
    naming = registered_model_problems(spec, cfg)
    m, d, s, par = cfg.model, cfg.data, cfg.schedule, cfg.parallelism
    vocab = m.vocab_size or DEFAULT_VOCAB
    layers = hidden = None
    parameters: Optional[float] = None
    source = "job spec model.parameters"
    if m.kind == "gpt" and m.size in GPT_SIZES:
        layers, hidden = GPT_SIZES[m.size]["num_layers"], GPT_SIZES[m.size]["embed_dim"]
        layers, hidden = m.num_layers or layers, m.embed_dim or hidden
        # 12 L h^2 in the blocks, token and position embeddings, an untied output head.
        parameters = 12.0 * layers * hidden**2 + 2 * vocab * hidden + d.seq_len * hidden
        source = f"trainer config (GPT {m.size}: {layers} layers x {hidden})"
    if spec.model is not None:
        parameters = spec.model.parameters
        layers = spec.model.num_layers or layers
        hidden = spec.model.hidden_size or hidden
        vocab = spec.model.vocab_size or vocab
        source = "job spec model"
    if m.kind == "hf" and not (spec.model and spec.model.vocab_size):
        # A Hugging Face model brings its own embedding (trainer/model.py load_hf_model ignores
        # model.vocab_size, which a GPT config passes on), so neither it nor the GPT default is a
        # guess for its tokenizer: the logits term would be off by the ratio (Llama 3: 128,256 /
        # 50,304 = 2.5x).
        problems = problems + [Problem("model.vocabSize", None, "a Hugging Face model's vocabulary sets the size "
                                       "of its logits, and preflight cannot read the model's config.json",
                                       "add vocabSize to the job spec's model block: its config.json vocab_size "
                                       "(e.g. model: {parameters: 8.03e9, numLayers: 32, hiddenSize: 4096, "
                                       "vocabSize: 128256} for Llama 3 8B)")]
    if parameters is None:
        return None, problems + naming + [Problem("model.parameters", None, f"the trainer config uses a {m.kind} model whose size "
                                         "preflight cannot read",
                                         "add model: {parameters: 8e9, numLayers: 32, hiddenSize: 4096} to the job spec")]
    if problems:  # a micro-batch of 0 or a bad schedule: no arithmetic on it
        return None, problems + naming
    return ModelShape(parameters, layers, hidden, vocab, d.seq_len, d.micro_batch_size, s.grad_accum_steps, s.num_steps,
                      par.strategy, par.activation_checkpointing, source, cfg.checkpoint.async_mode, m.kind), naming


def registered_model_problems(spec: JobSpec, cfg: Any) -> list[Problem]:
    """The model name the trainer registers at the end, from the config file when no override
    sets it: the team's MLflow login may create only ``<namespace>.<name>``
    (docker/mlflow/mlflow_team_auth.py); any other name is refused (403) and the trainer, which
    treats export as best effort (trainer/export.py), still ends the job Succeeded with nothing
    registered. An override is checked with the spec (workloads.jobspec.team_space_problems)."""
    key = "export.registered_model_name"
    name = cfg.export.registered_model_name
    if not cfg.export.at_end or not name or any(o.startswith(key + "=") for o in spec.trainer.overrides):
        return []
    prefix = registered_model_prefix(spec.namespace)
    if name.startswith(prefix) and len(name) > len(prefix):
        return []
    return [Problem(f"trainer[{key}]", name, f"comes from {spec.trainer.config} and is not under team {spec.team}'s model "
                    f"prefix {prefix}: MLflow would refuse to register it (403) and the job would still succeed, "
                    "registering nothing",
                    f"add {key}={prefix}{name} to trainer.overrides (or {key}=null to register nothing)")]


def _gib(n: float) -> str:
    return f"{n / GIB:,.1f} GiB"


def memory_per_gpu(shape: ModelShape, world_size: int) -> dict[str, float]:
    sharded = shape.strategy == "fsdp"
    state = shape.parameters * BYTES_PER_PARAMETER / (world_size if sharded else 1)
    tokens = shape.seq_len * shape.micro_batch_size
    if shape.num_layers and shape.hidden_size:
        per_layer = (CHECKPOINTED_ACTIVATION_BYTES if shape.activation_checkpointing
                     else ACTIVATION_BYTES_PER_TOKEN_PER_HIDDEN_PER_LAYER)
        activations = tokens * shape.hidden_size * shape.num_layers * per_layer
    else:
        activations = 0.0
    logits = tokens * shape.vocab_size * 8
    return {"state": state, "activations": activations, "logits": logits, "reserve": CUDA_RESERVE_GIB * GIB,
            "total": state + activations + logits + CUDA_RESERVE_GIB * GIB}


def planning_mfu(gpu_type: str, mfu: Optional[float], measured: dict[str, dict[str, Any]]) -> tuple[float, str]:
    """The MFU a step time is planned with, and where it comes from: an explicit --mfu, else
    the MFU `make gpu-check` measured on this GPU type, else the 35% default."""
    if mfu is not None:
        return mfu, "given"
    figures = measured.get(gpu_type)
    if figures and figures.get("mfu"):
        return float(figures["mfu"]), (f"measured by make gpu-check on {figures.get('device')}, {figures.get('date')}, "
                                       f"torch {figures.get('torch')}, CUDA {figures.get('cuda')}")
    return DEFAULT_MFU, f"default planning figure: nothing measured on {gpu_type} (make gpu-check on one records it)"


def preflight(spec: JobSpec, facts: PlatformFacts, *, repo_root: str, mfu: Optional[float] = None,
              measurements_file: str = gpu_measurements.MEASUREMENTS_FILE) -> Preflight:
    """Every check a job can fail before it is submitted, all in one pass: placement, quota,
    memory per GPU, step time and cost, checkpoint time (each section below is one function)."""
    job, resolve_problems = resolve_with_problems(spec, facts)
    if job is None:
        # Still check what the trainer would refuse: every mistake in one run.
        _, trainer_problems = trainer_shape(spec, repo_root)
        return Preflight(None, [f"Preflight of job {spec.name} on stack {facts.stack}"],
                         list(resolve_problems) + trainer_problems)
    report = Preflight(job, problems=list(resolve_problems), warnings=list(job.warnings))
    if spec.slice_resource:
        return _preflight_slice(spec, facts, job, report, repo_root=repo_root)
    price = PRICES.get(job.instance_type)
    _describe_placement(spec, facts, job, price, report)
    _check_quota(spec, job, report)
    shape, problems = trainer_shape(spec, repo_root)
    report.problems += problems
    if shape is None:
        if spec.trainer is None:
            report.lines.append("memory         not checked: your own code's model and batch are unknown to preflight "
                                "(run it with submit --local first)")
            _own_code_cost_bound(spec, job, price, report)
        return report
    measured = gpu_measurements.load(measurements_file)
    _check_memory(spec, facts, job, shape, measured, report)
    _check_host_memory(spec, job, shape, report)
    _check_step_time_and_cost(spec, job, shape, price, mfu, measured, report)
    _check_checkpoint_time(spec, facts, job, shape, report)
    return report


def _rate(job: ResolvedJob, price: Any) -> str:
    if price is None:
        return ""
    if "reserved" in job.pool.capacity_types:
        return f" reserved (billed ${price.reserved_usd_per_hour:.2f}/h used or not)"
    return f" at ${price.on_demand_usd_per_hour:.2f}/h on-demand"


def _describe_placement(spec: JobSpec, facts: PlatformFacts, job: ResolvedJob, price: Any, report: Preflight) -> None:
    pool, gpu, world = job.pool, GPU_TYPES[job.pool.gpu_type], spec.world_size
    report.lines += [
        f"Preflight of job {spec.name} on stack {facts.stack} ({', '.join(facts.notes) or 'facts from the plan'})",
        f"placement      pool {pool.name}: {spec.nodes} x {job.instance_type} ({spec.gpus_per_node} of {pool.gpus_per_node} "
        f"{gpu.description} per node), {_capacity(job)}"
        f"{', EFA x' + str(job.efa_devices) if job.efa_devices else ''}",
        f"queue          {job.team.namespace}/{job.team.local_queue}, priority {job.priority_class}",
        f"instance       {job.instance_type}{_rate(job, price)}"
        f"{f' (~${price.spot_usd_per_hour:.2f}/h spot)' if price and job.interruptible else ''}: the cheapest of "
        f"{', '.join(sorted(pool.instance_types, key=_hourly))} that holds the pod",
        f"pod            {job.size.cpu_cores:g} CPU, {job.memory_gib} GiB, /dev/shm {job.shm_gib} GiB ({_size_source(job)})",
        f"time budget    {job.budget.describe()} "
        f"(pool grace {pool.termination_grace_period_seconds}s{', spot notice 120s' if job.interruptible else ''})",
    ]
    report.figures.update({"pool": pool.name, "instance_type": job.instance_type, "gpu_memory_gib": gpu.gpu_memory_gib,
                           "world_size": world, "pod_cpu": job.size.cpu_cores, "pod_memory_gib": job.memory_gib,
                           "pod_shm_gib": job.shm_gib,
                           "instance_usd_per_hour": price.on_demand_usd_per_hour if price else None})


def _check_quota(spec: JobSpec, job: ResolvedJob, report: Preflight) -> None:
    pool, world = job.pool, spec.world_size
    quota = job.team.gpu_quota.get(pool.kueue_flavor or "", 0)
    report.lines.append(f"quota          {world} GPUs requested; team {spec.team} has {quota} nominal on {pool.name}"
                        f"{' (may borrow idle GPUs)' if job.team.borrowing else ''}; the pool launches at most {pool.max_gpus}")
    if pool.max_gpus and world > pool.max_gpus:
        report.problems.append(Problem("nodes", spec.nodes, f"{spec.nodes} x {spec.gpus_per_node} = {world} GPUs, more than pool "
                                       f"{pool.name} can ever launch ({pool.max_gpus})", f"use at most {pool.max_gpus // spec.gpus_per_node} nodes").does_not_fit())
    elif world > quota and not job.team.borrowing:
        report.problems.append(Problem("nodes", spec.nodes, f"{world} GPUs exceed team {spec.team}'s quota of {quota} on {pool.name} "
                                       "and the team may not borrow", f"use at most {quota // spec.gpus_per_node} nodes or raise the quota").does_not_fit())
    elif world > quota and world > (cohort := sum(t.gpu_quota.get(pool.kueue_flavor or "", 0) for t in job.facts.teams)):
        # Kueue lends only nominal quota of the cohort's ClusterQueues: it would never admit this.
        report.problems.append(Problem("nodes", spec.nodes, f"{world} GPUs exceed what the whole cohort holds on {pool.name} "
                                       f"({cohort}): Kueue can never admit the job, even by borrowing",
                                       f"use at most {cohort // spec.gpus_per_node} nodes or raise the quotas").does_not_fit())
    elif world > quota:
        # The namespace ResourceQuota of a borrowing team is the cohort's GPUs (infra.gpu_capacity),
        # so what Kueue admits by borrowing also gets its pods.
        report.warnings.append(f"{world} GPUs exceed the team's nominal {quota} on {pool.name}: admitted only while others' GPUs "
                               "are idle, and preempted when they reclaim them")


def _check_memory(spec: JobSpec, facts: PlatformFacts, job: ResolvedJob, shape: ModelShape,
                  measured: dict[str, dict[str, Any]], report: Preflight) -> None:
    pool, gpu, world = job.pool, GPU_TYPES[job.pool.gpu_type], spec.world_size
    mem = memory_per_gpu(shape, world)
    usable = gpu.gpu_memory_gib * GIB * USABLE_MEMORY_FRACTION
    sharding = f"/ {world} ranks (FSDP)" if shape.strategy == "fsdp" else "(replicated: DDP)"
    arithmetic = (f"{shape.parameters / 1e9:.2f}B params x {BYTES_PER_PARAMETER} B (fp32 weights 4 + grads 4 + AdamW 8) "
                  f"{sharding} = {_gib(mem['state'])} state + {_gib(mem['activations'])} activations "
                  f"({shape.micro_batch_size} x {shape.seq_len} tokens{', checkpointed' if shape.activation_checkpointing else ''}) "
                  f"+ {_gib(mem['logits'])} logits + {_gib(mem['reserve'])} CUDA/NCCL = {_gib(mem['total'])} per GPU")
    report.lines.append(f"memory         {arithmetic}; {gpu.name} has {gpu.gpu_memory_gib} GiB ({USABLE_MEMORY_FRACTION:.0%} usable "
                        f"= {_gib(usable)}) [{shape.source}]")
    report.figures.update({"memory_per_gpu_gib": round(mem["total"] / GIB, 2), "usable_gpu_memory_gib": round(usable / GIB, 2)})
    same_shape = measured.get(pool.gpu_type)
    if same_shape and same_shape.get("peak_memory_gib") and gpu_measurements.matches(
            same_shape, num_layers=shape.num_layers, hidden_size=shape.hidden_size, seq_len=shape.seq_len,
            micro_batch_size=shape.micro_batch_size, vocab_size=shape.vocab_size, strategy=shape.strategy,
            activation_checkpointing=shape.activation_checkpointing):
        peak_gib = float(same_shape["peak_memory_gib"])
        report.lines.append(f"               measured peak {peak_gib:.1f} GiB for this model and micro-batch on "
                            f"{same_shape.get('device')} ({same_shape.get('date')}, make gpu-check); the larger of the two is checked")
        report.figures["measured_peak_memory_gib"] = peak_gib
        mem["total"] = max(mem["total"], peak_gib * GIB)
    if mem["total"] > usable:
        report.problems.append(Problem("gpusPerNode", spec.gpus_per_node,
                                       f"does not fit: {arithmetic} > {_gib(usable)} usable on one {gpu.gpu_memory_gib} GiB {gpu.name}",
                                       memory_fix(shape, spec, pool, usable, facts)).does_not_fit())


STAGED_BYTES_PER_PARAMETER = 12  # what a checkpoint copies to the host: fp32 weights + AdamW's two moments
HF_READ_BYTES_PER_PARAMETER = 4  # a Hugging Face model's files, read once on rank 0 (fp32 at most)


def host_memory_per_node(shape: ModelShape, world_size: int, gpus_per_node: int) -> dict[str, float]:
    """Host memory the trainer's ranks on one node hold besides their own processes: checkpoint
    staging (one copy of each rank's saved state, in /dev/shm for async_mode process, pinned for
    thread) and, on node 0, a Hugging Face model's weights read for loading."""
    per_rank = shape.parameters * STAGED_BYTES_PER_PARAMETER / (world_size if shape.strategy == "fsdp" else 1)
    staged = per_rank * gpus_per_node
    return {"per_rank": per_rank,
            "shm": staged if shape.checkpoint_async_mode == "process" else 0.0,
            "pinned": staged if shape.checkpoint_async_mode == "thread" else 0.0,
            "hf_read": shape.parameters * HF_READ_BYTES_PER_PARAMETER if shape.model_kind == "hf" else 0.0}


def _check_host_memory(spec: JobSpec, job: ResolvedJob, shape: ModelShape, report: Preflight) -> None:
    host = host_memory_per_node(shape, spec.world_size, spec.gpus_per_node)
    sharding = f" / {spec.world_size} ranks (FSDP)" if shape.strategy == "fsdp" else ""
    staging = (f"{shape.parameters / 1e9:.2f}B params x {STAGED_BYTES_PER_PARAMETER} B (fp32 weights 4 + AdamW 8){sharding} "
               f"= {_gib(host['per_rank'])} per rank x {spec.gpus_per_node} GPUs")
    if shape.checkpoint_async_mode == "process":
        shm = job.shm_gib * GIB
        report.lines.append(f"host memory    checkpoint staging in /dev/shm (async_mode process): {staging} = "
                            f"{_gib(host['shm'])}; the pod's /dev/shm is {job.shm_gib} GiB")
        report.figures["shm_staging_gib"] = round(host["shm"] / GIB, 2)
        if host["shm"] > shm:
            report.problems.append(Problem(
                "trainer[checkpoint.async_mode]", "process",
                f"does not fit: checkpoint staging in /dev/shm needs {staging} = {_gib(host['shm'])} > the pod's "
                f"/dev/shm of {job.shm_gib} GiB: the first save would fail (No space left on device), for good",
                f"use checkpoint.async_mode=thread (pinned host memory) or off, raise resources.shmGib to "
                f"{math.ceil(host['shm'] / GIB)}, or shard the state (parallelism.strategy=fsdp)").does_not_fit())
    pinned = host["pinned"] + host["hf_read"]
    if pinned:
        parts = ([f"checkpoint staging, pinned (async_mode thread): {staging} = {_gib(host['pinned'])}"]
                 if host["pinned"] else [])
        if host["hf_read"]:
            parts.append(f"rank 0's read of the Hugging Face weights: {shape.parameters / 1e9:.2f}B params x "
                         f"{HF_READ_BYTES_PER_PARAMETER} B = {_gib(host['hf_read'])}")
        arithmetic = " + ".join(parts) + (f" = {_gib(pinned)}" if len(parts) > 1 else "")
        report.lines.append(f"host memory    {arithmetic}; the pod has {job.memory_gib} GiB")
        report.figures["host_memory_gib"] = round(pinned / GIB, 2)
        if pinned > job.memory_gib * GIB:
            report.problems.append(Problem(
                "resources.memoryGibPerGpu", job.memory_gib,
                f"does not fit: {arithmetic} > the pod's {job.memory_gib} GiB (pinned pages cannot be swapped: the "
                "kernel's OOM killer ends the rank)",
                "use checkpoint.async_mode=off, shard the state (parallelism.strategy=fsdp), or raise "
                "resources.memoryGibPerGpu").does_not_fit())


def _reserved_cost(spec: JobSpec, job: ResolvedJob, hours: float, price: Any, report: Preflight) -> None:
    """A pool with capacity type ``reserved`` launches into its capacity reservations first
    (Karpenter "Utilizing On-Demand Capacity Reservations and Capacity Blocks": reserved capacity is
    prioritized over spot and on-demand); the reservation is billed whether the job runs or not,
    so the job adds nothing while the reservation has room. Spot and on-demand are the fallbacks."""
    node_hours = hours * spec.nodes
    reserved = node_hours * price.reserved_usd_per_hour
    line = (f"cost           {spec.nodes} x {job.instance_type} x {hours:.1f} h: reserved, $0 beyond the reservation "
            f"({_usd(reserved)} of reserved time at ${price.reserved_usd_per_hour:.2f}/h, billed used or not)")
    report.figures.update({"cost_reserved_usd": round(reserved, 2), "cost_marginal_usd": 0.0})
    fallbacks = []
    if job.interruptible:
        spot = node_hours * price.spot_usd_per_hour
        fallbacks.append(f"spot ~{_usd(spot)}")
        report.figures["cost_spot_usd"] = round(spot, 2)
    if "on-demand" in job.pool.capacity_types:
        on_demand = node_hours * price.on_demand_usd_per_hour
        fallbacks.append(f"on-demand {_usd(on_demand)} (${price.on_demand_usd_per_hour:.2f}/h)")
        report.figures["cost_on_demand_usd"] = round(on_demand, 2)
    if fallbacks:
        line += "; when the reservation is full: " + ", ".join(fallbacks)
    report.lines.append(line)
    report.lines.append(f"               prices: {SOURCE_URL} ({PRICES_AS_OF}); reservations: "
                        "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-reservation-pricing-billing.html")


def _check_step_time_and_cost(spec: JobSpec, job: ResolvedJob, shape: ModelShape, price: Any, mfu: Optional[float],
                              measured: dict[str, dict[str, Any]], report: Preflight) -> None:
    pool, world = job.pool, spec.world_size
    peak = peak_tflops_for_gpu_type(pool.gpu_type)  # the figure the trainer's MFU divides by
    mfu, mfu_source = planning_mfu(pool.gpu_type, mfu, measured)
    layers, hidden = shape.num_layers or 0, shape.hidden_size or 0
    flops_per_token = model_flops_per_token(shape.parameters, layers, hidden, shape.seq_len)
    tokens_per_step = shape.micro_batch_size * shape.seq_len * shape.grad_accum_steps * world
    step_seconds = tokens_per_step * flops_per_token / (world * peak * 1e12 * mfu)
    hours = step_seconds * shape.num_steps / 3600
    report.lines.append(f"step time      {tokens_per_step:,} tokens x {flops_per_token / 1e9:.2f} GFLOP/token / ({world} x {peak:.0f} "
                        f"TFLOP/s x MFU {mfu:.0%}) = {step_seconds:.2f} s; {shape.num_steps:,} steps = {hours:.1f} h")
    report.lines.append(f"               MFU {mfu:.1%}: {mfu_source}")
    report.figures.update({"step_seconds": round(step_seconds, 3), "run_hours": round(hours, 2), "mfu": mfu,
                           "mfu_source": "measured" if mfu_source.startswith("measured") else
                           "given" if mfu_source == "given" else "default"})
    if price is not None and "reserved" in pool.capacity_types:
        _reserved_cost(spec, job, hours, price, report)
    elif price is not None:
        report.lines.append(_priced(spec, job, price, hours, report, head=f"{spec.nodes} x {job.instance_type} x {hours:.1f} h",
                                    figure="cost_", spot_note=", plus re-done steps after interruptions"))
        report.lines.append(f"               prices: {SOURCE_URL} ({PRICES_AS_OF})")
    if step_seconds > spec.time_budget.max_step_seconds:
        report.problems.append(Problem("timeBudget.maxStepSeconds", spec.time_budget.max_step_seconds,
                                       f"the estimated step takes {step_seconds:.1f} s, longer than the budget the grace period is sized for",
                                       step_time_fix(step_seconds, shape, spec, job)).does_not_fit())
    if hours * 3600 > spec.max_runtime_seconds:
        report.warnings.append(f"the estimated {hours:.1f} h exceed maxRuntime {spec.max_runtime}: the job will be stopped before the end")


def _priced(spec: JobSpec, job: ResolvedJob, price: Any, hours: float, report: Preflight, *, head: str, figure: str,
            spot_note: str) -> str:
    """The cost line for ``hours`` on the job's nodes, on-demand and (interruptible pools) spot;
    the figures ``<figure>on_demand_usd`` / ``<figure>spot_usd`` recorded beside it."""
    on_demand = hours * spec.nodes * price.on_demand_usd_per_hour
    line = f"cost           {head}: on-demand {_usd(on_demand)} (${price.on_demand_usd_per_hour:.2f}/h)"
    report.figures[f"{figure}on_demand_usd"] = round(on_demand, 2)
    if job.interruptible:
        spot = hours * spec.nodes * price.spot_usd_per_hour
        line += f", spot ~{_usd(spot)} (assumes {SPOT_DISCOUNT:.0%} below on-demand{spot_note})"
        report.figures[f"{figure}spot_usd"] = round(spot, 2)
    return line


def _own_code_cost_bound(spec: JobSpec, job: ResolvedJob, price: Any, report: Preflight) -> None:
    """Own code: no step-time arithmetic (its model is unknown), but maxRuntime bounds the run
    (activeDeadlineSeconds stops the job), so nodes x maxRuntime x $/h bounds what it can cost."""
    hours = spec.max_runtime_seconds / 3600
    report.figures["max_run_hours"] = round(hours, 2)
    if price is None:
        report.lines.append(f"cost           not estimated: no price for {job.instance_type}")
        return
    line = _priced(spec, job, price, hours, report, figure="max_cost_", spot_note="",
                   head=f"at most {spec.nodes} x {job.instance_type} x {hours:g} h (maxRuntime {spec.max_runtime})")
    report.lines.append(line + "; your code's own run time is unknown to preflight: lower maxRuntime to lower the bound")
    report.lines.append(f"               prices: {SOURCE_URL} ({PRICES_AS_OF})")


def _check_checkpoint_time(spec: JobSpec, facts: PlatformFacts, job: ResolvedJob, shape: ModelShape,
                           report: Preflight) -> None:
    if not facts.fsx_write_mb_per_s:
        return
    store = facts.checkpoint_store or "FSx"
    # EFS's per-client rate is fixed (500 MiB/s): the platform-side fix there is FSx.
    faster_store = ("use datasets.storage fsx (FSx for Lustre) on this stack" if store == "EFS"
                    else f"raise the {store} throughput (storage capacity or per-unit throughput)")
    ckpt_bytes = shape.parameters * BYTES_PER_PARAMETER
    seconds = ckpt_bytes / (facts.fsx_write_mb_per_s * 1e6)
    report.lines.append(f"checkpoint     {_gib(ckpt_bytes)} state / {store} {facts.fsx_write_mb_per_s:,.0f} MB/s = {seconds:.1f} s; "
                        f"budget {spec.time_budget.checkpoint_seconds}s, pod grace {job.budget.grace_seconds}s")
    report.figures["checkpoint_seconds"] = round(seconds, 2)
    if seconds > spec.time_budget.checkpoint_seconds:
        report.problems.append(Problem("timeBudget.checkpointSeconds", spec.time_budget.checkpoint_seconds,
                                       f"saving {_gib(ckpt_bytes)} at {facts.fsx_write_mb_per_s:,.0f} MB/s takes ~{seconds:.0f} s, "
                                       "more than the budget: an interruption would kill the save",
                                       (f"{faster_store}, shard/async the save, or use on-demand (spot: false) with a larger budget")).does_not_fit())


# -- fixes that would actually work ---------------------------------------------------------------
def _total(shape: ModelShape, world: int, **changes: Any) -> float:
    return memory_per_gpu(dataclasses.replace(shape, **changes), world)["total"]


def memory_fix(shape: ModelShape, spec: JobSpec, pool: Any, usable: float, facts: PlatformFacts) -> str:
    """Only what this arithmetic says fits: each candidate change is re-estimated, and one that
    still does not fit is not offered. When nothing on the pool fits, say so and name the pools
    whose GPUs would."""
    world, per_node = spec.world_size, spec.gpus_per_node
    most_nodes = max(1, (pool.max_gpus or world) // per_node)
    fits: list[str] = []

    def offer(text: str, total: float) -> None:
        fits.append(f"{text} ({_gib(total)} per GPU)")

    checkpointed = {"activation_checkpointing": True}
    if shape.strategy != "fsdp" and world > 1 and (t := _total(shape, world, strategy="fsdp")) <= usable:
        offer("shard it with FSDP (parallelism.strategy=fsdp)", t)
    elif (shape.strategy != "fsdp" or not shape.activation_checkpointing) and world > 1 and \
            (t := _total(shape, world, strategy="fsdp", **checkpointed)) <= usable:
        offer("FSDP with activation checkpointing (parallelism.strategy=fsdp, parallelism.activation_checkpointing=true)", t)
    if not shape.activation_checkpointing and (t := _total(shape, world, **checkpointed)) <= usable:
        offer("activation checkpointing (parallelism.activation_checkpointing=true)", t)
    for micro in range(shape.micro_batch_size - 1, 0, -1):
        if (t := _total(shape, world, micro_batch_size=micro)) <= usable:
            offer(f"data.micro_batch_size={micro} (raise schedule.grad_accum_steps to keep the batch)", t)
            break
    if not fits:
        for nodes in range(spec.nodes + 1, most_nodes + 1):
            if (t := _total(shape, nodes * per_node, strategy="fsdp", **checkpointed)) <= usable:
                offer(f"FSDP with activation checkpointing over {nodes} nodes ({nodes * per_node} GPUs)", t)
                break
    if fits:
        return "; or ".join(fits)
    floor = _total(shape, most_nodes * per_node, strategy="fsdp", micro_batch_size=1, **checkpointed)
    bigger = sorted({p.name for p in facts.pools if GPU_TYPES[p.gpu_type].gpu_memory_gib * GIB * USABLE_MEMORY_FRACTION > floor})
    return (f"nothing on pool {pool.name} fits: even FSDP over all {most_nodes * per_node} GPUs it can launch, with activation "
            f"checkpointing and a micro-batch of 1, needs {_gib(floor)} per GPU; "
            + (f"use a pool with larger GPUs ({', '.join(bigger)})" if bigger else
               "no pool of this stack has GPUs that large: ask the platform team, or train a smaller model"))


def step_time_fix(step_seconds: float, shape: ModelShape, spec: JobSpec, job: ResolvedJob) -> str:
    """A change that brings the step inside the budget: a shorter step (fewer micro-batches per
    step) or, where the field and the grace period allow it, a larger budget."""
    from workloads.jobspec import TimeBudgetSpec
    from workloads.trainingjob import TimeBudget

    fixes = []
    field_max = TimeBudgetSpec.model_fields["max_step_seconds"].metadata
    limit = next((m.le for m in field_max if getattr(m, "le", None) is not None), 60)
    needed = math.ceil(step_seconds)
    if needed <= limit:
        budget = TimeBudget(needed, spec.time_budget.checkpoint_seconds)
        if not budget.problems(job.pool, interruptible=job.interruptible):
            fixes.append(f"timeBudget.maxStepSeconds: {needed} (pod grace {budget.grace_seconds}s still fits the pool)")
    per_micro = step_seconds / (shape.micro_batch_size * shape.grad_accum_steps)
    allowed = math.floor(spec.time_budget.max_step_seconds / per_micro) if per_micro > 0 else 0
    if allowed >= 1:
        if allowed >= shape.micro_batch_size:
            fixes.append(f"schedule.grad_accum_steps={allowed // shape.micro_batch_size} (fewer tokens per optimizer step)")
        else:
            fixes.append(f"data.micro_batch_size={allowed} and schedule.grad_accum_steps=1")
    if not fixes:
        fixes.append(f"even one sequence per GPU takes {per_micro:.1f} s here: use more GPUs with FSDP, a faster GPU "
                     "or a shorter data.seq_len")
    return "; or ".join(fixes)


# -- every mistake of a spec file, in one run ------------------------------------------------------
def _raw_facts_problems(raw: dict[str, Any], facts: PlatformFacts, already: set[str]) -> list[Problem]:
    """Stack facts (team, pool or GPU type, GPUs per node) checked from the raw mapping, when the
    schema refused the spec: in the same run as the schema's problems."""
    from types import SimpleNamespace

    problems = []
    team = raw.get("team")
    if isinstance(team, str) and "team" not in already and facts.team(team) is None:
        names = [t.name for t in facts.teams]
        problems.append(Problem("team", team, f"is not a team of stack {facts.stack}",
                                (f"{did_you_mean(team, names)} " if did_you_mean(team, names) else "") + f"use one of {names}"))
    pool, gpu_type = raw.get("pool"), raw.get("gpuType", raw.get("gpu_type"))
    if (isinstance(pool, str)) != (isinstance(gpu_type, str)) and not ({"pool", "gpuType", "pool/gpuType"} & already):
        pools, problem = candidate_pools(SimpleNamespace(pool=pool if isinstance(pool, str) else None,
                                                          gpu_type=gpu_type if isinstance(gpu_type, str) else None), facts)
        if problem:
            problems.append(problem)
        per_node = raw.get("gpusPerNode", raw.get("gpus_per_node"))
        if pools and isinstance(per_node, int) and "gpusPerNode" not in already and all(p.gpus_per_node < per_node for p in pools):
            problems.append(Problem("gpusPerNode", per_node, f"pool {pools[0].name}'s instances have {pools[0].gpus_per_node} GPUs per node",
                                    f"use gpusPerNode <= {pools[0].gpus_per_node} (and nodes to scale out)"))
    return problems


def _raw_trainer_problems(raw: dict[str, Any], repo_root: str, already: set[str]) -> list[Problem]:
    from workloads.jobspec import TrainerSpec

    trainer = raw.get("trainer")
    if not isinstance(trainer, dict) or any(p == "trainer" or p.startswith("trainer.") for p in already):
        return []
    try:
        parsed = TrainerSpec.model_validate(trainer)
    except Exception:  # the schema already reported it
        return []
    dataset = raw.get("dataset") if isinstance(raw.get("dataset"), str) else None
    return trainer_config(parsed, repo_root, dataset=dataset, checkpoint_dir="/fsx/checkpoints/preflight")[1]


def preflight_file(path: str, facts: PlatformFacts, *, repo_root: str, mfu: Optional[float] = None,
                   measurements_file: str = gpu_measurements.MEASUREMENTS_FILE) -> Preflight:
    """Every mistake of a job spec file in one run: the file (duplicate keys), the schema, the
    stack's facts (team, pool, GPU type), the trainer's own config checks, quota and fit. Raises
    ``SpecFileError`` only when the file cannot be read as YAML at all."""
    raw, problems = read_job_spec_file(path)
    header = f"Preflight of {path} on stack {facts.stack}"
    try:
        spec = parse_job_spec(raw, source=path)
    except JobSpecError as exc:
        problems += list(exc.problems)
        if isinstance(raw, dict):
            already = {p.path.split("[")[0] for p in problems} | {p.path for p in problems}
            problems += _raw_facts_problems(raw, facts, already)
            problems += _raw_trainer_problems(raw, repo_root, already)
        return Preflight(None, [header], problems)
    report = preflight(spec, facts, repo_root=repo_root, mfu=mfu, measurements_file=measurements_file)
    report.problems[:0] = problems
    return report


def _preflight_slice(spec: JobSpec, facts: PlatformFacts, job: ResolvedJob, report: Preflight, *, repo_root: str) -> Preflight:
    """A one-pod job on a GPU slice: placement, quota in slices, memory against the slice (not the
    whole GPU), and the slice's share of the instance price."""
    from workloads import gpu_sharing
    from workloads.gpu_sharing import GpuSharing, PoolSharing

    pool, gpu = job.pool, GPU_TYPES[job.pool.gpu_type]
    resource = spec.slice_resource or ""
    sharing = PoolSharing(GpuSharing(pool.sharing), time_slicing_replicas=int(pool.slices_per_node.get(resource, 1)) // pool.gpus_per_node
                          if pool.sharing == GpuSharing.TIME_SLICING.value else 1)
    memory_gib = gpu_sharing.slice_memory_gib(pool.gpu_type, gpu.gpu_memory_gib, sharing, resource)
    fraction = gpu_sharing.slice_fraction(sharing, resource)
    report.lines += [
        f"Preflight of job {spec.name} on stack {facts.stack} ({', '.join(facts.notes) or 'facts from the plan'})",
        f"placement      pool {pool.name}: one {resource} on a {job.instance_type} ({pool.sharing}; {job.slices_per_node} such "
        f"slices per node, {pool.gpus_per_node} {gpu.description})",
        f"queue          {job.team.namespace}/{job.team.local_queue}, priority {job.priority_class}",
        f"pod            {job.cpu} CPU, {job.memory_gib} GiB, /dev/shm {job.shm_gib} GiB; {job.budget.describe()}",
    ]
    quota = job.team.gpu_quota.get(pool.kueue_flavor or "", 0)
    report.lines.append(f"quota          1 slice requested; team {spec.team} has {quota} nominal slices on {pool.name}"
                        f"{' (may borrow idle slices)' if job.team.borrowing else ''}")
    if quota < 1 and not job.team.borrowing:
        report.problems.append(Problem("team", spec.team, f"team {spec.team} has no slice quota on {pool.name} and may not borrow",
                                       "ask the platform team for gpuQuota on the shared pool"))
    report.figures.update({"pool": pool.name, "instance_type": job.instance_type, "slice_resource": resource,
                           "gpu_memory_gib": memory_gib, "world_size": 1})
    shape, problems = trainer_shape(spec, repo_root)
    report.problems += problems
    if shape is not None:
        mem = memory_per_gpu(shape, 1)
        usable = memory_gib * GIB * USABLE_MEMORY_FRACTION
        isolation = ("MIG: its own memory, enforced" if pool.sharing == GpuSharing.MIG.value else
                     f"time-slicing: the GPU's {gpu.gpu_memory_gib} GiB is shared by {sharing.time_slicing_replicas} pods "
                     "with no isolation; this is the fair share")
        arithmetic = (f"{shape.parameters / 1e9:.2f}B params x {BYTES_PER_PARAMETER} B = {_gib(mem['state'])} state + "
                      f"{_gib(mem['activations'])} activations + {_gib(mem['logits'])} logits + {_gib(mem['reserve'])} CUDA "
                      f"= {_gib(mem['total'])}")
        report.lines.append(f"memory         {arithmetic}; the slice has {memory_gib:g} GiB ({USABLE_MEMORY_FRACTION:.0%} usable = "
                            f"{_gib(usable)}; {isolation}) [{shape.source}]")
        report.figures.update({"memory_per_gpu_gib": round(mem["total"] / GIB, 2), "usable_gpu_memory_gib": round(usable / GIB, 2)})
        if mem["total"] > usable:
            report.problems.append(Problem("gpu.slice" if spec.slice else "shared", spec.slice or True,
                                           f"does not fit: {arithmetic} > {_gib(usable)} usable on one {resource}",
                                           ("a larger MIG profile (e.g. 3g.40gb), " if spec.slice else "a MIG slice or a pool with fewer "
                                            "time-slices per GPU, ") + "a smaller micro-batch / activation checkpointing, or whole GPUs"))
    price = PRICES.get(job.instance_type)
    if price is not None:
        per_hour = gpu_sharing.usd_per_slice_hour(price.on_demand_usd_per_hour, pool.gpus_per_node, sharing, resource)
        report.lines.append(f"cost           ${per_hour:.4f}/slice-hour on-demand = {job.instance_type} "
                            f"${price.on_demand_usd_per_hour:.4f}/h / {pool.gpus_per_node} GPU(s) x {fraction:.4g} of a GPU"
                            + (f"; spot ~${per_hour * (1 - SPOT_DISCOUNT):.4f}" if job.interruptible else ""))
        report.lines.append(f"               prices: {SOURCE_URL} ({PRICES_AS_OF})")
        report.figures["usd_per_slice_hour"] = round(per_hour, 4)
    return report


# -- one preflight for every caller -----------------------------------------------------------
def check(spec: Any, facts: PlatformFacts, *, repo_root: str, mfu: Optional[float] = None, code: Optional[str] = None,
          store: Any = None, stack: Optional[str] = None) -> Preflight:
    """Preflight of a spec (a file path, or a parsed ``JobSpec``) plus what the platform checks
    before creating it: your own code's script and requirements (``code``: the directory of
    ``submit --code``), and ``initFrom``'s step against the checkpoint ``store``. The CLI, the
    Python client and sweeps pass the stack's store; the GitOps render passes ``store=None`` on
    purpose (a rendered tree is a function of the repository alone), and then ``initFrom`` is left
    to the pod, which refuses a missing step as a permanent failure."""
    report = (preflight_file(str(spec), facts, repo_root=repo_root, mfu=mfu) if isinstance(spec, (str, os.PathLike))
              else preflight(spec, facts, repo_root=repo_root, mfu=mfu))
    job_spec = report.job.spec if report.job is not None else None
    if job_spec is not None and code is not None:
        # Your code (submit --code DIR): the script torchrun starts is there and parses.
        from pathlib import Path

        from jobs.usercode import check_requirements, entry_point_problems

        if not Path(code).is_dir():
            report.problems.append(Problem("--code", str(code), "is not a directory", "give the directory holding your script"))
        problems, warnings = entry_point_problems(job_spec, code)
        report.problems += problems
        report.warnings += warnings
        if Path(code).is_dir() and (requirements := check_requirements(code)) is not None:
            report.lines.append(requirements.install_step(job_spec.namespace))
    if job_spec is not None and not report.problems and store is not None:
        # initFrom is read from the checkpoint store once everything else holds.
        problems, warnings = init_from_check(job_spec, store, stack=stack)
        report.problems += problems
        report.warnings += warnings
    elif job_spec is not None and getattr(job_spec, "init_from", None) and not report.problems:
        report.warnings.append(f"initFrom {job_spec.init_from} not checked: no checkpoint store to read")
    return report


def init_from_check(spec: JobSpec, store: Any, *, stack: Optional[str] = None) -> tuple[list[Problem], list[str]]:
    """(problems, warnings) of ``initFrom`` against the store; the spec's own rules ran when it
    loaded. A store that cannot be read (no credentials) is a warning: the pod checks it again and
    refuses a missing step as a permanent failure."""
    from jobs.store import StoreError
    from workloads.jobspec import init_from_path

    ref = getattr(spec, "init_from", None)
    if not ref:
        return [], []
    path = init_from_path(spec)
    job_dir, _, step = path.rpartition("/")
    try:
        steps = store.complete_steps(job_dir)
    except StoreError as exc:
        return [], [f"initFrom {ref} not checked: {exc}"]
    if int(step.removeprefix("step-")) not in steps:
        return [Problem("initFrom", ref, f"no complete checkpoint there (complete steps of that job: {steps or 'none'})",
                        f"name one of them; list them: python -m workloads checkpoints {job_dir.rsplit('/', 1)[-1]} "
                        f"--team {spec.team} --stack {stack or 'STACK'}")], []
    return [], []
