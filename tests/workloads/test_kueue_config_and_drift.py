"""Kueue 0.19.2: the manager config the chart expects, and what admission changes in a job.

Config (kueue v0.19.2):
- charts/kueue/values.yaml, ``managerConfig.controllerManagerConfigYaml``: ``apiVersion:
  config.kueue.x-k8s.io/v1beta2`` / ``kind: Configuration``.
- pkg/config/config.go ``fromFile``: ``codecs := serializer.NewCodecFactory(scheme,
  serializer.EnableStrict)``: an unknown field is an error, so every key must be a json tag of
  apis/config/v1beta2/configuration_types.go (the table below lists the tags of the structs we
  use, copied from that file).

Drift (kueue v0.19.2):
- pkg/controller/jobs/kubeflow/kubeflowjob/kubeflowjob_controller.go ``RunWithPodSetsInfo``
  calls ``podset.Merge(log, &replica.ObjectMeta, &replica.Spec, info)`` for every replica.
- pkg/podset/podset.go ``FromAssignment``: ``utilmaps.Copy(&info.NodeSelector,
  flv.Spec.NodeLabels)`` / ``info.Tolerations = append(info.Tolerations, flv.Spec.Tolerations...)``
  (TAS adds an annotation and a scheduling gate only with a topology assignment; the platform
  uses none); ``Merge``: ``utilmaps.HaveConflict`` on labels/annotations/nodeSelector (a
  conflict is an error), ``utilmaps.Copy`` of the maps, and "make sure we don't duplicate
  tolerations": appended only ``if !slices.ContainsFunc(podSetInfo.Tolerations, func(e) bool {
  return utiltolerations.Equal(e, t) })``; ``Equal`` = ``a.MatchToleration(&b)`` (key, operator
  with "" as Equal, value, effect).
- pkg/controller/jobs/trainjob: the webhook's ``Default`` appends a runtime patch with manager
  ``kueue.x-k8s.io/manager`` and ``RunWithPodSetsInfo`` fills it.
- Argo CD's default ("Legacy") diff is a 3-way diff of live, desired and last-applied
  (docs/user-guide/diff-strategies.md): a key Kueue adds to a map the desired state does not
  mention is no difference; a list the desired state sets (tolerations, runtimePatches) is
  compared whole.

So a PyTorchJob shows no drift exactly when admission leaves its pod templates' tolerations as
rendered: the test merges every flavor into every rendered job the way Kueue does.
"""
from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from workloads import gitops, kueue
from workloads.trainingjob import render

# json tags of kueue v0.19.2 apis/config/v1beta2 (and component-base LeaderElectionConfiguration).
V1BETA2_FIELDS: dict[str, dict[str, Any]] = {
    "Configuration": {
        "apiVersion": None, "kind": None, "namespace": None, "manageJobsWithoutQueueName": None,
        "managedJobsNamespaceSelector": None, "internalCertManagement": None,
        "waitForPodsReady": "WaitForPodsReady", "clientConnection": None, "integrations": "Integrations",
        "multiKueue": None, "fairSharing": "FairSharing", "admissionFairSharing": None, "resources": None,
        "featureGates": None, "objectRetentionPolicies": None, "visibilityServer": None,
        # ControllerManager, inline
        "webhook": "ControllerWebhook", "leaderElection": "LeaderElectionConfiguration",
        "metrics": "ControllerMetrics", "health": "ControllerHealth", "pprofBindAddress": None,
        "controller": None, "tls": None,
    },
    "ControllerWebhook": {"port": None, "host": None, "certDir": None},
    "ControllerMetrics": {"bindAddress": None, "enableClusterQueueResources": None, "customLabels": None,
                          "localQueueMetrics": None},
    "ControllerHealth": {"healthProbeBindAddress": None, "readinessEndpointName": None, "livenessEndpointName": None},
    "LeaderElectionConfiguration": {"leaderElect": None, "leaseDuration": None, "renewDeadline": None,
                                    "retryPeriod": None, "resourceLock": None, "resourceName": None,
                                    "resourceNamespace": None},
    "WaitForPodsReady": {"timeout": None, "blockAdmission": None, "requeuingStrategy": "RequeuingStrategy",
                         "recoveryTimeout": None},
    "RequeuingStrategy": {"timestamp": None, "backoffLimitCount": None, "backoffBaseSeconds": None,
                          "backoffMaxSeconds": None},
    "FairSharing": {"preemptionStrategies": None},
    "Integrations": {"frameworks": None, "externalFrameworks": None, "labelKeysToCopy": None},
}


