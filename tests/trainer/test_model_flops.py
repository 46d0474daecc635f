"""Weight tying of the built-in GPT and the FLOP / MFU accounting (no training here)."""
import pytest
import torch

from trainer.config import ModelConfig
from trainer.metrics import PEAK_BF16_TFLOPS, flops_per_token, peak_tflops_for
from trainer.model import build_model, count_params

# torch.cuda.get_device_name() of the GPU types of catalog/gpus.py (names as the CUDA driver
# reports them on the EC2 instance families of the catalog), with their datasheet peaks below.
DEVICE_NAMES = {
    "a100": "NVIDIA A100-SXM4-40GB",
    "a100-80gb": "NVIDIA A100-SXM4-80GB",
    "h100": "NVIDIA H100 80GB HBM3",
    "h200": "NVIDIA H200",
    "l4": "NVIDIA L4",
    "a10g": "NVIDIA A10G",
    "l40s": "NVIDIA L40S",
}


def test_every_catalog_gpu_has_a_peak():
    from catalog.gpus import GPU_TYPES

    # A new type is one catalog entry; its own device name must resolve to its own peak.
    assert all(peak_tflops_for(gpu.cuda_device_name) == gpu.peak_bf16_tflops > 0 for gpu in GPU_TYPES.values())
    assert {name: GPU_TYPES[name].cuda_device_name for name in DEVICE_NAMES} == DEVICE_NAMES
    peaks = {name: peak_tflops_for(device) for name, device in DEVICE_NAMES.items()}
    assert all(peaks.values()), peaks
    # Datasheet figures (dense bf16), and the substring traps: A100 is not A10, L40S is not L4.
    assert peaks == {"a100": 312.0, "a100-80gb": 312.0, "h100": 989.0, "h200": 989.0, "l4": 121.0,
                     "a10g": 70.0, "l40s": 362.0}
    assert peak_tflops_for("NVIDIA A10") == 125.0 and peak_tflops_for("NVIDIA L40") == 181.0
    assert peak_tflops_for("NVIDIA H100 PCIe") == 756.0
    names = [key for key, _ in PEAK_BF16_TFLOPS]
    assert len(names) == len(set(names))


def test_gpt2_is_tied_and_has_124m_parameters():
    with torch.device("meta"):
        gpt = build_model(ModelConfig(size="gpt2"), 50257, 1024)
    assert gpt.lm_head.weight is gpt.wte.weight
    assert sum(p.numel() for p in gpt.parameters()) == 124_439_808  # GPT-2 small, as nanoGPT reports
    with torch.device("meta"):
        untied = build_model(ModelConfig(size="gpt2", tie_embeddings=False), 50257, 1024)
    assert untied.lm_head.weight is not untied.wte.weight


def test_flop_parameter_count_matches_nanogpt_and_transformers():
    """N of 6N: every parameter once, minus lookup-only embeddings (PaLM appendix B;
    nanoGPT's get_num_params(non_embedding=True) = 123.65M for GPT-2 124M)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from trainer.model import HFCausalLM

    with torch.device("meta"):
        tied = build_model(ModelConfig(size="gpt2"), 50257, 1024)
        untied = build_model(ModelConfig(size="gpt2", tie_embeddings=False), 50257, 1024)
        hf_gpt2 = HFCausalLM(GPT2LMHeadModel(GPT2Config()))
        llama = LlamaForCausalLM(LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                             tie_word_embeddings=False))
    nanogpt_non_embedding = 124_439_808 - 1024 * 768  # minus wpe only: wte is the output matmul
    assert count_params(tied) == nanogpt_non_embedding
    assert count_params(hf_gpt2) == nanogpt_non_embedding
    # Untied: the lookup table does no matmul, the separate head does; the FLOPs are the same.
    assert count_params(untied) == nanogpt_non_embedding
    total = sum(p.numel() for p in llama.parameters())
    embed = llama.get_input_embeddings().weight.numel()
    assert count_params(llama) == total - embed  # lm_head (a matmul) counted, the lookup not
    # 6N + 12·L·H·T for the 124M model at T=1024 (nanoGPT's estimate_mfu, per token)
    assert flops_per_token(count_params(tied), 12, 768, 1024) == 6 * nanogpt_non_embedding + 12 * 12 * 768 * 1024


def test_tied_weights_survive_a_dcp_round_trip(tmp_path):
    import torch.distributed.checkpoint as dcp

    from trainer.checkpoint import ModelAndOptimizer

    torch.manual_seed(0)
    model = build_model(ModelConfig(size="tiny"), 100, 16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randint(0, 100, (2, 16))).sum().backward()
    optimizer.step()
    dcp.save({"app": ModelAndOptimizer(model, optimizer)}, checkpoint_id=str(tmp_path), no_dist=True)

    torch.manual_seed(1)
    loaded = build_model(ModelConfig(size="tiny"), 100, 16)
    loaded_opt = torch.optim.AdamW(loaded.parameters(), lr=1e-2)
    dcp.load({"app": ModelAndOptimizer(loaded, loaded_opt)}, checkpoint_id=str(tmp_path), no_dist=True)
    assert loaded.lm_head.weight is loaded.wte.weight  # still one tensor, not two copies
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], loaded_opt.state_dict()["state"][0]["exp_avg"])


@pytest.mark.parametrize("tie", [True, False])
def test_built_in_gpt_exports_as_gpt2_with_the_same_logits(tie):
    from trainer.export import gpt_to_hf

    torch.manual_seed(0)
    model = build_model(ModelConfig(size="small", tie_embeddings=tie), 300, 32).eval()
    hf = gpt_to_hf(model)
    ids = torch.randint(0, 300, (2, 32))
    with torch.no_grad():
        ours, theirs = model(ids), hf(input_ids=ids).logits
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()
    assert (hf.lm_head.weight is hf.transformer.wte.weight) == tie


def test_export_crops_a_padded_vocabulary_to_the_tokenizers():
    """llm.c dev/eval/export_hf.py: "drop the padding back to GPT2 size" and GPT2Config(vocab_size=V):
    a model trained with vocab 50304 for 50257 tokens exports 50257 rows."""
    from trainer.export import gpt_to_hf

    torch.manual_seed(0)
    model = build_model(ModelConfig(size="small", vocab_size=320), 300, 32).eval()  # padded from 300
    hf = gpt_to_hf(model, vocab_size=300)
    assert hf.config.vocab_size == 300 and hf.transformer.wte.weight.shape[0] == 300
    ids = torch.randint(0, 300, (2, 32))
    with torch.no_grad():
        ours, theirs = model(ids)[..., :300], hf(input_ids=ids).logits
    assert theirs.shape[-1] == 300
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()


def test_preflight_plans_with_the_peak_the_trainer_measures_mfu_against():
    """One table (catalog/gpus.py): preflight said 125 TFLOP/s for an A10G, the trainer 70."""
    from catalog.gpus import GPU_TYPES
    from trainer.model_facts import peak_tflops_for_gpu_type

    for gpu_type in GPU_TYPES:
        assert peak_tflops_for_gpu_type(gpu_type) is not None, gpu_type
    assert peak_tflops_for_gpu_type("a10g") == peak_tflops_for("NVIDIA A10G") == 70.0


def test_model_facts_import_without_torch():
    import os
    import subprocess
    import sys

    from trainer_helpers import REPO

    code = ("import sys; sys.modules['torch'] = None; import trainer.model_facts, jobs.preflight; "
            "print(trainer.model_facts.peak_tflops_for_gpu_type('h100'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO})
    assert out.returncode == 0 and out.stdout.strip() == "989.0", out.stderr[-2000:]
