"""`prepare-data`: text or JSONL in, token shards (`.npy`) plus a manifest out."""
from __future__ import annotations

import glob
import hashlib
import json
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


def prepare(inputs: list[str], output_dir: str, tokenizer_dir: str | None = None,
            shard_tokens: int = 50_000_000, show_progress: bool = True) -> dict:
    tokenizer = HFTokenizer(tokenizer_dir) if tokenizer_dir else ByteTokenizer()
    # uint16 halves disk and page cache for any vocabulary below 65536 (GPT-2's 50257 fits).
    dtype = np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32
    os.makedirs(output_dir, exist_ok=True)
    files = input_files(inputs)
    shards, buffer, digest = [], [], hashlib.sha256()

    def flush() -> None:
        if not buffer:
            return
        array = np.array(buffer, dtype=dtype)
        name = f"shard-{len(shards):05d}.npy"
        np.save(os.path.join(output_dir, name), array)
        digest.update(array.tobytes())
        shards.append({"file": name, "num_tokens": int(array.size)})
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
    manifest = {
        "tokenizer": tokenizer.name,
        "vocab_size": tokenizer.vocab_size,
        "dtype": np.dtype(dtype).name,
        "num_tokens": sum(s["num_tokens"] for s in shards),
        "hash": digest.hexdigest()[:16],
        "sources": [os.path.basename(p) for p in files],
        "shards": shards,
    }
    with open(os.path.join(output_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    return manifest
