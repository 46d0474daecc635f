"""Job spec + platform facts -> a Kubeflow ``PyTorchJob`` (or a Trainer v2 ``TrainJob``).

Pure functions (no Pulumi, no cluster): the ``submit`` command, the ``TrainingJob`` component,
the GitOps renderer and an Argo WorkflowTemplate step all call ``render`` the same way.

How a pod starts (Training Operator 1.9, pkg/controller.v1/pytorch/envvar.go and master.go):
the operator adds to every container ``PYTHONUNBUFFERED``, ``MASTER_ADDR`` (``<job>-master-0``),
``MASTER_PORT`` (the container port named ``pytorchjob-port``), ``PET_MASTER_ADDR``,
``PET_MASTER_PORT``, ``WORLD_SIZE`` (replicas x nprocPerNode), ``RANK`` and ``PET_NODE_RANK``
(0 for the master, index + 1 for workers), ``PET_NPROC_PER_NODE`` (``spec.nprocPerNode``) and
``PET_NNODES`` (replicas, when there is no elasticPolicy). The container runs
``python -m trainer.launch`` (torchrun under a launcher that turns "checkpointed after SIGTERM"
into exit 143) with torchrun's static-rendezvous arguments taken from those variables, so the
same arguments work under Trainer v2, whose torch plugin sets the same ``PET_*`` variables.
"""
from __future__ import annotations

import copy
import difflib
import posixpath
from dataclasses import dataclass, field
from typing import Any, Optional

from trainer.contract.environment import ENV_CHECKPOINT_DIR, ENV_CHECKPOINT_KEY_FILE, ENV_RUN_ID
from workloads.problems import Problem
from workloads.fsx import team_pod_volumes, team_subtree_path, team_volume_mounts
from workloads.gpu_catalog import GPU_TYPES, SPOT_NOTICE_SECONDS
from workloads.nodefit import DoesNotFit, PodSize, size_pod, slice_pod_size
from workloads.jobspec import JobSpec, JobSpecError, Runtime, k8s_literal, team_space_problems, trainer_value
from workloads.karpenter import CAPACITY_TYPE_KEY, EFA_RESOURCE, GPU_RESOURCE, GPU_TYPE_LABEL, POOL_LABEL, ZONE_KEY
from workloads.kueue import QUEUE_LABEL
from workloads.monitoring.stack import (
    TRAINER_METRICS_LABEL, TRAINER_METRICS_PORT, TRAINER_METRICS_PORT_NAME, TRAINJOB_METRICS_LABEL_VALUE,
)
from workloads.platform_facts import PlatformFacts, PoolFacts, TeamFacts
from workloads.scan_skips import skip_annotations
from workloads.scheduling import Priority, priority_class_name
from workloads import owncode, trainjob_runtime

PYTORCHJOB_API = "kubeflow.org/v1"
TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"
# The platform's torch runtime: the chart's torch-distributed plus a failure policy
# (workloads/trainjob_runtime.py; components/training.py installs it with Trainer v2).
TORCH_DISTRIBUTED_RUNTIME = trainjob_runtime.RUNTIME_NAME
TRAINJOB_CONTAINER = trainjob_runtime.CONTAINER  # the trainer container of the runtime
TRAINJOB_PATCH_MANAGER = "mlplatform.io/training-job"
# The operator finds the master port on this container / port name (kubeflow.org/v1 defaults).
CONTAINER_NAME = "pytorch"
PORT_NAME = "pytorchjob-port"
MASTER_PORT = 23456
TRAINER_UID = 1000  # the image's `trainer` user (trainer/Dockerfile)
# The image's entrypoint, spelled out so the pod's command is the whole truth (and runs locally).
LAUNCH_COMMAND = ("/usr/bin/tini", "--", "python", "-m", "trainer.launch")
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
# Instance families with GPUDirect RDMA over EFA (EC2 User Guide, "EFA and NCCL": p4d, p4de, p5, p5e, p5en).
# The team's checkpoint signing key (trainer/trust.py): a Secret in the team namespace
# (components.training.TeamTrainerAccess), mounted read-only as a file, never an env var.
CHECKPOINT_KEY_SECRET = "checkpoint-signing"
CHECKPOINT_KEY_ITEM = "key"
CHECKPOINT_KEY_MOUNT = "/var/run/secrets/mlplatform/checkpoint-signing"
RDMA_FAMILIES = ("p4d.", "p4de.", "p5.", "p5e.", "p5en.")


