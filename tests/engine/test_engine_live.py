"""Each stack through the real Pulumi engine, in the order an operator runs it: preview, up, a
second up, a config change, refresh, destroy. The deploy driver (``python -m infra.plan.deploy``) runs
the program inline; the real Kubernetes provider and Helm apply every in-cluster object and chart
onto the stack's test control plane; the ``aws`` and ``eks`` plugins are the stand-ins of
``tools/engine/standins`` (docs/testing.md says what they do not model).

The tests of one stack share its state and run in file order (one xdist unit per stack)."""
from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.engine.graph import (
    KUSTOMIZE_TYPE, compare_graphs, crd_owners, custom_resources, dependency_closure, engine_only, recorded_graph,
)

RELEASE_TYPE = "kubernetes:helm.sh/v3:Release"


def steps_of(engine, name: str) -> dict[str, Any]:
    return json.loads((engine.workdir / f"{name}.steps.json").read_text())


def run_op(engine, operation: str, name: str, *flags: str, **kwargs):
    return engine.deploy(operation, "--steps-json", str(engine.workdir / f"{name}.steps.json"), *flags, **kwargs)


def ops(steps: dict[str, Any]) -> dict[str, str]:
    return {step["urn"]: step["op"] for step in steps["steps"]}


def after_up(engine) -> None:
    """The tests after `up` read the state it left: without it they would only repeat its failure."""
    if not getattr(engine, "up_done", False):
        pytest.fail(f"{engine.stack}: the stack's `up` did not succeed (test_up_creates_every_resource...); nothing to check")


def errors(steps: dict[str, Any]) -> list[str]:
    return [d["message"] for d in steps["diagnostics"] if d["severity"] == "error"]


def test_preview_plans_every_recorded_resource_without_errors(engine_stack):
    run = run_op(engine_stack, "preview", "preview")
    assert run.returncode == 0, run.explain()
    steps = steps_of(engine_stack, "preview")
    assert errors(steps) == [], run.explain()
    planned = ops(steps)
    recorded = {r["urn"] for r in recorded_graph(engine_stack.plan)}
    assert set(planned.values()) == {"create"}, {urn: op for urn, op in planned.items() if op != "create"}
    assert {u for u in planned if not engine_only(u)} == recorded


def first_deploy(engine) -> None:
    """The first-deploy order of docs/runbooks/first-deploy.md, as an operator follows it: a stack
    file naming an MLflow image in the repository its own first `up` creates is refused before
    anything is created; `up` without `tracking.image` builds everything else; the image is then
    pushed (here: nothing to push, the ECS stand-in runs no task) and set back."""
    from infra.config import PROJECT

    refused = run_op(engine, "up", "up-refused", "--skip-plan")
    if refused.returncode == 0:
        return
    assert "which this stack's first `up` creates" in refused.output, refused.explain()
    assert engine.state() == [], "the refused `up` created resources"
    image = {}
    engine.edit_config(lambda config: image.update(image=config[f"{PROJECT}:tracking"].pop("image")))
    run = run_op(engine, "up", "up-without-image", "--skip-plan")
    assert run.returncode == 0, run.explain()
    engine.edit_config(lambda config: config[f"{PROJECT}:tracking"].update(image=image["image"]))


