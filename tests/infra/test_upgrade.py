"""`python -m infra.plan.upgrade`: one minor at a time, dev first, ordered steps, real blockers.

EKS User Guide, "Update existing cluster to new Kubernetes version": "you can update only to the
next minor version" and "the control plane ... cannot be downgraded". The removed API versions come
from the Kubernetes Deprecated API Migration Guide ("Removed APIs by release"; the latest removal
listed is v1.32: "The flowcontrol.apiserver.k8s.io/v1beta3 API version of FlowSchema and
PriorityLevelConfiguration will no longer be served in v1.32").
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from catalog.versions import EKS_RELEASES
from infra.plan import upgrade
from infra.plan import plan_from_values, read_stack_file

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ["1.32", "1.33", "1.34", "1.35"]


def _project(tmp_path: Path, **versions: str) -> Path:
    shutil.copy(ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    for stack in ("dev", "prod"):
        document = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())
        if stack in versions:
            document["config"]["ml-training-platform:cluster"]["version"] = versions[stack]
            if stack == "prod":
                document["config"]["ml-training-platform:karpenter"]["amiAlias"] = \
                    f"al2023@{EKS_RELEASES[versions[stack]].ami_release}"
        (tmp_path / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump(document))
    return tmp_path


def _cli(*args: str, cwd: Path = ROOT):
    return subprocess.run([sys.executable, "-m", "infra.plan.upgrade", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_a_skip_a_downgrade_and_an_unknown_version_are_refused_with_the_fix():
    for target, says in (("1.34", "upgrade stack 'dev' to 1.33 first"), ("1.31", "cannot downgrade"),
                         ("1.36", "EKS_RELEASES")):
        done = _cli("--stack", "dev", "--to", target)
        assert done.returncode == upgrade.EXIT_BAD_INPUT, done.stdout
        assert says in done.stderr and "Traceback" not in done.stderr


def test_dev_plan_lists_the_steps_in_order_with_the_targets_builds():
    done = _cli("--stack", "dev", "--to", "1.33")
    assert done.returncode == upgrade.EXIT_OK, done.stdout + done.stderr
    order = ["cluster.version: \"1.33\"", "Control plane 1.32 -> 1.33", "Managed add-ons", "System node group",
             "Karpenter CPU pool", "GPU pools", "Verify"]
    positions = [done.stdout.index(step) for step in order]
    assert positions == sorted(positions)
    assert f"kube-proxy v1.32.9-eksbuild.2 -> {EKS_RELEASES['1.33'].addons['kube-proxy']}" in done.stdout
    assert "Drifted budget is 0" in done.stdout


def test_prod_waits_for_dev_and_moves_its_pinned_ami_alias(tmp_path):
    blocked = upgrade.plan_upgrade("prod", "1.33", _project(tmp_path))
    assert any("Pulumi.dev.yaml (dev) runs 1.32" in b for b in blocked.blockers)
    ready = upgrade.plan_upgrade("prod", "1.33", _project(tmp_path, dev="1.33"))
    # Dev soaked: what remains is prod's GPU Operator, whose release supports up to 1.32.
    assert [b for b in ready.blockers if not b.startswith("NVIDIA GPU Operator")] == []
    assert f"karpenter.amiAlias: al2023@{EKS_RELEASES['1.33'].ami_release}" in ready.steps[0]


def test_the_gpu_operator_blocks_prod_beyond_its_stated_range_and_dev_is_not_judged_by_it(tmp_path):
    """NVIDIA GPU Operator 25.3.0's Platform Support page states Kubernetes 1.29-1.32 in every
    Kubernetes column (NVIDIA/cloud-native-docs 7788e329, gpu-operator/platform-support.rst). Prod
    runs it (gpuEnablement.mode gpu-operator): 1.33 is a blocker, not a check. Dev runs the device
    plugin instead, so the operator's range does not hold dev back."""
    project = _project(tmp_path, dev="1.33")
    prod = upgrade.plan_upgrade("prod", "1.33", project)
    [operator] = [b for b in prod.blockers if "GPU Operator" in b]
    assert "supports Kubernetes 1.29-1.32" in operator and "not 1.33: upgrade the chart first" in operator
    assert not any("GPU Operator" in c for c in prod.checks)
    dev = upgrade.plan_upgrade("dev", "1.33", ROOT)
    assert not any("GPU Operator" in line for line in dev.blockers + dev.checks)


