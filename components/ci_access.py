"""CI's way into one stack: GitHub OIDC, a read-only preview role, a deploy role, the state key, an in-VPC runner.

Who may get what (security review C3/H1), each role trusted for exactly one kind of run of one
workflow file of one repository, through the token's ``sub`` claim. The repository's OIDC subject
template must include ``job_workflow_ref`` (GitHub docs, "OpenID Connect reference": with
``include_claim_keys: [repo, context, job_workflow_ref]`` the subject is
``repo:ORG/REPO:environment:ENV:job_workflow_ref:ORG/REPO/.github/workflows/FILE@REF``):

- ``<name>-ci-preview`` (automation account): ``pull_request`` runs of the workflow. It may assume
  only this stack's ``<name>-ci-reader`` roles (AWS ``ReadOnlyAccess`` minus data reads), read the
  state and take its lock; in dev it may also decrypt dev's state (dev holds no production data),
  in prod it may not, so prod's real preview runs in the deploy job behind the environment.
- ``<name>-ci-deploy`` (automation account): ``environment:<env>`` runs of the workflow on
  ``refs/heads/main`` only. It may assume only this stack's account roles (``accounts.*.roleArn``),
  use the state bucket and the state key. Sessions up to 4 h: a first prod ``up`` outlasts 1 h.
- Both carry a permissions boundary that is the same allow-list, so a policy attached later
  cannot widen them.
- ``alias/<name>-pulumi-state`` (automation account): the ``awskms://`` secrets provider of the
  stack. Its key policy lets the account administer the key but only the deploy role (and, in dev,
  the preview role) encrypt or decrypt with it.
- ``<name>-ci-runner`` (workload account): a CodeBuild project in the private subnets that
  GitHub Actions jobs run on (``runs-on: codebuild-<project>-${{ github.run_id }}-${{ github.run_attempt }}``,
  AWS CodeBuild user guide, "Self-hosted GitHub Actions runners in AWS CodeBuild"), so CI reaches
  the private EKS endpoint (aws-readiness N1). Its own service role can only write its logs and
  attach its network interfaces; the jobs get their AWS credentials from OIDC as above.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_aws as aws

GITHUB_OIDC_HOST = "token.actions.githubusercontent.com"
GITHUB_OIDC_URL = f"https://{GITHUB_OIDC_HOST}"
# configure-aws-credentials requests its token with this audience (action.yml `audience` default).
GITHUB_OIDC_AUDIENCE = "sts.amazonaws.com"
DEFAULT_WORKFLOW_PATH = ".github/workflows/platform.yml"
# The workflow's ``name:``; the in-VPC runner starts only for its jobs.
DEFAULT_WORKFLOW_NAME = "platform"
DEPLOY_BRANCH = "main"


def runner_webhook_filter_groups(workflow_name: str = DEFAULT_WORKFLOW_NAME, branch: str = DEPLOY_BRANCH) -> list[list[dict[str, str]]]:
    """The in-VPC runner's webhook: a build (and so a runner inside the VPC) only for a queued job
    of the deploy workflow on the deploy branch (security-4 N5). Without the ref and name filters
    any workflow job of the repository starts a runner, and a pull request can edit its own
    workflow's ``runs-on`` to the runner's (public) label and run its code inside the VPC.

    AWS CodeBuild "GitHub webhook events": a build starts when every filter of some group matches;
    ``HEAD_REF`` is matched against the workflow job's ``head_branch`` and ``WORKFLOW_NAME`` against
    its ``workflow_name`` for ``WORKFLOW_JOB_QUEUED``. A pull request's jobs carry the PR's head
    branch, never main (GitHub webhook ``workflow_job``: ``head_branch``)."""
    return [[
        {"type": "EVENT", "pattern": "WORKFLOW_JOB_QUEUED"},
        {"type": "HEAD_REF", "pattern": f"^(refs/heads/)?{branch}$"},
        {"type": "WORKFLOW_NAME", "pattern": f"^{workflow_name}$"},
    ]]
PREVIEW_SESSION_SECONDS = 3600
# The longest first `up` (prod: EKS, FSx 9.6 TiB, Aurora, Helm releases with 600-900 s timeouts)
# plus its preview; IAM allows MaxSessionDuration up to 12 h.
DEPLOY_SESSION_SECONDS = 4 * 3600
RUNNER_IMAGE = "aws/codebuild/standard:7.0"  # Ubuntu 22.04: actions/setup-python has builds for it


def role_name(name: str, kind: str) -> str:
    return f"{name}-ci-{kind}"


def reader_role_name(name: str, account_id: str) -> str:
    """Per account, with the account in the name: one stack's readers are told apart in logs and plans."""
    return role_name(name, f"reader-{account_id}")


