"""The trainer on a real GPU (issue 28 item 1): bf16 + compile, preemption and kills with
resume, DDP and FSDP2, every async checkpoint mode, CUDA RNG state, pinned checkpoint
staging, the Hugging Face export, the restore drill. Every test skips with its reason where
no CUDA GPU is present. Run on a GPU node from the project root: `make gpu-check`
(or `python3 -m pytest -m gpu tests/gpu`). One GPU: NCCL refuses two ranks on one device, so
DDP and FSDP2 run at world size 1 there (the trainer logs the wrapper as such) and with two
ranks where two GPUs exist."""
from __future__ import annotations

import functools
import json
import math
import os
import signal
import subprocess
import sys

import torch

from tests.gpu.gpu_helpers import (ON_CPU, device_word, launch, launch_cmd, overrides, prepared_data, require_gpu,
                                   scratch)
from tests.trainer.trainer_helpers import (assert_same_tensors, checkpoint_tensors, launcher_env, losses, run,
                                           run_and_signal)

try:
    import pytest

    pytestmark = pytest.mark.gpu
except ImportError:  # the GPU image may have no pytest: tools/gpu_check.py runs these functions itself
    pass


def metrics_rows(ckpt: str) -> list[dict]:
    with open(os.path.join(ckpt, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def final_step_dir(ckpt: str, step: int) -> str:
    return os.path.join(ckpt, f"step-{step:06d}")


@functools.lru_cache(maxsize=None)
def trained_run() -> str:
    """One bf16 + compiled run that the export and drill tests reuse (12 steps, export at the end)."""
    ckpt = scratch("trained")
    done = launch(overrides(ckpt, **{"export.at_end": "true"}))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return ckpt


def test_bf16_compiled_training_on_one_gpu():
    require_gpu()
    ckpt = trained_run()
    rows = metrics_rows(ckpt)
    loss = {r["step"]: r["loss"] for r in rows if "loss" in r}
    assert sorted(loss) == list(range(1, 13))
    assert all(math.isfinite(v) for v in loss.values())
    assert loss[12] < loss[1], f"the loss did not go down: {loss}"
    perf = [r for r in rows if "tokens_per_second" in r]
    assert perf and all(r["tokens_per_second"] > 0 for r in perf)
    if not ON_CPU:
        assert perf[-1]["peak_gpu_memory_gib"] > 0
        assert perf[-1]["mfu"] > 0  # the GPU is in the peak table (a GPU without an entry logs no MFU)
    assert any("val_loss" in r for r in rows)


def test_sigterm_exits_143_and_the_resume_is_bitwise_under_deterministic_mode():
    require_gpu()
    extra = {"reproducibility.deterministic": "true"}
    reference, interrupted = scratch("reference"), scratch("interrupted")
    done = launch(overrides(reference, **extra))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # SIGTERM from outside, to the launcher, as the kubelet sends it.
    stopped = run_and_signal(launch_cmd(overrides(interrupted, **extra)), launcher_env(), interrupted, at_step=5,
                             timeout=900)
    assert stopped.returncode == 143, stopped.stdout[-4000:]
    done = launch(overrides(interrupted, **extra))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "resumed from" in done.stdout + done.stderr
    assert losses(interrupted) == losses(reference)  # every step, exact
    assert_same_tensors(checkpoint_tensors(final_step_dir(reference, 12), scratch("flat")),
                        checkpoint_tensors(final_step_dir(interrupted, 12), scratch("flat")))


def test_two_deterministic_runs_are_bitwise_identical():
    """The failure the H100 showed without the mode: two runs of one config differed from step 2."""
    require_gpu()
    a, b = scratch("det-a"), scratch("det-b")
    for ckpt in (a, b):
        done = launch(overrides(ckpt, **{"reproducibility.deterministic": "true"}))
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert losses(a) == losses(b)
    assert_same_tensors(checkpoint_tensors(final_step_dir(a, 12), scratch("flat")),
                        checkpoint_tensors(final_step_dir(b, 12), scratch("flat")))


def test_a_sigkilled_worker_exits_137_and_the_next_attempt_resumes():
    require_gpu()
    ckpt = scratch("sigkill")
    killed = launch(overrides(ckpt), TRAINER_FAULTS="after_step@6:0:KILL")
    assert killed.returncode == 137, killed.stdout[-3000:] + killed.stderr[-3000:]
    done = launch(overrides(ckpt))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "resumed from" in done.stdout + done.stderr and "at step 4" in done.stdout + done.stderr
    assert max(losses(ckpt)) == 12


def test_ddp_and_fsdp2_train_on_the_gpus_there_are():
    require_gpu()
    nproc = min(2, torch.cuda.device_count()) if not ON_CPU else 1
    for strategy in ("ddp", "fsdp"):
        ckpt = scratch(strategy)
        done = launch(overrides(ckpt, **{"parallelism.strategy": strategy}), nproc=nproc)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-4000:]
        assert f"({strategy}, world size {nproc}, {device_word()}" in out
        if nproc == 1:
            assert f"parallelism.strategy={strategy} at world size 1" in out  # logged as such
        assert all(math.isfinite(v) for v in losses(ckpt).values())


def test_auto_runs_the_plain_model_at_world_size_one():
    require_gpu()
    ckpt = scratch("auto")
    done = launch(overrides(ckpt, **{"parallelism.strategy": "auto", "schedule.num_steps": 4}))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"(none, world size 1, {device_word()}" in done.stdout + done.stderr


def test_every_async_mode_writes_the_same_checkpoint():
    require_gpu()
    runs = {}
    for mode in ("off", "thread", "process"):
        ckpt = scratch(f"async-{mode}")
        done = launch(overrides(ckpt, **{"checkpoint.async_mode": mode, "reproducibility.deterministic": "true"}))
        assert done.returncode == 0, (mode, done.stdout[-3000:] + done.stderr[-3000:])
        runs[mode] = ckpt
    for step in (8, 12):
        ref = checkpoint_tensors(final_step_dir(runs["off"], step), scratch("flat"))
        for mode in ("thread", "process"):
            assert_same_tensors(ref, checkpoint_tensors(final_step_dir(runs[mode], step), scratch("flat")))


def _cuda_checkpointer(root: str, mode: str):
    from trainer.checkpoint import Checkpointer
    from trainer.distributed import Env
    from trainer.s3 import NoMirror

    env = Env(rank=0, local_rank=0, world_size=1, device=torch.device("cuda", 0), backend="nccl")
    return Checkpointer(root, env, keep_last=3, async_mode=mode, mirror=NoMirror())


def _small_model_and_optimizer():
    from trainer.checkpoint import ModelAndOptimizer
    from trainer.config import ModelConfig, TrainerConfig
    from trainer.model import build_model
    from trainer.optim import build_optimizer

    cfg = TrainerConfig(model=ModelConfig(size="tiny"))
    model = build_model(cfg.model, 64, 16).cuda()
    optimizer = build_optimizer(model, cfg, torch.device("cuda", 0))
    model(torch.randint(0, 64, (2, 16), device="cuda")).float().sum().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer, ModelAndOptimizer(model, optimizer)


def test_cuda_rng_state_is_restored():
    require_gpu(cuda_only=True)
    _, _, app = _small_model_and_optimizer()
    root = scratch("rng")
    ckpt = _cuda_checkpointer(root, "off")
    torch.cuda.manual_seed(1234)
    torch.rand(3, device="cuda")
    saved = torch.cuda.get_rng_state()
    expected_next = None
    ckpt.save(1, app, {"step": 1}, "{}")
    ckpt.wait()
    expected_next = torch.rand(5, device="cuda")  # what the generator gives right after the save
    torch.rand(1000, device="cuda")  # move it on
    ckpt.load(final_step_dir(root, 1), app)
    assert torch.equal(torch.cuda.get_rng_state(), saved)
    assert torch.equal(torch.rand(5, device="cuda"), expected_next)
    ckpt.close()


def test_thread_mode_stages_into_pinned_buffers_reused_across_saves():
    require_gpu(cuda_only=True)
    from trainer.checkpoint.staging import _for_each_tensor

    model, optimizer, app = _small_model_and_optimizer()
    ckpt = _cuda_checkpointer(scratch("pinned"), "thread")
    ckpt.prepare_staging(app)
    ckpt.poll()
    for step in (1, 2, 3):
        ckpt.save(step, app, {"step": step}, "{}")
        ckpt.wait()
    staging = ckpt.writer.staging
    assert staging.allocations == 1
    flags = []
    _for_each_tensor(staging.buffers, lambda t: flags.append(t.is_pinned() or t.dim() == 0))
    assert flags and all(flags), "staging buffers must be pinned host memory"
    ckpt.close()


def test_the_export_loads_with_transformers_and_generates():
    require_gpu()
    from transformers import AutoModelForCausalLM

    export = os.path.join(trained_run(), "export", "step-000012")
    assert os.path.isfile(os.path.join(export, "config.json")), os.listdir(os.path.dirname(export))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(export).to(device).eval()
    prompt = torch.tensor([[72, 101, 108, 108, 111]], device=device)  # "Hello" as byte-level tokens
    out = model.generate(prompt, max_new_tokens=8, do_sample=False)
    assert out.shape == (1, 13)


def test_verify_checkpoint_passes_on_a_gpu_checkpoint():
    require_gpu()
    ckpt = trained_run()
    result = run([sys.executable, "-m", "trainer", "verify-checkpoint", ckpt], launcher_env(), timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "VERDICT: PASS" in result.stdout
    assert "held-out check: val_loss" in result.stdout  # the drill evaluated the model it restored


def test_the_steps_agreement_runs_on_the_gpu_with_one_host_sync():
    """The per-step agreement (preempted, time due, non-finite) is one NCCL all-reduce of a CUDA
    tensor, read back once: one host sync per step (CUDA's sync debug mode counts them), where
    the step used to read the finiteness test back (a sync) and then all-reduce a CPU float64
    tensor over gloo's TCP ring before launching the optimizer step. The CPU half (one read,
    one collective on the loss's device) is tests/trainer/test_step_agreement.py."""
    require_gpu(cuda_only=True)
    import socket
    import warnings

    import torch.distributed as dist

    from trainer import distributed

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("cpu:gloo,cuda:nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            device_id=device)
    try:
        env = distributed.Env(0, 0, 1, device, "nccl")
        loss, norm = torch.tensor(2.5, device=device), torch.tensor(float("nan"), device=device)
        distributed.agree_on_step(env, loss, norm, False, False)  # NCCL's communicator is set up here
        torch.cuda.synchronize()
        reduced = []
        real = dist.all_reduce
        dist.all_reduce = lambda t, *a, **k: (reduced.append(t.device.type), real(t, *a, **k))[1]
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                preempted, due, bad = distributed.agree_on_step(env, loss, norm, True, False)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            dist.all_reduce = real
        syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
        assert (preempted, due, bad) == (True, False, True)
        assert reduced == ["cuda"], reduced
        assert len(syncs) == 1, [str(w.message) for w in syncs]
    finally:
        dist.destroy_process_group()