def test_up_creates_every_resource_and_installs_every_chart_with_our_values(engine_stack):
    first_deploy(engine_stack)
    run = run_op(engine_stack, "up", "up", "--skip-plan")
    assert run.returncode == 0, run.explain()
    engine_stack.up_done = True
    state = {r["urn"]: r for r in engine_stack.state()}
    recorded = recorded_graph(engine_stack.plan)
    assert {r["urn"] for r in recorded} <= set(state), sorted({r["urn"] for r in recorded} - set(state))
    releases = [r for r in state.values() if r["type"] == RELEASE_TYPE]
    assert releases, "the stack installs no Helm release"
    installed = {(r["namespace"], r["name"]): r for r in json.loads(
        engine_stack.helm("list", "--all-namespaces", "--all", "--output", "json").stdout)}
    for release in releases:
        inputs, outputs = release["inputs"], release["outputs"]
        key = (inputs["namespace"], inputs["name"])
        assert key in installed, f"{release['urn']}: Helm has no release {key}"
        assert installed[key]["status"] == "deployed", installed[key]
        assert installed[key]["chart"].endswith(f"-{inputs['version']}"), installed[key]
        values = json.loads(engine_stack.helm("get", "values", inputs["name"], "--namespace", inputs["namespace"],
                                              "--output", "json").stdout or "null") or {}
        assert values == (inputs.get("values") or {}), f"{release['urn']}: Helm holds other values than the program's"
        assert outputs["status"]["status"] == "deployed"


LIVE_KINDS = "configmaps,secrets,services,pods,deployments,daemonsets,statefulsets,jobs,cronjobs"


def test_the_installed_releases_pass_the_chart_checks_on_the_live_objects(engine_stack):
    """The chart checks (tests/support/chart_checks.py) on what the real install left in each
    release's namespace, as the API server returns it: every ConfigMap or Secret a release installs
    is mounted or read by a pod template, loaded by a sidecar or named by a custom resource (an
    unused one is configuration the chart ignores); Fluent Bit's `cloudwatch_logs` outputs name a
    log stream (without it Fluent Bit refuses to start and the release rolls back); the
    namespace's NetworkPolicies admit every port a Service sends traffic to and open no port
    nothing serves."""
    after_up(engine_stack)
    from tests.infra.test_chart_render import UNREACHABLE_OK, operand_services
    from tests.support import chart_checks
    from tests.support.charts import YamlLoader, with_namespace

    def listed(namespace: str, kinds: str) -> list[dict[str, Any]]:
        done = engine_stack.plane.kubectl("get", kinds, "--namespace", namespace, "--output", "json")
        return json.loads(done.stdout)["items"]

    installed: dict[str, list[dict[str, Any]]] = {}
    for release in (r for r in engine_stack.state() if r["type"] == RELEASE_TYPE):
        name, namespace = release["inputs"]["name"], release["inputs"]["namespace"]
        manifest = engine_stack.helm("get", "manifest", name, "--namespace", namespace).stdout
        for obj in (d for d in yaml.load_all(manifest, Loader=YamlLoader) if isinstance(d, dict) and d.get("kind")):
            installed.setdefault(namespace, []).append(with_namespace(obj, namespace))
    assert installed, "no release installed anything"
    problems = []
    for namespace, objects in sorted(installed.items()):
        # Plus the Services an operator creates at run time from a release's custom resource (the
        # GPU Operator's DCGM exporter operand): no GPU Operator runs its operands here.
        live = [*listed(namespace, LIVE_KINDS), *operand_services(objects, namespace)]
        filled = {chart_checks.key(o) for o in objects if o["kind"] in ("ConfigMap", "Secret")
                  and o["metadata"]["namespace"] == namespace}
        # The releases' custom resources (a Prometheus naming its Secret, the ClusterPolicy its
        # metrics ConfigMap) are consumers too; they are in the manifests, cluster-scoped ones included.
        everything = [*live, *objects]
        problems += [f"{namespace}: {p}" for p in chart_checks.unconsumed(everything, filled)]
        problems += [f"{namespace}: {p}" for p in chart_checks.cloudwatch_output_problems(live)]
        problems += [f"{namespace}: {p}" for p in chart_checks.policy_port_problems(
            live, listed(namespace, "networkpolicies"), namespace, unreachable_ok=UNREACHABLE_OK)]
    assert problems == [], "\n".join(problems)