def runner_log_group_name(name: str) -> str:
    return f"/aws/codebuild/{role_name(name, 'runner')}"


def role_arn(partition: str, account_id: str, role: str) -> str:
    return f"arn:{partition}:iam::{account_id}:role/{role}"


def oidc_provider_arn(partition: str, account_id: str) -> str:
    return f"arn:{partition}:iam::{account_id}:oidc-provider/{GITHUB_OIDC_HOST}"


def preview_subject(repository: str, workflow_path: str) -> str:
    """Pull-request runs of this workflow; GitHub runs a PR's workflow at refs/pull/<n>/merge."""
    return f"repo:{repository}:pull_request:job_workflow_ref:{repository}/{workflow_path}@refs/pull/*/merge"


def deploy_subject(repository: str, workflow_path: str, environment: str) -> str:
    """Runs of this workflow from main in the GitHub environment named like the stack's environment."""
    return f"repo:{repository}:environment:{environment}:job_workflow_ref:{repository}/{workflow_path}@refs/heads/main"


def trust_policy(provider_arn: str, subject: str) -> dict[str, Any]:
    """AssumeRoleWithWebIdentity for one subject; a `*` in it is matched with StringLike."""
    operator = "StringLike" if "*" in subject else "StringEquals"
    conditions: dict[str, dict[str, str]] = {"StringEquals": {f"{GITHUB_OIDC_HOST}:aud": GITHUB_OIDC_AUDIENCE}}
    conditions.setdefault(operator, {})[f"{GITHUB_OIDC_HOST}:sub"] = subject
    return {
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow",
            "Principal": {"Federated": provider_arn},
            "Action": "sts:AssumeRoleWithWebIdentity",
            "Condition": conditions,
        }],
    }


def _state_statements(partition: str, state_bucket: str, *, write: bool) -> list[dict[str, Any]]:
    bucket = f"arn:{partition}:s3:::{state_bucket}"
    # Pulumi's self-managed backend keeps stacks under .pulumi/; a preview still takes the lock.
    object_actions = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"] if write else ["s3:GetObject"]
    statements = [
        {"Sid": "StateList", "Effect": "Allow", "Action": ["s3:ListBucket", "s3:GetBucketLocation"], "Resource": bucket},
        {"Sid": "StateObjects", "Effect": "Allow", "Action": object_actions, "Resource": f"{bucket}/.pulumi/*"},
    ]
    if not write:
        statements.append({"Sid": "StateLocks", "Effect": "Allow", "Action": ["s3:PutObject", "s3:DeleteObject"],
                           "Resource": f"{bucket}/.pulumi/locks/*"})
    return statements


def permissions_policy(*, partition: str, state_bucket: str, state_key_alias_arn: str, assumable_role_arns: Sequence[str],
                       write: bool, decrypt_state: bool) -> dict[str, Any]:
    """What a CI role may do: assume the listed roles, use the state, and (if allowed) its key."""
    statements = [{"Sid": "AssumeOwnStackRoles", "Effect": "Allow", "Action": ["sts:AssumeRole", "sts:TagSession"],
                   "Resource": sorted(set(assumable_role_arns))}]
    statements += _state_statements(partition, state_bucket, write=write)
    if decrypt_state:
        actions = ["kms:Decrypt", "kms:DescribeKey"] + (["kms:Encrypt", "kms:GenerateDataKey"] if write else [])
        # Only the key carrying the state alias (kms:ResourceAliases, AWS KMS condition keys); the key
        # policy is the other half: it grants use to the CI roles and to nobody else.
        arn_parts = state_key_alias_arn.split(":", 5)
        statements.append({"Sid": "StateKey", "Effect": "Allow", "Action": actions,
                           "Resource": ":".join(arn_parts[:5]) + ":key/*",
                           "Condition": {"ForAnyValue:StringEquals": {"kms:ResourceAliases": arn_parts[5]}}})
    return {"Version": "2012-10-17", "Statement": statements}


