"""Evaluation computes its loss with the training loss's function, compiled like it (review
trainer-4 §2.1: eval ran the eager fp32 tail, whose transient peak set the recorded
peak_gpu_memory_gib)."""
import contextlib

import pytest
import torch
import torch.nn.functional as F

from trainer.config import load_config
from trainer.data import TokenShards, ValidationBatches
from trainer.distributed import Env
from trainer.evaluation import Evaluator
from trainer.model import build_model
from trainer_helpers import TINY_CONFIG


def evaluator(data_dir: str, compile_model: bool) -> tuple[Evaluator, torch.nn.Module, ValidationBatches]:
    cfg = load_config(TINY_CONFIG, [f"data.dir={data_dir}", "checkpoint.dir=unused", "data.seq_len=32"])
    torch.manual_seed(0)
    model = build_model(cfg.model, 257, 32)
    val = TokenShards(data_dir, 32, split="val")
    batches = ValidationBatches(val, 4, 2, 0, 1, torch.device("cpu"))
    env = Env(0, 0, 1, torch.device("cpu"), "gloo")
    return Evaluator(cfg.evaluation, model, batches, env, contextlib.nullcontext, compile_model), model, batches


def test_the_validation_loss_is_the_training_loss_function_compiled_when_training_is(data_dir):
    compiled, _, _ = evaluator(data_dir, compile_model=True)
    assert getattr(compiled.loss_fn, "_torchdynamo_orig_callable", None) is not None, "evaluation's loss is eager"
    eager, model, batches = evaluator(data_dir, compile_model=False)
    assert getattr(eager.loss_fn, "_torchdynamo_orig_callable", None) is None
    model.eval()
    with torch.no_grad():
        expected = sum(F.cross_entropy(model(x).float().view(-1, 257), y.reshape(-1)).double() for x, y in batches)
    assert eager.evaluate()["val_loss"] == pytest.approx((expected / len(batches)).item(), rel=1e-12)
