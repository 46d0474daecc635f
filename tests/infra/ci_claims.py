"""Test helpers for the CI path: the workflow's jobs, and the token claims GitHub issues per trigger."""
from __future__ import annotations

import re


def workflow_jobs(workflow: dict) -> dict:
    return workflow["jobs"]


# -- GitHub's OIDC token, as AWS STS sees it ------------------------------------------------
# GitHub docs, "OpenID Connect reference", subject customization: with include_claim_keys
# [repo, context, job_workflow_ref] the subject is
#   repo:ORG/REPO:environment:ENV:job_workflow_ref:ORG/REPO/.github/workflows/FILE@REF
# and the context is `pull_request` for pull_request runs, `environment:NAME` for a job with an
# environment, `ref:refs/heads/BRANCH` otherwise. The default template has no job_workflow_ref.
HOST = "token.actions.githubusercontent.com"
REPO = "example-org/ml-training-platform"
WORKFLOW = ".github/workflows/platform.yml"


def token(context: str, ref: str, *, repo: str = REPO, workflow: str = WORKFLOW, customized: bool = True,
          audience: str = "sts.amazonaws.com") -> dict[str, str]:
    sub = f"repo:{repo}:{context}" + (f":job_workflow_ref:{repo}/{workflow}@{ref}" if customized else "")
    return {f"{HOST}:sub": sub, f"{HOST}:aud": audience}


TRIGGERS: dict[str, dict[str, str]] = {
    "pull_request": token("pull_request", "refs/pull/42/merge"),
    "push to main": token("ref:refs/heads/main", "refs/heads/main"),
    "environment:dev on main": token("environment:dev", "refs/heads/main"),
    "environment:prod on main": token("environment:prod", "refs/heads/main"),
    # A PR that edits the workflow to run its job in the prod environment.
    "environment:prod from a pull request": token("environment:prod", "refs/pull/42/merge"),
    "environment:prod from another branch": token("environment:prod", "refs/heads/feature"),
    "environment:prod in another repository": token("environment:prod", "refs/heads/main", repo="evil-org/fork"),
    "environment:prod from another workflow": token("environment:prod", "refs/heads/main", workflow=".github/workflows/other.yml"),
    "environment:prod, default subject template": token("environment:prod", "refs/heads/main", customized=False),
    "environment:prod, another audience": token("environment:prod", "refs/heads/main", audience="https://github.com/example-org"),
}


def _string_like(pattern: str, value: str) -> bool:
    """IAM StringLike: case-sensitive, `*` any run of characters (also `:` and `/`), `?` one character."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, flags=re.DOTALL) is not None


OPERATORS = {"StringEquals": lambda pattern, value: pattern == value, "StringLike": _string_like}


def allows_web_identity(policy: dict, provider_arn: str, claims: dict[str, str]) -> bool:
    """Whether a trust policy lets this token call AssumeRoleWithWebIdentity (Allow statements only)."""
    for statement in policy["Statement"]:
        if statement["Effect"] != "Allow" or statement.get("Principal", {}).get("Federated") != provider_arn:
            continue
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        if "sts:AssumeRoleWithWebIdentity" not in actions:
            continue
        matched = True
        for operator, conditions in statement.get("Condition", {}).items():
            test = OPERATORS[operator]  # an unknown operator fails the test, as it should
            for key, patterns in conditions.items():
                patterns = patterns if isinstance(patterns, list) else [patterns]
                if key not in claims or not any(test(p, claims[key]) for p in patterns):
                    matched = False
        if matched:
            return True
    return False
