"""How `make test` spreads the suite over pytest-xdist workers (Makefile: ``-n $(PYTEST_WORKERS)
--dist loadgroup --no-loadscope-reorder``). Run without ``-n``, the marks it adds go unread and
only the order changes (the long units first).

Units of work (an ``xdist_group`` per test):

- one per stack for ``tests/cluster`` (``cluster-dev``, ``cluster-prod``): the stack's cluster is a
  session fixture, built once per worker, so all of a stack's tests share one worker (each test
  isolated by its own name prefix and cleanup: tests/cluster/isolation.py, so their order does not
  matter);
- one per stack for ``tests/engine`` (``engine-dev``, ``engine-prod``): the stack's state and its
  control plane are a session fixture, and each test continues from the state the one before
  left (preview, up, a second up, a config change, refresh, destroy);
- one per test file for everything else, so a module fixture (an MLflow server on PostgreSQL, a
  trained checkpoint) is built once, as in a serial run.

Why parallel at all on 2 cores: the cluster tests spend most of their minutes waiting on
controllers (Karpenter's batching, Kueue's admission, the Training Operator's restarts), with the
machine nearly idle; the rest is mostly CPU. Running both stacks' cluster tests beside the CPU-bound
files overlaps the waiting with work. ``LONG_UNITS_FIRST`` starts the units that take minutes first,
longest first (the classic longest-processing-time rule), so none of them starts last and runs alone.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_DIR = ROOT / "tests" / "cluster"
ENGINE_DIR = ROOT / "tests" / "engine"

# The units that take minutes, longest first: seconds of worker time per unit in a parallel
# `make test` on the 2-core machine (`--durations=0`, 2026-11-28; docs/testing.md, "CI time"). The
# cluster units mostly wait; the others are CPU. A unit missing here only starts later, and a unit
# renamed here only loses its place: both still run. The two engine units (about 850 s each on
# 2026-11-29) are left out on purpose: listed third and fourth, they started beside the two cluster
# units, four control planes at once, and the whole pytest took 3203 s instead of 2637-2702 s.
LONG_UNITS_FIRST: tuple[str, ...] = (
    "cluster-prod",                               # 1055
    "cluster-dev",                                # 760
    "tests/trainer/test_torchrun.py",             # 519
    "tests/trainer/test_verify_checkpoint.py",    # 308
    "tests/trainer/test_multinode_startup.py",    # 275
    "tests/trainer/test_fault_injection.py",      # 267
    "tests/trainer/test_multinode.py",            # 246
    "tests/trainer/test_recovery_training.py",    # 242
    "tests/trainer/test_local_run.py",            # 143
    "tests/trainer/test_verify_heldout.py",       # 138
    "tests/trainer/test_checkpoint_trust.py",     # 112
    "tests/integration/test_mlflow_server.py",    # 107
    "tests/infra/test_chart_mirror.py",           # 85 s CPU alone (388 s wall at load 18; 2026-11-29)
    "tests/infra/test_chart_render.py",           # 68 s CPU alone (290 s wall at load 18; 2026-11-29)
    "tests/cluster/test_controlplane_live.py",    # (new: a bare plane twice and an orphan drill)
    "tests/examples/test_examples.py",            # 100
    "tests/jobs/test_local_own_code.py",          # 98
    "tests/workloads/test_local_job.py",          # 89
    "tests/trainer/test_process_mode_deaths.py",  # 82
    "tests/trainer/test_checkpoint_operator_attacks.py",  # 74
    "tests/jobs/test_requirements_env.py",        # 74
    "tests/infra/test_upgrade.py",                # 73
    "tests/trainer/test_tied_torchrun.py",        # 67
    "tests/trainer/test_tracking_lineage.py",     # 62
)


def work_unit(item: pytest.Item) -> str:
    path = Path(str(item.fspath))
    if CLUSTER_DIR in path.parents:
        params = getattr(getattr(item, "callspec", None), "params", {})
        stack = params.get("stack_cluster")
        if stack:
            return f"cluster-{stack}"
    if ENGINE_DIR in path.parents:
        params = getattr(getattr(item, "callspec", None), "params", {})
        stack = params.get("engine_stack")
        if stack:
            return f"engine-{stack}"
    return path.relative_to(ROOT).as_posix()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # tryfirst: xdist's worker reads the marks in its own hook to name each test's unit.
    for item in items:
        item.add_marker(pytest.mark.xdist_group(work_unit(item)))


class Ordering:
    """The longest units first. xdist hands units out in the order the workers collected them, so
    the workers' collection order is what counts (a worker runs with ``dist`` set to "no", so this
    is not made conditional on it; a serial run gets the same order). A stable sort: each unit
    keeps pytest's own order (pytest groups a session-parametrized fixture's tests by parameter
    before this runs: trylast)."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        rank = {unit: n for n, unit in enumerate(LONG_UNITS_FIRST)}
        items.sort(key=lambda item: rank.get(work_unit(item), len(rank)))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--print-work-units", action="store_true",
                     help="after collection, print each test's xdist unit of work and node id, in run order")


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.getoption("print_work_units"):
        for item in session.items:
            print(f"{work_unit(item)}\t{item.nodeid}")


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Four workers on two cores, each torch process would otherwise start an OpenMP pool of one
        # thread per core whose spinning waits burn the CPU the other workers need (torch reads this
        # when it first loads, after this hook). Subprocesses inherit it; torchrun sets the same for
        # its ranks. A test that sets its own value keeps it.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    config.pluginmanager.register(Ordering(), "mlplatform-parallel-ordering")
