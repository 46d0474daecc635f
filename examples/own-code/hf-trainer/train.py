"""Your own Hugging Face ``Trainer`` script under the platform: a tiny GPT-2 built from a config
in code (no download), trained on the job's token shards, preemptible and resumable.

The contract in a ``TrainerCallback`` (trainer/contract/): at every step end, every rank asks
whether any rank got SIGTERM; if so the Trainer saves now and stops, and the script exits 143.
Each save the Trainer finishes is committed with the platform's marker pointing at its
``checkpoint-N`` directory, so a restart resumes only from a checkpoint that fully landed.
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from trainer import contract


class TokenWindows(torch.utils.data.Dataset):
    """Fixed windows of the platform's token shards (manifest.json + .npy, from prepare-data)."""

    def __init__(self, dataset_dir: str, seq_len: int):
        with open(os.path.join(dataset_dir, "manifest.json")) as f:
            manifest = json.load(f)
        self.vocab_size = int(manifest["vocab_size"])
        self.tokens = np.concatenate([np.load(os.path.join(dataset_dir, s["file"])) for s in manifest["shards"]]).astype(np.int64)
        self.seq_len = seq_len

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, i: int) -> dict:
        ids = torch.from_numpy(self.tokens[i * self.seq_len:(i + 1) * self.seq_len].copy())
        return {"input_ids": ids, "labels": ids}


class PlatformContract(TrainerCallback):
    def __init__(self, stop: contract.Stop, run) -> None:
        self.stop, self.run = stop, run

    def on_step_end(self, args, state, control, **kwargs):
        if self.stop.requested(state.global_step):  # all ranks, every step
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_save(self, args, state, control, **kwargs):
        # Called on every rank after the Trainer wrote checkpoint-N: the marker goes last.
        step = state.global_step
        contract.commit_checkpoint(step, path=os.path.relpath(os.path.join(args.output_dir, f"checkpoint-{step}"),
                                                              contract.job().checkpoint_dir))

    def on_log(self, args, state, control, logs=None, **kwargs):
        numbers = {k: v for k, v in (logs or {}).items() if isinstance(v, (int, float))}
        if numbers:
            self.run.log_metrics(numbers, state.global_step)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()

    job = contract.job()
    data = TokenWindows(job.dataset_dir or "data", args.seq_len)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=data.vocab_size, n_positions=args.seq_len, n_embd=64, n_layer=2, n_head=4)
    model = GPT2LMHeadModel(config)
    cuda = torch.cuda.is_available()
    training = TrainingArguments(
        output_dir=os.path.join(job.checkpoint_dir, "hf"), max_steps=args.steps, per_device_train_batch_size=args.batch,
        learning_rate=args.lr, save_strategy="steps", save_steps=args.save_every, logging_steps=args.save_every,
        report_to=[], use_cpu=not cuda, ddp_backend=None if cuda else "gloo", dataloader_num_workers=0, seed=0,
    )
    resume = contract.latest_checkpoint()
    with contract.tracking() as run, contract.preemption() as stop:
        trainer = Trainer(model=model, args=training, train_dataset=data, callbacks=[PlatformContract(stop, run)])
        if job.is_main:
            print(f"training from step {resume.step if resume else 0} to {args.steps} on {job.world_size} rank(s)", flush=True)
        trainer.train(resume_from_checkpoint=resume.path if resume else None)
        if stop.requested():
            print(f"preempted at step {trainer.state.global_step}: checkpoint landed; exiting for a restart", flush=True)
    if job.is_main:
        print(f"done: step {args.steps}", flush=True)


if __name__ == "__main__":
    main()