# -- the time budget -----------------------------------------------------------------------
@dataclass(frozen=True)
class TimeBudget:
    """SIGTERM -> checkpoint -> exit, innermost first (docs/trainer.md, "Spot interruptions and exit 143").

    torchrun's shutdown timeout covers finishing the current step, saving, and flushing
    MLflow; the pod's grace period adds a margin so that torchrun, not the kubelet, kills
    stragglers and the launcher still exits 143. Both stay below the pool's NodePool
    terminationGracePeriod (Karpenter force-drains after it) and, on spot, the 120 s notice.
    """

    max_step_seconds: int
    checkpoint_seconds: int
    tracking_flush_seconds: int = 10  # trainer.tracking: MLflow gets up to 10 s to flush
    margin_seconds: int = 5

    @property
    def shutdown_timeout_seconds(self) -> int:
        return self.max_step_seconds + self.checkpoint_seconds + self.tracking_flush_seconds + self.margin_seconds

    @property
    def grace_seconds(self) -> int:
        return self.shutdown_timeout_seconds + self.margin_seconds

    def describe(self) -> str:
        return (f"step {self.max_step_seconds}s + checkpoint {self.checkpoint_seconds}s + MLflow flush "
                f"{self.tracking_flush_seconds}s + margin {self.margin_seconds}s = torchrun shutdown "
                f"{self.shutdown_timeout_seconds}s; pod grace {self.grace_seconds}s")

    def problems(self, pool: PoolFacts, *, interruptible: bool) -> list[Problem]:
        out = []
        if self.grace_seconds >= pool.termination_grace_period_seconds:
            out.append(Problem(
                "timeBudget.checkpointSeconds", self.checkpoint_seconds,
                f"{self.describe()}, which is not below pool {pool.name}'s NodePool terminationGracePeriod "
                f"({pool.termination_grace_period_seconds}s): Karpenter would kill the pod mid-save",
                f"save faster (async/sharded checkpoints) so the grace period stays below "
                f"{pool.termination_grace_period_seconds}s, or raise the pool's terminationGracePeriodSeconds"))
        if interruptible and self.grace_seconds >= SPOT_NOTICE_SECONDS:
            out.append(Problem(
                "timeBudget.checkpointSeconds", self.checkpoint_seconds,
                f"{self.describe()}, not below the {SPOT_NOTICE_SECONDS} s spot notice",
                f"bring step + checkpoint under {SPOT_NOTICE_SECONDS - self.tracking_flush_seconds - 2 * self.margin_seconds}s, "
                "or set spot: false"))
        return out


