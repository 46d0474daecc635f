"""Checks that need the file system, the dataset or the machine, run by `python -m trainer
train` after the config parsed and before any process group starts: every problem at once,
as a ConfigError (exit code 2, field, value and fix; no traceback).

`trainer.config.validate` stays pure (types, ranges, cross-field rules); this module looks at
the world: can the checkpoint directory be written, does the data hold one global micro-batch
of windows, does the model's training state fit in the device's memory.
"""
from __future__ import annotations

import os
import tempfile

from trainer.branch import continues_rollback
from trainer.config import ConfigError, TrainerConfig
from trainer.contract.layout import MARKER
from trainer.contract.memory import TRAINING_STATE_BYTES_PER_PARAMETER


def nearest_existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def checkpoint_dir_problem(path: str) -> str | None:
    existing = nearest_existing(path)
    if not os.path.isdir(existing):
        return f"{existing!r} is a file, so the directory cannot be created there"
    # Write, don't ask: os.access answers from the mode bits for the real uid (always yes for
    # root), while a read-only mount, FSx root squash or a server-side ACL refuse only the write.
    try:
        fd, probe = tempfile.mkstemp(prefix=".preflight-write-", dir=existing)
    except OSError as error:
        what = "the directory" if existing == os.path.abspath(path) else f"its nearest existing parent {existing!r}"
        return (f"{what} is not writable by uid {os.getuid()} ({error.strerror}: read-only mount, "
                "root squash or permissions)")
    os.close(fd)
    os.unlink(probe)
    return None


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def device_memory_bytes() -> tuple[int, str] | None:
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(int(os.environ.get("LOCAL_RANK", "0")))
        return props.total_memory, props.name
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "host memory"
    except (ValueError, OSError):
        return None


