"""A Hugging Face model is built on the meta device, sharded, then filled from rank 0's read of
its files: never whole in fp32 on every rank's host and GPU before FSDP2 shards it (a 20B model:
80 GB on every GPU first, an OOM the memory preflight did not foresee; 8 host copies per node).

Checked here on CPU, 2 ranks, FSDP2 and DDP: the parameters start on the meta device, and the
trained model's weights, buffers (rotary `inv_freq`, computed, not saved) and logits are the
saved model's, exactly as `from_pretrained` gives them. (The GPU half, peak device memory while
building, is tests/gpu.)"""
import re
import subprocess
import sys
import textwrap

import pytest

from trainer_helpers import REPO, launcher_env

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from transformers import AutoModelForCausalLM
    from trainer import distributed
    from trainer.config import ModelConfig, ParallelismConfig
    from trainer.model import HFCausalLM, build_model, load_hf_weights, materialize

    path, strategy_name = sys.argv[1], sys.argv[2]
    env = distributed.init(ParallelismConfig(init_timeout_seconds=60))
    reference = HFCausalLM(AutoModelForCausalLM.from_pretrained(path, local_files_only=True,
                                                                torch_dtype=torch.float32)).eval()
    model = build_model(ModelConfig(kind="hf", hf_path=path), 256, 32, empty=True)
    on_meta = all(p.is_meta for p in model.parameters())
    if strategy_name == "fsdp":
        model = distributed.FSDPStrategy(bf16=False).wrap(model, env)
        materialize(model, env.device)
        load_hf_weights(model, path, env.is_main, env.distributed)
    else:
        materialize(model, env.device)
        load_hf_weights(model, path, env.is_main, env.distributed)
        model = distributed.DDPStrategy().wrap(model, env)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    expected = reference.state_dict()
    different = sorted(k for k in expected if not torch.equal(full[k].cpu(), expected[k]))
    buffers = dict(reference.named_buffers())
    module = model.module if hasattr(model, "module") else model
    different += sorted(n for n, b in module.named_buffers() if n in buffers and not torch.equal(b, buffers[n]))
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        same_logits = torch.equal(module.eval()(tokens), reference(tokens))
    # One write(2) per line, which a pipe never interleaves (POSIX write(): at most PIPE_BUF bytes
    # are written atomically). Both ranks share the pipe; with print(), a run once read rank 0's
    # line spliced into rank 1's before its newline.
    os.write(1, f"rank {env.rank}: meta {on_meta} different {different[:5]} logits {same_logits}\\n".encode())
    dist.destroy_process_group()
""")


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_an_hf_model_is_built_empty_then_filled_with_exactly_its_saved_weights(strategy, tmp_path, tiny_hf_dir):
    script = tmp_path / "hf_build.py"
    script.write_text(SCRIPT)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                             str(script), tiny_hf_dir, strategy], env=launcher_env(), cwd=REPO, capture_output=True,
                            text=True, timeout=240)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    found = re.findall(r"rank (\d): meta (\w+) different (\[.*?\]) logits (\w+)", out)
    assert sorted(found) == [(r, "True", "[]", "True") for r in "01"], found or out[-3000:]
