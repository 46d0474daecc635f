"""Pre-tokenised shards, memory-mapped, sampled deterministically across ranks.

The only state is `cursor`: the number of samples the whole job has consumed. Every batch
is a pure function of (seed, cursor, rank, world size), so restoring the cursor from a
checkpoint replays exactly the batches an uninterrupted run would have seen, and reading
batches ahead on a thread (prefetch) cannot change them.

The sample order of an epoch is a keyed permutation computed one index at a time (a
Feistel network, `FeistelPermutation`): no rank ever builds an array of the whole dataset,
and the order depends on our own integer arithmetic only, not on NumPy's RNG streams, so it
is the same on every NumPy and Python version.
"""
from __future__ import annotations

import collections
import json
import os
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """SplitMix64's finaliser (Steele, Lea, Flood 2014; the seeding function of xoshiro):
    a bijective 64-bit mixer with full avalanche, written with Python ints so its output is
    fixed by arithmetic, not by a library version."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


class FeistelPermutation:
    """A pseudo-random bijection of [0, n) chosen by `key`, evaluated per index in O(1)
    memory: a balanced Feistel network (Luby-Rackoff; 6 rounds of a SplitMix64 round
    function) over the smallest even bit width covering n, with cycle walking to map the
    values that fall in [n, 2^bits) back into range (Black & Rogaway, "Ciphers with
    arbitrary finite domains", 2002). The domain is < 4n, so a lookup takes < 4 walks on
    average."""

    NUM_ROUNDS = 6

    def __init__(self, n: int, key: int):
        if n < 1:
            raise ValueError("a permutation needs n >= 1")
        self.n = n
        bits = max(2, (n - 1).bit_length())
        bits += bits % 2
        self.half_bits = bits // 2
        self.half_mask = (1 << self.half_bits) - 1
        self.round_keys = []
        state = key & MASK64
        for _ in range(self.NUM_ROUNDS):
            state = splitmix64(state)
            self.round_keys.append(state)

    def _encrypt(self, x: int) -> int:
        left, right = x >> self.half_bits, x & self.half_mask
        for round_key in self.round_keys:
            left, right = right, left ^ (splitmix64(right ^ round_key) & self.half_mask)
        return (left << self.half_bits) | right

    def __getitem__(self, index: int) -> int:
        if not 0 <= index < self.n:
            raise IndexError(index)
        value = self._encrypt(index)
        while value >= self.n:  # cycle walking: stays a bijection of [0, n)
            value = self._encrypt(value)
        return value

    def __len__(self) -> int:
        return self.n


def epoch_key(seed: int, epoch: int) -> int:
    return splitmix64(splitmix64(seed & MASK64) ^ (epoch & MASK64))


def read_manifest(data_dir: str) -> dict:
    with open(os.path.join(data_dir, "manifest.json")) as f:
        return json.load(f)


def num_windows(num_tokens: int, seq_len: int) -> int:
    # Each window needs seq_len + 1 tokens (inputs plus shifted targets).
    return max(0, (num_tokens - 1) // seq_len)


class TokenShards:
    """Fixed-length windows over a list of `.npy` token shards (uint16 or uint32).

    `split="train"` reads the manifest's `shards`, `split="val"` its `val_shards` (the
    held-out tail of each shard that `prepare-data --val-fraction` writes)."""

    def __init__(self, data_dir: str, seq_len: int, split: str = "train"):
        self.manifest = read_manifest(data_dir)
        self.seq_len = seq_len
        self.split = split
        entries = self.manifest["shards"] if split == "train" else self.manifest.get("val_shards", [])
        self.shards = [np.load(os.path.join(data_dir, s["file"]), mmap_mode="r") for s in entries]
        # Windows never straddle shards, which keeps indexing O(log num_shards).
        per_shard = [num_windows(len(s), seq_len) for s in self.shards]
        self.starts = np.concatenate([[0], np.cumsum(per_shard, dtype=np.int64)]).astype(np.int64)
        self.num_samples = int(self.starts[-1])
        if self.num_samples == 0 and split == "train":
            raise ValueError(f"{data_dir}: fewer than {seq_len + 1} tokens per shard; lower data.seq_len")

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["vocab_size"])

    @property
    def dataset_hash(self) -> str:
        return self.manifest["hash"]

    def window(self, sample: int) -> np.ndarray:
        shard = int(np.searchsorted(self.starts, sample, side="right") - 1)
        offset = (sample - int(self.starts[shard])) * self.seq_len
        return np.asarray(self.shards[shard][offset : offset + self.seq_len + 1], dtype=np.int64)


class DistributedBatches:
    """Epoch-wise shuffled sample order, split into per-rank micro-batches, read ahead by
    one background thread (`prefetch` micro-batches; 0 reads on the caller's thread)."""

    def __init__(self, shards: TokenShards, micro_batch_size: int, rank: int, world_size: int, seed: int,
                 device: torch.device, prefetch: int = 0):
        self.shards = shards
        self.micro_batch_size = micro_batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.device = device
        self.cursor = 0
        self.prefetch = prefetch
        self._permutations: dict[int, FeistelPermutation] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="data-prefetch") if prefetch else None
        self._ahead: collections.deque[tuple[int, Future]] = collections.deque()

    @property
    def samples_per_micro_step(self) -> int:
        return self.micro_batch_size * self.world_size

    def permutation(self, epoch: int) -> FeistelPermutation:
        if epoch not in self._permutations:
            self._permutations = {epoch: FeistelPermutation(self.shards.num_samples, epoch_key(self.seed, epoch))}
        return self._permutations[epoch]

    def sample_at(self, position: int) -> int:
        """The dataset window consumed at global position `position` of the job."""
        epoch, index = divmod(position, self.shards.num_samples)
        return self.permutation(epoch)[index]

    def _rows(self, cursor: int) -> torch.Tensor:
        first = cursor + self.rank * self.micro_batch_size
        rows = [self.shards.window(self.sample_at(p)) for p in range(first, first + self.micro_batch_size)]
        tokens = torch.from_numpy(np.stack(rows))
        return tokens.pin_memory() if self.device.type == "cuda" else tokens

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._pool is None:
            tokens = self._rows(self.cursor)
        else:
            # Keep `prefetch` micro-batches in flight, in cursor order; a batch is a pure
            # function of its cursor, so reading ahead never changes what is returned.
            next_cursor = self._ahead[-1][0] + self.samples_per_micro_step if self._ahead else self.cursor
            while len(self._ahead) < self.prefetch:
                self._ahead.append((next_cursor, self._pool.submit(self._rows, next_cursor)))
                next_cursor += self.samples_per_micro_step
            cursor, future = self._ahead.popleft()
            assert cursor == self.cursor, "prefetch queue out of step with the cursor"
            tokens = future.result()
        self.cursor += self.samples_per_micro_step
        if self.device.type == "cuda":
            tokens = tokens.to(self.device, non_blocking=True)
        return tokens[:, :-1], tokens[:, 1:]

    def _drop_prefetched(self) -> None:
        for _, future in self._ahead:
            future.cancel()
        self._ahead.clear()

    def close(self) -> None:
        self._drop_prefetched()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def state_dict(self) -> dict:
        # world size and batch size are recorded so a resume with a different global batch is detected.
        return {"cursor": self.cursor, "samples_per_micro_step": self.samples_per_micro_step}

    def load_state_dict(self, state: dict) -> None:
        # The order of samples does not depend on the world size: what must match is the
        # global batch, checked from the marker before loading (trainer.guards).
        self._drop_prefetched()
        self.cursor = int(state["cursor"])


class ValidationBatches:
    """The same validation windows at every evaluation: `num_batches` micro-batches per
    rank, spread evenly over the held-out split, disjoint across ranks where the split is
    large enough. No RNG, no cursor: evaluating never moves the training data."""

    def __init__(self, shards: TokenShards, micro_batch_size: int, num_batches: int, rank: int, world_size: int,
                 device: torch.device):
        self.shards = shards
        self.device = device
        total = micro_batch_size * num_batches * world_size
        available = shards.num_samples
        # Evenly spaced windows; with fewer windows than requested some repeat (stated in the docs).
        picks = [(k * available) // total if total <= available else k % available for k in range(total)]
        mine = picks[rank * micro_batch_size * num_batches : (rank + 1) * micro_batch_size * num_batches]
        self.batches = [mine[i : i + micro_batch_size] for i in range(0, len(mine), micro_batch_size)]

    def __iter__(self):
        for samples in self.batches:
            tokens = torch.from_numpy(np.stack([self.shards.window(s) for s in samples])).to(self.device)
            yield tokens[:, :-1], tokens[:, 1:]

    def __len__(self) -> int:
        return len(self.batches)
