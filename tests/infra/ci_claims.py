"""Test helpers for the CI path: the workflow's jobs, and the token claims GitHub issues per trigger."""
from __future__ import annotations


def workflow_jobs(workflow: dict) -> dict:
    return workflow["jobs"]
