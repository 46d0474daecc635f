"""`make test` runs the suite on pytest-xdist workers (tests/support/parallel.py). A stack's cluster
tests must stay on one worker, in pytest's own order: the control plane and controllers are session
fixtures (built per worker), and later files rely on the state earlier ones leave. The units that
take minutes start first, so that none of them starts last and runs alone."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support import parallel

ROOT = Path(__file__).resolve().parents[2]
PARAMS = re.compile(r"\[(.*)\]$")
OWN_ORDER = ("-p", "no:mlplatform-parallel-ordering")  # pytest's order, without ours


def stack_of(nodeid: str) -> str | None:
    """The stack a cluster test's id names (``[dev]``, ``[dev-pods]``, ...)."""
    params = PARAMS.search(nodeid)
    found = set(params.group(1).split("-")) & {"dev", "prod"} if params else set()
    assert len(found) <= 1, nodeid
    return next(iter(found), None)


def pytest_run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def units(*args: str) -> list[tuple[str, str]]:
    done = pytest_run("--collect-only", "-q", "--print-work-units", *args, "tests/cluster", "tests/catalog/test_gpus.py")
    return [tuple(line.split("\t")) for line in done.stdout.splitlines() if "\t" in line]


def test_each_stack_s_cluster_tests_are_one_unit_in_pytest_s_order_and_start_first():
    own = units(*OWN_ORDER)
    ordered = units()
    assert sorted(own) == sorted(ordered)

    for unit, nodeid in ordered:
        stack = stack_of(nodeid)
        if nodeid.startswith("tests/cluster/") and stack:
            assert unit == f"cluster-{stack}", (unit, nodeid)
        else:
            assert unit == nodeid.split("::")[0], (unit, nodeid)
    assert {u for u, _ in ordered} >= {"cluster-dev", "cluster-prod", "tests/catalog/test_gpus.py"}

    first_seen = list(dict.fromkeys(u for u, _ in ordered))
    assert first_seen[:2] == list(parallel.LONG_UNITS_FIRST[:2]) == ["cluster-prod", "cluster-dev"], first_seen
    for stack in ("dev", "prod"):
        in_own = [n for u, n in own if u == f"cluster-{stack}"]
        assert in_own and [n for u, n in ordered if u == f"cluster-{stack}"] == in_own, \
            f"cluster-{stack} runs in another order than pytest's own"


def test_a_real_worker_runs_a_long_unit_before_the_files_collected_ahead_of_it():
    """On an xdist worker, not in a model of one: a worker's config is not the controller's (it runs
    with ``dist`` "no"), and xdist hands out units in the order the workers collected them."""
    quick = "tests/catalog/test_gpu_sharing_facts.py"
    long_unit = "tests/infra/test_upgrade.py"
    assert long_unit in parallel.LONG_UNITS_FIRST and quick not in parallel.LONG_UNITS_FIRST
    done = pytest_run("-n", "1", "--dist", "loadgroup", "--no-loadscope-reorder", "-v", quick,
                      f"{long_unit}::test_a_pinned_alias_without_the_clusters_version_is_refused")
    ran = re.findall(r"PASSED (\S+?)@", done.stdout)
    assert len(ran) >= 2 and ran[0].startswith(long_unit), ran
    assert all(n.startswith(quick) for n in ran[1:]), ran
