"""`python -m workloads <command>`: the ML engineer's and the platform team's entry point.

    render    write a stack's GitOps tree (what Argo CD applies)      infra/render.py
    pipeline  run a declared pipeline's steps locally on CPU            infra/pipeline_local.py

Each command lives in its own module with ``add_parser(subparsers)``, which registers the
subcommand and sets ``run`` (``args -> exit code``); adding a command is one line in COMMANDS.
The commands read the stack configuration, so their modules sit in infra/ (infra -> workloads);
the manifest builders they call stay pure in workloads/.
"""
from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = (
    "infra.render",
    "infra.pipeline_local",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workloads")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        importlib.import_module(module).add_parser(sub)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
