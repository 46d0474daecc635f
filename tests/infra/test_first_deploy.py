"""Issue 20 (deploy correctness 3): each first-`up` finding, tested from its upstream rule.

Every test quotes the upstream source it encodes; the constants under test are the project's,
the rule is upstream's.
"""
from __future__ import annotations

from components.argo_workflows import ArgoWorkflowsArgs, helm_values


def _argo_values() -> dict:
    return helm_values(ArgoWorkflowsArgs(cluster=None, namespaces=["team-a"]))  # type: ignore[arg-type]


# -- N2: Argo Workflows CRDs without a download -------------------------------------------------
def test_argo_workflows_crds_are_rendered_by_helm_not_downloaded_by_a_hook_job():
    """argoproj/argo-helm charts/argo-workflows (1.0.18, the 1.x values the component follows):

    templates/crds-install-job.yaml: ``{{- if and .Values.crds.install .Values.crds.full }}`` ...
    ``"helm.sh/hook": pre-install,pre-upgrade`` (a Job that downloads the full CRDs from
    raw.githubusercontent.com; argoproj/argo-workflows#16621: "That fails in air-gapped clusters").
    templates/crds.yaml: ``{{- if and .Values.crds.install (not .Values.crds.full) }}`` ranges over
    ``files/crds/minimal/*.yaml``. values.yaml: ``full: true`` is the default.
    """
    crds = _argo_values()["crds"]
    install, full = crds["install"], crds.get("full", True)  # the chart's default when unset
    download_job_rendered = install and full
    minimal_crds_rendered = install and not full
    assert not download_job_rendered
    assert minimal_crds_rendered
    assert crds["keep"] is True  # helm.sh/resource-policy: keep on the minimal CRDs
