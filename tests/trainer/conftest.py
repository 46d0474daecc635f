import os
import signal
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

# Python's own sources: a corpus that ships with the interpreter, no download.
CORPUS_MODULES = ["argparse", "textwrap", "string"]


@pytest.fixture(scope="session")
def corpus_files():
    import importlib

    return [importlib.import_module(m).__file__ for m in CORPUS_MODULES]


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory, corpus_files):
    from trainer.prepare import prepare

    out = str(tmp_path_factory.mktemp("data"))
    prepare(corpus_files, out, show_progress=False, val_fraction=0.05)  # a validation split for evaluation
    return out


@pytest.fixture
def restore_signals():
    """In-process training installs SIGTERM/SIGUSR1 handlers; give pytest its own back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.fixture(scope="session")
def tiny_hf_dir(tmp_path_factory):
    """A randomly initialised Llama-architecture causal LM saved locally, as on FSx."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128)
    out = str(tmp_path_factory.mktemp("hf-model"))
    LlamaForCausalLM(config).save_pretrained(out)
    return out
