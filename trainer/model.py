"""Built-in GPT (nanoGPT-style) and a loader for local Hugging Face causal LMs.

Both return logits from `model(input_ids)` so the loop never needs to know which it has.
"""
from __future__ import annotations

import contextlib
import glob
import math
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainer.config import ModelConfig
from trainer.model_facts import GPT_SIZES  # noqa: F401  (re-exported: trainer.model.GPT_SIZES)



@dataclass
class GPTShape:
    num_layers: int
    num_heads: int
    embed_dim: int
    vocab_size: int
    max_seq_len: int
    dropout: float = 0.0
    tie_embeddings: bool = True


class CausalSelfAttention(nn.Module):
    def __init__(self, shape: GPTShape):
        super().__init__()
        self.num_heads = shape.num_heads
        self.qkv = nn.Linear(shape.embed_dim, 3 * shape.embed_dim)
        self.proj = nn.Linear(shape.embed_dim, shape.embed_dim)
        self.dropout = shape.dropout
        # Residual dropout after the output projection, as nanoGPT (`resid_dropout`) and
        # HF GPT-2 (`GPT2Attention.resid_dropout`) do; no parameters, so checkpoints and the
        # export are unchanged, and a no-op at dropout 0.
        self.resid_dropout = nn.Dropout(shape.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(x).split(dim, dim=2)
        q, k, v = (t.view(batch, seq, self.num_heads, dim // self.num_heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.resid_dropout(self.proj(y.transpose(1, 2).contiguous().view(batch, seq, dim)))


class MLP(nn.Module):
    def __init__(self, shape: GPTShape):
        super().__init__()
        self.fc = nn.Linear(shape.embed_dim, 4 * shape.embed_dim)
        self.proj = nn.Linear(4 * shape.embed_dim, shape.embed_dim)
        self.dropout = nn.Dropout(shape.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, shape: GPTShape):
        super().__init__()
        self.ln_1 = nn.LayerNorm(shape.embed_dim)
        self.attn = CausalSelfAttention(shape)
        self.ln_2 = nn.LayerNorm(shape.embed_dim)
        self.mlp = MLP(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, shape: GPTShape):
        super().__init__()
        self.shape = shape
        self.wte = nn.Embedding(shape.vocab_size, shape.embed_dim)
        self.wpe = nn.Embedding(shape.max_seq_len, shape.embed_dim)
        self.drop = nn.Dropout(shape.dropout)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.num_layers))
        self.ln_f = nn.LayerNorm(shape.embed_dim)
        self.lm_head = nn.Linear(shape.embed_dim, shape.vocab_size, bias=False)
        self.apply(self._init_weights)
        if shape.tie_embeddings:
            # GPT-2 (and nanoGPT, llm.c) share the token embedding with the output projection:
            # 124M parameters instead of 163M. FSDP2 accepts it because wte and lm_head are
            # both in the root shard unit (trainer.distributed.FSDPStrategy wraps only the
            # blocks separately); a shared parameter across two units would not be.
            self.lm_head.weight = self.wte.weight
        # GPT-2 scales residual projections by 1/sqrt(2 * layers) to keep activations stable.
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * shape.num_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    def layers(self) -> list[nn.Module]:
        return list(self.blocks)


class HFCausalLM(nn.Module):
    """Adapter so a `transformers` model looks like GPT to the loop: ids in, logits out."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids=idx, use_cache=False).logits

    def layers(self) -> list[nn.Module]:
        # Decoder blocks live under different names per architecture.
        for path in ("model.layers", "transformer.h", "gpt_neox.layers", "model.decoder.layers"):
            node = self.inner
            try:
                for part in path.split("."):
                    node = getattr(node, part)
            except AttributeError:
                continue
            return list(node)
        raise ValueError(f"cannot find the decoder layers of {type(self.inner).__name__}")


def lm_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy. Compiled together with the model (`loss_function`),
    inductor fuses the fp32 upcast, log-softmax and NLL (and their backward) instead of
    materialising fp32 copies of the [B*T, vocab] logits eagerly (about 38 GB of memory
    traffic per 16 x 1024 micro-batch of GPT-2 124M: nanoGPT computes its loss inside the
    compiled forward for this reason)."""
    logits = model(inputs)
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def loss_function(model: nn.Module, compile_model: bool, blocks_compiled: bool = False):
    """`loss(inputs, targets)` for the training loop.

    - no compile: eager model, eager loss;
    - compile, whole model (single process, DDP): the model *and* the loss in one compiled
      graph (`torch.compile` of `lm_loss`; DDP modules are split per bucket by dynamo's
      DDPOptimizer);
    - compile, blocks already compiled one by one (FSDP2, torchtitan's way: a compiled root
      would graph-break on every FSDP hook): the root runs eager and the cross-entropy is
      compiled on its own, so the upcast and log-softmax are still fused."""
    def loss(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return lm_loss(model, inputs, targets)

    if not compile_model:
        return loss
    if blocks_compiled:
        compiled_ce = torch.compile(cross_entropy)
        return lambda inputs, targets: compiled_ce(model(inputs), targets)
    return torch.compile(loss)


def build_model(cfg: ModelConfig, vocab_size: int, seq_len: int, empty: bool = False) -> nn.Module:
    """`empty`: a Hugging Face model's parameters on the meta device (no memory, nothing
    read), to be sharded and then filled (`materialize`, `load_hf_weights`); the built-in GPT
    is always built whole (its initial weights come from the seed)."""
    if cfg.kind == "hf":
        return empty_hf_model(cfg.hf_path, vocab_size) if empty else load_hf_model(cfg.hf_path, vocab_size)
    sizes = dict(GPT_SIZES[cfg.size])
    for key in ("num_layers", "num_heads", "embed_dim"):
        if getattr(cfg, key) is not None:
            sizes[key] = getattr(cfg, key)
    shape = GPTShape(vocab_size=cfg.vocab_size or vocab_size, max_seq_len=seq_len, dropout=cfg.dropout,
                     tie_embeddings=cfg.tie_embeddings, **sizes)
    return GPT(shape)


def load_hf_model(path: str, dataset_vocab_size: int) -> nn.Module:
    """The saved model, whole, in fp32, in this process (the export and the restore drill)."""
    # Imported here so GPT-only jobs do not pay the transformers import.
    from transformers import AutoModelForCausalLM

    inner = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, torch_dtype=torch.float32)
    _check_vocab(inner, path, dataset_vocab_size)
    return HFCausalLM(inner)


def _check_vocab(inner: nn.Module, path: str, dataset_vocab_size: int) -> None:
    if inner.get_input_embeddings().num_embeddings < dataset_vocab_size:
        raise ValueError(
            f"model at {path} has {inner.get_input_embeddings().num_embeddings} token embeddings but the "
            f"dataset uses {dataset_vocab_size}: prepare the data with this model's tokenizer (--tokenizer-dir)"
        )


def hf_weight_files(path: str) -> list[str]:
    """The saved model's safetensors files (one, or the shards an index names)."""
    return sorted(glob.glob(os.path.join(path, "*.safetensors")))


@contextlib.contextmanager
def parameters_on_meta():
    """Parameters registered meanwhile land on the meta device: no memory and no
    initialisation (an op on a meta tensor computes nothing). Buffers stay real: the ones a
    model computes in its constructor and does not save (rotary `inv_freq`) keep their values.
    (accelerate's `init_empty_weights(include_buffers=False)` does the same.)"""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param) -> None:
        register(module, name, param)
        if param is not None and not param.is_meta:
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def empty_hf_model(path: str, dataset_vocab_size: int) -> nn.Module:
    """The saved model's architecture with its parameters on the meta device: every rank builds
    it in no time and no memory; the weights come later, into each rank's shard
    (`load_hf_weights`). Before, every rank loaded the whole model in fp32 on the host and then
    on its GPU before sharding: 80 GB per GPU for a 20B model, 8 host copies per node."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, local_files_only=True)
    with parameters_on_meta():
        inner = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    _check_vocab(inner, path, dataset_vocab_size)
    return HFCausalLM(inner)


def materialize(model: nn.Module, device: torch.device) -> None:
    """Storage for a model built on the meta device (sharded already, or not), on `device`;
    the real buffers keep their values. The parameters hold garbage until loaded."""
    saved = {name: buffer.detach().clone() for name, buffer in model.named_buffers() if not buffer.is_meta}
    model.to_empty(device=device)
    with torch.no_grad():
        for name, value in saved.items():
            model.get_buffer(name).copy_(value)


def load_hf_weights(model: nn.Module, path: str, is_main: bool, distributed: bool) -> None:
    """The saved weights into `model` (an `HFCausalLM`, sharded by FSDP2 or not). Only rank 0
    reads the files (one copy, in their dtype, on its host); every rank receives its part, one
    tensor at a time (`set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True)`,
    torchtitan's way)."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    full: dict[str, torch.Tensor] = {}
    if is_main or not distributed:
        for file in hf_weight_files(path):
            full.update({f"inner.{key}": value for key, value in load_file(file, device="cpu").items()})
        # A tied weight is saved once (the output head shares the token embedding): every name
        # of a shared parameter gets the saved tensor.
        names: dict[int, list[str]] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            names.setdefault(id(param), []).append(name)
        for group in names.values():
            saved = next((full[n] for n in group if n in full), None)
            for name in group:
                if saved is not None:
                    full.setdefault(name, saved)
        # Persistent buffers the files lack keep the values the constructor computed.
        for name, buffer in model.named_buffers():
            if name in model.state_dict() and name not in full:
                full[name] = buffer.detach().cpu()
        missing = [n for group in names.values() for n in group if n not in full]
        if missing:
            raise ValueError(f"model.hf_path={path!r}: no saved weights for {missing[:5]}; save the model with "
                             "save_pretrained")
    if distributed:
        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    else:
        missing, unexpected = model.load_state_dict(full, strict=False)
        if missing or unexpected:
            raise ValueError(f"model.hf_path={path!r}: weights do not match the architecture (missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]})")


def count_params(model: nn.Module, exclude_embeddings: bool = True) -> int:
    """N of the 6·N FLOPs-per-token estimate (PaLM appendix B; nanoGPT's get_num_params):
    every parameter once, even when shared, minus those that only an embedding lookup uses
    (a lookup does no matmul). A tied token embedding is also the output projection, a
    matmul, so it counts, once; an untied one (Llama) does not, its lm_head does. For the
    GPT-2 124M shape this gives 123.65M, nanoGPT's figure, for the built-in GPT and for
    transformers' GPT2LMHeadModel alike."""
    lookup_only: dict[int, bool] = {}
    sizes: dict[int, int] = {}
    for module in model.modules():
        is_lookup = isinstance(module, nn.Embedding)
        for p in module._parameters.values():
            if p is None:
                continue
            sizes[id(p)] = p.numel()
            lookup_only[id(p)] = lookup_only.get(id(p), True) and is_lookup
    return sum(n for key, n in sizes.items() if not (exclude_embeddings and lookup_only[key]))


def model_dims(model: nn.Module) -> tuple[int, int]:
    """(num_layers, hidden size) for the attention term of the FLOP count."""
    if isinstance(model, GPT):
        return model.shape.num_layers, model.shape.embed_dim
    config = model.inner.config
    return config.num_hidden_layers, config.hidden_size


def apply_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each decoder layer in backward instead of keeping its activations."""
    if isinstance(model, HFCausalLM):
        model.inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for i, block in enumerate(model.blocks):
        model.blocks[i] = checkpoint_wrapper(block)