def test_every_custom_resource_waits_for_the_resource_that_installs_its_crd(engine_stack):
    """The engine creates a resource only after everything in its ``dependencies`` (Pulumi's step
    executor); the Kubernetes provider retries a kind it does not know only 5 times over ~31 s
    (pulumi-kubernetes v4.25.0 provider/pkg/await/await.go ``WithMaxRetries(5).WithBackoffFactor(2)``
    on ``meta.IsNoMatchError``), so a custom resource whose CRD arrives later (a chart that waits
    for its pods) fails. Every custom resource must therefore depend, directly or through others,
    on what creates its CRD: a CustomResourceDefinition resource or the Helm release whose chart
    ships it (as the control plane reports it now)."""
    after_up(engine_stack)
    state = engine_stack.state()
    owners = crd_owners(engine_stack, state)
    closure = dependency_closure(state)
    kinds = custom_resources(state, owners)
    assert kinds, "no custom resource in the stack"
    missing = {urn: sorted(owner) for urn, owner in kinds.items() if not owner & closure[urn]}
    assert missing == {}, f"custom resources that do not wait for their CRD's owner: {missing}"


def test_second_up_changes_nothing(engine_stack):
    after_up(engine_stack)
    run = run_op(engine_stack, "up", "second-up", "--skip-plan")
    assert run.returncode == 0, run.explain()
    changed = {urn: op for urn, op in ops(steps_of(engine_stack, "second-up")).items() if op != "same"}
    assert changed == {}, f"a second up with nothing changed wants to: {changed}"


def test_graph_matches_the_recording_engine(engine_stack):
    """URNs, types, parents, providers, dependencies and inputs of the real engine's state against
    the offline plan's recording (infra.plan), both stacks. tests/engine/graph.py lists the
    differences that are inherent to the engine and why."""
    after_up(engine_stack)
    differences = compare_graphs(recorded_graph(engine_stack.plan), engine_stack.state(),
                                 kustomize=kustomize_builds(engine_stack.plan))
    assert differences == [], "\n".join(differences[:40]) + (f"\n... {len(differences)} in all" if len(differences) > 40 else "")


def kustomize_builds(plan) -> dict[str, list[dict[str, Any]]]:
    """Each kustomize Directory of the plan -> its overlay as ``kubectl kustomize`` builds it, in the
    program's working directory (what the provider builds at deploy time)."""
    from tools.cluster.layer import training_operator_objects

    return {r["urn"]: training_operator_objects(r["inputs"]["directory"])
            for r in recorded_graph(plan) if r["type"] == KUSTOMIZE_TYPE}


def test_refresh_finds_no_drift(engine_stack):
    after_up(engine_stack)
    run = run_op(engine_stack, "refresh", "refresh", "--expect-no-changes")
    assert run.returncode == 0, run.explain()
    changed = {urn: op for urn, op in ops(steps_of(engine_stack, "refresh")).items() if op not in ("same", "refresh")}
    assert changed == {}, changed


GPU_POOL_CHANGE = {
    # stack: (pool index in gpuPools, gpusPerNode before, after): the pool's instance type changes
    # (catalog/gpus.py: one instance type per GPU type and count), nothing else in the config.
    "dev": (0, 1, 4),     # l4: g6.xlarge -> g6.12xlarge
    "prod": (2, 1, 4),    # l40s: g6e.xlarge -> g6e.12xlarge
}


def test_changing_one_gpu_pools_instance_type_updates_exactly_what_the_plan_says(engine_stack):
    after_up(engine_stack)
    from infra.plan import build_plan

    index, before, after = GPU_POOL_CHANGE[engine_stack.stack]
    original = engine_stack.stack_file.read_text()
    engine_stack.set_config(f"gpuPools.{index}.gpusPerNode", after)
    try:
        changed_plan = build_plan(engine_stack.stack, engine_stack.project_dir)
        expected = {urn for urn, (old, new) in _paired_inputs(engine_stack.plan, changed_plan).items() if old != new}
        assert expected, "the recording engine sees no change: the test would prove nothing"
        run = run_op(engine_stack, "preview", "pool-change", "--skip-plan")
        assert run.returncode == 0, run.explain()
        changed = {urn: op for urn, op in ops(steps_of(engine_stack, "pool-change")).items() if op != "same"}
        assert set(changed.values()) <= {"update"}, changed
        assert set(changed) == expected, {"unexpected": sorted(set(changed) - expected),
                                          "missing": sorted(expected - set(changed))}
    finally:
        engine_stack.stack_file.write_text(original)