def state_key_policy(*, partition: str, automation_account_id: str, users: Sequence[str]) -> dict[str, Any]:
    """The account administers the key; only `users` (role ARNs) may use it.

    KMS reads the key policy first: a principal it does not name cannot encrypt or decrypt,
    whatever its IAM policies say (AWS KMS Developer Guide, "Key policies in AWS KMS"). So every
    principal that runs a command on the stack once it uses ``awskms://`` must be here: Pulumi
    encrypts a new data key when the provider changes and decrypts it on every load (pulumi
    pkg/secrets/cloud/manager.go ``generateNewDataKey``, ``newCloudSecretsManager``)."""
    root = f"arn:{partition}:iam::{automation_account_id}:root"
    admin_actions = ["kms:Create*", "kms:Describe*", "kms:Enable*", "kms:List*", "kms:Put*", "kms:Update*",
                     "kms:Revoke*", "kms:Disable*", "kms:Get*", "kms:Delete*", "kms:TagResource", "kms:UntagResource",
                     "kms:ScheduleKeyDeletion", "kms:CancelKeyDeletion"]
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "AccountAdministersOnly", "Effect": "Allow", "Principal": {"AWS": root}, "Action": admin_actions,
         "Resource": "*"},
        {"Sid": "CiRolesUse", "Effect": "Allow", "Principal": {"AWS": sorted(users)},
         "Action": ["kms:Encrypt", "kms:Decrypt", "kms:GenerateDataKey", "kms:DescribeKey"], "Resource": "*"},
    ]}


# Reads of data (not of configuration) that ReadOnlyAccess would otherwise allow the preview.
READER_DENIED_ACTIONS = ("s3:GetObject", "s3:GetObjectVersion", "secretsmanager:GetSecretValue", "kms:Decrypt",
                         "ssm:GetParameter", "ssm:GetParameters", "ssm:GetParametersByPath", "dynamodb:GetItem",
                         "dynamodb:Scan", "dynamodb:Query", "logs:GetLogEvents", "logs:FilterLogEvents",
                         "fsx:DescribeBackups", "rds-data:*", "lambda:GetFunction")


@dataclass(frozen=True)
class CiRunnerArgs:
    """The in-VPC CodeBuild runner (workload account)."""

    vpc_id: pulumi.Input[str]
    subnet_ids: pulumi.Input[Sequence[str]]
    # The EKS cluster security group: the runner gets 443 to the API endpoint.
    cluster_security_group_id: pulumi.Input[str]
    # An AWS CodeConnections connection to GitHub, authorised once in the console (runbook).
    code_connection_arn: str
    log_retention_days: int
    log_kms_key: Optional[aws.kms.Key] = None
    compute_type: str = "BUILD_GENERAL1_MEDIUM"