def _unknown_fields(value: dict, struct: str, path: str = "") -> list[str]:
    fields = V1BETA2_FIELDS[struct]
    problems = []
    for key, child in value.items():
        if key not in fields:
            problems.append(f"{path}{key}")
        elif fields[key] is not None and isinstance(child, dict):
            problems += _unknown_fields(child, fields[key], f"{path}{key}.")
    return problems


def test_manager_config_is_the_charts_version_and_decodes_strictly():
    config = yaml.safe_load(kueue.manager_config_yaml())
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2" and config["kind"] == "Configuration"
    assert _unknown_fields(config, "Configuration") == []
    # What the platform relies on is still there.
    assert config["waitForPodsReady"]["timeout"] == "10m"
    assert config["waitForPodsReady"]["requeuingStrategy"]["backoffLimitCount"] == 5
    assert {"kubeflow.org/pytorchjob", "trainer.kubeflow.org/trainjob"} <= set(config["integrations"]["frameworks"])


def test_the_v1beta1_switches_would_be_refused():
    """The finding's config, checked the same way: v1beta1's ``enable`` keys are unknown in v1beta2."""
    old = {"waitForPodsReady": {"enable": True, "timeout": "10m"}, "fairSharing": {"enable": True}}
    assert _unknown_fields(old, "Configuration") == ["waitForPodsReady.enable", "fairSharing.enable"]


# -- admission-time edits ------------------------------------------------------------------------
def _toleration_equal(a: dict, b: dict) -> bool:
    """utiltolerations.Equal: MatchToleration on key, operator ("" = Equal), value, effect."""
    op = lambda t: t.get("operator") or "Equal"
    return (a.get("key") == b.get("key") and op(a) == op(b) and a.get("value", "") == b.get("value", "")
            and a.get("effect", "") == b.get("effect", ""))


def kueue_merge(template: dict, flavor: dict) -> dict:
    """podset.Merge of FromAssignment(flavor) into one replica's pod template."""
    merged = copy.deepcopy(template)
    spec = merged.setdefault("spec", {})
    selector = spec.get("nodeSelector") or {}
    for key, value in flavor["spec"].get("nodeLabels", {}).items():
        if key in selector and selector[key] != value:
            raise AssertionError(f"HaveConflict: nodeSelector {key}={selector[key]} vs flavor {value}")
        selector[key] = value
    if selector:
        spec["nodeSelector"] = selector
    tolerations = list(spec.get("tolerations") or [])
    for t in flavor["spec"].get("tolerations", []):
        if not any(_toleration_equal(e, t) for e in tolerations):
            tolerations.append(t)
    if tolerations:
        spec["tolerations"] = tolerations
    return merged


@pytest.fixture(scope="module", params=["dev", "prod"])
def stack(request):
    return request.param