# -- resolving a spec against the platform ----------------------------------------------------
@dataclass(frozen=True)
class ResolvedJob:
    spec: JobSpec
    facts: PlatformFacts
    pool: PoolFacts
    team: TeamFacts
    priority_class: str
    budget: TimeBudget
    interruptible: bool  # may land on spot
    warnings: tuple[str, ...] = field(default_factory=tuple)

    pod: Optional[PodSize] = None  # set by resolve()

    @property
    def size(self) -> PodSize:
        assert self.pod is not None, "resolve() sizes the pod"
        return self.pod

    @property
    def instance_type(self) -> str:
        """The cheapest of the pool's instance types that fits the pod (what Karpenter launches)."""
        return self.size.instance_type

    @property
    def whole_node(self) -> bool:
        return self.spec.gpus_per_node == self.pool.gpus_per_node

    @property
    def efa_devices(self) -> int:
        # A job sharing a node cannot own its EFA devices; NCCL then uses TCP (preflight warns).
        return self.pool.efa_devices_per_node if self.whole_node else 0

    @property
    def slices_per_node(self) -> int:
        """Pods of this slice size one node of the pool holds (0 for whole-GPU jobs)."""
        resource = self.spec.slice_resource
        return int(self.pool.slices_per_node.get(resource, 0)) if resource else 0

    def _slice_size(self) -> tuple[int, int]:
        # Kueue grants a team's slice quota in the same pods (workloads.kueue, shared flavors).
        return slice_pod_size(self.pool.instance_types, sum(self.pool.slices_per_node.values()))

    @property
    def cpu(self) -> str:
        """The pod's CPU as a Kubernetes quantity ("3" or "2900m")."""
        if self.spec.slice_resource:
            millicores = self._slice_size()[0]
            cores, rest = divmod(millicores, 1000)
            return str(cores) if rest == 0 else f"{millicores}m"
        return self.size.cpu_quantity

    @property
    def memory_gib(self) -> int:
        if self.spec.slice_resource:
            return self._slice_size()[1]
        return self.size.memory_gib

    @property
    def shm_gib(self) -> int:
        if self.spec.slice_resource:
            # A memory-backed emptyDir counts against the container's memory limit.
            return max(1, self.memory_gib // 4)
        return self.size.shm_gib


def _candidate_pools(spec: JobSpec, facts: PlatformFacts) -> tuple[list[PoolFacts], Optional[Problem]]:
    if spec.pool is not None:
        pool = facts.pool(spec.pool)
        if pool is None:
            names = [p.name for p in facts.pools]
            close = difflib.get_close_matches(spec.pool, names, n=1)
            return [], Problem("pool", spec.pool, f"is not a GPU pool of stack {facts.stack}",
                               (f"did you mean {close[0]!r}? " if close else "") + f"use one of {names}")
        return [pool], None
    exact = [p for p in facts.pools if p.gpu_type == spec.gpu_type]
    if exact:
        return exact, None
    # "a100" asks for an A100; an A100 80 GB pool (same Karpenter GPU name) satisfies it.
    wanted = GPU_TYPES.get(spec.gpu_type or "")
    if wanted is not None:
        same_gpu = [p for p in facts.pools if GPU_TYPES[p.gpu_type].karpenter_gpu_name == wanted.karpenter_gpu_name
                    and GPU_TYPES[p.gpu_type].gpu_memory_gib >= wanted.gpu_memory_gib]
        if same_gpu:
            return same_gpu, None
    offered = sorted({p.gpu_type for p in facts.pools})
    return [], Problem("gpuType", spec.gpu_type, f"no GPU pool of stack {facts.stack} offers it",
                       f"use one of {offered}, or ask the platform team for a pool")


candidate_pools = _candidate_pools  # for checks of a spec the schema refused (jobs.preflight)


def resolve(spec: JobSpec, facts: PlatformFacts) -> ResolvedJob:
    """Pick the pool, team, queue and priority; raise ``JobSpecError`` with every problem."""
    job, problems = resolve_with_problems(spec, facts)
    if problems:
        raise JobSpecError(f"job {spec.name}", problems)
    assert job is not None
    return job


def resolve_with_problems(spec: JobSpec, facts: PlatformFacts) -> tuple[Optional[ResolvedJob], list[Problem]]:
    """The resolved job (whenever a pool, a team and a pod size were found) and every problem:
    preflight goes on to the quota and fit checks in the same run as the other problems."""
    warnings: list[str] = []
    team = facts.team(spec.team)
    problems = _unknown_team_problems(spec, facts) if team is None else []
    pool, pool_problems = _pick_pool(spec, facts, team)
    problems += pool_problems
    if pool is not None and spec.gpus_per_node < pool.gpus_per_node and spec.nodes > 1:
        warnings.append(f"{spec.gpus_per_node} of {pool.gpus_per_node} GPUs per node on {spec.nodes} nodes: pods share "
                        f"nodes{' and cannot own the EFA devices (NCCL over TCP)' if pool.efa else ''}; use whole nodes")
    if team is not None:
        problems += _team_readiness_problems(spec, team)
    priority_class, priority_problems = _priority_class(spec, facts, team)
    problems += priority_problems
    problems += team_space_problems(spec)
    problems += _storage_and_runtime_problems(spec, facts)
    budget = TimeBudget(spec.time_budget.max_step_seconds, spec.time_budget.checkpoint_seconds)
    interruptible = bool(pool and spec.spot and pool.offers_spot)
    if pool is not None:
        problems += [p.does_not_fit() for p in budget.problems(pool, interruptible=interruptible)]
    pod = None
    if pool is not None:
        pod, problem = _size(spec, pool)
        if problem:
            problems.append(problem)
        elif pod.source == "spec" and pool.cpu_per_gpu and pod.cpu_millicores > pool.cpu_per_gpu * 1000 * spec.gpus_per_node:
            warnings.append(f"{pod.cpu_quantity} CPU exceed the team's Kueue share of {pool.cpu_per_gpu:g} per GPU: "
                            "admitted only while the cohort has idle CPU quota")
    if pool is None or team is None or pod is None:
        return None, problems
    return ResolvedJob(spec, facts, pool, team, priority_class, budget, interruptible, tuple(warnings), pod), problems


def _unknown_team_problems(spec: JobSpec, facts: PlatformFacts) -> list[Problem]:
    names = [t.name for t in facts.teams]
    close = difflib.get_close_matches(spec.team, names, n=1)
    return [Problem("team", spec.team, f"is not a team of stack {facts.stack}",
                    (f"did you mean {close[0]!r}? " if close else "") + f"use one of {names}")]


def _pick_pool(spec: JobSpec, facts: PlatformFacts, team: Optional[TeamFacts]) -> tuple[Optional[PoolFacts], list[Problem]]:
    """The pool the job runs on: one that offers its slice (or whole GPUs), enough GPUs per node
    and its capacity type, the team's quota deciding between several; else why none does."""
    problems: list[Problem] = []
    pools, problem = _candidate_pools(spec, facts)
    if problem:
        problems.append(problem)
    # A slice request goes only to a pool that offers that slice; a whole-GPU job never to a
    # shared pool (Kueue's flavors refuse both the other way round too: workloads.kueue).
    wanted = spec.slice_resource
    matching = [p for p in pools if (wanted in p.slices_per_node if wanted else not p.shared)]
    if pools and not matching:
        offered = sorted({r for p in facts.pools for r in p.slices_per_node})
        if wanted:
            problems.append(Problem("gpu.slice" if spec.slice else "shared", spec.slice or True,
                                    f"no {'pool ' + spec.pool if spec.pool else spec.gpu_type + ' pool'} of stack {facts.stack} "
                                    f"offers {wanted}", f"ask for one of {offered or 'nothing: no pool shares GPUs'}"))
        else:
            problems.append(Problem("pool", spec.pool, f"pool {spec.pool} shares its GPUs ({pools[0].sharing}): it runs "
                                    f"slice requests only", f"add gpu.slice or shared: true for one of {offered}, or pick a "
                                    "whole-GPU pool"))
    pools = matching
    fitting = [p for p in pools if p.gpus_per_node >= spec.gpus_per_node]
    if pools and not fitting:
        problems.append(Problem("gpusPerNode", spec.gpus_per_node,
                                f"pool {pools[0].name}'s instances ({', '.join(pools[0].instance_types)}) have "
                                f"{pools[0].gpus_per_node} GPUs per node",
                                f"use gpusPerNode <= {pools[0].gpus_per_node} (and nodes to scale out)"))
    if not spec.spot and fitting:
        non_spot = [p for p in fitting if set(p.capacity_types) - {"spot"}]
        if not non_spot:
            problems.append(Problem("spot", False, f"pool {fitting[0].name} offers only spot capacity",
                                    "set spot: true (the job resumes from checkpoints) or pick a pool with on-demand"))
        fitting = non_spot
    if not fitting:
        return None, problems
    with_quota = [p for p in fitting if team and team.gpu_quota.get(p.kueue_flavor or "", 0) > 0]
    return (with_quota or fitting)[0], problems


def _team_readiness_problems(spec: JobSpec, team: TeamFacts) -> list[Problem]:
    """What the team's namespace lacks for a job to run there."""
    return [Problem("team", spec.team, f"namespace {team.namespace} has no {what}", fix) for what, ok, fix in (
        ("a Kueue LocalQueue", team.local_queue, "the scheduling capability creates it (scheduling.teams)"),
        ("the FSx claim", team.has_fsx_claim, "configure datasets in the stack"),
        ("the MLflow Secret", team.tracking_secret, "configure tracking in the stack"),
        ("the trainer service account", team.trainer_service_account, "deploy the training capability"),
    ) if not ok]


def _priority_class(spec: JobSpec, facts: PlatformFacts, team: Optional[TeamFacts]) -> tuple[str, list[Problem]]:
    """The job's PriorityClass (its priority, else the team's default) and why it may not have it."""
    priority = spec.priority
    if priority is None and team is not None and team.default_priority_class:
        priority_class = team.default_priority_class
    else:
        priority_class = priority_class_name(priority or Priority.DEFAULT)
    if priority_class not in facts.priority_classes:
        return priority_class, [Problem("priority", priority.value if priority else None,
                                        f"PriorityClass {priority_class} does not exist in stack {facts.stack}",
                                        f"use one of {[p.removeprefix('training-') for p in facts.priority_classes]}")]
    if team is not None and team.allowed_priority_classes and priority_class not in team.allowed_priority_classes:
        # The team admission policy refuses it on the cluster (workloads.tenancy); say so here first.
        return priority_class, [Problem("priority", priority.value if priority else None,
                                        f"team {spec.team} is not entitled to {priority_class}",
                                        f"use one of {[p.removeprefix('training-') for p in team.allowed_priority_classes]}")]
    return priority_class, []


def _storage_and_runtime_problems(spec: JobSpec, facts: PlatformFacts) -> list[Problem]:
    """The checkpoint directory, the S3 mirror, the job's own code and the runtime against the stack."""
    problems: list[Problem] = []
    team_root = team_checkpoint_root(spec.namespace)
    if not spec.checkpoint_path.startswith(team_root + "/"):
        problems.append(Problem("checkpointDir", spec.checkpoint_dir,
                                f"is outside {team_root}/, the team's writable checkpoint directory (exported to its "
                                "prefix of the checkpoints bucket)", f"use a path under {team_root}/, or leave it out"))
    if spec.s3_mirror is True and not facts.checkpoints_bucket:
        problems.append(Problem("s3Mirror", True, f"stack {facts.stack} has no checkpoints bucket",
                                "set s3Mirror: false or configure datasets"))
    problems += owncode.problems(spec, checkpoints_bucket=facts.checkpoints_bucket, stack=facts.stack)
    if spec.runtime is Runtime.TRAINJOB and not facts.trainer_v2_runtime:
        problems.append(Problem("runtime", spec.runtime.value, f"Trainer v2 is not installed in stack {facts.stack}",
                                "use runtime: pytorchjob, or enable training.trainerV2 in the stack"))
    return problems


def _size(spec: JobSpec, pool: PoolFacts) -> tuple[Optional[PodSize], Optional[Problem]]:
    """The pod's size on the smallest instance of the pool that fits it (workloads/nodefit.py)."""
    wanted = spec.resources
    try:
        return size_pod(pool.instance_types, node_gpus=pool.gpus_per_node, gpus=min(spec.gpus_per_node, pool.gpus_per_node),
                        cpu_per_gpu=wanted.cpu_per_gpu if wanted else None,
                        memory_gib_per_gpu=wanted.memory_gib_per_gpu if wanted else None,
                        shm_gib=wanted.shm_gib if wanted else None,
                        kueue_cpu_per_gpu=pool.cpu_per_gpu, kueue_memory_gib_per_gpu=pool.memory_gib_per_gpu), None
    except DoesNotFit as exc:
        return None, Problem(exc.field, exc.value, exc.message, exc.fix).does_not_fit()


# -- the pod ---------------------------------------------------------------------------------
def trainer_args(job: ResolvedJob) -> list[str]:
    """torchrun's arguments from the operator's variables, then the trainer command."""
    spec = job.spec
    torchrun = [
        "--nnodes=$(PET_NNODES)", "--nproc-per-node=$(PET_NPROC_PER_NODE)", "--node-rank=$(PET_NODE_RANK)",
        "--master-addr=$(PET_MASTER_ADDR)", "--master-port=$(PET_MASTER_PORT)",
        # A failed rank fails the pod; the operator restarts it (restartPolicy ExitCode) and the
        # trainer resumes. torchrun counts restarts per node, so multi-node jobs rely on pod
        # restarts rather than torchrun's (docs/trainer.md).
        "--max-restarts=0",
        f"--shutdown-timeout={job.budget.shutdown_timeout_seconds}",
    ]
    if spec.trainer is None:
        # Your own code: the same launcher and torchrun options, then your script or module.
        return torchrun + owncode.torchrun_target(spec)
    # The spec's own strings reach the trainer verbatim (trainer_value: its overrides are YAML).
    overrides = [f"data.dir={trainer_value(spec.dataset)}", *spec.trainer.overrides]
    if spec.run_name:
        overrides.append(f"tracking.run_name={trainer_value(spec.run_name)}")
    if spec.init_from:
        # The trainer's initial load (trainer/train.py _initial_load): weights of the other job's
        # step while this job has no checkpoint of its own; its own checkpoints win on a restart.
        overrides.append(f"checkpoint.initial_load_path={trainer_value(spec.init_from_path)}")
    # Every string from the spec is passed literally: no `$(SECRET_VAR)` expansion by the kubelet.
    overrides = [k8s_literal(o) for o in overrides]
    return [
        *torchrun,
        "-m", "trainer", "train", "--config", k8s_literal(spec.trainer.config), *overrides,
    ]


# In every team namespace the platform's deployed names (components/training.py): the checkpoints
# bucket's real name is known only after `up` (Pulumi names it), so a job reads it here instead of
# carrying the plan's name, and so does the job client of a team member without the stack's state.
PLATFORM_CONFIGMAP = "mlplatform-platform"
PLATFORM_BUCKET_KEY = "checkpointsBucket"
BUCKET_ENV = "MLPLATFORM_CHECKPOINTS_BUCKET"


def platform_config_map(namespace: str, checkpoints_bucket: Any) -> dict[str, Any]:
    """The deployed names a team's pods and its members' tools read (``checkpoints_bucket``: the
    bucket's name, a Pulumi output where deployed)."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": PLATFORM_CONFIGMAP, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "pulumi"}},
            "data": {PLATFORM_BUCKET_KEY: checkpoints_bucket}}


def mirrors_to_s3(spec: JobSpec, facts: PlatformFacts) -> bool:
    """Does the trainer mirror complete checkpoints to S3: as the spec says, else where the stack
    keeps checkpoints on EFS, which nothing exports (the mirror is then the only copy readable from
    outside the cluster: ``checkpoints``, ``initFrom``, the restore drill)."""
    if spec.s3_mirror is not None:
        return spec.s3_mirror and bool(facts.checkpoints_bucket)
    return facts.checkpoint_store == "EFS" and bool(facts.checkpoints_bucket)


def _secret_env(name: str, secret: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": name}}}


def trainer_env(job: ResolvedJob) -> list[dict[str, Any]]:
    spec, facts = job.spec, job.facts
    digest = spec.image.split("@", 1)[1] if "@" in spec.image else spec.image
    env = [
        {"name": ENV_CHECKPOINT_DIR, "value": k8s_literal(spec.checkpoint_path)},
        # Stable job identity: a recreated pod finds its MLflow run by it.
        {"name": ENV_RUN_ID, "value": f"{spec.namespace}.{spec.name}"},
        # A team's MLflow login may create experiments only under its prefix <namespace>/ and
        # sees nothing else unless granted (docker/mlflow/mlflow_team_auth.py).
        {"name": "MLFLOW_EXPERIMENT_NAME", "value": k8s_literal(spec.experiment_name)},
        {"name": "DATASET_VERSION", "value": k8s_literal(posixpath.basename(spec.dataset))},
        {"name": "IMAGE_DIGEST", "value": digest},
        {"name": "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "value": str(job.budget.shutdown_timeout_seconds)},
        {"name": ENV_CHECKPOINT_KEY_FILE, "value": f"{CHECKPOINT_KEY_MOUNT}/{CHECKPOINT_KEY_ITEM}"},
        {"name": "AWS_REGION", "value": facts.region},
        {"name": "AWS_DEFAULT_REGION", "value": facts.region},
        # The node a GPU fault happened on, for the termination message the launcher writes
        # (trainer/launch.py report_gpu_fault): the downward API's spec.nodeName.
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]
    if mirrors_to_s3(spec, facts):
        # The bucket's deployed name from the namespace's platform ConfigMap, expanded by the
        # kubelet ("Define dependent environment variables": $(VAR) of a variable defined above).
        env += [{"name": BUCKET_ENV, "valueFrom": {"configMapKeyRef": {"name": PLATFORM_CONFIGMAP, "key": PLATFORM_BUCKET_KEY}}},
                {"name": "TRAINER_CHECKPOINT_S3_URI",
                 "value": f"s3://$({BUCKET_ENV})/{spec.namespace}/mirror/{k8s_literal(spec.name)}"}]
    env += [_secret_env(key, job.team.tracking_secret or "") for key in facts.tracking_secret_keys]
    if job.efa_devices:
        # libfabric's EFA provider (the aws-ofi-nccl plugin of the image uses it).
        env += [{"name": "FI_PROVIDER", "value": "efa"}, {"name": "FI_EFA_FORK_SAFE", "value": "1"}]
        if job.instance_type.startswith(RDMA_FAMILIES):
            # GPUDirect RDMA between GPU and EFA exists on the P instances only (not on g5/g6/g6e).
            env += [{"name": "FI_EFA_USE_DEVICE_RDMA", "value": "1"}, {"name": "NCCL_NET_GDR_LEVEL", "value": "SYS"}]
    else:
        # No EFA: NCCL's socket transport on the pod's VPC CNI interface.
        env.append({"name": "NCCL_SOCKET_IFNAME", "value": "eth0"})
    env.append({"name": "NCCL_DEBUG", "value": "WARN"})
    if spec.own_code:
        env += owncode.env(spec)
    return env + team_runtime_env(spec.namespace)


def team_runtime_env(namespace: str) -> list[dict[str, Any]]:
    """The image points its compiler caches and NCCL dumps at /fsx/cache and /fsx/debug, which
    were on the shared file system's root: one team's Triton/Inductor cache would be another
    team's code. Pods now mount only their team's subtree, and run as the team's uid (which has
    no passwd entry in the image), so caches and dumps go to the team's own tree, HOME to /tmp,
    and USER is set (torch's cache naming calls getpass.getuser(), which fails without either)."""
    root = team_subtree_path(namespace)
    return [
        {"name": "TORCHINDUCTOR_CACHE_DIR", "value": f"{root}/.cache/torchinductor"},
        {"name": "TRITON_CACHE_DIR", "value": f"{root}/.cache/triton"},
        {"name": "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "value": f"{root}/.debug/nccl_trace_rank_"},
        {"name": "TORCH_FR_DUMP_TEMP_FILE", "value": f"{root}/.debug/nccl_trace_rank_"},
        {"name": "HOME", "value": "/tmp"},
        {"name": "USER", "value": "trainer"},
    ]


def resources(job: ResolvedJob) -> dict[str, Any]:
    gpu = {job.spec.slice_resource: "1"} if job.spec.slice_resource else {GPU_RESOURCE: str(job.spec.gpus_per_node)}
    amounts = {"cpu": job.cpu, "memory": f"{job.memory_gib}Gi", **gpu}
    if job.efa_devices:
        amounts[EFA_RESOURCE] = str(job.efa_devices)
    # requests == limits: Guaranteed QoS, and the LimitRange never adds limits of its own.
    return {"requests": dict(amounts), "limits": dict(amounts)}


def team_uid(job: ResolvedJob) -> int:
    """The team's uid/gid (its namespace's label); the admission policy refuses any other."""
    return job.team.posix_id if job.team.posix_id is not None else TRAINER_UID


def container_security_context(uid: int = TRAINER_UID) -> dict[str, Any]:
    # No capability is added for EFA: libfabric needs only locked memory (RLIMIT_MEMLOCK), which
    # the node's container runtime grants; IPC_LOCK would also be refused by the namespaces'
    # Pod Security "restricted" level. The trainer writes only to /fsx and /dev/shm.
    return {"allowPrivilegeEscalation": False, "privileged": False, "runAsNonRoot": True,
            "runAsUser": uid, "runAsGroup": uid,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def pod_security_context(uid: int = TRAINER_UID) -> dict[str, Any]:
    # fsGroup: the team's gid (the policy requires it); OnRootMismatch never walks a large tree.
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "fsGroup": uid,
            "fsGroupChangePolicy": "OnRootMismatch", "seccompProfile": {"type": "RuntimeDefault"}}


def volumes(job: ResolvedJob) -> list[dict[str, Any]]:
    return [
        # NCCL and DataLoader workers share memory through /dev/shm; the default 64 MiB is too small.
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{job.shm_gib}Gi"}},
        *team_pod_volumes(claim_name=job.facts.fsx_claim_name),
        {"name": "checkpoint-key", "secret": {"secretName": CHECKPOINT_KEY_SECRET,
                                              "items": [{"key": CHECKPOINT_KEY_ITEM, "path": CHECKPOINT_KEY_ITEM}]}},
    ]


def volume_mounts(namespace: str) -> list[dict[str, Any]]:
    # The team's own subtree and the datasets (read-only), at the paths they have on the file
    # system, and the team's checkpoint signing key.
    return [{"name": "dshm", "mountPath": "/dev/shm"}, *team_volume_mounts(namespace),
            {"name": "checkpoint-key", "mountPath": CHECKPOINT_KEY_MOUNT, "readOnly": True}]


def node_selector(job: ResolvedJob) -> dict[str, str]:
    labels = job.pool.node_labels
    return {POOL_LABEL: labels[POOL_LABEL], GPU_TYPE_LABEL: labels[GPU_TYPE_LABEL]}


def affinity(job: ResolvedJob) -> Optional[dict[str, Any]]:
    out: dict[str, Any] = {}
    if not job.spec.spot and job.pool.offers_spot:
        out["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": CAPACITY_TYPE_KEY, "operator": "NotIn", "values": ["spot"]}]}]}}
    if job.spec.nodes > 1:
        # Every pod of a multi-node job in one Availability Zone: EFA gives OS-bypass communication
        # "with other instances in the same subnet" (AWS docs, "Elastic Fabric Adapter"), and a
        # subnet lies in one AZ; without EFA, all-reduce across AZs pays latency and $0.01/GB each
        # way. The first pod matches its own term, so it may go anywhere (Kubernetes "Inter-pod
        # affinity": a pod whose affinity selects itself schedules when no other pod matches);
        # Karpenter launches the rest in that zone (karpenter.sh "Scheduling": pod affinity on
        # topology.kubernetes.io/zone is supported). A pool's own zone list (NodePool requirement
        # topology.kubernetes.io/zone) still bounds the choice. Karpenter learns the zone from pods
        # already bound to nodes (v1.14.1 scheduling/topology.go countDomains skips unbound pods);
        # until one is, it picks "a domain at random to bootstrap scheduling" (topologygroup.go
        # nextDomainAffinity), so a job's nodes can land in two zones: runbook failing-job, step 2.
        out["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {JOB_LABEL: job.spec.name}}, "topologyKey": ZONE_KEY}]}
    return out or None


def tolerations(job: ResolvedJob) -> list[dict[str, Any]]:
    return [{"key": t["key"], "operator": "Exists", "effect": t["effect"]} for t in job.pool.taints]


JOB_LABEL = "mlplatform.io/job"


def pod_labels(job: ResolvedJob) -> dict[str, str]:
    return {"app.kubernetes.io/name": "training-job", "app.kubernetes.io/managed-by": "mlplatform",
            JOB_LABEL: job.spec.name, "mlplatform.io/team": job.spec.team, "mlplatform.io/pool": job.pool.name}


# checkov's pod checks that a training pod fails by design, each with its reason (the security
# scan, infra/plan/security_scan.py, reads Argo CD's committed jobs as pods and refuses a bare skip).
TRAINING_POD_CHECKOV_SKIPS = (
    ("CKV_K8S_8", "a batch training pod: its liveness is its exit code (restartPolicy ExitCode); a probe would "
                  "kill a long compile or checkpoint, and a hung step is the stall alert's"),
    ("CKV_K8S_9", "no Service routes to a training pod: readiness gates nothing"),
    ("CKV_K8S_15", "IfNotPresent: the platform's ECR tags are immutable (components/images.py), and Always "
                   "would re-pull a multi-GB image on every restart after a preemption"),
    ("CKV_K8S_22", "the trainer writes temporary files under its HOME, /tmp, in its root file system"),
    ("CKV_K8S_35", "MLflow's client reads its login only from MLFLOW_TRACKING_USERNAME/PASSWORD"),
    ("CKV_K8S_38", "EKS Pod Identity authenticates the pod with its projected service account token"),
    ("CKV_K8S_43", "jobs name the platform's immutable ECR tags (components/images.py): a tag is one digest"),
)


def pod_annotations(job: ResolvedJob) -> dict[str, str]:
    # Karpenter never voluntarily disrupts (consolidation, drift) a node running this pod.
    return {DO_NOT_DISRUPT: "true", "mlplatform.io/time-budget": job.budget.describe(),
            **skip_annotations(TRAINING_POD_CHECKOV_SKIPS)}


def pod_template(job: ResolvedJob) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": CONTAINER_NAME, "image": job.spec.image, "imagePullPolicy": "IfNotPresent",
        "command": list(LAUNCH_COMMAND), "args": trainer_args(job), "env": trainer_env(job),
        "ports": [{"name": PORT_NAME, "containerPort": MASTER_PORT, "protocol": "TCP"}],
        "resources": resources(job), "volumeMounts": volume_mounts(job.spec.namespace),
        "securityContext": container_security_context(team_uid(job)),
    }
    spec: dict[str, Any] = {
        "priorityClassName": job.priority_class,
        "serviceAccountName": job.team.trainer_service_account,
        "terminationGracePeriodSeconds": job.budget.grace_seconds,
        "nodeSelector": node_selector(job),
        "tolerations": tolerations(job),
        "securityContext": pod_security_context(team_uid(job)),
        "containers": [container],
        "volumes": volumes(job),
    }
    if owncode.volume(job.spec) is not None:
        spec["volumes"].append(owncode.volume(job.spec))
        container["volumeMounts"].append(owncode.volume_mount(job.spec))
    if affinity(job):
        spec["affinity"] = affinity(job)
    return {"metadata": {"labels": pod_labels(job), "annotations": pod_annotations(job)}, "spec": spec}