def test_an_add_on_whose_aws_table_confirms_its_build_is_not_listed_as_unconfirmed(tmp_path):
    """coredns and vpc-cni have per-version tables in the EKS User Guide; at 1.34 -> 1.35 their builds
    simply do not change (catalog/versions.py EKS_RELEASES), which the table confirms. Only the
    add-ons without a table (UNCONFIRMED) need `describe-addon-versions`."""
    plan = upgrade.plan_upgrade("dev", "1.35", _project(tmp_path, dev="1.34"))
    [line] = [c for c in plan.checks if c.startswith("add-ons without a per-version AWS table")]
    listed = set(line.split("(", 1)[1].split(")", 1)[0].split(", "))
    assert listed and listed <= set(EKS_RELEASES["1.35"].unconfirmed_addons), listed
    assert not {"coredns", "vpc-cni", "kube-proxy"} & listed


def test_objects_using_a_removed_api_version_block_the_upgrade(monkeypatch):
    # Pretend 1.33 stopped serving networking.k8s.io/v1 NetworkPolicy: every rendered policy is a blocker.
    monkeypatch.setitem(upgrade.REMOVED_API_VERSIONS, "1.33", (("networking.k8s.io/v1", "NetworkPolicy"),))
    plan = upgrade.plan_upgrade("dev", "1.33", ROOT)
    assert plan.blockers and all("NetworkPolicy" in b and "no longer serves" in b for b in plan.blockers)


def test_a_chart_whose_range_excludes_the_target_blocks(monkeypatch):
    narrow = upgrade.ChartSupport("Karpenter", "1.14.1", "1.30", "1.32", "test")
    monkeypatch.setattr(upgrade, "CHARTS", (narrow,))
    plan = upgrade.plan_upgrade("dev", "1.33", ROOT)
    assert plan.blockers == ["Karpenter 1.14.1 supports Kubernetes 1.30-1.32 (test), not 1.33: upgrade the chart first"]


def test_removed_api_lookup_follows_the_guide():
    assert ("flowcontrol.apiserver.k8s.io/v1beta3", "FlowSchema") in upgrade.removed_apis_at("1.32")
    assert ("flowcontrol.apiserver.k8s.io/v1beta3", "FlowSchema") not in upgrade.removed_apis_at("1.31")
    assert set(upgrade.removed_apis_at("1.35")) == set(upgrade.removed_apis_at("1.32"))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_both_stacks_plan_at_every_version(stack, version):
    values, _ = read_stack_file(ROOT / f"Pulumi.{stack}.yaml")
    cluster = json.loads(values["ml-training-platform:cluster"])
    cluster["version"] = version
    values["ml-training-platform:cluster"] = json.dumps(cluster)
    karpenter = json.loads(values["ml-training-platform:karpenter"])
    if karpenter["amiAlias"] != "al2023@latest":
        karpenter["amiAlias"] = f"al2023@{EKS_RELEASES[version].ami_release}"
        values["ml-training-platform:karpenter"] = json.dumps(karpenter)
    plan = plan_from_values(stack, values, source=f"at {version}")
    assert not [w for w in plan.warnings if w.startswith("ERROR")]
    assert plan.recording.one("eks:index:Cluster").inputs["version"] == version
    addons = {r.inputs["addonName"]: r.inputs["addonVersion"] for r in plan.recording.by_type("aws:eks/addon:Addon")}
    assert addons and all(EKS_RELEASES[version].addons[name] == build for name, build in addons.items())
    # Each deployed add-on whose build no source confirms for this minor is listed once, with this minor's build.
    pins = [w for w in plan.warnings if w.startswith("unconfirmed pin:") and "describe-addon-versions" in w]
    for name in EKS_RELEASES[version].unconfirmed_addons & set(addons):
        (pin,) = [w for w in pins if f"--addon-name {name} " in w]
        assert f"{name} add-on {addons[name]} " in pin and f"--kubernetes-version {version} " in pin
    assert len(pins) == len(EKS_RELEASES[version].unconfirmed_addons & set(addons))
    # vpc-cni, coredns and kube-proxy rest on the EKS User Guide's per-version tables.
    assert not EKS_RELEASES[version].unconfirmed_addons & {"vpc-cni", "coredns", "kube-proxy"}
    assert not [o for o in upgrade.rendered_objects(plan.recording) if o[:2] in upgrade.removed_apis_at(version)]


