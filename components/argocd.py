"""Argo CD: pinned Helm release on the system nodes, SSO, repository credentials from a secret,
and the objects that bootstrap GitOps (the bootstrap project, one project per team, the locked
`default` project, an admission policy on Applications, and the root Application).

Values keys follow the argo-cd chart's values.yaml (argoproj/argo-helm charts/argo-cd, 10.x):
`global.nodeSelector/tolerations`, `configs.cm` (`admin.enabled`, `oidc.config`), `configs.rbac`,
`dex.enabled`, `redis-ha.enabled`, `<component>.replicas` / `.pdb`; HA as in the chart README
("HA mode without autoscaling"). Repository credentials are Secrets labelled
`argocd.argoproj.io/secret-type: repo-creds` (Argo CD declarative setup); an OIDC client secret
is referenced from `oidc.config` as `$<secret>:<key>`, which Argo CD resolves only in Secrets
labelled `app.kubernetes.io/part-of: argocd`.

Secrets never come from the stack file: either a Secrets Manager secret (JSON) of the workload
account, read at deploy time and kept encrypted in the Pulumi state as a secret output, or a
Secret someone created in the `argocd` namespace beforehand.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s
import yaml

from components.helm_addon import helm_addon
from components.cluster import Cluster
from components.k8s import apply_namespace_objects, apply_object
from workloads.problems import Problem, raise_if_any
from components.charts import ChartSource
from catalog.versions import ARGOCD
from workloads import argocd_health
from workloads import gitops
from workloads.placement import system_node_selector, system_tolerations
from workloads.system_namespaces import PodSecurityLevel, SystemNamespaceSpec, namespace_objects

NAMESPACE = gitops.ARGOCD_NAMESPACE
REPO_CREDS_SECRET = "argocd-repo-creds"
OIDC_SECRET = "argocd-oidc"
OIDC_SECRET_KEY = "clientSecret"
# Keys a repo-creds Secret may carry (Argo CD declarative setup, "Repository Credentials").
# The JSON a repository-credentials secret holds (HTTPS; or {"sshPrivateKey": "..."}).
REPO_CREDENTIALS_EXAMPLE = {"username": "...", "password": "..."}
REPO_CREDENTIAL_KEYS = ("username", "password", "sshPrivateKey", "githubAppID", "githubAppInstallationID",
                        "githubAppPrivateKey", "bearerToken")


@dataclass(frozen=True)
class SecretSource:
    """Exactly one: a Secrets Manager secret (JSON) or an existing Secret in the argocd namespace."""

    secrets_manager_secret_id: Optional[str] = None
    existing_secret: Optional[str] = None


@dataclass(frozen=True)
class SsoArgs:
    """OIDC login. admin_groups get role:admin, readonly_groups role:readonly; nobody else sees anything."""

    issuer: str
    client_id: str
    client_secret: SecretSource
    admin_groups: Sequence[str] = ()
    readonly_groups: Sequence[str] = ()
    scopes: Sequence[str] = ("openid", "profile", "email", "groups")


@dataclass(frozen=True)
class ArgoCDArgs:
    """Argo CD for one stack.

    cluster: the platform cluster (its static nodes run Argo CD; network and Service CIDRs).
    gitops: repository, rendered path, team namespaces and sync policy (workloads.gitops).
    domain: host name of the UI/API; the SSO callback is https://<domain>/auth/callback.
    ha: Redis HA plus two replicas (and a PDB) of server, repo server and ApplicationSet controller.
    repo_credentials: Git credentials for ``gitops.repo_url`` (None: a public repository).
    sso: OIDC; when set the local admin user is disabled.
    placeholder_secrets: a read-only preview (CI's reader roles are denied
        secretsmanager:GetSecretValue): the secrets are not read; values of the same shape stand in.
        The in-cluster objects that carry them are left out of such a preview anyway
        (``infra.plan.deploy preview --read-only`` excludes every Kubernetes resource).
    charts: where the charts come from (upstream by default, or the stack's verified chart mirror).
    """

    cluster: Cluster
    gitops: gitops.GitOpsSpec
    domain: str
    ha: bool = False
    repo_credentials: Optional[SecretSource] = None
    sso: Optional[SsoArgs] = None
    placeholder_secrets: bool = False
    charts: ChartSource = ChartSource()


def args_problems(args: ArgoCDArgs) -> list[Problem]:
    problems = []
    sources = [("repo_credentials", args.repo_credentials)] + ([("sso.client_secret", args.sso.client_secret)] if args.sso else [])
    for path, source in sources:
        if source is not None and bool(source.secrets_manager_secret_id) == bool(source.existing_secret):
            problems.append(Problem(path, source, "needs exactly one secret source",
                                    "set secrets_manager_secret_id or existing_secret"))
    if args.gitops.argocd_namespace != NAMESPACE:
        problems.append(Problem("gitops.argocd_namespace", args.gitops.argocd_namespace,
                                "the Helm release installs Argo CD into 'argocd'", "use 'argocd'"))
    return problems


def oidc_secret_ref(sso: SsoArgs) -> str:
    name = sso.client_secret.existing_secret or OIDC_SECRET
    return f"${name}:{OIDC_SECRET_KEY}"


def rbac_policy(sso: Optional[SsoArgs]) -> dict[str, str]:
    lines = [f"g, {g}, role:admin" for g in (sso.admin_groups if sso else ())]
    lines += [f"g, {g}, role:readonly" for g in (sso.readonly_groups if sso else ())]
    # policy.default "": a signed-in user outside the listed groups sees nothing.
    return {"policy.default": "", "policy.csv": "\n".join(lines) + ("\n" if lines else ""), "scopes": "[groups]"}


def helm_values(*, domain: str, ha: bool, sso: Optional[SsoArgs]) -> dict[str, Any]:
    placement = {"nodeSelector": system_node_selector(), "tolerations": system_tolerations()}
    cm: dict[str, Any] = {
        # The local admin is a shared, password-only account: off as soon as SSO exists.
        "admin.enabled": sso is None,
        "exec.enabled": False,
        "statusbadge.enabled": False,
        # Health of the jobs and workflows Argo CD and the pipelines run (Lua, workloads/argocd_health.py).
        **argocd_health.cm_entries(),
    }
    if sso is not None:
        cm["oidc.config"] = yaml.safe_dump({
            "name": "SSO", "issuer": sso.issuer, "clientID": sso.client_id, "clientSecret": oidc_secret_ref(sso),
            "requestedScopes": list(sso.scopes),
        }, sort_keys=False)
    replicas = 2 if ha else 1
    pdb = {"enabled": True, "minAvailable": 1} if ha else {"enabled": False}
    return {
        "global": {"domain": domain, **placement},
        "crds": {"install": True, "keep": True},
        "configs": {"cm": cm, "rbac": rbac_policy(sso), "params": {"server.insecure": False}},
        # OIDC goes straight to the IdP; Dex is only needed for connectors (GitHub, LDAP, SAML).
        "dex": {"enabled": False},
        # Redis HA runs 3 Redis + 3 HAProxy pods with hard anti-affinity: prod has >= 3 system nodes.
        # The subchart places HAProxy with its top-level nodeSelector/tolerations
        # (DandyDeveloper/charts redis-ha templates/redis-haproxy-deployment.yaml); newer releases
        # also read haproxy.tolerations, so both are set.
        "redis-ha": {"enabled": ha, **placement, "haproxy": dict(placement)},
        # One application controller: more replicas shard clusters, they do not add availability.
        "controller": {"replicas": 1},
        "server": {"replicas": replicas, "pdb": pdb},
        "repoServer": {"replicas": replicas, "pdb": pdb},
        "applicationSet": {"replicas": replicas, "pdb": pdb},
    }


# Container ports of the argo-cd chart (values.yaml `containerPorts`): server 8080, repo server
# 8081, application controller metrics 8082, server metrics 8083, repo server metrics 8084,
# ApplicationSet webhook 7000 and metrics 8080 (the same port as the server's, another pod).
ARGOCD_SERVER_PORT = 8080
ARGOCD_METRICS_PORTS = (8082, 8083, 8084)
GIT_SSH_PORT = 22


def namespace_spec(cluster_vpc_cidr: str, service_cidr: str) -> SystemNamespaceSpec:
    return SystemNamespaceSpec(
        name=NAMESPACE, pod_security=PodSecurityLevel.BASELINE, vpc_cidr=cluster_vpc_cidr, service_cidr=service_cidr,
        pod_security_reason=("the redis-ha subchart (Redis + HAProxy, prod) is not verified against `restricted` "
                             "(seccomp profile and dropped capabilities are not all set by its defaults)"),
        # The UI/API behind an internal load balancer or a port-forward: from inside the VPC.
        probe_ports=(ARGOCD_SERVER_PORT,), metrics_ports=ARGOCD_METRICS_PORTS,
        # Git hosts, Helm repositories and the OIDC issuer are outside the VPC: HTTPS anywhere.
        uses_aws=True,
        # server <-> repo server <-> Redis <-> controller.
        same_namespace=True,
    )


def git_ssh_policy() -> dict[str, Any]:
    """Egress to Git over SSH, only for ssh:// or git@ repository URLs."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "allow-git-ssh", "namespace": NAMESPACE},
            "spec": {"podSelector": {}, "policyTypes": ["Egress"],
                     "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}],
                                 "ports": [{"protocol": "TCP", "port": GIT_SSH_PORT}]}]}}