def job_labels(job: ResolvedJob) -> dict[str, str]:
    return {QUEUE_LABEL: job.team.local_queue or "", "mlplatform.io/team": job.spec.team,
            "mlplatform.io/pool": job.pool.name, "app.kubernetes.io/managed-by": "mlplatform"}


# -- the team's checkpoint directory ------------------------------------------------------------
def team_checkpoint_root(namespace: str) -> str:
    """Where a team's jobs checkpoint on FSx; the /checkpoints association exports it to the
    team's prefix of the checkpoints bucket (the prefix its trainer role may use). It is the
    team's own volume (workloads.fsx): nothing outside it is writable from the team's pods."""
    return team_subtree_path(namespace)


# -- PyTorchJob -------------------------------------------------------------------------------
def with_health_endpoint(template: dict[str, Any], job_name: str) -> dict[str, Any]:
    """The Master pod holds rank 0, which serves the trainer's health (trainer/health.py): its
    port, and the label the platform's PodMonitor selects (workloads/monitoring/stack.py)."""
    out = copy.deepcopy(template)
    out["metadata"]["labels"][TRAINER_METRICS_LABEL] = "true"
    container = out["spec"]["containers"][0]
    container["ports"].append({"name": TRAINER_METRICS_PORT_NAME, "containerPort": TRAINER_METRICS_PORT, "protocol": "TCP"})
    container["env"] += [{"name": "TRAINER_METRICS_PORT", "value": str(TRAINER_METRICS_PORT)},
                         {"name": "TRAINER_JOB_NAME", "value": job_name}]
    return out


