"""Pre-tokenised shards, memory-mapped, sampled deterministically across ranks.

The only state is `cursor`: the number of samples the whole job has consumed. Every batch
is a pure function of (seed, cursor, rank, world size), so restoring the cursor from a
checkpoint replays exactly the batches an uninterrupted run would have seen.
"""
from __future__ import annotations

import json
import os
from functools import lru_cache

import numpy as np
import torch


class TokenShards:
    """Fixed-length windows over a list of `.npy` token shards (uint16 or uint32)."""

    def __init__(self, data_dir: str, seq_len: int):
        with open(os.path.join(data_dir, "manifest.json")) as f:
            self.manifest = json.load(f)
        self.seq_len = seq_len
        self.shards = [np.load(os.path.join(data_dir, s["file"]), mmap_mode="r") for s in self.manifest["shards"]]
        # Each window needs seq_len + 1 tokens (inputs plus shifted targets); windows never
        # straddle shards, which keeps indexing O(log num_shards).
        per_shard = [max(0, (len(s) - 1) // seq_len) for s in self.shards]
        self.starts = np.concatenate([[0], np.cumsum(per_shard)])
        self.num_samples = int(self.starts[-1])
        if self.num_samples == 0:
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
    """Epoch-wise shuffled sample order, split into per-rank micro-batches."""

    def __init__(self, shards: TokenShards, micro_batch_size: int, rank: int, world_size: int, seed: int,
                 device: torch.device):
        self.shards = shards
        self.micro_batch_size = micro_batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.device = device
        self.cursor = 0

    @property
    def samples_per_micro_step(self) -> int:
        return self.micro_batch_size * self.world_size

    @lru_cache(maxsize=2)
    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.shards.num_samples)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        first = self.cursor + self.rank * self.micro_batch_size
        rows = []
        for position in range(first, first + self.micro_batch_size):
            epoch, index = divmod(position, self.shards.num_samples)
            rows.append(self.shards.window(int(self._order(epoch)[index])))
        self.cursor += self.samples_per_micro_step
        tokens = torch.from_numpy(np.stack(rows))
        if self.device.type == "cuda":
            tokens = tokens.pin_memory().to(self.device, non_blocking=True)
        return tokens[:, :-1], tokens[:, 1:]

    def state_dict(self) -> dict:
        # world size and batch size are recorded so a resume with a different global batch is detected.
        return {"cursor": self.cursor, "samples_per_micro_step": self.samples_per_micro_step}

    def load_state_dict(self, state: dict) -> None:
        # The order of samples does not depend on the world size: what must match is the
        # global batch, checked from the marker before loading (trainer.guards).
        self.cursor = int(state["cursor"])
