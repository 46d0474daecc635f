"""Shared fixtures: stack configs, recorded plans, and the upstream schemas."""
from __future__ import annotations

import copy
import functools
import json
import os
from pathlib import Path
from typing import Any, Callable

import pytest

ROOT = Path(__file__).resolve().parent.parent

# How `make test` spreads the suite over pytest-xdist workers.
pytest_plugins = ["tests.support.parallel"]


def schemas_dir() -> Path:
    """Upstream CRD and pulumi-eks schemas: $ML_PLATFORM_SCHEMAS, else `make schemas`' cache."""
    from tools.schemas import schemas_dir as pinned_schemas_dir

    return pinned_schemas_dir(ROOT)


@functools.lru_cache(maxsize=None)
def _schema_problems(path: Path) -> tuple[str, ...]:
    from tools.schemas import problems

    return tuple(problems(path))


@pytest.fixture
def schemas() -> Path:
    # Per test, not per session: a test that points ML_PLATFORM_SCHEMAS elsewhere (monkeypatch)
    # must not decide where every later test reads. Hashing is cached per directory.
    path = schemas_dir()
    found = _schema_problems(path)
    if found:
        message = (f"pinned upstream schemas not usable at {path} ({len(found)} problems, first: {found[0]}); "
                   "run `make schemas` or set ML_PLATFORM_SCHEMAS to a verified copy")
        # CI must validate what we generate: there a missing schema fails instead of skipping.
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def charts_dir() -> Path:
    """The pinned Helm chart archives: $ML_PLATFORM_CHARTS, else .cache/charts (.ci/run seeds it)."""
    return Path(os.environ.get("ML_PLATFORM_CHARTS") or ROOT / ".cache" / "charts")


@pytest.fixture
def chart_archives() -> Path:
    """A directory holding every pinned chart archive that has a pinned SHA-256, each verified.
    Skips (saying how to get them) when they are absent; a present archive with other bytes fails."""
    from catalog.versions import HELM_CHARTS
    from tools.chart_mirror import verify

    path = charts_dir()
    missing = [c.archive for c in HELM_CHARTS if c.sha256 is not None and not (path / c.archive).is_file()]
    if missing:
        pytest.skip(f"pinned chart archives not at {path} (missing {', '.join(missing)}); copy the team's offline chart "
                    "repository there (.ci/run seeds it) or set ML_PLATFORM_CHARTS to a copy")
    problems = verify(path)
    assert not problems, f"chart archives at {path} differ from their pins: {problems}"
    return path


@functools.lru_cache(maxsize=None)
def _stack_values(stack: str) -> dict[str, str]:
    from infra.plan import read_stack_file, stack_file

    values, _ = read_stack_file(stack_file(stack, ROOT))
    return values


def stack_config(stack: str) -> dict[str, Any]:
    """A stack file's project config as plain data (camelCase keys, no namespace): mutate freely."""
    from infra.plan import raw_project_config

    return copy.deepcopy(raw_project_config(_stack_values(stack)))


def to_values(raw: dict[str, Any]) -> dict[str, str]:
    """Inverse of ``stack_config``: the strings the CLI would pass."""
    from infra.config import PROJECT

    return {f"{PROJECT}:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in raw.items()}


@functools.lru_cache(maxsize=None)
def _plan(stack: str):
    from infra.plan import build_plan

    return build_plan(stack, ROOT)


@pytest.fixture(scope="session", params=["dev", "prod"])
def plan(request):
    """The offline plan of each stack file (recorded once per session)."""
    return _plan(request.param)


@pytest.fixture(scope="session")
def dev_plan():
    return _plan("dev")


@pytest.fixture(scope="session")
def prod_plan():
    return _plan("prod")


@pytest.fixture
def plan_config() -> Callable[[str, dict[str, Any]], Any]:
    """Plan an arbitrary config: ``plan_config("dev", raw)``."""
    from infra.plan import plan_from_values

    def run(stack: str, raw: dict[str, Any]):
        return plan_from_values(stack, to_values(raw))

    return run


def problems_of(raw: dict[str, Any]) -> dict[str, list]:
    """Every problem ``load_platform_config`` reports for ``raw``, grouped by path (it must refuse it)."""
    from infra.config import ConfigError, load_platform_config

    with pytest.raises(ConfigError) as info:
        load_platform_config(raw)
    by_path: dict[str, list] = {}
    for problem in info.value.problems:
        by_path.setdefault(problem.path, []).append(problem)
    return by_path


def problem_per_path(raw: dict[str, Any]) -> dict[str, Any]:
    """``problems_of`` with one problem per path (the last), for configs with one problem per field."""
    return {path: problems[-1] for path, problems in problems_of(raw).items()}
