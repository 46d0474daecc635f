"""GitOps capability: Argo CD (app of apps over the stack's rendered manifests) and Argo Workflows.

Reads the ``gitops`` section (and the team namespaces of ``scheduling``), creates the two
components in the cluster, and adds a plan section. The same ``gitops_spec`` feeds
``python -m workloads render``, so the root Application and the rendered tree always agree.
"""
from __future__ import annotations

from typing import Any, Iterator, Optional

import pulumi

from components.argo_workflows import ArgoWorkflows, ArgoWorkflowsArgs
from components.argocd import ArgoCD, ArgoCDArgs
from components.charts import ChartSource
from catalog.versions import ARGO_WORKFLOWS, ARGO_WORKFLOWS_APP_VERSION, ARGOCD, ARGOCD_APP_VERSION, ARGOCD_CHART_VERSION, HelmChart
from infra.capability import Capability
from infra.ci import read_only_requested
from infra.config import GitopsConfig, PlatformConfig, SecretSourceConfig
from infra.recording import Recording
from infra.platform import Platform
from workloads import gitops
from workloads.scheduling import team_namespace

RENDERED_ROOT = "workloads/rendered"


def rendered_path(config: PlatformConfig, stack: str) -> str:
    assert config.gitops is not None
    return config.gitops.rendered_path or f"{RENDERED_ROOT}/{stack}"


def is_ha(config: PlatformConfig) -> bool:
    assert config.gitops is not None
    return config.gitops.ha if config.gitops.ha is not None else config.is_prod


def sync_mode(config: PlatformConfig) -> gitops.SyncMode:
    assert config.gitops is not None
    if config.gitops.sync_mode:
        return gitops.SyncMode(config.gitops.sync_mode)
    return gitops.SyncMode.MANUAL if config.is_prod else gitops.SyncMode.AUTOMATED


def gitops_spec(config: PlatformConfig, stack: str) -> gitops.GitOpsSpec:
    g = config.gitops
    assert g is not None
    return gitops.GitOpsSpec(
        platform=config.name, repo_url=g.repo_url, target_revision=g.target_revision,
        rendered_path=rendered_path(config, stack), namespaces=tuple(sorted(config.team_namespaces)),
        sync_mode=sync_mode(config),
        sync_windows=tuple(w.spec() for w in g.sync_windows),
        viewer_groups={team_namespace(team): tuple(groups) for team, groups in (g.sso.team_groups if g.sso else {}).items()},
    )


def argocd_args(config: PlatformConfig, stack: str, cluster: Any, charts: ChartSource = ChartSource()) -> ArgoCDArgs:
    g: GitopsConfig = config.gitops  # type: ignore[assignment]
    return ArgoCDArgs(cluster=cluster, gitops=gitops_spec(config, stack), domain=g.domain, ha=is_ha(config),
                      repo_credentials=g.repo_credentials.args() if g.repo_credentials else None,
                      sso=g.sso.args() if g.sso else None,
                      # aws-readiness-4 R5: the PR preview's reader roles may not read secrets.
                      placeholder_secrets=read_only_requested(), charts=charts)


def deploy(platform: Platform) -> dict[str, Any]:
    config: PlatformConfig = platform.config
    if config.gitops is None:
        return {}
    stack = pulumi.get_stack()
    argocd = ArgoCD(f"{config.name}-argocd", argocd_args(config, stack, platform.cluster, platform.charts), opts=platform.kubernetes_opts())
    outputs: dict[str, Any] = {"argocdRootApplication": argocd.root_application.metadata["name"],
                               "gitopsRenderedPath": rendered_path(config, stack)}
    if config.gitops.argo_workflows and config.scheduling.teams:
        ArgoWorkflows(f"{config.name}-argo-workflows",
                      ArgoWorkflowsArgs(cluster=platform.cluster, namespaces=sorted(config.team_namespaces), ha=is_ha(config),
                                        namespace_resources=platform.team_namespace_resources(),
                                        charts=platform.charts),
                      opts=platform.kubernetes_opts())
    return outputs


# -- offline plan ------------------------------------------------------------------------
def gitops_lines(config: PlatformConfig, stack: str) -> list[str]:
    g = config.gitops
    assert g is not None
    spec = gitops_spec(config, stack)
    windows = "; ".join(f"{w.kind.value} '{w.schedule}' for {w.duration} {w.time_zone}" for w in spec.sync_windows)
    return [
        f"argo cd          chart {ARGOCD_CHART_VERSION} (Argo CD {ARGOCD_APP_VERSION}), {'HA' if is_ha(config) else 'single replicas'}",
        f"source           {g.repo_url} @ {g.target_revision}, path {spec.apps_path}",
        f"sync             {spec.sync_mode.value}" + (" (prune + self-heal)" if spec.sync_mode is gitops.SyncMode.AUTOMATED else "")
        + (f", windows: {windows}" if windows else ""),
        f"login            {'SSO ' + g.sso.issuer + ' (admin user disabled)' if g.sso else 'local admin user (no SSO)'}",
        f"repo credentials {_describe(g.repo_credentials) if g.repo_credentials else 'none (public repository)'}",
        f"namespaces       {', '.join(spec.namespaces) or 'none'}",
        f"argo workflows   {ARGO_WORKFLOWS_APP_VERSION if g.argo_workflows else 'off'}",
    ]


def _describe(source: SecretSourceConfig) -> str:
    if source.secrets_manager_secret_id:
        return f"Secrets Manager {source.secrets_manager_secret_id}"
    return f"existing Secret argocd/{source.existing_secret}"


def plan_sections(config: PlatformConfig, recording: Recording) -> Iterator[tuple[str, list[str]]]:
    if config.gitops is None:
        return
    # The program exported the rendered path it used; its last component is the stack by default.
    path = recording.stack_outputs.get("gitopsRenderedPath") or f"{RENDERED_ROOT}/{config.environment.value}"
    yield "GitOps", gitops_lines(config, path.rsplit("/", 1)[-1])


def warnings(config: PlatformConfig, recording: Recording) -> Iterator[str]:
    g = config.gitops
    if g is None:
        return
    if g.sso is None:
        yield "gitops: no SSO; Argo CD's local admin user is enabled (its password is in argocd-initial-admin-secret)"
    for path, source in (("gitops.repoCredentials", g.repo_credentials),
                         ("gitops.sso.clientSecret", g.sso.client_secret if g.sso else None)):
        if source is not None and source.secrets_manager_secret_id:
            keys = "username/password or sshPrivateKey" if path == "gitops.repoCredentials" else "clientSecret"
            yield (f"gitops: {path} reads Secrets Manager secret {source.secrets_manager_secret_id!r} (JSON keys {keys}) "
                   f"in the workload account at preview: it must exist before the first `up` "
                   f"(docs/runbooks/first-deploy.md; check: aws secretsmanager describe-secret --secret-id "
                   f"{source.secrets_manager_secret_id})")
    if g.argo_workflows and not config.scheduling.teams:
        yield "gitops: argoWorkflows is on but scheduling.teams is empty: no namespace runs pipelines, Argo Workflows is not installed"


def charts(config: PlatformConfig) -> list[HelmChart]:
    """Argo CD, and Argo Workflows where pipelines run (some team exists)."""
    g = config.gitops
    if g is None:
        return []
    return [ARGOCD, *([ARGO_WORKFLOWS] if g.argo_workflows and config.scheduling.teams else [])]


CAPABILITY = Capability("gitops", deploy=deploy, plan_sections=plan_sections, warnings=warnings, charts=charts)
