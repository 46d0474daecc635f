"""GitOps capability: config rules, and what the recorded plans of both stacks create."""
from __future__ import annotations

import json

import pytest
import yaml

from components import argocd as argocd_component
from workloads.problems import InvalidInputError
from catalog.versions import ARGO_WORKFLOWS_APP_VERSION, ARGOCD_CHART_VERSION
from infra.config import load_platform_config
from tests.conftest import problem_per_path, stack_config
from workloads.placement import system_node_selector
from tests.support.validation import validate_core, validate_custom_resource


def _release(plan, chart):
    found = [r for r in plan.recording.by_type("kubernetes:helm.sh/v3:Release") if r.inputs.get("chart") == chart]
    assert len(found) == 1, chart
    return found[0]


# -- config -------------------------------------------------------------------------------
def test_prod_refuses_automated_sync_no_sso_and_no_ha_all_at_once():
    raw = stack_config("prod")
    raw["gitops"]["syncMode"] = "automated"
    raw["gitops"]["ha"] = False
    del raw["gitops"]["sso"]
    problems = problem_per_path(raw)
    assert {"gitops.syncMode", "gitops.sso", "gitops.ha"} <= set(problems)
    assert "syncWindows" in problems["gitops.syncMode"].fix


def test_a_secret_source_needs_exactly_one_source():
    raw = stack_config("dev")
    raw["gitops"]["repoCredentials"] = {}
    assert "gitops.repoCredentials" in problem_per_path(raw)
    raw["gitops"]["repoCredentials"] = {"secretsManagerSecretId": "a", "existingSecret": "b"}
    assert "gitops.repoCredentials.existingSecret" in problem_per_path(raw)


def test_repository_url_and_window_schedule_are_checked():
    raw = stack_config("prod")
    raw["gitops"]["repoUrl"] = "github.com/example-org/ml-training-platform"
    raw["gitops"]["syncWindows"][0]["schedule"] = "weekdays"
    problems = problem_per_path(raw)
    assert {"gitops.repoUrl", "gitops.syncWindows[0].schedule"} <= set(problems)


def test_the_stack_files_hold_no_credentials():
    for stack in ("dev", "prod"):
        text = json.dumps(stack_config(stack)["gitops"]).lower()
        for word in ("password", "token", "privatekey", "-----begin"):
            assert word not in text, (stack, word)


# -- Argo CD ------------------------------------------------------------------------------
def test_argocd_chart_is_pinned_on_system_nodes(plan):
    release = _release(plan, "argo-cd")
    assert release.inputs["version"] == ARGOCD_CHART_VERSION
    assert release.inputs["repositoryOpts"]["repo"] == "https://argoproj.github.io/argo-helm"
    values = release.inputs["values"]
    assert values["global"]["nodeSelector"] == system_node_selector()
    assert values["global"]["tolerations"][0]["key"] == "CriticalAddonsOnly"
    assert values["dex"]["enabled"] is False


def test_prod_is_highly_available_with_sso_only(prod_plan):
    values = _release(prod_plan, "argo-cd").inputs["values"]
    assert values["redis-ha"]["enabled"] is True
    assert values["redis-ha"]["nodeSelector"] == system_node_selector()
    for component in ("server", "repoServer", "applicationSet"):
        assert values[component]["replicas"] == 2 and values[component]["pdb"]["enabled"] is True
    cm = values["configs"]["cm"]
    assert cm["admin.enabled"] is False
    oidc = yaml.safe_load(cm["oidc.config"])
    assert oidc["issuer"] == "https://login.example.com/oauth2/default"
    # A reference Argo CD resolves from a labelled Secret, never the value itself.
    assert oidc["clientSecret"] == "$argocd-oidc:clientSecret"
    assert "g, ml-platform-admins, role:admin" in values["configs"]["rbac"]["policy.csv"]
    assert values["configs"]["rbac"]["policy.default"] == ""


def test_dev_keeps_single_replicas_and_the_admin_user(dev_plan):
    values = _release(dev_plan, "argo-cd").inputs["values"]
    assert values["redis-ha"]["enabled"] is False
    assert values["server"]["replicas"] == 1
    assert values["configs"]["cm"]["admin.enabled"] is True
    assert "oidc.config" not in values["configs"]["cm"]


def test_secrets_come_from_secrets_manager_into_labelled_secrets(prod_plan):
    secrets = {r.inputs["metadata"]["name"]: r for r in prod_plan.recording.by_type("kubernetes:core/v1:Secret")
               if r.inputs["metadata"]["namespace"] == "argocd"}
    assert secrets["argocd-repo-creds"].inputs["metadata"]["labels"] == {"argocd.argoproj.io/secret-type": "repo-creds"}
    assert secrets["argocd-oidc"].inputs["metadata"]["labels"] == {"app.kubernetes.io/part-of": "argocd"}
    # The value is a secret output (recorded redacted), and no Helm value carries it.
    assert secrets["argocd-repo-creds"].inputs["stringData"] == "[secret]"
    assert "mock-password" not in json.dumps(_release(prod_plan, "argo-cd").inputs["values"])
    # The chart waits for the secrets it reads.
    release = _release(prod_plan, "argo-cd")
    assert {secrets["argocd-repo-creds"].urn, secrets["argocd-oidc"].urn} <= set(release.dependencies)


def test_an_existing_secret_creates_no_secret(plan_config):
    raw = stack_config("prod")
    raw["gitops"]["repoCredentials"] = {"existingSecret": "platform-git"}
    raw["gitops"]["sso"]["clientSecret"] = {"existingSecret": "corp-oidc"}
    plan = plan_config("prod", raw)
    assert not [r for r in plan.recording.by_type("kubernetes:core/v1:Secret") if r.inputs["metadata"]["namespace"] == "argocd"]
    oidc = yaml.safe_load(_release(plan, "argo-cd").inputs["values"]["configs"]["cm"]["oidc.config"])
    assert oidc["clientSecret"] == "$corp-oidc:clientSecret"


