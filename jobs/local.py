"""Run a rendered job's pods as local CPU processes: the exact command, arguments and environment.

One process per replica (the pod), with what the cluster would add emulated on loopback:

- the operator's rendezvous variables (``operator_env``: Training Operator 1.9 envvar.go /
  master.go for a PyTorchJob; Trainer v2's torch plugin for a TrainJob), with MASTER_ADDR on
  127.0.0.1 and a free port instead of the ``<job>-master-0`` Service;
- the kubelet: ``valueFrom`` (secretKeyRef from local secrets, fieldRef), then ``$(VAR)``
  expansion of command and args;
- volumes: the FSx claim's mount path maps to a local directory; ``/dev/shm`` is the host's;
- the image: its WORKDIR /app is this repository (same ``trainer/`` package), ``python`` is this
  interpreter, and ``tini`` (PID 1 in the pod, forwarding signals) is left out when not installed.

``shrink`` makes the job tiny first (one process per node, trainer/configs/tiny.yaml, a few dozen
steps): the only changes to the rendered manifest, so the test that runs this proves the manifest's
own wiring, not a copy of it. ``replacements`` says, line by line, what that changed (model,
strategy, sequence length, batch, data...). ``faithful`` keeps the job's own trainer config (its
model, strategy, sequence length and batch) and shortens only the run; your own code
(``command``/``script``) always runs unchanged, on one CPU process per pod. S3 (a pinned code
archive) is a local directory, an emptyDir a per-pod directory. Interruption: SIGTERM to one replica (a reclaimed spot node), every
pod must exit 128-255 (retried under ``restartPolicy: ExitCode``), and the recreated pods resume.
"""
from __future__ import annotations

import posixpath

import copy
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from trainer.contract.environment import ENV_CHECKPOINT_DIR, ENV_DATASET_DIR
from trainer.contract.layout import complete_steps
from workloads.jobspec import FSX_MOUNT_PATH

REPO_ROOT = Path(__file__).resolve().parent.parent
EXIT_PREEMPTED = 143
TINY_CONFIG = "trainer/configs/tiny.yaml"
CORPUS_MODULES = ("argparse", "textwrap", "string", "functools", "dataclasses")


@dataclass(frozen=True)
class LocalOverrides:
    """What makes a GPU job run on a laptop CPU in a minute."""

    num_steps: int = 40
    checkpoint_every_steps: int = 10
    nproc_per_node: int = 1
    config: str = TINY_CONFIG
    trainer_overrides: tuple[str, ...] = (
        "model.kind=gpt", "model.size=tiny", "model.vocab_size=null", "model.hf_path=null",
        "data.seq_len=64", "data.micro_batch_size=8", "schedule.warmup_steps=2", "schedule.grad_accum_steps=1",
        "parallelism.strategy=auto", "parallelism.backend=auto", "parallelism.mixed_precision=auto",
        "parallelism.compile=false", "parallelism.activation_checkpointing=false",
        'checkpoint.async_mode="off"', "checkpoint.every_seconds=0", "tracking.log_every_steps=5",
    )

    # Keep the job's model, strategy, sequence length and batch; only what a CPU cannot do goes.
    faithful: bool = False
    faithful_overrides: tuple[str, ...] = (
        "parallelism.backend=auto", "parallelism.mixed_precision=auto", "parallelism.compile=false",
        'checkpoint.async_mode="off"', "checkpoint.every_seconds=0", "tracking.log_every_steps=1",
        "schedule.warmup_steps=1", "schedule.grad_accum_steps=1",
        # The generated corpus's validation split is too short for a long sequence.
        "evaluation.every_steps=0",
    )

    def trainer_args(self) -> list[str]:
        return [*(self.faithful_overrides if self.faithful else self.trainer_overrides), f"schedule.num_steps={self.num_steps}",
                f"checkpoint.every_steps={self.checkpoint_every_steps}"]


# -- reading the rendered job ------------------------------------------------------------------
@dataclass
class Replica:
    replica_type: str  # "master" / "worker" (PyTorchJob), "node" (TrainJob)
    index: int
    container: dict[str, Any]
    volumes: list[dict[str, Any]]
    mounts: list[dict[str, Any]]
    pod_name: str


