"""Preflight counts the pinned staging memory of thread-mode checkpoints (review trainer-4 §2.2:
1.66x the state, unswappable, in the pod's memory limit, invisible to preflight)."""
import torch

from trainer.config import ModelConfig
from trainer.model import build_model
from trainer.preflight import pinned_staging_bytes, staging_problem


def gpt2_numels() -> list[int]:
    with torch.device("meta"):
        model = build_model(ModelConfig(size="gpt2"), 50304, 1024)
    return [p.numel() for p in model.parameters()]


def test_gpt2_with_adamw_pins_2_31_gib_for_1_39_gib_of_state():
    numels = gpt2_numels()
    assert round(sum(numels) * 12 / 2**30, 2) == 1.39
    assert round(pinned_staging_bytes(numels) / 2**30, 2) == 2.31  # every block rounded up to a power of two
    assert pinned_staging_bytes([3]) == 3 * 16 and pinned_staging_bytes([4]) == 3 * 16 and pinned_staging_bytes([5]) == 3 * 32


def test_eight_ranks_of_gpt2_do_not_fit_a_16_gib_pod_and_the_message_says_what_to_change():
    numels = gpt2_numels()
    problem = staging_problem(numels, shards=1, local_ranks=8, host_bytes=16 * 2**30)
    assert problem and "8 rank(s) on this node pin 18.5 GiB" in problem and "16.0 GiB" in problem
    assert "checkpoint.async_mode=off" in problem
    assert staging_problem(numels, shards=1, local_ranks=8, host_bytes=64 * 2**30) is None
    assert staging_problem(numels, shards=8, local_ranks=8, host_bytes=16 * 2**30) is None  # FSDP: a shard each
