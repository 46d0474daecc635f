"""FSDP2 with gradient accumulation keeps no unsharded gradient between micro-steps.

With gradient sync switched off until the last micro-step, FSDP2 keeps every parameter's whole
gradient (`unsharded_accumulated_grad` in the reduce dtype, or the unsharded parameter's
`.grad`; torch 2.13 _fully_shard/_fsdp_param.py): 4 bytes per parameter, unsharded, on every
GPU, which the memory preflight (16 bytes per parameter / shards) does not count. The trainer
reduce-scatters every micro-step instead, as torchtitan does."""
import re
import subprocess
import sys
import textwrap

import pytest

from trainer_helpers import REPO, launcher_env

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    from trainer import distributed
    from trainer.config import ModelConfig, ParallelismConfig
    from trainer.model import build_model

    env = distributed.init(ParallelismConfig(init_timeout_seconds=60))
    torch.manual_seed(0)
    model = build_model(ModelConfig(size="tiny"), 64, 16)
    strategy = distributed.FSDPStrategy(bf16=False)
    model = strategy.wrap(model, env)
    inputs = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(env.rank))
    with strategy.grad_sync(model, False):  # the first of two micro-steps
        model(inputs).float().pow(2).mean().backward()
    held = 0
    for module in model.modules():
        state = module._get_fsdp_state() if hasattr(module, "_get_fsdp_state") else None
        group = state._fsdp_param_group if state is not None else None
        for param in (group.fsdp_params if group is not None else []):
            for grad in (param.unsharded_accumulated_grad, getattr(param._unsharded_param, "grad", None)):
                if grad is not None:
                    held += grad.numel() * grad.element_size()
    full = sum(p.numel() * 4 for p in model.parameters())
    # One write(2) per line: a pipe never interleaves it with the other rank's.
    os.write(1, f"rank {env.rank}: unsharded gradient bytes held {held} of {full}\\n".encode())
    dist.destroy_process_group()
""")


def test_no_unsharded_gradient_is_kept_between_micro_steps(tmp_path):
    script = tmp_path / "accumulate.py"
    script.write_text(SCRIPT)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                             str(script)], env=launcher_env(), cwd=REPO, capture_output=True, text=True, timeout=180)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    held = re.findall(r"rank \d: unsharded gradient bytes held (\d+) of (\d+)", out)
    assert len(held) == 2 and all(int(n) == 0 for n, _ in held), held
