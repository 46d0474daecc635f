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
from typing import TYPE_CHECKING, Callable, Optional

from datetime import timedelta

if TYPE_CHECKING:
    from datetime import date

    from infra.config import PlatformConfig
    from catalog.versions import EksRelease
    from infra.plan import Plan

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
    target_values: Optional[dict] = None  # the stack's config after this upgrade (the next hop starts there)

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


def plan_upgrade(stack: str, target: str, project_dir: Path, *, values: Optional[dict] = None) -> UpgradePlan:
    """``values``: the stack file's config as it will be (a later hop of ``plan_path``), instead of
    the file's."""
    from infra.config import load_platform_config
    from infra.plan import raw_project_config

    file_values, plan_from_values = _load(stack, project_dir)
    values = file_values if values is None else values
    config = load_platform_config(raw_project_config(values), source=f"Pulumi.{stack}.yaml")
    current = config.cluster.version
    _check_target(stack, current, target)
    release, old = EKS_RELEASES[target], EKS_RELEASES[current]

    def config_of(stack_values: dict, source: str) -> PlatformConfig:
        return load_platform_config(raw_project_config(stack_values), source=source)

    blockers = _dev_first_blockers(project_dir, target, config_of) if config.is_prod else []
    target_values, new_alias = _target_values(values, target, config.karpenter.ami_alias, release.ami_release)
    target_plan = plan_from_values(stack, target_values, source=f"Pulumi.{stack}.yaml at {target}")
    errors = [w for w in target_plan.warnings if w.startswith("ERROR")]
    blockers += [f"the plan at {target}: {e}" for e in errors]
    plan_blockers, checks = _target_plan_verdicts(target_plan, target, release)
    blockers += plan_blockers
    steps = _upgrade_steps(stack, config, current, target, old, release,
                           alias=config.karpenter.ami_alias, new_alias=new_alias)
    return UpgradePlan(stack, current, target, steps, blockers, checks, target_values)


def _check_target(stack: str, current: str, target: str) -> None:
    """Refuse a target that is not the next minor this platform knows."""
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


def _dev_first_blockers(project_dir: Path, target: str,
                        config_of: Callable[[dict, str], PlatformConfig]) -> list[str]:
    """Dev first: prod moves only to a version dev already runs."""
    blockers = []
    for other in sorted(project_dir.glob("Pulumi.*.yaml")):
        other_values, _ = _load(other.name[len("Pulumi."):-len(".yaml")], project_dir)
        other_config = config_of(other_values, other.name)
        if not other_config.is_prod and _minor(other_config.cluster.version) < _minor(target):
            blockers.append(f"{other.name} ({other_config.environment.value}) runs {other_config.cluster.version}: "
                            f"upgrade it to {target} and let it soak before prod")
    return blockers


def _target_values(values: dict, target: str, alias: str, ami_release: str) -> tuple[dict, str]:
    """The target's config: version bumped, and a pinned AMI alias moved to a release that ships it."""
    import json

    target_cluster = json.loads(values["ml-training-platform:cluster"])
    target_cluster["version"] = target
    # The system group's release names the current minor; the target's is read at upgrade time (step 4).
    target_cluster.get("systemNodeGroup", {}).pop("releaseVersion", None)
    target_values = {**values, "ml-training-platform:cluster": json.dumps(target_cluster)}
    alias_date, needed = ami_release_date(alias), ami_release_date(ami_release)
    new_alias = alias
    if alias_date is not None and needed is not None and alias_date < needed:
        new_alias = f"{alias.split('@')[0]}@{ami_release}"
        karpenter = json.loads(values.get("ml-training-platform:karpenter", "{}"))
        karpenter["amiAlias"] = new_alias
        target_values["ml-training-platform:karpenter"] = json.dumps(karpenter)
    return target_values, new_alias


def _target_plan_verdicts(target_plan: Plan, target: str, release: EksRelease) -> tuple[list[str], list[str]]:
    """Blockers and checks the target's plan shows: removed APIs, charts, unconfirmed add-on builds."""
    blockers: list[str] = []
    removed = removed_apis_at(target)
    for api_version, kind, name in rendered_objects(target_plan.recording):
        if (api_version, kind) in removed:
            blockers.append(f"{kind} {name} uses {api_version}, which Kubernetes {removed[(api_version, kind)]} "
                            "no longer serves (Deprecated API Migration Guide): move it to the served version first")
    charts = {r.inputs.get("chart") for r in target_plan.recording.by_type("kubernetes:helm.sh/v3:Release")}
    chart_blockers, checks = chart_verdicts(target, CHARTS, deployed_charts=charts)
    blockers += chart_blockers
    checks = list(checks)
    deployed = {r.inputs.get("addonName") for r in target_plan.recording.by_type("aws:eks/addon:Addon")}
    # Only builds no AWS table confirms: a mapped add-on (vpc-cni, coredns, kube-proxy) whose
    # build is the same at both minors is confirmed by its table, not "kept".
    unmapped = sorted(name for name in release.addons if name in deployed and name in release.unconfirmed_addons)
    if unmapped:
        checks.append(f"add-ons without a per-version AWS table keep their build ({', '.join(unmapped)}): confirm with "
                      f"`aws eks describe-addon-versions --kubernetes-version {target} --addon-name <name>`")
    return blockers, checks


