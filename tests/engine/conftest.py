"""The program under the real Pulumi engine (marker ``engine``): one control plane and one file
backend per stack, shared by that stack's tests in file order (preview, up, second up, a config
change, refresh, destroy). They skip, with the reason, where the engine tools or the cluster tools
are not built (`make engine-tools cluster-tools`) or the pinned chart archives are absent; under CI
a missing tool fails instead."""
from __future__ import annotations

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


def _skip_or_fail(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def require_tools() -> None:
    from tools.cluster.charts import helm_path
    from tools.cluster.nodes import runner_binaries

    missing = missing_engine_tools()
    missing += controlplane.missing_tools((*controlplane.CONTROL_PLANE_COMMANDS, *runner_binaries()))
    missing += [] if helm_path() else ["helm"]
    if missing:
        _skip_or_fail(f"engine tools not built: {', '.join(missing)} (run `make engine-tools cluster-tools`)")
    refused = controlplane.namespaces_available()
    if refused:
        pytest.fail(refused)


def start_nodes(plane: controlplane.ControlPlane, stack: str) -> None:
    """The test cluster's kubelet (tools/cluster/nodes.py: the pods of the controllers built here
    run as their real binaries, any other pod is Running and Ready at once) with the stack's node
    setup, and the nodes EKS registers for the stack's managed node groups, where the charts' pods
    go. Nothing else: every CRD, object and release comes from the engine."""
    from tests.conftest import _plan, schemas_dir
    from tools.cluster.aws import AwsStandIns
    from tools.cluster.layer import apply, stack_layer
    from tools.cluster.nodes import Nodes, register, system_nodes_from_groups

    # The plan with upstream charts: its node groups and the charts' values the node setup reads
    # are those of the engine's run (a chart mirror changes where a chart comes from, not its values).
    layer = stack_layer(stack, schemas_dir(), plan=_plan(stack))
    aws = AwsStandIns(layer, plane.workdir / "aws")
    # The EC2 stand-in's own kind (Karpenter's kwok provider watches KWOKNodeClasses; the stack's
    # NodePools and EC2NodeClasses come from the engine).
    apply(plane, [aws.kwok_crd()])
    Nodes(plane, aws.prepare()).start()
    register(plane, system_nodes_from_groups(layer.node_groups))


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
    """A control plane with no CRD and no object (the engine applies them all), the kubelet and
    the stack's system nodes, the pinned charts served by a loopback chart mirror, and the stack
    in a fresh file backend. Under `make test` each stack's engine tests run on a worker of their
    own (tests/support/parallel.py)."""
    require_tools()
    from infra.plan import build_plan
    from tests.conftest import charts_dir
    from tools import chart_mirror
    from tools.cluster.layer import seed_training_operator_tree

    stack = request.param
    charts = charts_dir()
    if not charts.is_dir() or chart_mirror.verify(charts):
        _skip_or_fail(f"pinned chart archives not usable at {charts} (`python -m tools.chart_mirror verify {charts}`)")
    seed_training_operator_tree()
    with chart_mirror.serve(charts) as mirror, controlplane.ControlPlane.in_tempdir() as plane:
        start_nodes(plane, stack)
        engine = EngineStack(stack, tmp_path_factory.mktemp(f"engine-{stack}"), plane.admin_kubeconfig)
        test_config(engine, mirror.url)
        engine.plane, engine.mirror = plane, mirror
        engine.plan = build_plan(stack, engine.project_dir)
        yield engine
