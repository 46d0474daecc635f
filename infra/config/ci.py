"""The ``ci`` section: the GitHub repository whose workflow deploys this stack, and how (components/ci_access.py)."""
from __future__ import annotations

import re
from enum import Enum
from typing import Annotated, Iterator, Optional

from pydantic import Field

from components.ci_access import DEFAULT_WORKFLOW_PATH
from workloads.problems import Problem
from infra.config.common import _Model, syntax
from infra.config.engine import Rule

_REPOSITORY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_CONNECTION = re.compile(r"^arn:aws[a-z-]*:(codeconnections|codestar-connections):[a-z0-9-]+:\d{12}:connection/[0-9a-f-]{36}$")

GithubRepository = Annotated[str, syntax(
    lambda value: None if _REPOSITORY.match(value) else "is not a GitHub ORG/REPO",
    "use the repository's owner and name, e.g. example-org/ml-training-platform")]
BucketName = Annotated[str, syntax(
    lambda value: None if _BUCKET.match(value) else "is not an S3 bucket name",
    "use the bucket of PULUMI_BACKEND_URL, without s3://")]
ConnectionArn = Annotated[str, syntax(
    lambda value: None if _CONNECTION.match(value) else "is not a CodeConnections connection ARN",
    "use arn:aws:codeconnections:<region>:<account>:connection/<uuid> (console: Developer Tools > Connections)")]


class OidcProviderMode(str, Enum):
    """An account holds one OIDC provider per URL: one stack creates it, the others use it."""

    CREATE = "create"
    EXISTING = "existing"


class CiConfig(_Model):
    """CI's roles in the automation account, the state's KMS key and the in-VPC runner."""

    repository: GithubRepository = Field(description="GitHub ORG/REPO whose workflow deploys this stack.")
    workflow_path: str = Field(DEFAULT_WORKFLOW_PATH, description="The workflow file the roles trust (job_workflow_ref).")
    oidc_provider: OidcProviderMode = Field(OidcProviderMode.CREATE, description=(
        "create | existing: only one stack per automation account creates token.actions.githubusercontent.com."))
    state_bucket: BucketName = Field(description="S3 bucket of the Pulumi state (PULUMI_BACKEND_URL s3://<bucket>).")
    code_connection_arn: Optional[ConnectionArn] = Field(None, description=(
        "AWS CodeConnections connection to GitHub for the in-VPC runner; null: no runner (CI cannot reach a private endpoint)."))


def _runner_in_workload_account(ci: Optional[CiConfig], accounts) -> Iterator[Problem]:
    if ci is not None and ci.code_connection_arn:
        account = ci.code_connection_arn.split(":")[4]
        if account != accounts.workload.id:
            yield Problem("ci.codeConnectionArn", ci.code_connection_arn,
                          f"the connection is in account {account}; the runner lives in the workload account {accounts.workload.id}",
                          "create the connection in the workload account")


RULES: tuple[Rule, ...] = (
    Rule(("ci", "accounts"), _runner_in_workload_account),
)
