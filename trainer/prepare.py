"""`prepare-data`: text or JSONL in, token shards (`.npy`) plus a manifest out."""
from __future__ import annotations

import glob
import hashlib
import json
import math
import os
from typing import Iterator

import numpy as np
from tqdm import tqdm

BYTE_VOCAB_SIZE = 257  # 256 byte values + end-of-text
BYTE_EOT = 256


class ByteTokenizer:
    """Fallback when no tokenizer directory is given: no files, no network, any text."""

    name = "bytes"
    vocab_size = BYTE_VOCAB_SIZE
    eot_id = BYTE_EOT

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


class HFTokenizer:
    def __init__(self, path: str):
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.name = os.path.abspath(path)
        self.vocab_size = len(self.tok)
        self.eot_id = self.tok.eos_token_id if self.tok.eos_token_id is not None else 0

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)


def input_files(inputs: list[str]) -> list[str]:
    files: list[str] = []
    for item in inputs:
        if os.path.isdir(item):
            files += sorted(p for p in glob.glob(os.path.join(item, "**", "*"), recursive=True) if os.path.isfile(p))
        else:
            matches = sorted(glob.glob(item))
            if not matches:
                raise FileNotFoundError(f"{item}: no such file")
            files += matches
    return files


def documents(path: str) -> Iterator[str]:
    if path.endswith((".jsonl", ".json")):
        with open(path, encoding="utf-8") as f:
            for line_number, line in enumerate(f, 1):
                if line.strip():
                    record = json.loads(line)
                    if "text" not in record:
                        raise ValueError(f"{path}:{line_number}: JSONL records need a 'text' field")
                    yield record["text"]
    else:
        with open(path, encoding="utf-8", errors="replace") as f:
            yield f.read()


DEFAULT_VAL_FRACTION = 0.005


def prepare(inputs: list[str], output_dir: str, tokenizer_dir: str | None = None,
            shard_tokens: int = 50_000_000, show_progress: bool = True,
            val_fraction: float = 0.0) -> dict:
    """Writes `shard-*.npy` for training and, with val_fraction > 0, holds out the last
    ceil(val_fraction x tokens) tokens of every shard as `val-*.npy`: the validation split is
    spread over the corpus (one cut per shard), never seen in training, and known before the
    whole corpus is read (streaming). The CLI defaults to DEFAULT_VAL_FRACTION; this
    function to no split."""
    if not 0.0 <= val_fraction < 0.5:
        raise ValueError(f"--val-fraction={val_fraction}: must be in [0, 0.5)")
    tokenizer = HFTokenizer(tokenizer_dir) if tokenizer_dir else ByteTokenizer()
    # uint16 halves disk and page cache for any vocabulary below 65536 (GPT-2's 50257 fits).
    dtype = np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32
    os.makedirs(output_dir, exist_ok=True)
    files = input_files(inputs)
    shards, val_shards, buffer, digest = [], [], [], hashlib.sha256()

    def flush() -> None:
        if not buffer:
            return
        array = np.array(buffer, dtype=dtype)
        digest.update(array.tobytes())
        num_val = math.ceil(array.size * val_fraction) if val_fraction > 0 else 0
        train, held_out = array[: array.size - num_val], array[array.size - num_val :]
        name = f"shard-{len(shards):05d}.npy"
        np.save(os.path.join(output_dir, name), train)
        shards.append({"file": name, "num_tokens": int(train.size)})
        if num_val:
            val_name = f"val-{len(val_shards):05d}.npy"
            np.save(os.path.join(output_dir, val_name), held_out)
            val_shards.append({"file": val_name, "num_tokens": int(held_out.size)})
        buffer.clear()

    for path in tqdm(files, desc="tokenizing", unit="file", disable=not show_progress):
        for text in documents(path):
            buffer.extend(tokenizer.encode(text))
            buffer.append(tokenizer.eot_id)
            if len(buffer) >= shard_tokens:
                flush()
    flush()
    if not shards:
        raise ValueError(f"no text found in {inputs}")
    if val_fraction > 0:
        digest.update(f"val_fraction={val_fraction!r}".encode())  # another split is another dataset
    manifest = {
        "tokenizer": tokenizer.name,
        "vocab_size": tokenizer.vocab_size,
        "dtype": np.dtype(dtype).name,
        "num_tokens": sum(s["num_tokens"] for s in shards),  # training tokens
        "hash": digest.hexdigest()[:16],
        "sources": [os.path.basename(p) for p in files],
        "shards": shards,
        "val_fraction": val_fraction,
        "num_val_tokens": sum(s["num_tokens"] for s in val_shards),
        "val_shards": val_shards,
    }
    with open(os.path.join(output_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    return manifest
