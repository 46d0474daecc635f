"""One real cluster per stack (tools/cluster/stack.py): a Kubernetes 1.32 control plane, its nodes,
and the stack's whole in-cluster layer installed as the program installs it, with the charts'
controllers (Kueue, Karpenter) and the Training Operator running from their pinned binaries as the
pods their Deployments create.

Every test here is marked ``cluster``. They skip, with the reason, only where the tools are not
built (``make cluster-tools``, ``make engine-tools`` for Helm); under CI a missing tool fails
instead, since ``.ci/run`` builds them.

Fixtures: ``stack_cluster`` (session, one per stack; the training jobs its GitOps render installs
are run to completion first, so they hold no team's quota); ``stack_controllers`` is the same object (the
controllers always run now; the name stays for the tests that ask for it); ``scope`` gives a test a
name prefix of its own and, when the test ends however it ends, deletes everything it created with
that prefix, so no test depends on what another left behind.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cluster.isolation import Scope
from tools.cluster import controlplane
from tools.cluster.charts import helm_path
from tools.cluster.nodes import runner_binaries


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.cluster)


def _require(missing: list[str]) -> None:
    if missing:
        message = f"cluster tools not built: {', '.join(missing)} (run `make cluster-tools engine-tools`)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def _require_tools(names=controlplane.CONTROL_PLANE_COMMANDS) -> None:
    _require(controlplane.missing_tools(names))


@pytest.fixture(scope="session", params=["dev", "prod"])
def stack_cluster(request):
    """The stack's cluster, started once per session and stopped (every process, its directory)
    at the end. Under ``make test`` each stack's tests run on a worker of their own
    (tests/support/parallel.py); the two clusters run side by side, each in its own namespaces."""
    _require_tools((*controlplane.CONTROL_PLANE_COMMANDS, *runner_binaries()))
    _require([] if helm_path() else ["helm"])
    refused = controlplane.namespaces_available()
    if refused:
        pytest.fail(refused)
    from tests.conftest import _plan, schemas_dir
    from tools.cluster.stack import StackCluster, cls_env

    from tests.cluster.lifecycle import gitops_runs_completed

    running = os.environ.get(cls_env(request.param))
    if running:  # a cluster `python -m tools.cluster.stack up <stack>` keeps running
        cluster = StackCluster.attach(Path(running))
        gitops_runs_completed(cluster)
        yield cluster
        return
    with StackCluster(request.param, schemas_dir(), plan=_plan(request.param)) as cluster:
        gitops_runs_completed(cluster)
        yield cluster


@pytest.fixture(scope="session")
def stack_controllers(stack_cluster):
    return stack_cluster


@pytest.fixture
def scope(stack_cluster, request):
    with Scope.for_test(stack_cluster, request.node.nodeid) as test_scope:
        yield test_scope
