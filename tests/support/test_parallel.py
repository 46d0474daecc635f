"""`make test` runs the suite on pytest-xdist workers (tests/support/parallel.py). A stack's cluster
tests must stay on one worker, in their serial order: the control plane and controllers are session
fixtures (built per worker), and later files rely on the state earlier ones leave. Those two units
start first, so their minutes of waiting overlap the rest."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARAMS = re.compile(r"\[(.*)\]$")


def stack_of(nodeid: str) -> str | None:
    """The stack a cluster test's id names (``[dev]``, ``[dev-pods]``, ...)."""
    params = PARAMS.search(nodeid)
    found = set(params.group(1).split("-")) & {"dev", "prod"} if params else set()
    assert len(found) <= 1, nodeid
    return next(iter(found), None)


def units(*args: str) -> list[tuple[str, str]]:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "--print-work-units", *args, "tests/cluster", "tests/catalog/test_gpus.py"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [tuple(line.split("\t")) for line in done.stdout.splitlines() if "\t" in line]


def test_each_stack_s_cluster_tests_are_one_unit_in_serial_order_and_start_first():
    serial = units()
    parallel = units("--dist", "loadgroup")
    assert sorted(serial) == sorted(parallel)

    for unit, nodeid in parallel:
        stack = stack_of(nodeid)
        if nodeid.startswith("tests/cluster/") and stack:
            assert unit == f"cluster-{stack}", (unit, nodeid)
        else:
            assert unit == nodeid.split("::")[0], (unit, nodeid)
    assert {u for u, _ in parallel} >= {"cluster-dev", "cluster-prod", "tests/catalog/test_gpus.py"}

    first_seen = list(dict.fromkeys(u for u, _ in parallel))
    assert first_seen[:2] == ["cluster-prod", "cluster-dev"], first_seen
    for stack in ("dev", "prod"):
        in_serial = [n for u, n in serial if u == f"cluster-{stack}"]
        in_parallel = [n for u, n in parallel if u == f"cluster-{stack}"]
        assert in_parallel == in_serial, f"cluster-{stack} runs in another order under xdist"
