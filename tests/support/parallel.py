"""How `make test` spreads the suite over pytest-xdist workers (Makefile: ``-n $(PYTEST_WORKERS)
--dist loadgroup --no-loadscope-reorder``). Run without ``-n``, this plugin changes nothing that
matters: the marks it adds are read only by xdist.

Units of work (an ``xdist_group`` per test):

- one per stack for ``tests/cluster`` (``cluster-dev``, ``cluster-prod``): the control plane and
  the controllers are session fixtures, built once per worker, so all of a stack's tests share one
  worker, in the order they run without xdist (later files rely on the Kueue and Training Operator
  state earlier ones leave, as one process would see it);
- one per test file for everything else, so a module fixture (an MLflow server on PostgreSQL, a
  trained checkpoint) is built once, as in a serial run.

Why parallel at all on 2 cores: the cluster tests spend most of their minutes waiting on
controllers (Karpenter's batching, Kueue's admission, the Training Operator's restarts), with the
machine nearly idle; the rest is mostly CPU. Running both stacks' cluster tests beside the CPU-bound
files overlaps the waiting with work. ``LONG_UNITS_FIRST`` starts the units that take minutes first,
longest first (the classic longest-processing-time rule), so none of them starts last and runs alone.
"""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_DIR = ROOT / "tests" / "cluster"

# Measured with `pytest --durations` on the 2-core machine (docs/testing.md, "CI time"); a unit
# missing here only starts later, it still runs.
LONG_UNITS_FIRST: tuple[str, ...] = (
    "cluster-dev",
    "cluster-prod",
)


def work_unit(item: pytest.Item) -> str:
    path = Path(str(item.fspath))
    if CLUSTER_DIR in path.parents:
        params = getattr(getattr(item, "callspec", None), "params", {})
        stack = params.get("stack_cluster")
        if stack:
            return f"cluster-{stack}"
    return path.relative_to(ROOT).as_posix()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # tryfirst: xdist's worker reads the marks in its own hook to name each test's unit.
    for item in items:
        item.add_marker(pytest.mark.xdist_group(work_unit(item)))


class Ordering:
    """The longest units first; a stable sort, so each unit keeps pytest's own order (pytest groups a
    session-parametrized fixture's tests by parameter before this runs: trylast)."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        rank = {unit: n for n, unit in enumerate(LONG_UNITS_FIRST)}
        items.sort(key=lambda item: rank.get(work_unit(item), len(rank)))


def pytest_configure(config: pytest.Config) -> None:
    # Only under xdist: a serial run keeps pytest's own order.
    if getattr(config.option, "dist", "no") != "no":
        config.pluginmanager.register(Ordering(), "mlplatform-parallel-ordering")
