"""The ``gitops`` section: Argo CD (app of apps over the rendered manifests) and Argo Workflows; its rules."""
from __future__ import annotations

from typing import Any, Iterator, Optional

from pydantic import Field, field_validator

from components.argocd import SecretSource, SsoArgs
from workloads.problems import Problem
from infra.config.common import DnsName, Environment, GitRef, _Model
from infra.config.engine import Rule, invalid
from infra.config.syntax import (
    checked, https_url_problem, relative_path_problem, secrets_manager_id_problem, url_path_problem,
)
from workloads.gitops import SyncWindowSpec, WindowKind

_GIT_URL = r"^(https://[\w.-]+(:\d+)?/[\w./~-]+|ssh://[\w.@-]+(:\d+)?/[\w./~-]+|git@[\w.-]+:[\w./~-]+)$"
_CRON = r"^(\S+\s+){4}\S+$"


class SecretSourceConfig(_Model):
    """A credential that never appears in the stack file: a Secrets Manager secret (JSON) in the
    workload account, copied into a Kubernetes Secret, or a Secret that already exists in the
    `argocd` namespace. Exactly one of the two."""

    secrets_manager_secret_id: Optional[str] = Field(None, description="Name or ARN of a Secrets Manager secret holding JSON.")
    existing_secret: Optional[str] = Field(None, pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$",
                                           description="A Secret already in the argocd namespace.")

    def args(self) -> SecretSource:
        return self.copy_into(SecretSource)

    @field_validator("secrets_manager_secret_id")
    @classmethod
    def _secret_id(cls, value: Optional[str]) -> Optional[str]:
        return value if value is None else checked(
            secrets_manager_id_problem(value), "use the secret's name, e.g. mlp-dev/argocd/repo-credentials, or its ARN", value)

    @field_validator("existing_secret")
    @classmethod
    def _one_source(cls, value, info):  # runs after secretsManagerSecretId (field order)
        if value and info.data.get("secrets_manager_secret_id"):
            raise invalid("set together with secretsManagerSecretId", "keep exactly one of the two")
        return value


class SsoConfig(_Model):
    """OIDC single sign-on for Argo CD; the local admin user is disabled when this is set."""

    issuer: str = Field(pattern=r"^https://", description="OIDC issuer URL.")
    client_id: str = Field(min_length=1)
    client_secret: SecretSourceConfig = Field(description="JSON key `clientSecret` (Secrets Manager) or the Secret's key `clientSecret`.")
    admin_groups: list[str] = Field(default_factory=list, description="IdP groups given role:admin.")
    readonly_groups: list[str] = Field(default_factory=list, description="IdP groups given role:readonly: every team's Applications and pod logs; platform staff only.")
    team_groups: dict[str, list[str]] = Field(default_factory=dict, description="Team name -> IdP groups that see that team's Applications and pod logs (read-only) in Argo CD, and no other team's.")
    scopes: list[str] = Field(default_factory=lambda: list(SsoArgs.scopes))

    def args(self) -> SsoArgs:
        return self.copy_into(SsoArgs, client_secret=self.client_secret.args())

    @field_validator("issuer")
    @classmethod
    def _issuer(cls, value: str) -> str:
        return checked(https_url_problem(value), "use the IdP's issuer URL, e.g. https://login.example.com", value)


class SyncWindowConfig(_Model):
    kind: str = Field("allow", pattern="^(allow|deny)$", description="allow | deny.")
    schedule: str = Field(pattern=_CRON, description="Cron expression of when the window opens.")
    duration: str = Field(pattern=r"^\d+[mh]$", description="How long it stays open, e.g. 4h.")
    time_zone: str = Field("UTC")
    manual_sync: bool = Field(False, description="Allow manual syncs while the window blocks syncs.")

    def spec(self) -> SyncWindowSpec:
        return self.copy_into(SyncWindowSpec, kind=WindowKind(self.kind))


class GitopsConfig(_Model):
    """Argo CD (app of apps over the rendered manifests) and Argo Workflows (pipelines)."""

    repo_url: str = Field(pattern=_GIT_URL, description="This repository; the only source Argo CD accepts.")
    target_revision: GitRef = Field("main", description="Branch or tag Argo CD follows.")
    rendered_path: Optional[str] = Field(None, pattern=r"^[\w./-]+$", description="Default workloads/rendered/<stack>.")
    domain: DnsName = Field(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", description="Argo CD host name (SSO callback).")
    repo_credentials: Optional[SecretSourceConfig] = Field(None, description="Git credentials (JSON keys username/password or sshPrivateKey).")
    sso: Optional[SsoConfig] = None
    sync_mode: Optional[str] = Field(None, pattern="^(automated|manual)$", description="Default automated in dev, manual in prod.")
    sync_windows: list[SyncWindowConfig] = Field(default_factory=list, description="When syncs may happen (prod).")
    ha: Optional[bool] = Field(None, description="Redis HA and 2 replicas of each server; default true in prod.")
    argo_workflows: bool = Field(True, description="Install Argo Workflows for the training pipelines.")

    @field_validator("rendered_path")
    @classmethod
    def _rendered(cls, value: Optional[str]) -> Optional[str]:
        return value if value is None else checked(
            relative_path_problem(value), "use a path inside the repository, e.g. workloads/rendered/dev", value)

    @field_validator("repo_url")
    @classmethod
    def _repo(cls, value: str) -> str:
        return checked(url_path_problem(value), "use the repository's clone URL, e.g. https://github.com/org/repo.git", value)


def _gitops_rules(environment: Environment, gitops: Optional[GitopsConfig]) -> Iterator[Problem]:
    if gitops is None:
        return
    sources = [("gitops.repoCredentials", gitops.repo_credentials)] + (
        [("gitops.sso.clientSecret", gitops.sso.client_secret)] if gitops.sso else [])
    for path, source in sources:
        if source is not None and not (source.secrets_manager_secret_id or source.existing_secret):
            yield Problem(path, {}, "names no secret", "set secretsManagerSecretId or existingSecret")
    if environment is not Environment.PROD:
        return
    if gitops.sync_mode == "automated":
        yield Problem("gitops.syncMode", gitops.sync_mode, "prod applies merged changes by hand, inside sync windows",
                      "remove gitops.syncMode (manual in prod) and add gitops.syncWindows")
    if gitops.sso is None:
        yield Problem("gitops.sso", None, "prod Argo CD must use single sign-on (the shared admin user is disabled)",
                      "add gitops.sso with your OIDC issuer, clientId and clientSecret source")
    if gitops.ha is False:
        yield Problem("gitops.ha", False, "prod Argo CD runs highly available", "remove gitops.ha (true in prod)")


def _team_groups(scheduling: Any, gitops: Optional[GitopsConfig]) -> Iterator[Problem]:
    if gitops is None or gitops.sso is None:
        return
    teams = sorted(t.name for t in scheduling.teams)
    for team in sorted(set(gitops.sso.team_groups) - set(teams)):
        yield Problem(f"gitops.sso.teamGroups.{team}", team, "is not a team of scheduling.teams",
                      f"use one of {teams}, or remove it")


RULES: tuple[Rule, ...] = (
    Rule(("environment", "gitops"), _gitops_rules),
    Rule(("scheduling", "gitops"), _team_groups),
)