def _pytorchjob_replicas(job: Mapping[str, Any]) -> list[Replica]:
    out = []
    specs = job["spec"]["pytorchReplicaSpecs"]
    for rtype in ("Master", "Worker"):
        if rtype not in specs:
            continue
        template = specs[rtype]["template"]["spec"]
        container = template["containers"][0]
        for index in range(int(specs[rtype].get("replicas", 1))):
            out.append(Replica(rtype.lower(), index, container, template.get("volumes", []), container.get("volumeMounts", []),
                               f"{job['metadata']['name']}-{rtype.lower()}-{index}"))
    return out


def _trainjob_replicas(job: Mapping[str, Any]) -> list[Replica]:
    trainer = job["spec"]["trainer"]
    patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod = patch["template"]["spec"]["template"]["spec"]
    mounts = pod["containers"][0].get("volumeMounts", [])
    container = {"command": trainer["command"], "args": trainer["args"], "env": trainer.get("env", [])}
    return [Replica("node", i, container, pod.get("volumes", []), mounts, f"{job['metadata']['name']}-node-0-{i}")
            for i in range(int(trainer["numNodes"]))]


def replicas(job: Mapping[str, Any]) -> list[Replica]:
    return _pytorchjob_replicas(job) if job["kind"] == "PyTorchJob" else _trainjob_replicas(job)


def nproc_per_node(job: Mapping[str, Any]) -> int:
    if job["kind"] == "PyTorchJob":
        return int(job["spec"].get("nprocPerNode", "1"))
    return int(job["spec"]["trainer"].get("numProcPerNode", 1))


def operator_env(job: Mapping[str, Any], replica: Replica, *, master_addr: str, master_port: int) -> dict[str, str]:
    """The variables the operator adds to each pod, as its source sets them.

    PyTorchJob (training-operator v1.9, pkg/controller.v1/pytorch/envvar.go setPodEnv and
    master.go): PYTHONUNBUFFERED; MASTER_PORT/ADDR and PET_MASTER_PORT/ADDR; WORLD_SIZE =
    replicas x nprocPerNode; RANK = PET_NODE_RANK = index (+1 for workers); PET_NPROC_PER_NODE;
    PET_NNODES = replicas (no elasticPolicy). TrainJob (Trainer v2 torch plugin): PET_NNODES,
    PET_NPROC_PER_NODE, PET_NODE_RANK (the Job completion index), PET_MASTER_ADDR/PORT.
    """
    nodes = len(replicas(job))
    nproc = nproc_per_node(job)
    if job["kind"] == "PyTorchJob":
        rank = replica.index + (1 if replica.replica_type == "worker" else 0)
        return {
            "PYTHONUNBUFFERED": "1", "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
            "PET_MASTER_ADDR": master_addr, "PET_MASTER_PORT": str(master_port),
            "WORLD_SIZE": str(nodes * nproc), "RANK": str(rank), "PET_NODE_RANK": str(rank),
            "PET_NPROC_PER_NODE": str(nproc), "PET_NNODES": str(nodes),
        }
    return {"PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": str(nproc), "PET_NODE_RANK": str(replica.index),
            "PET_MASTER_ADDR": master_addr, "PET_MASTER_PORT": str(master_port)}


def shrink(job: Mapping[str, Any], overrides: LocalOverrides = LocalOverrides()) -> dict[str, Any]:
    """A copy of the rendered job, tiny for CPU: processes per node, the trainer config, and
    trainer overrides appended to the args. Nothing else in the manifest changes."""
    job = copy.deepcopy(dict(job))

    def patch_args(args: list[str]) -> list[str]:
        args = list(args)
        if not runs_builtin_trainer(args):
            return args  # your own code: its command and arguments run as they are
        if "--config" in args and not overrides.faithful:
            args[args.index("--config") + 1] = overrides.config
        return args + overrides.trainer_args()

    if job["kind"] == "PyTorchJob":
        job["spec"]["nprocPerNode"] = str(overrides.nproc_per_node)
        for spec in job["spec"]["pytorchReplicaSpecs"].values():
            container = spec["template"]["spec"]["containers"][0]
            container["args"] = patch_args(container["args"])
    else:
        trainer = job["spec"]["trainer"]
        trainer["numProcPerNode"] = overrides.nproc_per_node
        trainer["args"] = patch_args(trainer["args"])
    return job


