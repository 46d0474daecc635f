"""`python -m trainer {train,prepare-data,local-run}`."""
from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    process_start = time.time()
    parser = argparse.ArgumentParser(prog="python -m trainer")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train (single process, or one rank under torchrun)")
    train.add_argument("--config", required=True, help="YAML config file")
    train.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. optimizer.lr=3e-4")

    prep = sub.add_parser("prepare-data", help="tokenise text/JSONL files into token shards")
    prep.add_argument("--input", nargs="+", required=True, help="files, directories or globs (.txt, .jsonl with 'text')")
    prep.add_argument("--output-dir", required=True)
    prep.add_argument("--tokenizer-dir", help="local Hugging Face tokenizer directory; default: byte-level")
    prep.add_argument("--shard-tokens", type=int, default=50_000_000)

    local = sub.add_parser("local-run", help="the README demo: 2 CPU ranks, SIGTERM half way, resume, summary")
    local.add_argument("--output-dir", default="runs/local")

    args = parser.parse_args(argv)
    if args.command == "train":
        from trainer.config import ConfigError, load_config

        try:
            cfg = load_config(args.config, args.overrides)
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            return 2
        from trainer.guards import TrainingStopped
        from trainer.train import main as train_main

        try:
            return train_main(cfg, process_start)
        except TrainingStopped as exc:  # a deliberate stop: the message, not a traceback
            print(f"trainer stopped: {exc}", file=sys.stderr)
            return 1
    if args.command == "prepare-data":
        from trainer.prepare import prepare

        manifest = prepare(args.input, args.output_dir, args.tokenizer_dir, args.shard_tokens)
        print(f"{manifest['num_tokens']} tokens in {len(manifest['shards'])} shard(s), vocab {manifest['vocab_size']}, "
              f"hash {manifest['hash']} -> {args.output_dir}")
        return 0
    from trainer.local_run import main as local_main

    return local_main(["--output-dir", args.output_dir])


if __name__ == "__main__":
    sys.exit(main())