def test_admitting_a_rendered_pytorchjob_changes_no_list_argo_cd_compares(stack):
    from jobs.facts import facts_for_stack
    from tests.conftest import _plan

    facts = facts_for_stack(stack, use_outputs=False)
    plan = _plan(stack)
    flavors = {r.inputs["metadata"]["name"]: r.inputs for r in plan.recording.resources
               if r.inputs.get("kind") == "ResourceFlavor"}
    assert flavors, "the plan defines Kueue flavors"
    from workloads.problems import InvalidInputError
    from workloads.jobspec import parse_job_spec

    checked = 0
    for pool in facts.pools:
        flavor = next((f for f in flavors.values() if f["spec"].get("nodeLabels", {}).items()
                       <= pool.node_labels.items()), None)
        assert flavor is not None, f"no flavor selects pool {pool.name}"
        team = facts.teams[0]
        raw = {"name": "drift", "team": team.name, "image": "example.com/trainer@sha256:" + "0" * 64,
               "trainer": {"config": "trainer/configs/gpt2-124m.yaml"}, "nodes": 1,
               "gpusPerNode": pool.gpus_per_node, "pool": pool.name, "dataset": "/fsx/datasets/x",
               "spot": pool.offers_spot}
        try:
            job = render(parse_job_spec(raw), facts)
        except InvalidInputError:  # a pool this team cannot use: not a job anyone can declare
            continue
        for replica in job["spec"]["pytorchReplicaSpecs"].values():
            template = replica["template"]
            admitted = kueue_merge(template, flavor)
            assert admitted["spec"].get("tolerations") == template["spec"].get("tolerations"), pool.name
            # Keys Kueue adds to maps are no drift in a 3-way diff; changed values would be.
            for key, value in template["spec"].get("nodeSelector", {}).items():
                assert admitted["spec"]["nodeSelector"][key] == value
        checked += 1
    assert checked, "at least one pool renders a job"


def test_trainjob_runtime_patch_of_kueue_is_ignored_and_nothing_else():
    ignores = {(d["group"], d["kind"]): d for d in gitops.kueue_ignore_differences()}
    trainjob = ignores[("trainer.kubeflow.org", "TrainJob")]
    assert trainjob["jsonPointers"] == ["/spec/suspend"]
    assert trainjob["jqPathExpressions"] == ['.spec.runtimePatches[] | select(.manager == "kueue.x-k8s.io/manager")']
    pytorchjob = ignores[("kubeflow.org", "PyTorchJob")]
    assert pytorchjob == {"group": "kubeflow.org", "kind": "PyTorchJob", "jsonPointers": ["/spec/runPolicy/suspend"]}


def test_memory_quotas_are_written_as_kubernetes_writes_them_back():
    """resource.Quantity's canonical form (k8s.io/apimachinery pkg/api/resource/quantity.go
    ``CanonicalizeBytes``: binary SI, the largest exponent that leaves an integer mantissa; zero is
    "0"): Kueue's webhook stores a ClusterQueue re-encoded that way, so anything else drifts."""
    from workloads.kueue import memory_quantity

    assert [memory_quantity(g) for g in (0, 1, 128, 1023, 1024, 1536, 2048, 1024 ** 2)] == \
        ["0", "1Gi", "128Gi", "1023Gi", "1Ti", "1536Gi", "2Ti", "1Pi"]


def test_cpu_quotas_are_written_as_kubernetes_writes_them_back():
    """resource.Quantity's canonical decimal form (quantity.go ``CanonicalizeBytes`` for DecimalSI:
    the largest exponent in steps of 3 that leaves an integer mantissa). ``resource.MustParse(s).String()``
    with k8s.io/apimachinery v0.33.3 gives 2100m -> "2100m", 29400m -> "29400m", 24000m -> "24",
    1000 -> "1k", 1500 -> "1500", 3000000m -> "3k", 0 -> "0": a slice quota in millicores must be
    written that way, or the ClusterQueue Kueue stores differs from the program's on every `up`."""
    from workloads.kueue import cpu_quantity

    assert [cpu_quantity(m) for m in (0, 100, 2100, 29400, 24000, 1000 * 1000, 1500 * 1000, 3000000)] == \
        ["0", "100m", "2100m", "29400m", "24", "1k", "1500", "3k"]