def pinned_staging_bytes(numels: list[int], shards: int = 1) -> int:
    """Host memory the thread-mode checkpoint stages into: fp32 weights and AdamW's two moments,
    each tensor pinned on its own, and torch's CachingHostAllocator rounds every pinned block up
    to a power of two (ATen/core/CachingHostAllocator.h, `c10::llvm::PowerOf2Ceil`): GPT-2 124M
    needs 1.39 GiB of state and pins 2.31 GiB. Pinned pages cannot be
    swapped and count against the pod's memory limit."""
    return sum(3 * (1 << max(0, (4 * -(-n // shards) - 1).bit_length())) for n in numels if n)


def host_memory_limit_bytes() -> int | None:
    """The container's memory limit (cgroup v2 memory.max), else the machine's memory."""
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            value = f.read().strip()
        if value != "max":
            return int(value)
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def staging_problem(numels: list[int], shards: int, local_ranks: int, host_bytes: int) -> str | None:
    need = pinned_staging_bytes(numels, shards) * local_ranks
    if need <= host_bytes:
        return None
    return (f"checkpoint.async_mode=thread: {local_ranks} rank(s) on this node pin {need / 2**30:.1f} GiB of host memory "
            f"for checkpoint staging (fp32 weights + AdamW moments, each tensor rounded up to a power of two) but the "
            f"container's memory limit is {host_bytes / 2**30:.1f} GiB; raise the pod's memory, use "
            "checkpoint.async_mode=off or process, or parallelism.strategy=fsdp")


def shm_staging_problem(numels: list[int], shards: int, local_ranks: int, shm_free_bytes: int) -> str | None:
    """`checkpoint.async_mode=process` stages each rank's state in shared memory (/dev/shm):
    fp32 weights and AdamW's two moments, each tensor its own segment, rounded up to pages."""
    page = 4096
    per_rank = sum(3 * -(-4 * -(-n // shards) // page) * page for n in numels if n)
    need = per_rank * local_ranks
    if need <= shm_free_bytes:
        return None
    return (f"checkpoint.async_mode=process: {local_ranks} rank(s) on this node stage {per_rank / 2**30:.2f} GiB each "
            f"(fp32 weights + AdamW moments{f' / {shards} FSDP shards' if shards > 1 else ''}) in /dev/shm = "
            f"{need / 2**30:.2f} GiB, but /dev/shm has {shm_free_bytes / 2**30:.2f} GiB free: the first save would fail "
            "(No space left on device). Use checkpoint.async_mode=thread or off, raise the pod's /dev/shm "
            "(resources.shmGib), or parallelism.strategy=fsdp")


def shm_free_bytes(path: str = "/dev/shm") -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _model_on_meta(cfg: TrainerConfig, vocab_size: int):
    import torch

    from trainer.model import build_model

    if cfg.model.kind == "hf":
        return build_model(cfg.model, vocab_size, cfg.data.seq_len, empty=True)
    with torch.device("meta"):
        return build_model(cfg.model, vocab_size, cfg.data.seq_len)


def model_param_numels(cfg: TrainerConfig, vocab_size: int) -> list[int]:
    return [p.numel() for p in _model_on_meta(cfg, vocab_size).parameters()]


def num_model_params(cfg: TrainerConfig, vocab_size: int) -> int | None:
    """Parameter count without allocating: the model built on the meta device (a Hugging Face
    model from its config.json alone)."""
    if cfg.model.kind == "hf":
        if not (cfg.model.hf_path and os.path.isfile(os.path.join(cfg.model.hf_path, "config.json"))):
            return None
    else:
        from trainer.model_facts import GPT_SIZES

        if cfg.model.size not in GPT_SIZES:
            return None
    return sum(p.numel() for p in _model_on_meta(cfg, vocab_size).parameters())


def preflight(cfg: TrainerConfig, world_size: int | None = None, memory: tuple[int, str] | None = None) -> None:
    world_size = world_size or world_size_from_env()
    problems: list[str] = []
    c, d, m = cfg.checkpoint, cfg.data, cfg.model
    problem = checkpoint_dir_problem(c.dir)
    if problem:
        problems.append(f"checkpoint.dir={c.dir!r}: {problem}; point it (or TRAINER_CHECKPOINT_DIR) at a writable "
                        "volume such as the FSx mount")
    # A later attempt of a rollback continues its branch even when retention or a lost volume
    # removed the source since (trainer/branch.py).
    if c.initial_load_path is not None and not os.path.isfile(os.path.join(c.initial_load_path, MARKER)):
        problems.append(f"checkpoint.initial_load_path={c.initial_load_path!r}: not a complete checkpoint (no "
                        "complete.json); name a step-N directory of the job to start from")
    if c.resume not in ("auto", "none") and not os.path.isdir(c.resume) and not continues_rollback(c.dir, c.resume):
        problems.append(f"checkpoint.resume={c.resume!r}: no such directory; use auto, none or a step-N directory")
    from trainer.trust import CheckpointKeyError, read_key

    try:
        read_key()  # the checkpoint signing key: unusable, or missing inside a pod, is bad input
    except CheckpointKeyError as exc:
        problems.append(str(exc))

    from trainer.data import num_windows, read_manifest

    manifest = read_manifest(d.dir)
    windows = sum(num_windows(s["num_tokens"], d.seq_len) for s in manifest["shards"])
    global_micro_batch = d.micro_batch_size * world_size
    if windows == 0:
        longest = max(s["num_tokens"] for s in manifest["shards"])
        problems.append(f"data.seq_len={d.seq_len}: no shard of {d.dir!r} holds seq_len + 1 tokens "
                        f"(longest {longest}); lower data.seq_len or prepare more data")
    elif windows < global_micro_batch:
        problems.append(f"data.micro_batch_size={d.micro_batch_size}: one micro-step needs {global_micro_batch} windows "
                        f"(x world size {world_size}) but {d.dir!r} holds {windows} of {d.seq_len + 1} tokens; "
                        "lower data.micro_batch_size or data.seq_len, or prepare more data")
    val_windows = sum(num_windows(s["num_tokens"], d.seq_len) for s in manifest.get("val_shards", []))
    if cfg.evaluation.every_steps > 0 and val_windows == 0:
        problems.append(f"evaluation.every_steps={cfg.evaluation.every_steps}: {d.dir!r} has no validation split with "
                        f"windows of {d.seq_len + 1} tokens; run prepare-data with --val-fraction (default 0.005) "
                        "or set evaluation.every_steps=0")

    vocab = int(manifest["vocab_size"])
    if m.kind == "gpt" and m.vocab_size is not None and m.vocab_size < vocab:
        problems.append(f"model.vocab_size={m.vocab_size}: the dataset uses {vocab} token ids; set it >= {vocab} "
                        "or leave it unset (taken from the manifest)")
    if m.kind == "hf" and m.hf_path and os.path.isdir(m.hf_path):
        problems += _hf_problems(m.hf_path, d.seq_len, vocab)

    num_params = num_model_params(cfg, m.vocab_size or vocab)
    memory = memory or device_memory_bytes()
    if num_params and memory:
        total_bytes, where = memory
        shards = world_size if cfg.parallelism.strategy == "fsdp" else 1
        need_bytes = num_params * TRAINING_STATE_BYTES_PER_PARAMETER / shards
        if need_bytes > total_bytes:
            what = f"model.hf_path={m.hf_path!r}" if m.kind == "hf" else f"model.size={m.size!r}"
            problems.append(
                f"{what}: {num_params / 1e6:.0f}M parameters need {need_bytes / 2**30:.1f} GiB of "
                f"weights, gradients and AdamW state per rank ({TRAINING_STATE_BYTES_PER_PARAMETER} bytes/parameter"
                f"{f' / {shards} FSDP shards' if shards > 1 else ''}) but {where} has {total_bytes / 2**30:.1f} GiB; "
                "use a smaller size, parallelism.strategy=fsdp, or more ranks")
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    shards = world_size if cfg.parallelism.strategy == "fsdp" else 1
    if num_params and cfg.checkpoint.async_mode == "thread" and memory and memory[1] != "host memory":
        host = host_memory_limit_bytes()  # pinned staging exists on CUDA only
        problem = host and staging_problem(model_param_numels(cfg, m.vocab_size or vocab), shards, local_ranks, host)
        if problem:
            problems.append(problem)
    if num_params and cfg.checkpoint.async_mode == "process":
        free = shm_free_bytes()
        problem = free is not None and shm_staging_problem(model_param_numels(cfg, m.vocab_size or vocab), shards,
                                                           local_ranks, free)
        if problem:
            problems.append(problem)
    if problems:
        raise ConfigError(problems)


def _hf_problems(path: str, seq_len: int, vocab: int) -> list[str]:
    import json

    try:
        with open(os.path.join(path, "config.json")) as f:
            hf = json.load(f)
    except (OSError, ValueError) as exc:
        return [f"model.hf_path={path!r}: no readable config.json ({exc}); save the model with save_pretrained"]
    problems = []
    positions = hf.get("max_position_embeddings") or hf.get("n_positions")
    if positions and seq_len > positions:
        problems.append(f"data.seq_len={seq_len}: the model at {path!r} has {positions} positions; lower data.seq_len")
    model_vocab = hf.get("vocab_size")
    if model_vocab and model_vocab < vocab:
        problems.append(f"model.hf_path={path!r}: {model_vocab} token embeddings but the dataset uses {vocab}; "
                        "prepare the data with this model's tokenizer (--tokenizer-dir)")
    return problems


# Directories the image's environment points at (trainer/Dockerfile): on a freshly mounted
# FSx volume they do not exist yet, and the flight recorder does not create its dump directory.
RUNTIME_DIR_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
RUNTIME_FILE_PREFIX_VARIABLES = ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE")


def prepare_runtime_dirs(environ=None) -> list[str]:
    """Creates them (best effort: a failure only loses a cache or a dump, never the run)."""
    environ = os.environ if environ is None else environ
    wanted = [environ[v] for v in RUNTIME_DIR_VARIABLES if environ.get(v)]
    wanted += [os.path.dirname(environ[v]) for v in RUNTIME_FILE_PREFIX_VARIABLES if environ.get(v)]
    made = []
    for path in wanted:
        try:
            os.makedirs(path, exist_ok=True)
            made.append(path)
        except OSError:
            pass
    return made
