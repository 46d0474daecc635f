"""A team member's job client on a test control plane (kept for tests that import it; the identity
comes from the plan's access entries: tests/cluster/identities.py)."""
from __future__ import annotations

from jobs.client import JobClient
from tests.cluster.identities import job_client


def team_client(cluster, team: str, store=None) -> JobClient:
    return job_client(cluster, team, store=store)
