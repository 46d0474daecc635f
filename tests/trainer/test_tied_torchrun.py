"""The tied built-in GPT under DDP and FSDP2 with 2 CPU ranks (torchrun, gloo): the same
training within float tolerance, and the tie kept through DCP's sharded save."""
import pytest
import torch

from trainer.checkpoint.layout import step_dir
from trainer_helpers import checkpoint_tensors, launcher_env, losses, run, tiny_overrides, torchrun_cmd

pytestmark = pytest.mark.slow

NUM_STEPS = 30
EXTRA = {"schedule.num_steps": NUM_STEPS, "checkpoint.every_steps": 15, "schedule.grad_accum_steps": 2,
         "export.at_end": "false"}


def test_tied_gpt_trains_the_same_under_ddp_and_fsdp2(tmp_path, data_dir):
    runs = {}
    for strategy in ("ddp", "fsdp"):
        ckpt = str(tmp_path / strategy)
        result = run(torchrun_cmd(2, tiny_overrides(data_dir, ckpt, **EXTRA, **{"parallelism.strategy": strategy})),
                     launcher_env())
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        runs[strategy] = (losses(ckpt), checkpoint_tensors(step_dir(ckpt, NUM_STEPS), tmp_path))
    (ddp_losses, ddp), (fsdp_losses, fsdp) = runs["ddp"], runs["fsdp"]
    assert sorted(ddp_losses) == sorted(fsdp_losses) == list(range(1, NUM_STEPS + 1))
    # Same maths, different reduction order (all-reduce vs reduce-scatter): equal to fp32 rounding.
    worst = max(abs(ddp_losses[s] - fsdp_losses[s]) for s in ddp_losses)
    print(f"max |loss_ddp - loss_fsdp| over {NUM_STEPS} steps: {worst:.3e}")
    assert worst < 1e-4
    assert ddp_losses[NUM_STEPS] < ddp_losses[1] - 0.5, "the model did not learn"
    for name, tensors in (("ddp", ddp), ("fsdp", fsdp)):
        # One weight, saved under both names by DCP, identical: the tie survived sharding.
        assert torch.equal(tensors["app.model.wte.weight"], tensors["app.model.lm_head.weight"]), name
    model_keys = [k for k in ddp if k.startswith("app.model.")]
    assert model_keys and set(model_keys) == {k for k in fsdp if k.startswith("app.model.")}
    diff = max((ddp[k] - fsdp[k]).abs().max().item() for k in model_keys)
    print(f"max |w_ddp - w_fsdp| after {NUM_STEPS} steps: {diff:.3e}")
    assert diff < 1e-3