def runs_builtin_trainer(args: list[str]) -> bool:
    return any(list(args[i:i + 3]) == ["-m", "trainer", "train"] for i in range(len(args) - 2))


def _first_container(job: Mapping[str, Any]) -> dict[str, Any]:
    return replicas(job)[0].container


def _trainer_config(args: list[str], repo_root: Path, extra: list[str] = ()):
    """The trainer config the args select (file + overrides + extra), or None when unreadable."""
    from trainer.config import ConfigError, build_config

    start = next(i for i in range(len(args) - 2) if list(args[i:i + 3]) == ["-m", "trainer", "train"]) + 3
    rest = [a.replace("$$", "$") for a in args[start:]]
    config = rest[rest.index("--config") + 1] if "--config" in rest else None
    overrides = [a for i, a in enumerate(rest) if a != "--config" and (i == 0 or rest[i - 1] != "--config")]
    try:
        return build_config(str(repo_root / config) if config else None, overrides + list(extra), environ={})
    except (ConfigError, OSError):
        return None


# What `--local` reports when it differs: (label, dotted field of the trainer config).
REPORTED_FIELDS = (
    ("model", "model.kind"), ("model size", "model.size"), ("model path", "model.hf_path"),
    ("vocabulary", "model.vocab_size"), ("strategy", "parallelism.strategy"),
    ("precision", "parallelism.mixed_precision"), ("torch.compile", "parallelism.compile"),
    ("activation ckpt", "parallelism.activation_checkpointing"), ("sequence length", "data.seq_len"),
    ("micro-batch", "data.micro_batch_size"), ("grad accumulation", "schedule.grad_accum_steps"),
    ("steps", "schedule.num_steps"), ("warmup steps", "schedule.warmup_steps"),
    ("checkpoint every", "checkpoint.every_steps"), ("evaluation every", "evaluation.every_steps"),
)