def is_ssh_url(url: str) -> bool:
    return url.startswith(("ssh://", "git@"))


def secret_fields(secret_id: str, secret_json: str, required: Sequence[str] = ()) -> dict[str, Any]:
    """The JSON object of a Secrets Manager secret, or an error naming the secret and the fix."""
    try:
        values = json.loads(secret_json)
    except ValueError:
        values = None
    if not isinstance(values, dict):
        raise ValueError(f"Secrets Manager secret {secret_id!r} is not a JSON object; store e.g. "
                         '{"username": "...", "password": "..."}')
    missing = [k for k in required if k not in values]
    if missing:
        raise ValueError(f"Secrets Manager secret {secret_id!r} lacks key(s) {missing}; add them to its JSON value")
    return values


def repo_creds_string_data(repo_url: str, secret_id: str, secret_json: str) -> dict[str, str]:
    """The repo-creds Secret's data: the URL (a prefix match) plus the credential keys of the JSON."""
    values = secret_fields(secret_id, secret_json)
    data = {k: str(v) for k, v in values.items() if k in REPO_CREDENTIAL_KEYS}
    if not data:
        raise ValueError(f"Secrets Manager secret {secret_id!r} holds none of {list(REPO_CREDENTIAL_KEYS)}")
    return {"type": "git", "url": repo_url, **data}


