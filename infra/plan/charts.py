"""Download and verify the charts a stack installs from its chart mirror, before `pulumi up`.

    python -m infra.plan.charts --stack prod

The same check `pulumi up` makes before registering anything (infra/chart_mirror.py): every chart the
stack installs, from ``chartMirror.url`` at its pinned version, kept under ``build/charts`` only if
its archive's SHA-256 is the pinned one. Run it to check a mirror after filling it, or to seed
``build/charts`` on a machine that can reach the mirror. Exit 0: all verified (or no mirror set);
1: a chart is missing or differs, or the mirror cannot be reached (one line per chart); 2: the
stack file is invalid.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional

from catalog.versions import CHART_ARCHIVE_DIR
from infra import chart_mirror
from infra.chart_mirror import ChartMirrorError
from infra.config import PROJECT, ConfigError, load_platform_config
from infra.plan import EXIT_CONFIG_ERROR, EXIT_FAILED, ROOT, raw_project_config, read_stack_file, stack_file


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.plan.charts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--stack", required=True, help="the stack whose chart mirror and charts to check (Pulumi.<stack>.yaml)")
    args = parser.parse_args(argv)
    path = stack_file(args.stack, ROOT)
    try:
        values, secret_paths = read_stack_file(path)
        prefix = f"{PROJECT}:"
        config = load_platform_config(raw_project_config(values), source=path.name,
                                      secret_paths=[p[len(prefix):] for p in secret_paths if p.startswith(prefix)])
        chart_mirror.check_pins(config)
    except (ConfigError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    if config.chart_mirror is None:
        print(f"stack {args.stack} has no chartMirror: its releases install from the charts' upstream repositories")
        return 0
    try:
        paths = chart_mirror.prepare(config)
    except ChartMirrorError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_FAILED
    print(f"{len(paths)} charts from {config.chart_mirror.url} verified into {CHART_ARCHIVE_DIR}/:")
    for chart_path in paths:
        print(f"  {chart_path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
