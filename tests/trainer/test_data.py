import json
import os

import numpy as np
import pytest
import torch

from trainer.data import DistributedBatches, TokenShards
from trainer.prepare import BYTE_EOT, prepare


def batches(data_dir, rank, world_size, seed=1, micro=3, seq_len=16):
    return DistributedBatches(TokenShards(data_dir, seq_len), micro, rank, world_size, seed, torch.device("cpu"))


def test_prepare_bytes_roundtrip_and_manifest(tmp_path):
    (tmp_path / "a.txt").write_text("héllo")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "ab"}) + "\n" + json.dumps({"text": "c"}) + "\n")
    out = tmp_path / "out"
    manifest = prepare([str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl")], str(out), show_progress=False)
    tokens = np.load(out / manifest["shards"][0]["file"])
    assert tokens.dtype == np.uint16
    expected = list("héllo".encode()) + [BYTE_EOT] + [97, 98, BYTE_EOT, 99, BYTE_EOT]
    assert tokens.tolist() == expected
    assert manifest["vocab_size"] == 257 and manifest["num_tokens"] == len(expected)
    again = prepare([str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl")], str(tmp_path / "o2"), show_progress=False)
    assert again["hash"] == manifest["hash"]


def test_prepare_rejects_jsonl_without_text(tmp_path):
    (tmp_path / "bad.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(ValueError, match="'text' field"):
        prepare([str(tmp_path / "bad.jsonl")], str(tmp_path / "out"), show_progress=False)


def test_prepare_with_local_hf_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "</s>": 1, "hello": 2, "world": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="[UNK]").save_pretrained(tmp_path / "tok")
    (tmp_path / "in.txt").write_text("hello world hello nope")
    manifest = prepare([str(tmp_path / "in.txt")], str(tmp_path / "out"), str(tmp_path / "tok"), show_progress=False)
    tokens = np.load(tmp_path / "out" / manifest["shards"][0]["file"])
    assert tokens.tolist() == [2, 3, 2, 0, 1]


def test_ranks_see_disjoint_samples_and_cover_an_epoch(data_dir):
    world = 2
    loaders = [batches(data_dir, r, world) for r in range(world)]
    seen = {r: [] for r in range(world)}
    for r, loader in enumerate(loaders):
        window = loader.shards.window
        loader.shards.window = lambda sample, r=r, window=window: seen[r].append(sample) or window(sample)
    num_samples = loaders[0].shards.num_samples
    num_micro_steps = num_samples // (3 * world)
    for _ in range(num_micro_steps):
        for loader in loaders:
            x, y = loader.next_batch()
            assert torch.equal(x[:, 1:], y[:, :-1])  # targets are inputs shifted by one
    assert not set(seen[0]) & set(seen[1])
    assert len(set(seen[0]) | set(seen[1])) == num_micro_steps * 3 * world  # no sample twice in an epoch
    assert loaders[0].cursor == loaders[1].cursor == num_micro_steps * 3 * world


def test_cursor_restores_the_exact_batch_sequence(data_dir):
    full = batches(data_dir, 1, 2)
    expected = [full.next_batch()[0] for _ in range(40)]  # crosses an epoch boundary on small corpora
    resumed = batches(data_dir, 1, 2)
    for _ in range(17):
        resumed.next_batch()
    state = resumed.state_dict()
    fresh = batches(data_dir, 1, 2)
    fresh.load_state_dict(state)
    for i in range(17, 40):
        assert torch.equal(fresh.next_batch()[0], expected[i])


def test_two_ranks_to_one_rank_with_double_accumulation_sees_the_same_samples(data_dir):
    # Issue 10 item 4: the sample order does not depend on the world size, so a resume onto
    # another world size at the same global batch continues exactly (trainer.guards checks it).
    two = [batches(data_dir, r, 2) for r in (0, 1)]
    for b in two:
        b.next_batch()  # one optimizer step of the 2-rank run
    state = two[0].state_dict()
    next_two = torch.cat([b.next_batch()[0] for b in two])
    one = batches(data_dir, 0, 1)
    one.load_state_dict(state)
    next_one = torch.cat([one.next_batch()[0] for _ in range(2)])  # two micro-steps on one rank
    assert torch.equal(next_two, next_one)


def test_epochs_are_reshuffled(data_dir):
    loader = batches(data_dir, 0, 1)
    assert not np.array_equal(loader._order(0), loader._order(1))
    assert sorted(loader._order(1)) == list(range(loader.shards.num_samples))
