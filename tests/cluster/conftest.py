"""A real control plane per stack (kube-apiserver, controller-manager, scheduler 1.32, etcd),
with the stack's in-cluster layer applied from the program's own output (tools/cluster/layer.py).

Every test here is marked ``cluster``. They skip, with the reason, only where the tools are not
built (`make cluster-tools`); under CI a missing tool fails instead, since `.ci/run` builds them.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tools.cluster import controlplane
from tools.cluster.layer import install, stack_layer


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.cluster)


def _require_tools(names=controlplane.CONTROL_PLANE_COMMANDS) -> None:
    missing = controlplane.missing_tools(names)
    if missing:
        message = f"cluster tools not built: {', '.join(missing)} (run `make cluster-tools`)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


class StackCluster:
    def __init__(self, stack: str, plane: controlplane.ControlPlane, layer):
        self.stack, self.plane, self.layer = stack, plane, layer

    def kubectl(self, *args, **kwargs):
        return self.plane.kubectl(*args, **kwargs)


@pytest.fixture(scope="session", params=["dev", "prod"])
def stack_cluster(request):
    """A control plane per stack with that stack's layer installed. Under `make test` each stack's
    tests run on a worker of their own (tests/support/parallel.py), so the two planes run side by
    side, each on its own free loopback ports and temporary directory."""
    _require_tools()
    from tests.conftest import _plan, schemas_dir

    layer = stack_layer(request.param, schemas_dir(), plan=_plan(request.param))
    with controlplane.ControlPlane.in_tempdir() as plane:
        install(plane, layer)
        yield StackCluster(request.param, plane, layer)


CONTROLLER_BINARIES = ("kwok", "kueue", "training-operator", "karpenter-kwok")


@pytest.fixture(scope="session")
def stack_controllers(stack_cluster):
    """kwok, Kueue, the Training Operator and Karpenter (kwok provider) on the stack's control
    plane, configured from the stack's own objects (tools/cluster/controllers.py); once per stack,
    stopped (their process groups) when the stack's control plane is."""
    _require_tools(CONTROLLER_BINARIES)
    from tools.cluster.controllers import Controllers

    with Controllers(stack_cluster.plane, stack_cluster.layer) as controllers:
        stack_cluster.controllers = controllers
        yield stack_cluster
