"""Plan one EKS minor upgrade of one stack: the ordered steps and what blocks them.

    python -m infra.plan.upgrade --stack dev --to 1.33 [--project-dir DIR]

EKS upgrades the control plane one minor at a time ("UpdateClusterVersion ... you can only update
to the next minor version"), so a skip is refused. Each stack moves on its own: the add-on builds
and AMI releases come from the target's row of ``catalog.versions.EKS_RELEASES``, so dev can
run 1.33 while prod stays on 1.32; prod is refused until dev runs the target.

Blockers (exit 1): Kubernetes objects the stack renders whose API version the target no longer
serves (the Kubernetes Deprecated API Migration Guide, "Removed APIs by release"), charts whose
recorded supported range excludes the target, a pinned Karpenter AMI release that does not ship
the target. Exit 0: no blocker; 2: bad input (unknown stack or version, a skip, a downgrade).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from catalog.versions import (
    ARGO_WORKFLOWS_APP_VERSION,
    ARGOCD_APP_VERSION,
    EKS_RELEASES,
    KARPENTER_VERSION,
    KUEUE_VERSION,
    NVIDIA_DEVICE_PLUGIN_VERSION,
    NVIDIA_GPU_OPERATOR_VERSION,
    TRAINING_OPERATOR_VERSION,
    ami_release_date,
)

EXIT_OK, EXIT_BLOCKED, EXIT_BAD_INPUT = 0, 1, 2

# Kubernetes Deprecated API Migration Guide (kubernetes/website
# content/en/docs/reference/using-api/deprecation-guide.md), "Removed APIs by release": the
# release that stops serving each group/version, per kind. No removal is listed after v1.32.
REMOVED_API_VERSIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "1.25": (("batch/v1beta1", "CronJob"), ("discovery.k8s.io/v1beta1", "EndpointSlice"),
             ("events.k8s.io/v1beta1", "Event"), ("autoscaling/v2beta1", "HorizontalPodAutoscaler"),
             ("policy/v1beta1", "PodDisruptionBudget"), ("policy/v1beta1", "PodSecurityPolicy"),
             ("node.k8s.io/v1beta1", "RuntimeClass")),
    "1.26": (("flowcontrol.apiserver.k8s.io/v1beta1", "FlowSchema"),
             ("flowcontrol.apiserver.k8s.io/v1beta1", "PriorityLevelConfiguration"),
             ("autoscaling/v2beta2", "HorizontalPodAutoscaler")),
    "1.27": (("storage.k8s.io/v1beta1", "CSIStorageCapacity"),),
    "1.29": (("flowcontrol.apiserver.k8s.io/v1beta2", "FlowSchema"),
             ("flowcontrol.apiserver.k8s.io/v1beta2", "PriorityLevelConfiguration")),
    "1.32": (("flowcontrol.apiserver.k8s.io/v1beta3", "FlowSchema"),
             ("flowcontrol.apiserver.k8s.io/v1beta3", "PriorityLevelConfiguration")),
}


@dataclass(frozen=True)
class ChartSupport:
    """What a component's own source states about Kubernetes versions.

    minimum / maximum: the stated supported range (a target outside it blocks); maximum None: the
    source states no upper bound ("1.29 or newer"). tested_up_to: the newest minor the release's
    own CI runs on (a later target is a check, not a blocker). minimum None: nothing could be
    verified offline: the upgrade lists it as a check with the source to read."""

    name: str
    version: str
    minimum: Optional[str]
    maximum: Optional[str]
    source: str
    tested_up_to: Optional[str] = None
    # The Helm chart whose release brings it: judged only for a stack whose plan deploys that
    # chart. None: every stack runs it.
    chart: Optional[str] = None


CHARTS: tuple[ChartSupport, ...] = (
    ChartSupport("Karpenter", KARPENTER_VERSION, "1.30", "1.36",
                 "karpenter.sh docs, Upgrade > Compatibility matrix (catalog/versions.py)"),
    ChartSupport("Kueue", KUEUE_VERSION, "1.29", None,
                 "kubernetes-sigs/kueue v0.19.2 README: \"Requires Kubernetes 1.29 or newer\"; e2e on kindest/node "
                 "v1.36.1 (hack/testing/e2e-common_test.sh)", tested_up_to="1.36"),
    ChartSupport("Training Operator", TRAINING_OPERATOR_VERSION, "1.27", None,
                 "kubeflow/trainer v1.9.4 README (operator table: latest 1.27+); CI integration tests on v1.34.3 and "
                 "v1.35.0 (.github/workflows/integration-tests.yaml)", tested_up_to="1.35"),
    ChartSupport("NVIDIA device plugin", NVIDIA_DEVICE_PLUGIN_VERSION, "1.10", None,
                 "NVIDIA/k8s-device-plugin v0.17.1 README, Prerequisites: \"Kubernetes version >= 1.10\"",
                 chart="nvidia-device-plugin"),
    ChartSupport("Argo CD", ARGOCD_APP_VERSION, None, None,
                 "argo-cd.readthedocs.io, Installation > Tested versions (not readable offline)"),
    ChartSupport("Argo Workflows", ARGO_WORKFLOWS_APP_VERSION, None, None,
                 "argo-workflows.readthedocs.io, Installation (not readable offline)"),
    # The release's own Platform Support page: every Kubernetes column reads "1.29---1.32"
    # (NVIDIA/cloud-native-docs commit 7788e329, "GPU Operator 25.3.0 release docs",
    # gpu-operator/platform-support.rst). A later minor blocks until the operator moves.
    ChartSupport("NVIDIA GPU Operator", NVIDIA_GPU_OPERATOR_VERSION, "1.29", "1.32",
                 "docs.nvidia.com/datacenter/cloud-native/gpu-operator/25.3.0, Platform Support: Kubernetes 1.29-1.32",
                 chart="gpu-operator"),
)


def chart_verdicts(target: str, charts: tuple[ChartSupport, ...] = CHARTS,
                   deployed_charts: Optional[set[str]] = None) -> tuple[list[str], list[str]]:
    """(blockers, checks) for ``target`` from each chart's stated range. ``deployed_charts``: the
    Helm charts the stack's plan installs (None: judge every chart)."""
    blockers, checks = [], []
    for chart in charts:
        if chart.chart is not None and deployed_charts is not None and chart.chart not in deployed_charts:
            continue
        if chart.minimum is None:
            checks.append(f"{chart.name} {chart.version}: supported Kubernetes range not recorded here; confirm {target} "
                          f"in {chart.source}")
            continue
        above = chart.maximum is not None and _minor(target) > _minor(chart.maximum)
        if _minor(target) < _minor(chart.minimum) or above:
            stated = f"{chart.minimum}-{chart.maximum}" if chart.maximum else f"{chart.minimum} or newer"
            blockers.append(f"{chart.name} {chart.version} supports Kubernetes {stated} ({chart.source}), not {target}: "
                            "upgrade the chart first")
        elif chart.tested_up_to is not None and _minor(target) > _minor(chart.tested_up_to):
            checks.append(f"{chart.name} {chart.version}: its CI runs up to {chart.tested_up_to}, not {target} "
                          f"({chart.source}); test in dev before prod")
    return blockers, checks


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def removed_apis_at(target: str) -> dict[tuple[str, str], str]:
    """(apiVersion, kind) -> the release that stopped serving it, for every removal up to ``target``."""
    return {api: release for release, apis in REMOVED_API_VERSIONS.items() if _minor(release) <= _minor(target)
            for api in apis}