def test_a_pinned_alias_without_the_clusters_version_is_refused():
    from infra.config import ConfigError, load_platform_config
    from infra.plan import raw_project_config

    values, _ = read_stack_file(ROOT / "Pulumi.prod.yaml")
    cluster = json.loads(values["ml-training-platform:cluster"])
    cluster["version"] = "1.35"
    values["ml-training-platform:cluster"] = json.dumps(cluster)
    with pytest.raises(ConfigError, match=r"karpenter.amiAlias.*v20251023.*1.35"):
        load_platform_config(raw_project_config(values))


def test_stated_chart_ranges_block_outside_and_check_beyond_their_ci():
    """Kueue v0.19.2 README: "Requires Kubernetes 1.29 or newer"; Training Operator v1.9.4 README
    (latest 1.27+) with CI on 1.34/1.35; NVIDIA device plugin v0.17.1: "Kubernetes version >= 1.10"."""
    charts = {c.name: c for c in upgrade.CHARTS}
    assert (charts["Kueue"].minimum, charts["Kueue"].maximum) == ("1.29", None)
    assert charts["Training Operator"].minimum == "1.27" and charts["NVIDIA device plugin"].minimum == "1.10"
    blockers, checks = upgrade.chart_verdicts("1.28", (charts["Kueue"],))
    assert blockers == [f"Kueue {charts['Kueue'].version} supports Kubernetes 1.29 or newer ({charts['Kueue'].source}), "
                        "not 1.28: upgrade the chart first"] and not checks
    assert upgrade.chart_verdicts("1.35", (charts["Kueue"],)) == ([], [])
    blockers, checks = upgrade.chart_verdicts("1.36", (charts["Training Operator"],))
    assert not blockers and "CI runs up to 1.35" in checks[0]
    for version in VERSIONS[1:]:  # every supported hop passes the recorded ranges, but prod's GPU Operator
        assert [b for b in upgrade.chart_verdicts(version)[0] if "GPU Operator" not in b] == []
    unverified = [c.name for c in upgrade.CHARTS if c.minimum is None]
    assert unverified == ["Argo CD", "Argo Workflows"]
    assert all(any(name in check for check in upgrade.chart_verdicts("1.33")[1]) for name in unverified)


def test_system_node_release_version_is_checked_against_the_cluster_and_followed_by_the_upgrade(tmp_path):
    """awslabs/amazon-eks-ami CHANGELOG: "Release versions for these AMIs: `1.27.1-20230703` ..."
    (<Kubernetes patch>-<YYYYMMDD>); a managed node group's release must be one of its version."""
    from infra.config import ConfigError, load_platform_config
    from infra.plan import raw_project_config

    values, _ = read_stack_file(ROOT / "Pulumi.dev.yaml")
    raw = raw_project_config(values)
    raw["cluster"]["systemNodeGroup"]["releaseVersion"] = "1.33.4-20260903"
    with pytest.raises(ConfigError, match=r"releaseVersion.*1.33.*1.32"):
        load_platform_config(raw)
    raw["cluster"]["systemNodeGroup"]["releaseVersion"] = "v20260903"
    with pytest.raises(ConfigError, match=r"not an EKS AMI release version"):
        load_platform_config(raw)
    raw["cluster"]["systemNodeGroup"]["releaseVersion"] = "1.32.9-20260903"
    assert load_platform_config(raw).cluster.system_node_group.release_version == "1.32.9-20260903"
    # Unset (the stack files today): the plan says the group is never patched and how to read the release.
    plan = plan_from_values("dev", values)
    assert any("releaseVersion is not set" in w and "/aws/service/eks/optimized-ami/1.32/" in w for w in plan.warnings)
    assert plan.recording.one("aws:eks/nodeGroup:NodeGroup").inputs.get("releaseVersion") is None
    # Set: the node group pins it, and the upgrade tells the operator to move it with the version.
    project = _project(tmp_path)
    document = yaml.safe_load((project / "Pulumi.dev.yaml").read_text())
    document["config"]["ml-training-platform:cluster"]["systemNodeGroup"]["releaseVersion"] = "1.32.9-20260903"
    (project / "Pulumi.dev.yaml").write_text(yaml.safe_dump(document))
    result = upgrade.plan_upgrade("dev", "1.33", project)
    assert any("releaseVersion (1.32.9-20260903)" in step and "optimized-ami/1.33/" in step for step in result.steps)
    assert not result.blockers
