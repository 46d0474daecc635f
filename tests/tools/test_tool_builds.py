"""The Go binaries `make cluster-tools engine-tools` builds carry no path of the machine that built
them: not the checkout, not Go's module or build cache. Their SHA-256 in docs/testing.md is then the
same for every checkout of the same commit built with the same Go, wherever it lives (`-trimpath`
removes file paths; a directory `replace` would still be written into the build info as go.mod
spells it, so the build scripts spell it relative)."""
from __future__ import annotations

import os
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

from tests.engine.harness import ENGINE_BIN, ENGINE_TOOLS
from tools.cluster.nodes import runner_binaries
from tools.cluster.paths import ROOT, bin_dir

# What tools/cluster/build.sh builds: the control plane's binaries (etcd is Debian's) and the
# controllers the kubelet runs.
CLUSTER_TOOLS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", *runner_binaries())


def built_binaries() -> list[Path]:
    return [bin_dir() / name for name in CLUSTER_TOOLS] + [ENGINE_BIN / name for name in ENGINE_TOOLS]


@lru_cache(maxsize=1)
def build_machine_paths() -> tuple[str, ...]:
    """Directories a build could leak: the build's copies under a checkout's .cache and sources under
    its tools/ (this checkout, and the one whose .cache holds the binaries: a worktree's main
    checkout), and Go's module and build caches. Each with enough of its tail that a short
    checkout path ("/app") cannot match an unrelated string ("/apps/v1")."""
    roots = {ROOT} | {parent.parent for directory in (bin_dir(), ENGINE_BIN)
                      for parent in directory.parents if parent.name == ".cache"}
    paths = {str(root / part) for root in roots for part in (".cache", "tools")}
    go = shutil.which("go")
    if go:
        env = subprocess.run([go, "env", "GOMODCACHE", "GOCACHE"], capture_output=True, text=True, check=True)
        paths.update(line for line in env.stdout.splitlines() if line)
    return tuple(sorted(paths))


@pytest.mark.parametrize("binary", built_binaries(), ids=lambda path: path.name)
def test_binary_holds_no_path_of_the_build_machine(binary: Path):
    if not os.access(binary, os.X_OK):
        if os.environ.get("CI"):
            pytest.fail(f"{binary} not built (`make cluster-tools engine-tools` runs before pytest)")
        pytest.skip(f"{binary.name} not built (`make cluster-tools engine-tools`)")
    content = binary.read_bytes()
    leaked = [path for path in build_machine_paths() if path.encode() in content]
    assert not leaked, (f"{binary.name} embeds {leaked}: its bytes depend on where it was built "
                        f"(`go version -m {binary}` shows where; a directory replace must be relative)")