class ArgoCD(pulumi.ComponentResource):
    release: k8s.helm.v3.Release

    def __init__(self, name: str, args: ArgoCDArgs, opts: Optional[pulumi.ResourceOptions] = None):
        raise_if_any(f"ArgoCD {name}", args_problems(args))
        super().__init__("mlplatform:argocd:ArgoCD", name, None, opts)
        self._placeholders = args.placeholder_secrets
        creds = args.repo_credentials
        sso = args.sso
        # Read at preview, before any child: a missing secret is one clear error, not an invoke trace.
        secret_values = self._read_secrets(name, [
            *([("repository credentials", creds.secrets_manager_secret_id, REPO_CREDENTIALS_EXAMPLE)]
              if creds is not None and creds.secrets_manager_secret_id else []),
            *([("OIDC client secret", sso.client_secret.secrets_manager_secret_id, {OIDC_SECRET_KEY: "..."})]
              if sso is not None and sso.client_secret.secrets_manager_secret_id else []),
        ])
        cluster = args.cluster
        objects = namespace_objects(namespace_spec(cluster.vpc_cidr, cluster.service_cidr))
        if is_ssh_url(args.gitops.repo_url):
            objects.append(git_ssh_policy())
        self.namespace, self.network_policies = apply_namespace_objects(name, objects, self)
        in_namespace = pulumi.ResourceOptions(parent=self, depends_on=[self.namespace])
        secrets: list[pulumi.Resource] = []

        if creds is not None and creds.secrets_manager_secret_id:
            value = secret_values[creds.secrets_manager_secret_id]
            secrets.append(apply_object(f"{name}-repo-creds", {
                "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": REPO_CREDS_SECRET, "namespace": NAMESPACE,
                             "labels": {"argocd.argoproj.io/secret-type": "repo-creds"}},
                "stringData": pulumi.Output.secret(value.apply(lambda v: repo_creds_string_data(
                    args.gitops.repo_url, creds.secrets_manager_secret_id, v))),
            }, in_namespace))
        if sso is not None and sso.client_secret.secrets_manager_secret_id:
            value = secret_values[sso.client_secret.secrets_manager_secret_id]
            secrets.append(apply_object(f"{name}-oidc-secret", {
                "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": OIDC_SECRET, "namespace": NAMESPACE,
                             "labels": {"app.kubernetes.io/part-of": "argocd"}},
                "stringData": pulumi.Output.secret(value.apply(lambda v: {OIDC_SECRET_KEY: str(secret_fields(
                    sso.client_secret.secrets_manager_secret_id, v, [OIDC_SECRET_KEY])[OIDC_SECRET_KEY])})),
            }, in_namespace))

        self.release = helm_addon(
            f"{name}-chart", parent=self, cluster=cluster, release="argo-cd", chart=ARGOCD,
            source=args.charts, namespace=NAMESPACE,
            values=helm_values(domain=args.domain, ha=args.ha, sso=sso), skip_crds=False, timeout_seconds=900,
            depends_on=[self.namespace, *self.network_policies, *secrets],
        )
        # The CRDs arrive with the chart: the bootstrap objects wait for it.
        after_chart = pulumi.ResourceOptions(parent=self, depends_on=[self.release])
        spec = args.gitops
        # Argo CD creates `default` at start-up; the provider's server-side apply takes it over
        # (pulumi-kubernetes 4: create is an upsert under SSA).
        self.projects = [apply_object(f"{name}-project-{obj['metadata']['name']}", obj, after_chart)
                         for obj in (gitops.bootstrap_project(spec), *gitops.team_projects(spec),
                                     gitops.default_project_lockdown(spec))]
        self.application_policy = [apply_object(f"{name}-{obj['kind'].lower()}-{obj['metadata']['name']}", obj,
                                                pulumi.ResourceOptions(parent=self))
                                   for obj in gitops.application_policy(spec)]
        self.root_application = apply_object(
            f"{name}-root-application", gitops.root_application(spec),
            pulumi.ResourceOptions(parent=self, depends_on=[self.release, *self.projects, *self.application_policy]))
        self.register_outputs({"release_status": self.release.status,
                               "root_application": spec.root_application_name})

    def _read_secrets(self, name: str, reads: Sequence[tuple[str, str, Mapping[str, str]]]) -> dict[str, pulumi.Output[str]]:
        """Each (purpose, secret id, example JSON) read through the workload account's provider;
        every unreadable one reported at once, naming the secret, its JSON keys and the command
        that creates it (Secrets Manager GetSecretValue answers ResourceNotFoundException)."""
        values: dict[str, pulumi.Output[str]] = {}
        problems: list[Problem] = []
        for purpose, secret_id, example in reads:
            if self._placeholders:
                values[secret_id] = pulumi.Output.secret(json.dumps(dict(example)))
                continue
            try:
                version = aws.secretsmanager.get_secret_version(secret_id=secret_id, opts=pulumi.InvokeOptions(parent=self))
            except Exception as error:  # the engine's invoke error: its first line names AWS's reason
                reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                problems.append(Problem(
                    f"Argo CD {purpose}", secret_id, f"cannot be read from Secrets Manager in the workload account: {reason}",
                    f"create it before the first `up` (docs/runbooks/first-deploy.md): aws secretsmanager create-secret "
                    f"--name {secret_id} --secret-string '{json.dumps(dict(example))}'"))
                continue
            values[secret_id] = pulumi.Output.secret(version.secret_string)
        raise_if_any(f"ArgoCD {name}", problems)
        return values