def render_pytorchjob(job: ResolvedJob) -> dict[str, Any]:
    spec = job.spec
    template = pod_template(job)
    replicas = {"Master": {"replicas": 1, "restartPolicy": "ExitCode", "template": with_health_endpoint(template, spec.name)}}
    if spec.nodes > 1:
        replicas["Worker"] = {"replicas": spec.nodes - 1, "restartPolicy": "ExitCode", "template": copy.deepcopy(template)}
    return {
        "apiVersion": PYTORCHJOB_API,
        "kind": "PyTorchJob",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": job_labels(job)},
        "spec": {
            "nprocPerNode": str(spec.gpus_per_node),
            "runPolicy": {
                # Kept for restartPolicy OnFailure replicas and for tools that read it: under
                # ExitCode the operator recreates pods and never reaches this limit
                # (kubeflow/trainer#2045). Crash loops are bounded by the trainer's launcher
                # (checkpoint.max_attempts_without_progress, counted in the checkpoint directory).
                "backoffLimit": spec.backoff_limit,
                "activeDeadlineSeconds": spec.max_runtime_seconds,
                "ttlSecondsAfterFinished": spec.ttl_seconds,
                # When the master finishes, stop the workers and free their GPUs.
                "cleanPodPolicy": "Running",
                "schedulingPolicy": {"priorityClass": job.priority_class},
            },
            "pytorchReplicaSpecs": replicas,
        },
    }