def rendered_objects(recording) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of every Kubernetes object the stack's program declares."""
    objects = []
    for resource in recording.resources:
        if not resource.type.startswith("kubernetes:") or resource.type.startswith("kubernetes:helm.sh"):
            continue
        _, group_version, kind = resource.type.split(":")
        api_version = group_version.replace("core/", "") if group_version.startswith("core/") else group_version
        objects.append((api_version, kind, resource.name))
    return objects


@dataclass
class UpgradePlan:
    stack: str
    current: str
    target: str
    steps: list[str]
    blockers: list[str]
    checks: list[str]

    def render(self) -> str:
        lines = [f"Upgrade of stack '{self.stack}': EKS {self.current} -> {self.target}", "", "Steps, in order:"]
        lines += [f"  {i}. {step}" for i, step in enumerate(self.steps, 1)]
        lines += ["", f"Blockers ({len(self.blockers)}):"] + [f"  ! {b}" for b in self.blockers or ["none"]]
        lines += ["", f"Check before step 2 ({len(self.checks)}):"] + [f"  ? {c}" for c in self.checks or ["none"]]
        return "\n".join(lines)


class UpgradeInputError(ValueError):
    pass


def _load(stack: str, project_dir: Path):
    from infra.plan import plan_from_values, read_stack_file, stack_file

    path = stack_file(stack, project_dir)
    if not path.is_file():
        raise UpgradeInputError(f"stack '{stack}': {path.name} not found in {project_dir}")
    values, _ = read_stack_file(path)
    return values, plan_from_values


