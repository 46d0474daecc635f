"""`python -m trainer {train,prepare-data,local-run,verify-checkpoint}`."""
from __future__ import annotations

import argparse
import sys
import time

DEFAULT_VAL_FRACTION = 0.005  # trainer.prepare.DEFAULT_VAL_FRACTION, without importing numpy for --help


def _add_train_arguments(train: argparse.ArgumentParser) -> None:
    train.add_argument("--config", required=True, help="YAML config file")
    train.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. optimizer.lr=3e-4")


def train_input_problem(train_argv: list[str], world_size: int | None = None) -> str | None:
    """Why `train` with these arguments must not start (config, file system, data, memory), or
    None. `python -m trainer.launch` calls it before torchrun, the trainer again in each rank."""
    from trainer.config import ConfigError, load_config
    from trainer.preflight import preflight

    parser = argparse.ArgumentParser(prog="python -m trainer train")
    _add_train_arguments(parser)
    try:
        args = parser.parse_args(train_argv)
    except SystemExit:
        return "python -m trainer train: invalid arguments (see the usage above)"
    try:
        cfg = load_config(args.config, args.overrides)
        # The data and memory checks depend on the world size: skipped when torchrun alone
        # knows it (--nproc-per-node gpu); each rank runs them again.
        if world_size is not None:
            preflight(cfg, world_size=world_size)
    except ConfigError as exc:
        return str(exc)
    return None


def main(argv: list[str] | None = None) -> int:
    process_start = time.time()
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["verify-checkpoint"]:  # its own parser: python -m trainer verify-checkpoint --help
        from trainer.verify import main as verify_main

        return verify_main(args_in[1:])
    parser = argparse.ArgumentParser(prog="python -m trainer")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("verify-checkpoint", add_help=False,
                   help="restore drill: load the newest complete checkpoint (dir or s3://), one step, verdict")

    train = sub.add_parser("train", help="train (single process, or one rank under torchrun)")
    _add_train_arguments(train)

    prep = sub.add_parser("prepare-data", help="tokenise text/JSONL files into token shards")
    prep.add_argument("--input", nargs="+", required=True, help="files, directories or globs (.txt, .jsonl with 'text')")
    prep.add_argument("--output-dir", required=True)
    prep.add_argument("--tokenizer-dir", help="local Hugging Face tokenizer directory; default: byte-level")
    prep.add_argument("--shard-tokens", type=int, default=50_000_000)
    prep.add_argument("--val-fraction", type=float, default=DEFAULT_VAL_FRACTION,
                      help="tail of every shard held out as the validation split (0 disables); default 0.005")

    sub.add_parser("export", help="Hugging Face export of a checkpoint, logged to MLflow (see --help)", add_help=False)

    local = sub.add_parser("local-run", help="the README demo: 2 CPU ranks, SIGTERM half way, resume, summary")
    local.add_argument("--output-dir", default="runs/local")

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["export"]:
        from trainer.config import ConfigError
        from trainer.export import main as export_main

        from trainer.guards import TrainingStopped
        from trainer.trust import CheckpointKeyError

        try:
            return export_main(argv[1:])
        except (ConfigError, CheckpointKeyError) as exc:
            print(exc, file=sys.stderr)
            return 2
        except TrainingStopped as exc:  # a checkpoint refused (trainer/trust.py, trainer/safe_load.py)
            print(f"export: {exc}", file=sys.stderr)
            return 1
    args = parser.parse_args(argv)
    if args.command == "train":
        from trainer.config import ConfigError, load_config
        from trainer.preflight import preflight, prepare_runtime_dirs

        try:
            cfg = load_config(args.config, args.overrides)
            preflight(cfg)  # file system, data and memory checks, before any process group starts
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            return 2
        prepare_runtime_dirs()
        from trainer.guards import TrainingStopped
        from trainer.train import main as train_main

        try:
            return train_main(cfg, process_start)
        except TrainingStopped as exc:  # a deliberate stop: the message, not a traceback
            print(f"trainer stopped: {exc}", file=sys.stderr)
            return 1
    if args.command == "prepare-data":
        from trainer.prepare import prepare

        manifest = prepare(args.input, args.output_dir, args.tokenizer_dir, args.shard_tokens,
                           val_fraction=args.val_fraction)
        print(f"{manifest['num_tokens']} training + {manifest['num_val_tokens']} validation tokens in "
              f"{len(manifest['shards'])} shard(s), vocab {manifest['vocab_size']}, "
              f"hash {manifest['hash']} -> {args.output_dir}")
        return 0
    from trainer.local_run import main as local_main

    return local_main(["--output-dir", args.output_dir])


if __name__ == "__main__":
    sys.exit(main())