# -- TrainJob (Trainer v2) ---------------------------------------------------------------------
def render_trainjob(job: ResolvedJob) -> dict[str, Any]:
    """The same pod as a TrainJob on the pinned ``torch-distributed`` ClusterTrainingRuntime.

    The runtime's failure policy owns restarts with PyTorchJob's exit-code contract
    (workloads/trainjob_runtime.py): a disrupted pod is replaced without counting, exit codes
    1-127 fail the TrainJob at once, other failures restart every node from the checkpoint up
    to the runtime's maxRestarts (one platform-wide budget, not the spec's backoffLimit). Kueue
    priority would need a WorkloadPriorityClass: a reason PyTorchJob stays the default.
    """
    spec = job.spec
    pod = pod_template(job)
    # Every node's pod carries the label; the TrainJob PodMonitor keeps node index 0 (rank 0,
    # the only one serving), workloads/monitoring/stack.py.
    pod["metadata"]["labels"][TRAINER_METRICS_LABEL] = TRAINJOB_METRICS_LABEL_VALUE
    pod_spec = pod["spec"]
    container = pod_spec["containers"][0]
    container["env"] = [*container["env"], {"name": "TRAINER_METRICS_PORT", "value": str(TRAINER_METRICS_PORT)},
                        {"name": "TRAINER_JOB_NAME", "value": spec.name}]
    patch_spec = {k: v for k, v in pod_spec.items() if k not in ("containers", "priorityClassName")}
    patch_spec["containers"] = [{"name": TRAINJOB_CONTAINER, "volumeMounts": container["volumeMounts"],
                                 "securityContext": container["securityContext"]}]
    return {
        "apiVersion": TRAINJOB_API,
        "kind": "TrainJob",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": job_labels(job)},
        "spec": {
            "runtimeRef": {"name": job.facts.trainer_v2_runtime or TORCH_DISTRIBUTED_RUNTIME,
                           "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"},
            "activeDeadlineSeconds": spec.max_runtime_seconds,
            "trainer": {
                "image": spec.image, "command": container["command"], "args": container["args"],
                "env": container["env"], "numNodes": spec.nodes, "numProcPerNode": spec.gpus_per_node,
                "resourcesPerNode": container["resources"],
            },
            "runtimePatches": [{
                "manager": TRAINJOB_PATCH_MANAGER,
                "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{
                    "name": TRAINJOB_CONTAINER,
                    "template": {"spec": {"template": {"metadata": pod["metadata"], "spec": patch_spec}}},
                }]}}},
            }],
        },
    }


def render_resolved(job: ResolvedJob) -> dict[str, Any]:
    """The job object of a resolved job (preflight's: the pool, team, priority and pod size it
    checked are the ones rendered, with no second resolution)."""
    return render_trainjob(job) if job.spec.runtime is Runtime.TRAINJOB else render_pytorchjob(job)


def render(spec: JobSpec, facts: PlatformFacts) -> dict[str, Any]:
    """The job object the spec asks for (PyTorchJob by default)."""
    return render_resolved(resolve(spec, facts))
