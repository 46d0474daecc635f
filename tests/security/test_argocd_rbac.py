"""Reading another team's jobs and logs in Argo CD (security review 4, N4), from the attacker's
seat: an engineer of team A signs in to prod's Argo CD with SSO and asks for team B's
Application and its pods' logs. What refuses it is the RBAC the platform configures: no global
read-only group, and a ``viewer`` role per team project bound to that team's SSO groups only.

``allowed`` ports Argo CD's RBAC decision for a signed-in user (argo-cd ``util/rbac/rbac.go``
casbin model ``p, sub, res, act, obj, eft`` with glob-matched objects, deny wins; ``server/rbacpolicy``:
a user's groups (``scopes: [groups]``) are subjects, and a project role's ``groups`` make its
members ``proj:<project>:<role>``). Built-in ``role:readonly`` from argo-cd ``assets/builtin-policy.csv``:
``p, role:readonly, applications, get, */*, allow`` and ``p, role:readonly, logs, get, */*, allow``.
"""
from __future__ import annotations

from fnmatch import fnmatchcase

from components.argocd import rbac_policy
from infra.config import load_platform_config
from infra.gitops import gitops_spec
from tests.conftest import stack_config
from workloads import gitops

BUILTIN_READONLY = ["p, role:readonly, applications, get, */*, allow", "p, role:readonly, logs, get, */*, allow"]
BUILTIN_ADMIN = ["p, role:admin, applications, *, */*, allow", "p, role:admin, logs, get, */*, allow"]


def _lines(text: str) -> list[list[str]]:
    return [[part.strip() for part in line.split(",")] for line in text.splitlines() if line.strip()]


def allowed(groups: list[str], resource: str, action: str, obj: str, *, csv: str, projects: list[dict]) -> bool:
    policies = _lines(csv) + _lines("\n".join(BUILTIN_READONLY + BUILTIN_ADMIN))
    subjects = set(groups)
    subjects |= {p[2] for p in policies if p[0] == "g" and p[1] in subjects}
    for project in projects:
        for role in project["spec"].get("roles", []):
            if set(role.get("groups", [])) & set(groups):
                subjects.add(f"proj:{project['metadata']['name']}:{role['name']}")
                policies += _lines("\n".join(role["policies"]))
    effects = [p[5] for p in policies if p[0] == "p" and p[1] in subjects and p[2] == resource
               and (p[3] == action or p[3] == "*") and fnmatchcase(obj, p[4])]
    return "allow" in effects and "deny" not in effects


def _prod():
    config = load_platform_config(stack_config("prod"))
    spec = gitops_spec(config, "prod")
    return config, spec, rbac_policy(config.gitops.sso.args())["policy.csv"], gitops.team_projects(spec)


def _team_groups(config, team: str) -> list[str]:
    return list(getattr(config.gitops.sso, "team_groups", {}).get(team, [])) or [f"idp-{team}"]


def test_an_engineer_cannot_read_another_teams_application_or_logs():
    config, spec, csv, projects = _prod()
    a, b = "research", "foundation-models"
    # The attacker is in its team's group and in whatever company-wide engineering group exists.
    groups = [*_team_groups(config, a), "ml-engineers"]
    victim = f"{spec.team_project_name('team-' + b)}/mlp-prod-team-{b}"
    assert not allowed(groups, "logs", "get", victim, csv=csv, projects=projects), "reads team B's pod logs"
    assert not allowed(groups, "applications", "get", victim, csv=csv, projects=projects), "reads team B's manifests"


def test_an_engineer_reads_its_own_teams_application_and_logs():
    config, spec, csv, projects = _prod()
    for team in (t.name for t in config.scheduling.teams):
        own = f"{spec.team_project_name('team-' + team)}/mlp-prod-team-{team}"
        groups = _team_groups(config, team)
        assert config.gitops.sso.team_groups.get(team), f"prod gives team {team} no Argo CD group"
        assert allowed(groups, "logs", "get", own, csv=csv, projects=projects), team
        assert allowed(groups, "applications", "get", own, csv=csv, projects=projects), team
        assert not allowed(groups, "applications", "sync", own, csv=csv, projects=projects), "viewers do not sync"


def test_platform_admins_still_see_everything():
    config, spec, csv, projects = _prod()
    admin = list(config.gitops.sso.admin_groups)
    assert admin and allowed(admin, "logs", "get", "mlp-prod-team-research/x", csv=csv, projects=projects)


def test_an_unknown_team_in_team_groups_is_refused_with_its_path():
    import pytest

    from infra.config.engine import ConfigError

    raw = stack_config("prod")
    raw["gitops"]["sso"]["teamGroups"]["nosuchteam"] = ["g"]
    with pytest.raises(ConfigError) as err:
        load_platform_config(raw)
    assert "gitops.sso.teamGroups.nosuchteam" in str(err.value)