@dataclass(frozen=True)
class CiAccessArgs:
    """CI's roles for one stack. Plain values decide every ARN, so the policies are pure functions."""

    name: str
    partition: str
    region: str
    environment: str                       # "dev" | "prod": the GitHub environment of the deploy job
    repository: str                        # ORG/REPO
    automation_account_id: str
    account_role_arns: Sequence[str]       # accounts.*.roleArn: what the deploy role may assume
    reader_account_ids: Sequence[str]      # accounts that get a <name>-ci-reader role
    state_bucket: str
    # accounts.automation.roleArn: the role the administrator runs the first `up`, the switch to the
    # KMS secrets provider and the MLflow `up` as (docs/runbooks/ci-roles.md section 2).
    administrator_role_arn: Optional[str] = None
    workflow_path: str = DEFAULT_WORKFLOW_PATH
    workflow_name: str = DEFAULT_WORKFLOW_NAME
    create_oidc_provider: bool = True
    preview_decrypts_state: bool = False
    protect: bool = False
    tags: Mapping[str, str] = field(default_factory=dict)

    @property
    def preview_role_arn(self) -> str:
        return role_arn(self.partition, self.automation_account_id, role_name(self.name, "preview"))

    @property
    def deploy_role_arn(self) -> str:
        return role_arn(self.partition, self.automation_account_id, role_name(self.name, "deploy"))

    @property
    def reader_role_arns(self) -> list[str]:
        return [role_arn(self.partition, account, reader_role_name(self.name, account)) for account in self.reader_account_ids]

    @property
    def state_key_alias(self) -> str:
        return f"alias/{self.name}-pulumi-state"

    @property
    def state_key_alias_arn(self) -> str:
        return f"arn:{self.partition}:kms:{self.region}:{self.automation_account_id}:{self.state_key_alias}"

    @property
    def secrets_provider(self) -> str:
        return f"awskms://{self.state_key_alias}?region={self.region}"

    @property
    def provider_arn(self) -> str:
        return oidc_provider_arn(self.partition, self.automation_account_id)

    def preview_policy(self) -> dict[str, Any]:
        return permissions_policy(partition=self.partition, state_bucket=self.state_bucket,
                                  state_key_alias_arn=self.state_key_alias_arn, assumable_role_arns=self.reader_role_arns,
                                  write=False, decrypt_state=self.preview_decrypts_state)

    def deploy_policy(self) -> dict[str, Any]:
        return permissions_policy(partition=self.partition, state_bucket=self.state_bucket,
                                  state_key_alias_arn=self.state_key_alias_arn, assumable_role_arns=self.account_role_arns,
                                  write=True, decrypt_state=True)

    def key_users(self) -> list[str]:
        """Who may encrypt and decrypt the stack's secrets: CI's deploy role, the administrator who
        switches the stack to the key and runs the admin-side steps, and (dev) the preview role."""
        users = [self.deploy_role_arn] + ([self.administrator_role_arn] if self.administrator_role_arn else [])
        return users + ([self.preview_role_arn] if self.preview_decrypts_state else [])


