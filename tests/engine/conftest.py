"""The program under the real Pulumi engine (marker ``engine``): one control plane and one file
backend per stack, shared by that stack's tests in file order (preview, up, second up, a config
change, refresh, destroy). They skip, with the reason, where the engine tools or the stand-in
plugins are not built (`make engine-tools`); under CI a missing tool fails instead."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.engine.harness import EngineStack, missing_engine_tools
from tools.cluster import controlplane


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.engine)


def require_tools() -> None:
    missing = missing_engine_tools() + controlplane.missing_tools((*controlplane.CONTROL_PLANE_COMMANDS, "kwok"))
    if missing:
        message = f"engine tools not built: {', '.join(missing)} (run `make engine-tools cluster-tools`)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def system_nodes(plane: controlplane.ControlPlane, plan) -> list[str]:
    """A node as EKS registers it for each managed node group of the plan (its ``labels`` and
    ``taints``; EKS API ``NO_SCHEDULE`` -> ``NoSchedule``), run by kwok: where the charts' pods go."""
    from infra.plan import resource_graph
    from tools.cluster.standins import KWOK_ANNOTATION

    effects = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
    names = []
    for index, group in enumerate(r for r in resource_graph(plan.recording, plan.config)
                                  if r["type"] == "aws:eks/nodeGroup:NodeGroup"):
        name = f"system-{index}"
        capacity = {"cpu": "16", "memory": "64Gi", "pods": "110"}
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "annotations": dict(KWOK_ANNOTATION),
                             "labels": {**(group["inputs"].get("labels") or {}), "kubernetes.io/hostname": name,
                                        "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "type": "kwok"}},
                "spec": {"taints": [{"key": t["key"], "value": t.get("value", ""), "effect": effects[t["effect"]]}
                                    for t in group["inputs"].get("taints") or []]},
                "status": {"capacity": capacity, "allocatable": capacity}}
        plane.kubectl("apply", "-f", "-", input=json.dumps(node))
        names.append(name)
    return names


# Charts the team's chart repository has no archive of, so no SHA-256 is pinned for them and a
# chart mirror refuses them (catalog/versions.py): the Argo CD and Argo Workflows releases come with
# the `gitops` section, which the engine tests leave out (test_engine_live.py lists them).
NOT_INSTALLABLE_SECTIONS = ("gitops",)


def test_config(engine: EngineStack, mirror_url: str) -> None:
    """The stack file as the engine tests run it: every chart from the loopback chart mirror of the
    pinned archives, and without the sections whose charts have no verified archive."""
    from infra.config import PROJECT

    def edit(config):
        config[f"{PROJECT}:chartMirror"] = {"url": mirror_url}
        for section in NOT_INSTALLABLE_SECTIONS:
            config.pop(f"{PROJECT}:{section}", None)

    engine.edit_config(edit)


@pytest.fixture(scope="session", params=["dev", "prod"])
def engine_stack(request, tmp_path_factory):
    """A bare control plane (no CRD, no object: the engine applies them all), kwok and the stack's
    system nodes, the pinned charts served by a loopback chart mirror, and the stack in a fresh
    file backend. Under `make test` each stack's engine tests run on a worker of their own
    (tests/support/parallel.py)."""
    require_tools()
    from infra.plan import build_plan
    from tests.conftest import charts_dir
    from tools import chart_mirror
    from tools.cluster.layer import seed_training_operator_tree
    from tools.cluster.standins import start_kwok

    stack = request.param
    charts = charts_dir()
    if not charts.is_dir() or chart_mirror.verify(charts):
        message = f"pinned chart archives not usable at {charts} (`python -m tools.chart_mirror verify {charts}`)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    seed_training_operator_tree()
    with chart_mirror.serve(charts) as mirror, controlplane.ControlPlane.in_tempdir() as plane:
        start_kwok(plane)
        engine = EngineStack(stack, tmp_path_factory.mktemp(f"engine-{stack}"), plane.admin_kubeconfig)
        test_config(engine, mirror.url)
        engine.plane, engine.mirror = plane, mirror
        engine.plan = build_plan(stack, engine.project_dir)
        system_nodes(plane, engine.plan)
        yield engine