def _upgrade_steps(stack: str, config: PlatformConfig, current: str, target: str, old: EksRelease,
                   release: EksRelease, *, alias: str, new_alias: str) -> list[str]:
    """The runbook: config change, control plane, add-ons, system nodes, Karpenter's CPU and GPU pools, verify."""
    addon_changes = [f"{name} {old.addons.get(name)} -> {build}" for name, build in sorted(release.addons.items())
                     if old.addons.get(name) != build]
    gpu_pools = [pool.name for pool in config.gpu_pools]
    file = f"Pulumi.{stack}.yaml"
    return [
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


# -- the whole path ------------------------------------------------------------------------------
HOURS_PER_MONTH = 730  # AWS's monthly hours (the plan's cost report uses the same)
# A version worth stopping at keeps standard support at least this long: each hop is a PR, a dev
# soak and a prod `up`, so a minor whose standard support ends sooner is extended again on arrival.
STOP_HORIZON_DAYS = 90


def extended_premium_usd_per_month() -> float:
    """What extended support adds to a cluster's control-plane bill per month (EKS pricing:
    $0.60 instead of $0.10 per cluster-hour once standard support has ended)."""
    from catalog.versions import EKS_EXTENDED_USD_PER_HOUR, EKS_STANDARD_USD_PER_HOUR

    return (EKS_EXTENDED_USD_PER_HOUR - EKS_STANDARD_USD_PER_HOUR) * HOURS_PER_MONTH


def _dev_first(blocker: str) -> bool:
    """The prod-after-dev rule's blocker: an order in the schedule, not a defect of the hop."""
    return blocker.endswith("and let it soak before prod")


@dataclass
class UpgradePath:
    stack: str
    environment: str
    current: str
    today: "date"
    hops: list[UpgradePlan]
    problem: Optional[str] = None  # a hop that could not be planned (its message)

    def _support(self, version: str) -> str:
        release = EKS_RELEASES[version]
        if self.today >= release.standard_support_ends:
            return (f"extended support since {release.standard_support_ends} (until {release.extended_support_ends}): "
                    f"+${extended_premium_usd_per_month():,.2f}/month")
        days = (release.standard_support_ends - self.today).days
        soon = f": extended again within {STOP_HORIZON_DAYS} days" if days < STOP_HORIZON_DAYS else ""
        return f"standard support until {release.standard_support_ends} ({days} days{soon})"

    def render(self) -> str:
        premium = extended_premium_usd_per_month()
        versions = [self.current] + [hop.target for hop in self.hops]
        lines = [f"stack {self.stack} ({self.environment}): runs EKS {self.current}, {self._support(self.current)}"]
        if not self.hops and self.problem is None:
            lines.append("  path: none (the newest minor this platform knows)")
            return "\n".join(lines)
        lines.append(f"  path: {' -> '.join(versions)} ({len(self.hops)} hop(s), one `up` each; EKS moves one minor at a time)")
        for number, hop in enumerate(self.hops, 1):
            order = [b for b in hop.blockers if _dev_first(b)]
            blockers = [b for b in hop.blockers if not _dev_first(b)]
            lines.append(f"  hop {number}: {hop.current} -> {hop.target}: then {self._support(hop.target)}; "
                         f"{len(blockers)} blocker(s), {len(hop.checks)} check(s)"
                         + (f"; after {', '.join(o.split(' runs ')[0] for o in order)} runs {hop.target}" if order else ""))
            lines += [f"    ! {b}" for b in blockers]
        if self.problem:
            lines.append(f"  ! the path stops here: {self.problem}")
        release = EKS_RELEASES[self.current]
        if self.today >= release.standard_support_ends:
            left = max(0, (release.extended_support_ends - self.today).days)
            months = left / 30.44
            lines.append(f"  staying on {self.current}: ${premium:,.2f}/month of extended support, about ${premium * months:,.0f} "
                         f"until its extended support ends on {release.extended_support_ends} (then EKS upgrades it itself)")
        horizon = self.today + timedelta(days=STOP_HORIZON_DAYS)
        leaves = next((hop.target for hop in self.hops if horizon < EKS_RELEASES[hop.target].standard_support_ends), None)
        if leaves and self.today >= release.standard_support_ends:
            passing = [hop.target for hop in self.hops if _minor(hop.target) < _minor(leaves)]
            lines.append(f"  leaves extended support for good at {leaves} (standard until "
                         f"{EKS_RELEASES[leaves].standard_support_ends})"
                         + (f"; {', '.join(passing)} on the way are (or soon are) extended" if passing else ""))
        elif not leaves and self.hops:
            lines.append(f"  no known minor keeps standard support past {horizon}: add the next EKS_RELEASES row")
        return "\n".join(lines)


def plan_path(stack: str, project_dir: Path, *, today: "date") -> UpgradePath:
    """Every hop from the stack's version to the newest minor the platform knows, each planned on
    the config the previous hop leaves (version, AMI alias)."""
    from infra.config import load_platform_config
    from infra.plan import raw_project_config

    values, _ = _load(stack, project_dir)
    config = load_platform_config(raw_project_config(values), source=f"Pulumi.{stack}.yaml")
    current = config.cluster.version
    newest = max(EKS_RELEASES, key=_minor)
    path = UpgradePath(stack, config.environment.value, current, today, [])
    at = current
    while _minor(at) < _minor(newest):
        target = f"{_minor(at)[0]}.{_minor(at)[1] + 1}"
        try:
            hop = plan_upgrade(stack, target, project_dir, values=values)
        except UpgradeInputError as error:
            path.problem = str(error)
            break
        path.hops.append(hop)
        values, at = hop.target_values, target
    return path


def render_paths(paths: list[UpgradePath], today: "date") -> str:
    premium = extended_premium_usd_per_month()
    extended = [p for p in paths if today >= EKS_RELEASES[p.current].standard_support_ends]
    head = [f"EKS upgrade paths as of {today} (support calendar: catalog/versions.py EKS_RELEASES; extended support "
            f"adds ${premium:,.2f}/month per cluster, EKS pricing)"]
    if extended:
        head.append(f"staying where they are costs ${premium * len(extended):,.2f}/month in extended support "
                    f"({', '.join(p.stack for p in extended)}); the stacks stay pinned until someone runs the hops")
    return "\n\n".join(["\n".join(head), *(p.render() for p in paths)])


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.plan.upgrade", description=__doc__.split("\n\n")[0])
    parser.add_argument("--stack", action="append", help="the stack (repeat for more; --path: default every stack)")
    parser.add_argument("--to", dest="target", help="the next Kubernetes minor, e.g. 1.33")
    parser.add_argument("--path", action="store_true",
                        help="every hop to the newest minor the platform knows, per stack, with each hop's blockers and "
                             "what staying costs in extended support")
    parser.add_argument("--today", help="--path: the date the support calendar is read at (YYYY-MM-DD; default today)")
    parser.add_argument("--project-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    from infra.config import ConfigError
    from infra.plan import default_project_dir

    project_dir = (args.project_dir or default_project_dir()).resolve()
    if args.path:
        return _main_path(args, project_dir)
    if args.target is None or not args.stack or len(args.stack) != 1:
        print("error: give --stack STACK and --to VERSION (one hop), or --path (every hop, every stack)", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        plan = plan_upgrade(args.stack[0], args.target, project_dir)
    except (UpgradeInputError, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(plan.render())
    return EXIT_BLOCKED if plan.blockers else EXIT_OK


def _main_path(args: argparse.Namespace, project_dir: Path) -> int:
    import datetime as dt

    from infra.config import ConfigError

    if args.target:
        print("error: --path plans every hop to the newest minor; drop --to (or drop --path for one hop)", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        today = dt.date.fromisoformat(args.today) if args.today else dt.date.today()
    except ValueError:
        print(f"error: --today {args.today}: not a date. Fix: YYYY-MM-DD, e.g. 2026-11-29", file=sys.stderr)
        return EXIT_BAD_INPUT
    stacks = args.stack or sorted(p.name[len("Pulumi."):-len(".yaml")] for p in project_dir.glob("Pulumi.*.yaml"))
    try:
        paths = [plan_path(stack, project_dir, today=today) for stack in stacks]
    except (UpgradeInputError, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    # Dev first: a schedule lists the non-prod stacks before prod.
    paths.sort(key=lambda p: (p.environment == "prod", p.stack))
    print(render_paths(paths, today))
    blocked = any(b for p in paths for hop in p.hops for b in hop.blockers if not _dev_first(b)) or any(p.problem for p in paths)
    return EXIT_BLOCKED if blocked else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
