"""PR code inside the VPC through the in-VPC CI runner (security review 4, N5), from the
attacker's seat: a same-repository pull request edits ``.github/workflows/platform.yml`` (for
``pull_request`` GitHub runs the PR's version) so that a job ``runs-on`` the CodeBuild runner's
label, whose scheme is public. GitHub then sends a ``workflow_job`` ``queued`` webhook. What
refuses it is the webhook's filter group: CodeBuild starts the runner (a build in the private
subnets) only when every filter of a group matches (AWS CodeBuild "GitHub webhook events":
``EVENT`` ``WORKFLOW_JOB_QUEUED`` is ``X-GitHub-Event: workflow_job`` with action ``queued``;
``HEAD_REF`` is the workflow job's ``head_branch``; ``WORKFLOW_NAME`` its ``workflow_name``).

``starts_build`` ports that rule; the payloads are GitHub's ``workflow_job`` webhook (GitHub
docs, "Webhook events and payloads": ``workflow_job.head_branch``, ``workflow_job.workflow_name``).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from components.ci_access import DEFAULT_WORKFLOW_NAME, DEFAULT_WORKFLOW_PATH, runner_webhook_filter_groups

ROOT = Path(__file__).resolve().parents[2]
WEBHOOK = "aws:codebuild/webhook:Webhook"


def starts_build(groups: list[list[dict[str, str]]], event: str, payload: dict) -> bool:
    job = payload.get("workflow_job", {})
    fields = {"HEAD_REF": job.get("head_branch", ""), "WORKFLOW_NAME": job.get("workflow_name", "")}
    for group in groups:
        ok = True
        for f in group:
            if f["type"] == "EVENT":
                ok &= event == "workflow_job" and payload.get("action") == "queued" and "WORKFLOW_JOB_QUEUED" in f["pattern"]
            else:
                ok &= re.search(f["pattern"], fields[f["type"]]) is not None
        if ok:
            return True
    return False


def queued(branch: str, workflow: str = DEFAULT_WORKFLOW_NAME) -> dict:
    return {"action": "queued", "workflow_job": {"head_branch": branch, "workflow_name": workflow,
                                                 "labels": ["codebuild-mlp-prod-ci-runner-123-1"]}}


def _recorded_groups(plan) -> list[list[dict[str, str]]]:
    (hook,) = plan.recording.by_type(WEBHOOK)
    return [group["filters"] for group in hook.inputs["filterGroups"]]


def test_a_pull_request_job_on_the_runner_label_starts_no_runner(prod_plan):
    groups = _recorded_groups(prod_plan)
    assert not starts_build(groups, "workflow_job", queued("feature/steal-vpc")), "PR code runs inside the VPC"
    # Renaming its workflow or branch to look like something else does not help either.
    assert not starts_build(groups, "workflow_job", queued("main-but-not", "platform"))
    assert not starts_build(groups, "workflow_job", queued("feature/x", "other"))


def test_the_deploy_job_from_main_starts_the_runner(prod_plan):
    groups = _recorded_groups(prod_plan)
    assert starts_build(groups, "workflow_job", queued("main"))
    assert not starts_build(groups, "push", {"ref": "refs/heads/main"})


def test_the_filters_name_the_real_workflow_and_its_deploy_trigger():
    workflow = yaml.safe_load((ROOT / DEFAULT_WORKFLOW_PATH).read_text())
    assert workflow["name"] == DEFAULT_WORKFLOW_NAME
    deploy = workflow["jobs"]["deploy"]
    # The deploy job runs from main only: pushed, or dispatched by hand for prod's second phase
    # (docs/runbooks/first-deploy.md); never for a pull request.
    assert deploy["if"].endswith("&& github.ref == 'refs/heads/main'"), deploy["if"]
    assert "pull_request" not in deploy["if"]
    assert any(f["type"] == "HEAD_REF" for f in runner_webhook_filter_groups()[0])