class CiAccess(pulumi.ComponentResource):
    """OIDC provider, preview/deploy roles with boundaries, reader roles, the state key, the runner."""

    def __init__(self, name: str, args: CiAccessArgs, *, automation: aws.Provider,
                 reader_providers: Mapping[str, tuple[str, aws.Provider]], runner: Optional[CiRunnerArgs] = None,
                 runner_provider: Optional[aws.Provider] = None, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:ci:CiAccess", name, None, opts)
        tags = dict(args.tags)
        in_automation = pulumi.ResourceOptions(parent=self, provider=automation)
        if args.create_oidc_provider:
            # One per account and URL: the stack that owns it sets ci.oidcProvider: create. Other
            # stacks' CI roles trust it too (prod: oidcProvider existing), so destroying or
            # re-creating the owning stack must not take it away (aws-readiness-4 K5): it is
            # retained on delete, and protected against a replacement.
            provider = aws.iam.OpenIdConnectProvider(
                f"{name}-github-oidc", url=GITHUB_OIDC_URL, client_id_lists=[GITHUB_OIDC_AUDIENCE], tags=tags,
                opts=pulumi.ResourceOptions.merge(in_automation, pulumi.ResourceOptions(retain_on_delete=True,
                                                                                        protect=True)))
            depends: list[pulumi.Resource] = [provider]
        else:
            depends = []
        self.roles: dict[str, aws.iam.Role] = {}
        for kind, subject, policy, seconds in (
            ("preview", preview_subject(args.repository, args.workflow_path), args.preview_policy(), PREVIEW_SESSION_SECONDS),
            ("deploy", deploy_subject(args.repository, args.workflow_path, args.environment), args.deploy_policy(),
             DEPLOY_SESSION_SECONDS),
        ):
            document = json.dumps(policy, sort_keys=True)
            boundary = aws.iam.Policy(f"{name}-{kind}-boundary", name=f"{role_name(args.name, kind)}-boundary",
                                      description=f"Upper bound of {role_name(args.name, kind)}", policy=document,
                                      tags=tags, opts=in_automation)
            role = aws.iam.Role(
                f"{name}-{kind}", name=role_name(args.name, kind),
                assume_role_policy=json.dumps(trust_policy(args.provider_arn, subject), sort_keys=True),
                max_session_duration=seconds, permissions_boundary=boundary.arn, tags=tags,
                opts=pulumi.ResourceOptions(parent=self, provider=automation, depends_on=depends))
            aws.iam.RolePolicy(f"{name}-{kind}-policy", role=role.name, policy=document,
                               opts=pulumi.ResourceOptions(parent=self, provider=automation))
            self.roles[kind] = role
        for account, (account_id, provider) in sorted(reader_providers.items()):
            reader = aws.iam.Role(
                f"{name}-reader-{account}", name=reader_role_name(args.name, account_id),
                assume_role_policy=json.dumps({"Version": "2012-10-17", "Statement": [{
                    "Effect": "Allow", "Principal": {"AWS": args.preview_role_arn}, "Action": ["sts:AssumeRole", "sts:TagSession"],
                }]}, sort_keys=True),
                max_session_duration=PREVIEW_SESSION_SECONDS, tags=tags,
                opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[self.roles["preview"]]))
            aws.iam.RolePolicyAttachment(f"{name}-reader-{account}-readonly", role=reader.name,
                                         policy_arn=f"arn:{args.partition}:iam::aws:policy/ReadOnlyAccess",
                                         opts=pulumi.ResourceOptions(parent=self, provider=provider))
            aws.iam.RolePolicy(f"{name}-reader-{account}-no-data", role=reader.name, policy=json.dumps({
                "Version": "2012-10-17", "Statement": [{"Sid": "NoDataReads", "Effect": "Deny",
                                                        "Action": list(READER_DENIED_ACTIONS), "Resource": "*"}]}),
                opts=pulumi.ResourceOptions(parent=self, provider=provider))
            # The program generates passwords at preview too (GetRandomPassword: no resource, no
            # data read); ReadOnlyAccess is not documented to include it, so it is granted here.
            aws.iam.RolePolicy(f"{name}-reader-{account}-random-password", role=reader.name, policy=json.dumps({
                "Version": "2012-10-17", "Statement": [{"Sid": "GenerateOnly", "Effect": "Allow",
                                                        "Action": ["secretsmanager:GetRandomPassword"], "Resource": "*"}]}),
                opts=pulumi.ResourceOptions(parent=self, provider=provider))
        self.state_key = aws.kms.Key(
            f"{name}-state-key", description=f"Pulumi secrets provider of stack {args.name} (awskms://)",
            enable_key_rotation=True, deletion_window_in_days=30,
            policy=json.dumps(state_key_policy(partition=args.partition, automation_account_id=args.automation_account_id,
                                               users=args.key_users()), sort_keys=True),
            tags=tags, opts=pulumi.ResourceOptions(parent=self, provider=automation, protect=args.protect,
                                                   depends_on=list(self.roles.values())))
        aws.kms.Alias(f"{name}-state-key-alias", name=args.state_key_alias, target_key_id=self.state_key.key_id,
                      opts=in_automation)
        self.runner_project: Optional[aws.codebuild.Project] = None
        if runner is not None:
            self.runner_project = self._runner(name, args, runner, runner_provider or automation, tags)
        self.register_outputs({
            "previewRoleArn": self.roles["preview"].arn, "deployRoleArn": self.roles["deploy"].arn,
            "secretsProvider": args.secrets_provider,
            "runnerProject": self.runner_project.name if self.runner_project else None,
        })

    def _runner(self, name: str, args: CiAccessArgs, runner: CiRunnerArgs, provider: aws.Provider,
                tags: dict[str, str]) -> aws.codebuild.Project:
        opts = pulumi.ResourceOptions(parent=self, provider=provider)
        project = role_name(args.name, "runner")
        group = aws.ec2.SecurityGroup(
            f"{name}-runner-sg", vpc_id=runner.vpc_id, description=f"{project}: egress only",
            egress=[aws.ec2.SecurityGroupEgressArgs(protocol="tcp", from_port=443, to_port=443, cidr_blocks=["0.0.0.0/0"],
                                                    description="GitHub, AWS APIs, PyPI, the EKS endpoint")],
            tags={**tags, "Name": project}, opts=opts)
        aws.ec2.SecurityGroupRule(
            f"{name}-runner-to-eks", type="ingress", security_group_id=runner.cluster_security_group_id,
            source_security_group_id=group.id, protocol="tcp", from_port=443, to_port=443,
            description=f"{project} reaches the private EKS API endpoint", opts=opts)
        logs = aws.cloudwatch.LogGroup(f"{name}-runner-logs", name=runner_log_group_name(args.name),
                                       retention_in_days=runner.log_retention_days,
                                       kms_key_id=runner.log_kms_key.arn if runner.log_kms_key else None, tags=tags, opts=opts)
        service_role = aws.iam.Role(
            f"{name}-runner-role", name=f"{project}-service",
            assume_role_policy=json.dumps({"Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Principal": {"Service": "codebuild.amazonaws.com"}, "Action": "sts:AssumeRole"}]}),
            tags=tags, opts=opts)
        aws.iam.RolePolicy(
            f"{name}-runner-policy", role=service_role.name,
            policy=pulumi.Output.all(logs.arn, runner.subnet_ids).apply(lambda values: json.dumps({
                "Version": "2012-10-17", "Statement": [
                    {"Sid": "Logs", "Effect": "Allow", "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
                     "Resource": [f"{values[0]}:*"]},
                    # AWS CodeBuild user guide, "Use CodeBuild with Amazon VPC": the ENI permissions.
                    {"Sid": "VpcEni", "Effect": "Allow", "Action": [
                        "ec2:CreateNetworkInterface", "ec2:DescribeDhcpOptions", "ec2:DescribeNetworkInterfaces",
                        "ec2:DeleteNetworkInterface", "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups",
                        "ec2:DescribeVpcs"], "Resource": "*"},
                    {"Sid": "VpcEniPermission", "Effect": "Allow", "Action": "ec2:CreateNetworkInterfacePermission",
                     "Resource": f"arn:{args.partition}:ec2:{args.region}:*:network-interface/*",
                     "Condition": {"StringEquals": {"ec2:AuthorizedService": "codebuild.amazonaws.com"},
                                   "ArnEquals": {"ec2:Subnet": [
                                       f"arn:{args.partition}:ec2:{args.region}:*:subnet/{subnet}" for subnet in values[1]]}}},
                    {"Sid": "GitHubConnection", "Effect": "Allow",
                     "Action": ["codeconnections:GetConnectionToken", "codeconnections:GetConnection",
                                "codeconnections:UseConnection"], "Resource": runner.code_connection_arn},
                ]})),
            opts=opts)
        codebuild = aws.codebuild.Project(
            f"{name}-runner", name=project, description=f"GitHub Actions runner of {args.repository} inside {args.name}'s VPC",
            service_role=service_role.arn, build_timeout=int(DEPLOY_SESSION_SECONDS / 60),
            artifacts=aws.codebuild.ProjectArtifactsArgs(type="NO_ARTIFACTS"),
            environment=aws.codebuild.ProjectEnvironmentArgs(
                type="LINUX_CONTAINER", compute_type=runner.compute_type, image=RUNNER_IMAGE,
                image_pull_credentials_type="CODEBUILD"),
            source=aws.codebuild.ProjectSourceArgs(
                type="GITHUB", location=f"https://github.com/{args.repository}.git",
                auth=aws.codebuild.ProjectSourceAuthArgs(type="CODECONNECTIONS", resource=runner.code_connection_arn)),
            vpc_config=aws.codebuild.ProjectVpcConfigArgs(vpc_id=runner.vpc_id, subnets=runner.subnet_ids,
                                                          security_group_ids=[group.id]),
            logs_config=aws.codebuild.ProjectLogsConfigArgs(cloudwatch_logs=aws.codebuild.ProjectLogsConfigCloudwatchLogsArgs(
                group_name=logs.name, status="ENABLED")),
            tags=tags, opts=opts)
        # A queued workflow job starts a build that registers itself as the job's runner; only jobs
        # of the platform workflow (CodeBuild User Guide, "GitHub webhook events": WORKFLOW_NAME
        # filters WORKFLOW_JOB_QUEUED events), so another workflow file in the repository cannot
        # claim the in-VPC runner (aws-readiness-4 K3). What it cannot stop, a branch that edits this
        # workflow itself, is bounded by the deploy role's trust (environment on main only) and
        # checked in docs/runbooks/ci-roles.md.
        aws.codebuild.Webhook(
            f"{name}-runner-webhook", project_name=codebuild.name, build_type="BUILD",
            filter_groups=[aws.codebuild.WebhookFilterGroupArgs(filters=[
                aws.codebuild.WebhookFilterGroupFilterArgs(**f) for f in group])
                for group in runner_webhook_filter_groups(re.escape(args.workflow_name))],
            opts=opts)
        return codebuild
