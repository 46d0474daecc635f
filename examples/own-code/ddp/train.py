"""Your own plain PyTorch DDP script under the platform: a tiny causal transformer on the job's
token shards, resumable, and honouring the preemption contract (trainer/contract/).

Runs anywhere torchrun runs; under the platform it gets its rank, rendezvous, checkpoint
directory, dataset and MLflow run from the pod. The contract adds ~10 lines to a DDP loop:
``latest_checkpoint`` to resume, ``preemption()`` + ``stop.requested()`` to stop at a step
boundary on SIGTERM, ``begin/commit_checkpoint`` for a save that is never half-resumed.
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from trainer import contract


class TinyLM(nn.Module):
    def __init__(self, vocab: int, seq_len: int, dim: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(seq_len, dim)
        block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        return self.head(self.blocks(x, mask=self.mask[: tokens.shape[1], : tokens.shape[1]], is_causal=True))


def load_tokens(dataset_dir: str) -> tuple[np.ndarray, int]:
    """The platform's token shards (manifest.json + .npy), as `prepare-data` writes them."""
    with open(os.path.join(dataset_dir, "manifest.json")) as f:
        manifest = json.load(f)
    tokens = np.concatenate([np.load(os.path.join(dataset_dir, s["file"]), mmap_mode="r") for s in manifest["shards"]])
    return tokens.astype(np.int64), int(manifest["vocab_size"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()

    job = contract.job()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device(f"cuda:{job.local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    tokens, vocab = load_tokens(job.dataset_dir or "data")
    torch.manual_seed(0)
    model = TinyLM(vocab, args.seq_len).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    first = 1
    resume = contract.latest_checkpoint()
    if resume is not None:  # a recreated pod: continue where the last complete checkpoint ended
        state = torch.load(os.path.join(resume.path, "state.pt"), map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first = resume.step + 1
    ddp = DistributedDataParallel(model)
    if job.is_main:
        print(f"training from step {first} to {args.steps} on {job.world_size} rank(s)", flush=True)

    with contract.tracking() as run, contract.preemption() as stop:
        run.log_params(vars(args))
        for step in range(first, args.steps + 1):
            # The batch depends only on (step, rank): a resumed run sees the data it would have.
            rng = np.random.default_rng(step * job.world_size + job.rank)
            starts = rng.integers(0, len(tokens) - args.seq_len - 1, args.batch)
            window = torch.from_numpy(np.stack([tokens[s:s + args.seq_len + 1] for s in starts])).to(device)
            logits = ddp(window[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), window[:, 1:].reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

            stopping = stop.requested(step)  # every rank, every step: one all-reduce
            if step % args.save_every == 0 or step == args.steps or stopping:
                path = contract.begin_checkpoint(step)
                if job.is_main:
                    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                               os.path.join(path, "state.pt"))
                contract.commit_checkpoint(step)
            run.log_metrics({"loss": loss.item()}, step)
            if stopping:
                print(f"preempted: checkpoint at step {step} landed; exiting for a restart", flush=True)
                break
    dist.destroy_process_group()
    if job.is_main:
        print(f"done: step {args.steps}, loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