def _field(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def replacements(job: Mapping[str, Any], overrides: LocalOverrides, *, dataset: str, repo_root: Path = REPO_ROOT) -> list[str]:
    """What the local run changes, one line each ("what: job's value -> local value"), read from
    the rendered job and from the shrunk one through the trainer's own config parser."""
    nodes, nproc = len(replicas(job)), nproc_per_node(job)
    lines = [f"GPUs              {nodes} pod(s) x {nproc} GPU process(es) -> {nodes} pod(s) x "
             f"{overrides.nproc_per_node} CPU process(es) (gloo)"]
    args = list(_first_container(job)["args"])
    if not runs_builtin_trainer(args):
        lines.append(f"dataset           {dataset} -> a generated byte-level corpus in the platform's format "
                     f"({len(CORPUS_MODULES)} Python standard-library modules)")
        lines.append("your code         unchanged: its command, arguments, model and batch are the job's")
        return lines
    before = _trainer_config(args, repo_root)
    after = _trainer_config(list(_first_container(shrink(job, overrides))["args"]), repo_root)
    if before is None or after is None:
        lines.append("trainer config    could not be read here; the local run replaced "
                     + ("only steps and precision" if overrides.faithful else f"it with {overrides.config}"))
    else:
        for label, dotted in REPORTED_FIELDS:
            was, now = _field(before, dotted), _field(after, dotted)
            if was != now:
                if dotted == "parallelism.mixed_precision" and now == "auto":
                    now = "auto (fp32 on CPU)"
                was, now = ("unset" if v is None else v for v in (was, now))
                lines.append(f"{label:<17} {was} -> {now}")
    lines.append(f"dataset           {dataset} -> a generated byte-level corpus ({len(CORPUS_MODULES)} Python "
                 "standard-library modules)")
    return lines


def faithful_memory_problem(needed_bytes: float, available_bytes: float, what: str) -> Optional[str]:
    """One line when the job's own model would not fit this host (--faithful), else None."""
    if needed_bytes <= available_bytes:
        return None
    return (f"--faithful: {what} needs about {needed_bytes / 2**30:.1f} GiB of host memory, this machine has "
            f"{available_bytes / 2**30:.1f} GiB available: it would not fit. Fix: run --local without --faithful "
            "(a tiny model), lower data.micro_batch_size / data.seq_len, or use a larger host")


def host_available_bytes() -> float:
    """MemAvailable (proc(5)): what can be allocated without swapping."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


# -- the kubelet's part ------------------------------------------------------------------------
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined variables are replaced, $$ escapes, others stay."""
    def sub(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _VAR.sub(sub, value)


class LocalRunError(RuntimeError):
    pass


def container_env(replica: Replica, *, secrets: Mapping[str, Mapping[str, str]], pod_name: str, namespace: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in replica.container.get("env", []):
        name = item["name"]
        if "value" in item:
            env[name] = expand(str(item["value"]), env)
            continue
        source = item.get("valueFrom", {})
        if "secretKeyRef" in source or "configMapKeyRef" in source:
            ref = source.get("secretKeyRef") or source["configMapKeyRef"]
            kind = "Secret" if "secretKeyRef" in source else "ConfigMap"
            try:
                env[name] = secrets[ref["name"]][ref["key"]]
            except KeyError:
                raise LocalRunError(f"env {name}: no local value for {kind} {ref['name']} key {ref['key']}") from None
        elif "fieldRef" in source:
            env[name] = {"metadata.name": pod_name, "metadata.namespace": namespace}.get(source["fieldRef"]["fieldPath"], "")
        else:
            raise LocalRunError(f"env {name}: unsupported valueFrom {sorted(source)}")
    return env


def secret_volumes(replica: Replica, *, secrets: Mapping[str, Mapping[str, str]], local_dir: Path) -> dict[str, str]:
    """Secret volumes as the kubelet mounts them: each listed key a file (mode 0400 here).
    Returns mountPath -> the local directory standing in for it."""
    by_volume = {v["name"]: v["secret"] for v in replica.volumes if "secret" in v}
    mounted = {}
    for mount in replica.mounts:
        source = by_volume.get(mount["name"])
        if source is None:
            continue
        name = source["secretName"]
        if name not in secrets:
            raise LocalRunError(f"volume {mount['name']}: no local value for Secret {name}")
        target = local_dir / mount["name"]
        target.mkdir(parents=True, exist_ok=True)
        items = source.get("items") or [{"key": k, "path": k} for k in secrets[name]]
        for item in items:
            if item["key"] not in secrets[name]:
                raise LocalRunError(f"volume {mount['name']}: no local value for Secret {name} key {item['key']}")
            path = target / item["path"]
            path.write_text(secrets[name][item["key"]])
            path.chmod(0o400)
        mounted[mount["mountPath"]] = str(target)
    return mounted


def emptydir_volumes(replica: Replica, *, local_dir: Path) -> dict[str, str]:
    """Disk-backed emptyDirs (a pinned code archive's): a fresh directory per pod. Memory-backed
    ones (/dev/shm) are the host's."""
    by_volume = {v["name"]: v["emptyDir"] for v in replica.volumes if "emptyDir" in v}
    mounted = {}
    for mount in replica.mounts:
        source = by_volume.get(mount["name"])
        if source is None or source.get("medium") == "Memory":
            continue
        target = local_dir / mount["name"]
        target.mkdir(parents=True, exist_ok=True)
        mounted[mount["mountPath"]] = str(target)
    return mounted


def fsx_mount_path(replica: Replica) -> str:
    """Where the file system appears in the pod: the common parent of its FSx mounts (a team
    mounts its own subtree and the datasets, both at their file-system paths under /fsx)."""
    claims = {v["name"] for v in replica.volumes if "persistentVolumeClaim" in v}
    paths = [m["mountPath"] for m in replica.mounts if m["name"] in claims]
    if len(paths) > 1:
        return posixpath.commonpath(paths)
    return paths[0] if paths else FSX_MOUNT_PATH


def remap(value: str, mount_path: str, local_dir: str) -> str:
    """Paths on the FSx mount point at the local stand-in directory."""
    return re.sub(rf"(?<![\w/]){re.escape(mount_path)}(?=/|$)", local_dir, value)


def local_command(command: list[str]) -> list[str]:
    command = list(command)
    if command[:2] == ["/usr/bin/tini", "--"] and shutil.which("tini") is None:
        command = command[2:]
    elif command[:1] == ["/usr/bin/tini"] and shutil.which("tini"):
        command[0] = shutil.which("tini")  # type: ignore[assignment]
    return [sys.executable if part == "python" else part for part in command]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- running ------------------------------------------------------------------------------------
@dataclass
class Attempt:
    exit_codes: list[int]
    interrupted: bool
    logs: list[Path]


@dataclass
class LocalResult:
    attempts: list[Attempt] = field(default_factory=list)
    checkpoint_dir: Optional[Path] = None
    succeeded: bool = False

    @property
    def steps(self) -> list[int]:
        if not self.checkpoint_dir or not self.checkpoint_dir.is_dir():
            return []
        return complete_steps(str(self.checkpoint_dir))


def prepare_dataset(data_dir: Path) -> None:
    """A byte-level dataset from a few stdlib modules, where the job's dataset path maps locally."""
    if (data_dir / "manifest.json").exists():
        return
    import importlib

    from trainer.prepare import prepare

    prepare([importlib.import_module(m).__file__ for m in CORPUS_MODULES], str(data_dir), show_progress=False)


def _logged_step(metrics: Path) -> int:
    if not metrics.exists():
        return 0
    last = 0
    for line in metrics.read_text().splitlines():
        try:
            last = max(last, int(json.loads(line).get("step", 0)))
        except (ValueError, AttributeError):
            pass
    return last


def _replica_process(job: Mapping[str, Any], replica: Replica, *, secrets: Mapping[str, Mapping[str, str]], namespace: str,
                     master_port: int, workdir: Path, fsx_dir: Path, attempt_no: int,
                     s3_root: Optional[Path]) -> tuple[list[str], dict[str, str], Optional[Path]]:
    """The command line and environment of one replica's process (its pod's paths mapped onto
    local directories, its dataset prepared) and its checkpoint directory, if it names one."""
    mount = fsx_mount_path(replica)
    env = container_env(replica, secrets=secrets, pod_name=replica.pod_name, namespace=namespace)
    env.update(operator_env(job, replica, master_addr="127.0.0.1", master_port=master_port))
    env = {k: remap(v, mount, str(fsx_dir)) for k, v in env.items()}
    for secret_mount, local in secret_volumes(replica, secrets=secrets,
                                              local_dir=workdir / "secrets" / replica.pod_name).items():
        env = {k: remap(v, secret_mount, local) for k, v in env.items()}
    for empty_mount, local in emptydir_volumes(replica, local_dir=workdir / "pods" / replica.pod_name /
                                               f"attempt-{attempt_no}").items():
        env = {k: remap(v, empty_mount, local) for k, v in env.items()}
    if s3_root is not None:
        # S3 is a local directory: s3://bucket/key -> file://<s3_root>/bucket/key.
        env = {k: (f"file://{s3_root}/{v[len('s3://'):]}" if v.startswith("s3://") else v) for k, v in env.items()}
    # No AWS here: the S3 mirror stays off (FSx's own export is what the cluster relies on).
    env.pop("TRAINER_CHECKPOINT_S3_URI", None)
    command = [remap(expand(c, env), mount, str(fsx_dir)) for c in replica.container["command"]]
    args = [remap(expand(a, env), mount, str(fsx_dir)) for a in replica.container["args"]]
    data_dir = next((a.split("=", 1)[1] for a in args if a.startswith("data.dir=")), env.get(ENV_DATASET_DIR))
    if data_dir:
        prepare_dataset(Path(data_dir))
    checkpoint_dir = Path(env[ENV_CHECKPOINT_DIR]) if ENV_CHECKPOINT_DIR in env else None
    # A pod's environment is its own: only what a base image provides comes from the host.
    process_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workdir), "LANG": "C.UTF-8",
                   "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", **env}
    return local_command(command) + args, process_env, checkpoint_dir


def _wait_for_pods(procs: list[subprocess.Popen], reps: Sequence[Replica], *, attempt_no: int, logs: list[Path],
                   timeout_seconds: float, interrupt_at_step: Optional[int], checkpoint_dir: Optional[Path],
                   say: Callable[[str], None]) -> bool:
    """Wait until every process exits; reclaim the last pod's node once the log reaches
    ``interrupt_at_step``. True when it did."""
    interrupted = False
    deadline = time.monotonic() + timeout_seconds
    while any(p.poll() is None for p in procs):
        if time.monotonic() > deadline:
            raise LocalRunError(f"attempt {attempt_no} did not finish within {timeout_seconds:.0f} s; logs: {logs}")
        if (interrupt_at_step and not interrupted and checkpoint_dir is not None
                and _logged_step(checkpoint_dir / "metrics.jsonl") >= interrupt_at_step):
            # One node is reclaimed: Karpenter drains it, its pod gets SIGTERM.
            victim = procs[-1]
            say(f"  SIGTERM to pod {reps[-1].pod_name} at step >= {interrupt_at_step} (its node is reclaimed)")
            victim.send_signal(signal.SIGTERM)
            interrupted = True
        time.sleep(0.05)
    return interrupted


def run_local(
    job: Mapping[str, Any],
    *,
    workdir: Path,
    secrets: Optional[Mapping[str, Mapping[str, str]]] = None,
    interrupt_at_step: Optional[int] = None,
    s3_root: Optional[Path] = None,
    max_attempts: int = 3,
    timeout_seconds: float = 600,
    say: Callable[[str], None] = print,
) -> LocalResult:
    """Run the (already shrunk) job's replicas until it succeeds, fails permanently, or runs out of attempts."""
    workdir = Path(workdir).resolve()
    fsx_dir = workdir / "fsx"
    fsx_dir.mkdir(parents=True, exist_ok=True)
    reps = replicas(job)
    namespace = job["metadata"].get("namespace", "default")
    from workloads.trainingjob import PLATFORM_BUCKET_KEY, PLATFORM_CONFIGMAP

    # The namespace's platform ConfigMap (deployed names) has a local stand-in: S3 is a directory here.
    secrets = {PLATFORM_CONFIGMAP: {PLATFORM_BUCKET_KEY: "local-checkpoints"}, **(secrets or {})}
    result = LocalResult()
    for attempt_no in range(1, max_attempts + 1):
        port = free_port()
        procs: list[subprocess.Popen] = []
        logs: list[Path] = []
        checkpoint_dir: Optional[Path] = None
        try:
            for replica in reps:
                argv, process_env, replica_checkpoints = _replica_process(
                    job, replica, secrets=secrets, namespace=namespace, master_port=port, workdir=workdir,
                    fsx_dir=fsx_dir, attempt_no=attempt_no, s3_root=s3_root)
                checkpoint_dir = replica_checkpoints or checkpoint_dir
                log = workdir / f"attempt-{attempt_no}-{replica.pod_name}.log"
                logs.append(log)
                with open(log, "w") as handle:
                    procs.append(subprocess.Popen(argv, cwd=REPO_ROOT, env=process_env,
                                                  stdout=handle, stderr=subprocess.STDOUT, start_new_session=True))
            result.checkpoint_dir = checkpoint_dir
            say(f"attempt {attempt_no}: {len(procs)} pod(s) started ({', '.join(r.pod_name for r in reps)}), master 127.0.0.1:{port}")
            interrupted = _wait_for_pods(
                procs, reps, attempt_no=attempt_no, logs=logs, timeout_seconds=timeout_seconds,
                interrupt_at_step=interrupt_at_step if attempt_no == 1 else None, checkpoint_dir=checkpoint_dir, say=say)
            # A container killed by a signal reports 128 + the signal number.
            codes = [128 - p.returncode if p.returncode < 0 else p.returncode for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        result.attempts.append(Attempt(codes, interrupted, logs))
        say(f"  exit codes {codes}")
        if all(c == 0 for c in codes):
            result.succeeded = True
            return result
        permanent = [c for c in codes if 0 < c < 128]
        if permanent:
            # restartPolicy ExitCode: 1-127 are permanent failures; the operator fails the job.
            say(f"  permanent failure (exit {permanent}): the operator would fail the job; logs: {[str(l) for l in logs]}")
            return result
        say("  retryable exit (128-255): the operator recreates the pods; they resume from the newest checkpoint")
    return result
