"""CI's roles from the attacker's seat: every trigger GitHub can issue a token for, against each role's trust.

Security review C3: a role trusting `repo:<org>/<repo>:*` lets any branch or PR act as prod admin.
Each role here must accept exactly its own trigger, from this workflow file on the expected ref,
and refuse every other (tests/infra/ci_claims.py builds the tokens per GitHub's OIDC reference and
evaluates StringEquals/StringLike as IAM does).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from components.ci_access import READER_DENIED_ACTIONS, trust_policy
from infra.ci import ci_args
from infra.config import load_platform_config
from infra.plan import raw_project_config, read_stack_file
from tests.infra.ci_claims import TRIGGERS, allows_web_identity

ROOT = Path(__file__).resolve().parents[2]
ACCEPTS = {
    ("dev", "preview"): "pull_request",
    ("dev", "deploy"): "environment:dev on main",
    ("prod", "preview"): "pull_request",
    ("prod", "deploy"): "environment:prod on main",
}


def _args(stack: str):
    values, _ = read_stack_file(ROOT / f"Pulumi.{stack}.yaml")
    return ci_args(load_platform_config(raw_project_config(values), source=stack))


def _trust(args, kind: str) -> dict:
    from components.ci_access import deploy_subject, preview_subject

    subject = (preview_subject(args.repository, args.workflow_path) if kind == "preview"
               else deploy_subject(args.repository, args.workflow_path, args.environment))
    return trust_policy(args.provider_arn, subject)


@pytest.mark.parametrize("stack,kind", sorted(ACCEPTS))
def test_each_role_accepts_its_trigger_and_refuses_every_other(stack, kind):
    args = _args(stack)
    policy = _trust(args, kind)
    accepted = {name for name, claims in TRIGGERS.items() if allows_web_identity(policy, args.provider_arn, claims)}
    assert accepted == {ACCEPTS[(stack, kind)]}


def test_a_token_from_another_identity_provider_is_refused():
    args = _args("prod")
    other = args.provider_arn.replace("token.actions.githubusercontent.com", "gitlab.com")
    assert not allows_web_identity(_trust(args, "deploy"), other, TRIGGERS["environment:prod on main"])


def test_deploy_roles_assume_only_their_own_stacks_account_roles():
    dev, prod = _args("dev"), _args("prod")
    for args, other in ((dev, prod), (prod, dev)):
        [assume] = [s for s in args.deploy_policy()["Statement"] if s["Sid"] == "AssumeOwnStackRoles"]
        assert set(assume["Resource"]) == set(args.account_role_arns)
        # Neither stack's deploy role reaches a role of the other stack, even in shared accounts
        # (automation and logging are one account each for both stacks): each stack has its own roles.
        assert not set(other.account_role_arns) & set(assume["Resource"])


def test_preview_roles_assume_only_read_only_readers():
    for stack in ("dev", "prod"):
        args = _args(stack)
        [assume] = [s for s in args.preview_policy()["Statement"] if s["Sid"] == "AssumeOwnStackRoles"]
        assert set(assume["Resource"]) == set(args.reader_role_arns)
        assert not set(assume["Resource"]) & set(args.account_role_arns)
        writes = [s for s in args.preview_policy()["Statement"] if "s3:PutObject" in s["Action"]]
        assert [s["Resource"] for s in writes] == [f"arn:aws:s3:::{args.state_bucket}/.pulumi/locks/*"]
    assert "secretsmanager:GetSecretValue" in READER_DENIED_ACTIONS and "s3:GetObject" in READER_DENIED_ACTIONS


def test_only_deploy_roles_use_prods_state_key():
    """H1: prod's state secrets decrypt only for the prod deploy role; the account root administers but cannot decrypt."""
    from components.ci_access import state_key_policy

    prod = _args("prod")
    policy = state_key_policy(partition=prod.partition, automation_account_id=prod.automation_account_id,
                              users=prod.key_users())
    users = [s for s in policy["Statement"] if "kms:Decrypt" in s["Action"]]
    assert [u["Principal"]["AWS"] for u in users] == [sorted([prod.deploy_role_arn, prod.administrator_role_arn])]
    assert prod.preview_role_arn not in users[0]["Principal"]["AWS"]
    [admin] = [s for s in policy["Statement"] if s["Sid"] == "AccountAdministersOnly"]
    assert not {"kms:Decrypt", "kms:Encrypt", "kms:*"} & set(admin["Action"])
    assert not any(s["Sid"] == "StateKey" for s in prod.preview_policy()["Statement"])
    # Dev's preview may decrypt dev's state (documented trade-off: a PR gets a real dev preview).
    dev = _args("dev")
    assert dev.preview_role_arn in dev.key_users()