def _paired_inputs(before, after) -> dict[str, tuple[Any, Any]]:
    old = {r["urn"]: r["inputs"] for r in recorded_graph(before)}
    new = {r["urn"]: r["inputs"] for r in recorded_graph(after)}
    assert set(old) == set(new), {"added": sorted(set(new) - set(old)), "removed": sorted(set(old) - set(new))}
    return {urn: (old[urn], new[urn]) for urn in old}


def test_destroy_is_refused_by_the_protected_resources_and_deletes_nothing(engine_stack):
    after_up(engine_stack)
    before = engine_stack.state()
    protected = sorted(r["urn"] for r in before if r.get("protect"))
    assert protected, "the stack protects nothing: the refusal would not be exercised"
    run = engine_stack.deploy("destroy")
    assert run.returncode == 1, run.explain()
    count = "1 of its resources is" if len(protected) == 1 else f"{len(protected)} of its resources are"
    assert f"refusing to destroy stack '{engine_stack.stack}': {count} protected" in run.stderr
    from infra.plan.deploy import PROTECTED_LISTED

    listed = [urn for urn in protected if f"\n  - {urn}\n" in run.stderr + "\n"]
    assert len(listed) == min(len(protected), PROTECTED_LISTED), run.stderr
    assert "--exclude-protected" in run.stderr
    assert [r["urn"] for r in engine_stack.state()] == [r["urn"] for r in before]


def test_an_invoke_without_a_provider_is_refused_by_the_real_engine(engine_stack):
    """Pulumi.yaml disables the default aws provider; an invoke made outside any component (no
    parent to inherit a provider from) has none. Re-inject the partition lookup as an invoke there
    (it used to be one) and the real engine refuses the preview with its own message."""
    inject = ("import pulumi_aws as aws, infra.foundation as foundation\n"
              "foundation.partition_of = lambda region: aws.get_partition_output().partition\n")
    run = engine_stack.deploy("preview", "--skip-plan", python_prelude=inject, timeout_s=600)
    assert run.returncode == 1, run.explain()
    assert ("Default provider for 'aws' disabled. 'aws:index/getPartition:getPartition' must use an explicit provider"
            in run.output), run.explain()


def test_releases_without_a_verified_chart_archive_are_listed_as_not_installable(engine_stack):
    """The engine tests install every chart from the loopback mirror of the pinned archives; a chart
    whose archive no one could verify (no SHA-256 pinned: the team's chart repository has no copy)
    cannot be served by a mirror, so the sections that install one are left out of the test config
    (tests/engine/conftest.py). This lists them, with the reason, and fails if any other chart of
    the stack is left out or a left-out section installs a chart that could be verified."""
    from infra.capabilities import charts_used
    from infra.config import load_platform_config
    from tests.conftest import stack_config
    from tests.engine.conftest import NOT_INSTALLABLE_SECTIONS

    full = charts_used(load_platform_config(stack_config(engine_stack.stack), source="stack file"))
    tested = charts_used(engine_stack.plan.config)
    left_out = {chart.name: chart for chart in full} .keys() - {chart.name for chart in tested}
    unverifiable = {chart.name for chart in full if chart.sha256 is None}
    assert left_out == unverifiable, {"left out": sorted(left_out), "without a pinned archive": sorted(unverifiable)}
    assert all(chart.sha256 for chart in tested)
    reasons = [f"{chart.name} {chart.version}: no verified archive ({chart.source})" for chart in full if chart.name in left_out]
    print(f"{engine_stack.stack}: not installable here, sections {NOT_INSTALLABLE_SECTIONS} left out:\n  " + "\n  ".join(reasons))
