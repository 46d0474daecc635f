"""A team member's job client on a test control plane: a kubeconfig whose identity carries the group
the platform's access mapping gives the team (``workloads.tenancy.team_group``)."""
from __future__ import annotations

import os

from jobs.client import JobClient
from jobs.kube import KubectlApi
from tools.cluster.controlplane import tool_path
from workloads.tenancy import team_group


def team_client(cluster, team: str, store=None) -> JobClient:
    namespace = f"team-{team}"
    kubeconfig = cluster.plane.kubeconfig(f"alice@{namespace}", [team_group(namespace)])
    kube = KubectlApi(kubectl=str(tool_path("kubectl")),
                      # HOME: kubectl keeps its discovery cache under $HOME/.kube (here, the plane's dir).
                      environ={"KUBECONFIG": str(kubeconfig), "PATH": os.environ.get("PATH", ""),
                               "HOME": str(cluster.plane.workdir)})
    return JobClient(cluster.stack, kube=kube, store=store)
