"""Will this job fit, how long will a step take, what will it cost? One screen, before any GPU.

Checks, each with its arithmetic in the message:

- GPUs per node: what the pool's instances offer (``trainingjob.resolve``).
- Memory per GPU: training state = parameters x 16 bytes (fp32 weights 4 + fp32 gradients 4 +
  AdamW first and second moments 8; bf16 autocast keeps fp32 master weights), divided by the
  world size under FSDP (DDP replicates it), plus activations (per layer s*b*h*34 bytes in bf16,
  Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", with
  fused attention; s*b*h*2 with activation checkpointing), fp32 logits and their gradient
  (s*b*V*8), and a fixed 2 GiB for the CUDA context and NCCL buffers; against 95% of the GPU's memory.
- World size vs the team's Kueue quota on the pool, and the pool's NodePool limit.
- Step time from FLOPs per token (6N + 12*L*h*s, as trainer/metrics.py) at an assumed MFU,
  run time for ``schedule.num_steps``, and its cost on-demand and on spot from workloads/prices.py.
- Checkpoint time: the whole state over the FSx write throughput, against the time budget.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional


from trainer.model_facts import GPT_SIZES, peak_tflops_for_gpu_type
from trainer.model_facts import flops_per_token as model_flops_per_token
from workloads.problems import Problem
from workloads import gpu_measurements
from workloads.gpu_catalog import GPU_TYPES
from workloads.jobspec import JobSpec, JobSpecError
from workloads.platform_facts import PlatformFacts
from workloads.prices import PRICES, PRICES_AS_OF, SOURCE_URL, SPOT_DISCOUNT
from workloads.trainingjob import ResolvedJob, resolve

BYTES_PER_PARAMETER = 16  # fp32 weights + fp32 grads + AdamW m and v
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

    def render(self) -> str:
        out = list(self.lines)
        out += [f"  ! {w}" for w in self.warnings]
        if self.problems:
            out.append(f"REFUSED: {len(self.problems)} problem(s)")
            out += [f"  - {p.render()}" for p in self.problems]
        else:
            out.append("OK: the job fits")
        return "\n".join(out)


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


def trainer_shape(spec: JobSpec, repo_root: str) -> tuple[Optional[ModelShape], list[Problem]]:
    """The model and batch from the trainer config file + overrides (the trainer's own parser)."""
    from trainer.config import ConfigError, build_config

    path = os.path.join(repo_root, spec.trainer.config)
    if not os.path.isfile(path):
        return None, [Problem("trainer.config", spec.trainer.config, "no such trainer config in this checkout",
                              "give a path relative to the repository root, e.g. trainer/configs/gpt2-124m.yaml")]
    try:
        cfg = build_config(path, list(spec.trainer.overrides), environ={})
    except ConfigError as exc:
        return None, [Problem("trainer", spec.trainer.config, "; ".join(exc.problems), "fix the trainer config or overrides")]
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
        source = "job spec model"
    if parameters is None:
        return None, [Problem("model.parameters", None, f"the trainer config uses a {m.kind} model whose size preflight cannot read",
                              "add model: {parameters: 8e9, numLayers: 32, hiddenSize: 4096} to the job spec")]
    return ModelShape(parameters, layers, hidden, vocab, d.seq_len, d.micro_batch_size, s.grad_accum_steps, s.num_steps,
                      par.strategy, par.activation_checkpointing, source), []


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
    try:
        job = resolve(spec, facts)
    except JobSpecError as exc:
        return Preflight(None, [f"Preflight of job {spec.name} on stack {facts.stack}"], list(exc.problems))
    report = Preflight(job, warnings=list(job.warnings))
    pool, gpu = job.pool, GPU_TYPES[job.pool.gpu_type]
    world = spec.world_size
    price = PRICES.get(job.instance_type)
    report.lines += [
        f"Preflight of job {spec.name} on stack {facts.stack} ({', '.join(facts.notes) or 'facts from the plan'})",
        f"placement      pool {pool.name}: {spec.nodes} x {job.instance_type} ({spec.gpus_per_node} of {pool.gpus_per_node} "
        f"{gpu.description} per node), {'spot or ' if job.interruptible else ''}{'/'.join(c for c in pool.capacity_types if c != 'spot') or 'spot'}"
        f"{', EFA x' + str(job.efa_devices) if job.efa_devices else ''}",
        f"queue          {job.team.namespace}/{job.team.local_queue}, priority {job.priority_class}",
        f"instance       {job.instance_type}{f' at ${price.on_demand_usd_per_hour:.2f}/h on-demand' if price else ''}"
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

    # -- quota ------------------------------------------------------------------------------
    quota = job.team.gpu_quota.get(pool.kueue_flavor or "", 0)
    report.lines.append(f"quota          {world} GPUs requested; team {spec.team} has {quota} nominal on {pool.name}"
                        f"{' (may borrow idle GPUs)' if job.team.borrowing else ''}; the pool launches at most {pool.max_gpus}")
    if pool.max_gpus and world > pool.max_gpus:
        report.problems.append(Problem("nodes", spec.nodes, f"{spec.nodes} x {spec.gpus_per_node} = {world} GPUs, more than pool "
                                       f"{pool.name} can ever launch ({pool.max_gpus})", f"use at most {pool.max_gpus // spec.gpus_per_node} nodes"))
    elif world > quota and not job.team.borrowing:
        report.problems.append(Problem("nodes", spec.nodes, f"{world} GPUs exceed team {spec.team}'s quota of {quota} on {pool.name} "
                                       "and the team may not borrow", f"use at most {quota // spec.gpus_per_node} nodes or raise the quota"))
    elif world > quota and world > (cohort := sum(t.gpu_quota.get(pool.kueue_flavor or "", 0) for t in job.facts.teams)):
        # Kueue lends only nominal quota of the cohort's ClusterQueues: it would never admit this.
        report.problems.append(Problem("nodes", spec.nodes, f"{world} GPUs exceed what the whole cohort holds on {pool.name} "
                                       f"({cohort}): Kueue can never admit the job, even by borrowing",
                                       f"use at most {cohort // spec.gpus_per_node} nodes or raise the quotas"))
    elif world > quota:
        # The namespace ResourceQuota of a borrowing team is the cohort's GPUs (infra.gpu_capacity),
        # so what Kueue admits by borrowing also gets its pods.
        report.warnings.append(f"{world} GPUs exceed the team's nominal {quota} on {pool.name}: admitted only while others' GPUs "
                               "are idle, and preempted when they reclaim them")

    # -- memory -------------------------------------------------------------------------------
    repo = repo_root
    shape, problems = trainer_shape(spec, repo)
    report.problems += problems
    if shape is None:
        return report
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
    measured = gpu_measurements.load(measurements_file)
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
        fixes = []
        if shape.strategy != "fsdp" and world > 1:
            fixes.append(f"shard it with FSDP (parallelism.strategy=fsdp: state {_gib(shape.parameters * BYTES_PER_PARAMETER / world)} per GPU)")
        fixes += ["more GPUs", "a GPU with more memory", "activation checkpointing / a smaller micro-batch"]
        report.problems.append(Problem("gpusPerNode", spec.gpus_per_node,
                                       f"does not fit: {arithmetic} > {_gib(usable)} usable on one {gpu.gpu_memory_gib} GiB {gpu.name}",
                                       "; or ".join(fixes)))

    # -- step time and cost -----------------------------------------------------------------------
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
    if price is not None:
        on_demand = hours * spec.nodes * price.on_demand_usd_per_hour
        line = (f"cost           {spec.nodes} x {job.instance_type} x {hours:.1f} h: on-demand {_usd(on_demand)} "
                f"(${price.on_demand_usd_per_hour:.2f}/h)")
        report.figures["cost_on_demand_usd"] = round(on_demand, 2)
        if job.interruptible:
            spot = hours * spec.nodes * price.spot_usd_per_hour
            line += f", spot ~{_usd(spot)} (assumes {SPOT_DISCOUNT:.0%} below on-demand, plus re-done steps after interruptions)"
            report.figures["cost_spot_usd"] = round(spot, 2)
        report.lines.append(line)
        report.lines.append(f"               prices: {SOURCE_URL} ({PRICES_AS_OF})")
    if step_seconds > spec.time_budget.max_step_seconds:
        report.problems.append(Problem("timeBudget.maxStepSeconds", spec.time_budget.max_step_seconds,
                                       f"the estimated step takes {step_seconds:.1f} s, longer than the budget the grace period is sized for",
                                       "lower data.micro_batch_size or schedule.grad_accum_steps, or raise maxStepSeconds (within the grace period)"))
    if hours * 3600 > spec.max_runtime_seconds:
        report.warnings.append(f"the estimated {hours:.1f} h exceed maxRuntime {spec.max_runtime}: the job will be stopped before the end")

    # -- checkpoint time ------------------------------------------------------------------------
    if facts.fsx_write_mb_per_s:
        ckpt_bytes = shape.parameters * BYTES_PER_PARAMETER
        seconds = ckpt_bytes / (facts.fsx_write_mb_per_s * 1e6)
        report.lines.append(f"checkpoint     {_gib(ckpt_bytes)} state / FSx {facts.fsx_write_mb_per_s:,.0f} MB/s = {seconds:.1f} s; "
                            f"budget {spec.time_budget.checkpoint_seconds}s, pod grace {job.budget.grace_seconds}s")
        report.figures["checkpoint_seconds"] = round(seconds, 2)
        if seconds > spec.time_budget.checkpoint_seconds:
            report.problems.append(Problem("timeBudget.checkpointSeconds", spec.time_budget.checkpoint_seconds,
                                           f"saving {_gib(ckpt_bytes)} at {facts.fsx_write_mb_per_s:,.0f} MB/s takes ~{seconds:.0f} s, "
                                           "more than the budget: an interruption would kill the save",
                                           "raise the FSx throughput, shard/async the save, or use on-demand (spot: false) with a larger budget"))
    return report
