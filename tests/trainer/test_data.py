import json
import os

import numpy as np
import pytest
import torch

from trainer.data import (DistributedBatches, FeistelPermutation, TokenShards, ValidationBatches, epoch_key,
                          splitmix64)
from trainer.prepare import BYTE_EOT, prepare

# FeistelPermutation(1000, epoch_key(1337, 0))[0:8], computed once; see the test using it.
PINNED_ORDER = [168, 62, 239, 243, 394, 198, 995, 712]


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
    n = loader.shards.num_samples
    epoch0 = [loader.sample_at(i) for i in range(n)]
    epoch1 = [loader.sample_at(n + i) for i in range(n)]
    assert epoch0 != epoch1
    assert sorted(epoch0) == sorted(epoch1) == list(range(n))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 16, 17, 255, 256, 257, 1000, 4099])
def test_feistel_permutation_is_a_bijection(n):
    for key in (0, 1, 2**63 + 12345):
        perm = FeistelPermutation(n, key)
        assert sorted(perm[i] for i in range(n)) == list(range(n))
    if n >= 16:
        # Not the identity and keyed: two keys give different orders.
        a, b = FeistelPermutation(n, 1), FeistelPermutation(n, 2)
        assert [a[i] for i in range(n)] != list(range(n))
        assert [a[i] for i in range(n)] != [b[i] for i in range(n)]


def test_sample_order_is_pinned_and_independent_of_numpy_rng(monkeypatch):
    """The order is our own arithmetic: pinned values (a change of algorithm must be a
    conscious, documented break of resumability) and no call into NumPy's generators."""
    def no_numpy_rng(*args, **kwargs):
        raise AssertionError("the sample order must not use NumPy's RNG")

    monkeypatch.setattr(np.random, "default_rng", no_numpy_rng)
    monkeypatch.setattr(np.random, "permutation", no_numpy_rng)
    perm = FeistelPermutation(1000, epoch_key(1337, 0))
    assert [perm[i] for i in range(8)] == PINNED_ORDER
    assert splitmix64(0) == 0xE220A8397B1DCDAF  # SplitMix64's published first output for seed 0


def test_huge_datasets_need_no_permutation_array():
    # 10^12 windows (about 10^15 tokens): an array permutation would need 8 TB per rank.
    perm = FeistelPermutation(10**12, 7)
    values = [perm[i] for i in range(0, 10**12, 10**10)]
    assert all(0 <= v < 10**12 for v in values) and len(set(values)) == len(values)


def test_prefetch_returns_the_same_batches_and_resumes_exactly(data_dir):
    plain = batches(data_dir, 1, 2)
    expected = [plain.next_batch()[0] for _ in range(30)]
    shards = TokenShards(data_dir, 16)
    ahead = DistributedBatches(shards, 3, 1, 2, 1, torch.device("cpu"), prefetch=4)
    for i in range(11):
        assert torch.equal(ahead.next_batch()[0], expected[i])
    state = ahead.state_dict()  # 4 batches are read ahead at this point: the cursor must not count them
    assert state["cursor"] == 11 * 3 * 2
    ahead.close()
    resumed = DistributedBatches(shards, 3, 1, 2, 1, torch.device("cpu"), prefetch=2)
    resumed.load_state_dict(state)
    for i in range(11, 30):
        assert torch.equal(resumed.next_batch()[0], expected[i])
    # Rewinding a live loader (load_state_dict with batches in flight) drops them.
    resumed.load_state_dict(state)
    assert torch.equal(resumed.next_batch()[0], expected[11])
    resumed.close()


def test_validation_split_is_held_out_and_fixed(tmp_path, corpus_files):
    manifest = prepare(corpus_files, str(tmp_path / "d"), show_progress=False, val_fraction=0.1)
    train = TokenShards(str(tmp_path / "d"), 16)
    val = TokenShards(str(tmp_path / "d"), 16, split="val")
    total = manifest["num_tokens"] + manifest["num_val_tokens"]
    assert manifest["num_val_tokens"] == int(np.ceil(total * 0.1))  # one shard: its last 10%
    assert val.num_samples > 0 and train.num_samples > 0
    # The held-out tokens are the tail of the stream: training never reads them.
    stream = np.concatenate([np.load(tmp_path / "d" / s["file"]) for s in manifest["shards"]])
    held_out = np.load(tmp_path / "d" / manifest["val_shards"][0]["file"])
    assert len(stream) + len(held_out) == total
    no_split = prepare(corpus_files, str(tmp_path / "e"), show_progress=False)
    assert np.array_equal(np.concatenate([stream, held_out]), np.load(tmp_path / "e" / no_split["shards"][0]["file"]))
    assert no_split["hash"] != manifest["hash"] and no_split["val_shards"] == []
    # Each rank gets its own windows, the same ones at every evaluation.
    ranks = [ValidationBatches(val, 2, 3, r, 2, torch.device("cpu")) for r in range(2)]
    picks = [[s for batch in v.batches for s in batch] for v in ranks]
    assert len(picks[0]) == len(picks[1]) == 6 and not set(picks[0]) & set(picks[1])
    first = [x for x, _ in ranks[0]]
    again = [x for x, _ in ranks[0]]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