def plan_upgrade(stack: str, target: str, project_dir: Path) -> UpgradePlan:
    import json

    from infra.config import load_platform_config
    from infra.plan import raw_project_config

    values, plan_from_values = _load(stack, project_dir)
    config = load_platform_config(raw_project_config(values), source=f"Pulumi.{stack}.yaml")
    current = config.cluster.version
    try:
        _minor(target)
    except ValueError:
        raise UpgradeInputError(f"--to {target}: not a Kubernetes minor; use e.g. 1.33") from None
    if _minor(target) <= _minor(current):
        raise UpgradeInputError(f"--to {target}: stack '{stack}' already runs {current}; EKS cannot downgrade a control plane")
    if target not in EKS_RELEASES:
        raise UpgradeInputError(f"--to {target}: not a version this platform knows; use one of {sorted(EKS_RELEASES)} "
                                "(a new one needs its row in catalog/versions.py EKS_RELEASES, with sources)")
    if _minor(target)[1] - _minor(current)[1] != 1:
        following = f"{_minor(current)[0]}.{_minor(current)[1] + 1}"
        raise UpgradeInputError(f"--to {target}: EKS upgrades one minor at a time; upgrade stack '{stack}' to {following} first")

    release, old = EKS_RELEASES[target], EKS_RELEASES[current]
    blockers: list[str] = []
    checks: list[str] = []
    # Dev first: prod moves only to a version dev already runs.
    if config.is_prod:
        for other in sorted(project_dir.glob("Pulumi.*.yaml")):
            other_values, _ = _load(other.name[len("Pulumi."):-len(".yaml")], project_dir)
            other_config = load_platform_config(raw_project_config(other_values), source=other.name)
            if not other_config.is_prod and _minor(other_config.cluster.version) < _minor(target):
                blockers.append(f"{other.name} ({other_config.environment.value}) runs {other_config.cluster.version}: "
                                f"upgrade it to {target} and let it soak before prod")

    # The target's config: version bumped, and a pinned AMI alias moved to a release that ships it.
    target_cluster = json.loads(values["ml-training-platform:cluster"])
    target_cluster["version"] = target
    # The system group's release names the current minor; the target's is read at upgrade time (step 4).
    target_cluster.get("systemNodeGroup", {}).pop("releaseVersion", None)
    target_values = {**values, "ml-training-platform:cluster": json.dumps(target_cluster)}
    alias = config.karpenter.ami_alias
    alias_date, needed = ami_release_date(alias), ami_release_date(release.ami_release)
    new_alias = alias
    if alias_date is not None and needed is not None and alias_date < needed:
        new_alias = f"{alias.split('@')[0]}@{release.ami_release}"
        karpenter = json.loads(values.get("ml-training-platform:karpenter", "{}"))
        karpenter["amiAlias"] = new_alias
        target_values["ml-training-platform:karpenter"] = json.dumps(karpenter)
    target_plan = plan_from_values(stack, target_values, source=f"Pulumi.{stack}.yaml at {target}")
    errors = [w for w in target_plan.warnings if w.startswith("ERROR")]
    blockers += [f"the plan at {target}: {e}" for e in errors]

    removed = removed_apis_at(target)
    for api_version, kind, name in rendered_objects(target_plan.recording):
        if (api_version, kind) in removed:
            blockers.append(f"{kind} {name} uses {api_version}, which Kubernetes {removed[(api_version, kind)]} "
                            "no longer serves (Deprecated API Migration Guide): move it to the served version first")
    charts = {r.inputs.get("chart") for r in target_plan.recording.by_type("kubernetes:helm.sh/v3:Release")}
    chart_blockers, chart_checks = chart_verdicts(target, CHARTS, deployed_charts=charts)
    blockers += chart_blockers
    checks += chart_checks
    deployed = {r.inputs.get("addonName") for r in target_plan.recording.by_type("aws:eks/addon:Addon")}
    # Only builds no AWS table confirms: a mapped add-on (vpc-cni, coredns, kube-proxy) whose
    # build is the same at both minors is confirmed by its table, not "kept".
    unmapped = sorted(name for name in release.addons if name in deployed and name in release.unconfirmed_addons)
    if unmapped:
        checks.append(f"add-ons without a per-version AWS table keep their build ({', '.join(unmapped)}): confirm with "
                      f"`aws eks describe-addon-versions --kubernetes-version {target} --addon-name <name>`")

    addon_changes = [f"{name} {old.addons.get(name)} -> {build}" for name, build in sorted(release.addons.items())
                     if old.addons.get(name) != build]
    gpu_pools = [pool.name for pool in config.gpu_pools]
    file = f"Pulumi.{stack}.yaml"
    steps = [
        f"In {file} set cluster.version: \"{target}\""
        + (f" and karpenter.amiAlias: {new_alias} (the release that ships {target})" if new_alias != alias else "")
        + "; open the PR (the plan and the read-only preview run there).",
        f"Control plane {current} -> {target}: `python -m infra.plan.deploy up --stack {stack}` applies the cluster version "
        "first (EKS keeps the API available; 10-20 min; no rollback).",
        "Managed add-ons to the target's builds (same `up`, after the control plane): "
        + ("; ".join(addon_changes) if addon_changes else "no build changes"),
        f"System node group rolls to the {target} AMI (managed node group update, respecting PodDisruptionBudgets)"
        + (f"; cluster.systemNodeGroup.releaseVersion ({config.cluster.system_node_group.release_version}) names a "
           f"{current} release: set it to the {target} one (`aws ssm get-parameter --name /aws/service/eks/optimized-ami/"
           f"{target}/amazon-linux-2023/x86_64/standard/recommended/release_version`) in the same change"
           if config.cluster.system_node_group.release_version else "") + ".",
        f"Karpenter CPU pool: nodes drift to the {target} AMI of {new_alias} and are replaced by Karpenter.",
        (f"GPU pools ({', '.join(gpu_pools)}): their Drifted budget is 0, so old-AMI GPU nodes are replaced only when "
         "they are empty (consolidation) or expire (expireAfter); finish the step by waiting for running jobs, then "
         "`kubectl drain` any GPU node still on the old version." if gpu_pools else "No GPU pools."),
        f"Verify: `kubectl get nodes` all on v{target}; `python -m infra.plan.deploy preview --stack {stack} --expect-no-changes`.",
    ]
    return UpgradePlan(stack, current, target, steps, blockers, checks)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.plan.upgrade", description=__doc__.split("\n\n")[0])
    parser.add_argument("--stack", required=True)
    parser.add_argument("--to", required=True, dest="target", help="the next Kubernetes minor, e.g. 1.33")
    parser.add_argument("--project-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    from infra.config import ConfigError
    from infra.plan import default_project_dir

    project_dir = (args.project_dir or default_project_dir()).resolve()
    try:
        plan = plan_upgrade(args.stack, args.target, project_dir)
    except (UpgradeInputError, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(plan.render())
    return EXIT_BLOCKED if plan.blockers else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