def _key_policy_allows(policy: dict, principal: str, action: str, *, iam_allows_everything: bool) -> bool:
    """AWS KMS key policy evaluation for a role session: the key policy must allow the action to
    the role itself, or to the account root, in which case the role's IAM policies decide (KMS
    Developer Guide, "Key policies in AWS KMS": "Unlike IAM policies ... the key policy must
    allow" it; the root principal "enables IAM policies" only for the actions it lists)."""
    import fnmatch

    account_root = principal.split(":role/")[0] + ":root"
    for statement in policy["Statement"]:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        if statement["Effect"] != "Allow" or not any(fnmatch.fnmatchcase(action, a) for a in actions):
            continue
        principals = statement["Principal"]["AWS"]
        principals = principals if isinstance(principals, list) else [principals]
        if principal in principals or (account_root in principals and iam_allows_everything):
            return True
    return False


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_runbooks_state_key_steps_are_allowed_to_whoever_runs_them(stack):
    """docs/runbooks/ci-roles.md section 2 and first-deploy.md: the administrator, running as
    accounts.automation.roleArn with AdministratorAccess, switches the stack from its passphrase to
    the awskms:// key (Pulumi encrypts a new data key: kms:Encrypt; pkg/secrets/cloud/manager.go
    ``generateNewDataKey``) and later reads outputs and runs the MLflow `up` (every load decrypts
    it: kms:Decrypt). CI's deploy role then previews and deploys (both). Before the administrator
    was a key user, the switch failed with AccessDeniedException and CI never got a stack it can open."""
    from components.ci_access import state_key_policy

    import yaml

    args = _args(stack)
    policy = state_key_policy(partition=args.partition, automation_account_id=args.automation_account_id,
                              users=args.key_users())
    # The role the administrator runs as: the one the stack file names (first-deploy.md step 1).
    stack_file = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())
    administrator = stack_file["config"]["ml-training-platform:accounts"]["automation"]["roleArn"]
    steps = [
        ("administrator: pulumi stack change-secrets-provider awskms://", administrator, "kms:Encrypt", True),
        ("administrator: infra.plan.deploy outputs / MLflow up", administrator, "kms:Decrypt", True),
        ("CI deploy job: preview and up", args.deploy_role_arn, "kms:Decrypt", False),
        ("CI deploy job: a new secret", args.deploy_role_arn, "kms:Encrypt", False),
    ]
    refused = [what for what, principal, action, admin in steps
               if not _key_policy_allows(policy, principal, action, iam_allows_everything=admin)]
    assert not refused, refused
    # Nobody else: an account principal with AdministratorAccess may administer the key, not use it.
    other = administrator.rsplit("/", 1)[0] + "/someone-else"
    assert not _key_policy_allows(policy, other, "kms:Decrypt", iam_allows_everything=True)
    assert _key_policy_allows(policy, other, "kms:PutKeyPolicy", iam_allows_everything=True)


def test_deploy_sessions_outlast_a_first_up_and_the_workflow_asks_for_them():
    import yaml

    from components.ci_access import DEPLOY_SESSION_SECONDS

    workflow = yaml.safe_load((ROOT / ".github/workflows/platform.yml").read_text())
    creds = next(s for s in workflow["jobs"]["deploy"]["steps"] if s.get("uses", "").startswith("aws-actions/"))
    assert 3 * 3600 <= int(creds["with"]["role-duration-seconds"]) <= DEPLOY_SESSION_SECONDS <= 12 * 3600


def test_the_shared_github_oidc_provider_outlives_the_stack_that_creates_it(dev_plan, prod_plan):
    """aws-readiness-4 K5: prod's CI roles trust the provider dev creates (ci.oidcProvider:
    existing); destroying or replacing dev must leave it (retainOnDelete, protect)."""
    (provider,) = dev_plan.recording.by_type("aws:iam/openIdConnectProvider:OpenIdConnectProvider")
    assert provider.retain_on_delete and provider.protect
    assert not prod_plan.recording.by_type("aws:iam/openIdConnectProvider:OpenIdConnectProvider")


def test_the_in_vpc_runner_starts_only_for_jobs_of_the_platform_workflow(plan):
    """aws-readiness-4 K3. The attack: another workflow file in the repository (a same-repo
    branch) asks for `runs-on: codebuild-<runner>-…` to run its code in the private subnets.
    What refuses it: the webhook's WORKFLOW_NAME filter (CodeBuild User Guide, "GitHub webhook
    events") admits only jobs of the workflow whose `name:` is the platform workflow's."""
    import re

    import yaml

    from tests.infra.test_workflow import WORKFLOW

    workflow_name = yaml.safe_load(WORKFLOW.read_text())["name"]
    (hook,) = plan.recording.by_type("aws:codebuild/webhook:Webhook")
    (group,) = hook.inputs["filterGroups"]
    filters = {f["type"]: f["pattern"] for f in group["filters"]}
    assert filters["EVENT"] == "WORKFLOW_JOB_QUEUED"
    assert re.fullmatch(filters["WORKFLOW_NAME"].strip("^$"), workflow_name)
    assert not re.search(filters["WORKFLOW_NAME"], "attacker-workflow")