def test_bootstrap_objects_validate_and_wait_for_the_chart(plan, schemas):
    release = _release(plan, "argo-cd")
    objects = [r for r in plan.recording.resources if r.type.startswith("kubernetes:argoproj.io/")]
    teams = len(plan.config.scheduling.teams)
    # bootstrap + one per team + the locked default, and the root Application.
    assert sorted(r.inputs["kind"] for r in objects) == ["AppProject"] * (teams + 2) + ["Application"]
    for r in objects:
        doc = {k: r.inputs[k] for k in ("apiVersion", "kind", "metadata", "spec")}
        assert validate_custom_resource(doc, schemas) == [], r.name
        assert release.urn in r.dependencies
    root = next(r for r in objects if r.inputs["kind"] == "Application")
    assert root.inputs["spec"]["source"]["path"] == f"workloads/rendered/{plan.stack}/apps"


def test_namespaces_carry_pod_security_labels_and_default_deny(plan):
    levels = {"argocd": "baseline", "argo-workflows": "restricted"}
    found = {r.inputs["metadata"]["name"]: r for r in plan.recording.by_type("kubernetes:core/v1:Namespace")
             if r.inputs["metadata"]["name"] in levels}
    assert set(found) == set(levels)
    for name, r in found.items():
        labels = r.inputs["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == levels[name]
        assert validate_core({k: r.inputs[k] for k in ("apiVersion", "kind", "metadata")}) == []
        policies = {p.inputs["metadata"]["name"]: p for p in plan.recording.by_type("kubernetes:networking.k8s.io/v1:NetworkPolicy")
                    if p.inputs["metadata"]["namespace"] == name}
        assert "default-deny" in policies and "allow-dns" in policies
        for policy in policies.values():
            assert validate_core({k: policy.inputs[k] for k in ("apiVersion", "kind", "metadata", "spec")}) == []
        # Git over SSH only when the repository URL needs it.
        assert "allow-git-ssh" not in policies


def test_an_ssh_repository_opens_port_22_only(plan_config):
    raw = stack_config("dev")
    raw["gitops"]["repoUrl"] = "git@github.com:example-org/ml-training-platform.git"
    plan = plan_config("dev", raw)
    ssh = [p for p in plan.recording.by_type("kubernetes:networking.k8s.io/v1:NetworkPolicy")
           if p.inputs["metadata"]["name"] == "allow-git-ssh"]
    assert len(ssh) == 1 and ssh[0].inputs["metadata"]["namespace"] == "argocd"
    assert ssh[0].inputs["spec"]["egress"][0]["ports"] == [{"protocol": "TCP", "port": 22}]


def test_component_refuses_two_secret_sources():
    from workloads import gitops

    spec = gitops.GitOpsSpec(platform="p", repo_url="https://x/y.git", target_revision="main",
                             rendered_path="workloads/rendered/p", namespaces=("team-a",))
    args = argocd_component.ArgoCDArgs(cluster=None, gitops=spec, domain="argocd.example.com",
                                       repo_credentials=argocd_component.SecretSource("a", "b"))
    with pytest.raises(InvalidInputError, match="exactly one secret source"):
        argocd_component.ArgoCD("bad", args)


def test_malformed_secret_value_names_the_secret():
    with pytest.raises(ValueError, match="'mlp/x' is not a JSON object"):
        argocd_component.repo_creds_string_data("https://x/y.git", "mlp/x", "hunter2")
    with pytest.raises(ValueError, match="holds none of"):
        argocd_component.repo_creds_string_data("https://x/y.git", "mlp/x", '{"user": "a"}')


# -- Argo Workflows ---------------------------------------------------------------------------
def test_argo_workflows_runs_the_team_namespaces_from_system_nodes(plan):
    release = _release(plan, "argo-workflows")
    values = release.inputs["values"]
    assert values["images"]["tag"] == ARGO_WORKFLOWS_APP_VERSION
    assert release.inputs["namespace"] == "argo-workflows"
    teams = sorted(f"team-{t['name']}" for t in stack_config(plan.stack)["scheduling"]["teams"])
    assert values["controller"]["workflowNamespaces"] == teams
    assert values["controller"]["nodeSelector"] == system_node_selector()
    assert values["server"]["authModes"] == ["client"]
    rules = values["workflow"]["rbac"]["rules"]
    assert {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"],
            "verbs": ["get", "list", "watch", "create", "patch"]} in rules
    assert values["controller"]["replicas"] == (2 if plan.config.is_prod else 1)


def test_no_gitops_section_creates_nothing(plan_config):
    raw = stack_config("dev")
    del raw["gitops"]
    plan = plan_config("dev", raw)
    assert not [r for r in plan.recording.resources if "argo" in r.type or r.inputs.get("chart", "").startswith("argo")]


# -- plan ----------------------------------------------------------------------------------------
def test_plan_section_says_how_each_stack_syncs(plan):
    sections = dict(plan.sections)
    lines = "\n".join(sections["GitOps"])
    assert f"path workloads/rendered/{plan.stack}/apps" in lines
    if plan.config.is_prod:
        assert "HA" in lines and "manual, windows: allow '0 8 * * 1-4' for 8h UTC" in lines
        assert "admin user disabled" in lines
    else:
        assert "automated (prune + self-heal)" in lines and "local admin user" in lines
    assert any("no SSO" in w for w in plan.warnings) != plan.config.is_prod
