"""Preflight counts the pinned staging memory of thread-mode checkpoints (review trainer-4 §2.2:
1.66x the state, unswappable, in the pod's memory limit, invisible to preflight)."""
import pytest
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


def test_process_mode_stages_in_dev_shm_and_a_pod_whose_shm_is_too_small_is_refused(tmp_path, data_dir, monkeypatch):
    """checkpoint.async_mode=process stages a full copy of each rank's state in /dev/shm: a
    256 MiB /dev/shm passed preflight and failed the first save with "No space left on device",
    exit 1, permanent, a whole checkpoint interval of GPU time later."""
    from trainer import preflight as preflight_mod
    from trainer.config import ConfigError, load_config
    from trainer.preflight import preflight, shm_staging_problem
    from trainer_helpers import TINY_CONFIG

    numels = gpt2_numels()
    problem = shm_staging_problem(numels, shards=1, local_ranks=8, shm_free_bytes=2**30)
    assert problem and "8 rank(s) on this node stage 1.39 GiB each" in problem and "= 11.13 GiB" in problem
    assert "1.00 GiB free" in problem and "checkpoint.async_mode=thread" in problem
    assert shm_staging_problem(numels, shards=8, local_ranks=8, shm_free_bytes=2 * 2**30) is None

    monkeypatch.setattr(preflight_mod, "shm_free_bytes", lambda path="/dev/shm": 256 * 2**20)
    cfg = load_config(TINY_CONFIG, [f"data.dir={data_dir}", f"checkpoint.dir={tmp_path}/ckpt", "model.size=gpt2",
                                    "checkpoint.async_mode=process"], environ={})
    with pytest.raises(ConfigError) as refused:
        preflight(cfg, world_size=1, memory=(80 * 2**30, "a test GPU"))
    assert "1 rank(s) on this node stage 0.95 GiB each" in str(refused.value)
    assert "in /dev/shm = 0.95 GiB, but /dev/shm has 0.25 GiB free" in str(refused.value)
    monkeypatch.setattr(preflight_mod, "shm_free_bytes", lambda path="/dev/shm": 4 * 2**30)
    preflight(cfg, world_size=1, memory=(80 * 2**30, "a test GPU"))


def test_a_hugging_face_model_is_counted_from_its_config_and_refused_when_it_does_not_fit(tmp_path, data_dir,
                                                                                           tiny_hf_dir):
    """Preflight had no memory check for Hugging Face models (no parameter count): now the
    model is built on the meta device from its config.json alone and counted like the GPT."""
    from trainer.config import ConfigError, load_config
    from trainer.preflight import num_model_params, preflight
    from trainer_helpers import TINY_CONFIG
    from transformers import AutoModelForCausalLM

    cfg = load_config(TINY_CONFIG, [f"data.dir={data_dir}", f"checkpoint.dir={tmp_path}/ckpt", "model.kind=hf",
                                    f"model.hf_path={tiny_hf_dir}"], environ={})
    expected = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tiny_hf_dir).parameters())
    assert num_model_params(cfg, 257) == expected
    with pytest.raises(ConfigError) as refused:
        preflight(cfg, world_size=1, memory=(expected * 8, "a test GPU"))  # half of 16 B/parameter
    assert f"model.hf_path={tiny_hf_dir!r}" in str(refused.value) and "16 bytes/parameter" in str(refused.value)
    preflight(cfg, world_size=1, memory=(expected * 32, "a test GPU"))
