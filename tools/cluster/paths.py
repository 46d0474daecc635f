"""Where the cluster tools live: one rule for the harness and the build scripts.

    python -m tools.cluster.paths bin      # the directory build.sh writes and the harness reads

The binaries go to ``$CLUSTER_TOOLS_BIN`` when set; else, from a git worktree, to the main
checkout's ``.cache/cluster-tools/bin`` (git's common directory: every worktree shares one build);
else to this checkout's ``.cache/cluster-tools/bin``. ``tools/cluster/build.sh`` asks this module,
so a worktree's tests find what ``make cluster-tools`` built.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]


@lru_cache(maxsize=1)
def _cache_root() -> Path:
    """The ``.cache`` directory builds share: the main checkout's when this is a git worktree."""
    try:
        common = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--path-format=absolute", "--git-common-dir"],
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        common = None
    if common is not None and common.returncode == 0 and common.stdout.strip():
        main_checkout = Path(common.stdout.strip()).parent
        if (main_checkout / ".cache").is_dir():
            return main_checkout / ".cache"
    return ROOT / ".cache"


def bin_dir() -> Path:
    override = os.environ.get("CLUSTER_TOOLS_BIN")
    return Path(override) if override else _cache_root() / "cluster-tools" / "bin"


def tool_path(name: str) -> Optional[Path]:
    """A built tool first, then PATH (Debian's etcd)."""
    built = bin_dir() / name
    if built.is_file() and os.access(built, os.X_OK):
        return built
    found = shutil.which(name)
    return Path(found) if found else None


def missing_tools(names) -> list[str]:
    return [name for name in names if tool_path(name) is None]


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["bin"]:
        print("usage: python -m tools.cluster.paths bin", file=sys.stderr)
        return 2
    print(bin_dir())
    return 0


if __name__ == "__main__":
    sys.exit(main())
