"""EKS managed add-ons as one table (components/addons.py) and Helm add-ons as one building block
(components/helm_addon.py), checked on the recorded plan of each stack."""
from __future__ import annotations

import json

from components.addons import ADDONS, CLUSTER_ADDONS, AddonTiming
from catalog.versions import EKS_RELEASES, addon_versions

ADDON = "aws:eks/addon:Addon"
RELEASE = "kubernetes:helm.sh/v3:Release"


def _deployed(plan, addon_name):
    found = [r for r in plan.recording.by_type(ADDON) if r.inputs["addonName"] == addon_name]
    assert len(found) == 1, (addon_name, [r.name for r in found])
    return found[0]


def test_every_row_has_a_build_in_every_kubernetes_minor_the_pin_file_knows():
    """A row takes its build from the pin file by name; a minor without it could not deploy the row."""
    for version, release in EKS_RELEASES.items():
        assert set(ADDONS) <= set(release.addons), f"{version} lacks builds for {sorted(set(ADDONS) - set(release.addons))}"


def test_each_cluster_row_is_one_addon_with_its_minors_pin_and_configuration(plan):
    pins = addon_versions(plan.config.cluster.version)
    for spec in CLUSTER_ADDONS:
        addon = _deployed(plan, spec.name)
        assert addon.name == f"{plan.config.name}-cluster-{spec.name}"  # the URN contract
        assert addon.inputs["addonVersion"] == pins[spec.name]
        configuration = addon.inputs.get("configurationValues")
        assert (json.loads(configuration) if configuration else None) == (dict(spec.configuration) if spec.configuration else None)


def test_timing_orders_each_row_against_the_system_nodes(plan):
    """EKS User Guide, "Amazon VPC CNI": "the Amazon VPC CNI plugin for Kubernetes ... must be
    installed" before nodes can run pods (a node without a CNI never becomes Ready); CoreDNS is a
    Deployment, and EKS reports it ACTIVE only once its pods are scheduled on a node."""
    nodes = plan.recording.one("aws:eks/nodeGroup:NodeGroup")
    for spec in CLUSTER_ADDONS:
        addon = _deployed(plan, spec.name)
        nodes_wait = plan.recording.depends_on(nodes, addon, transitive=False)
        waits_for_nodes = plan.recording.depends_on(addon, nodes, transitive=False)
        assert (nodes_wait, waits_for_nodes) == {
            AddonTiming.BEFORE_NODES: (True, False),
            AddonTiming.WITH_CONTROL_PLANE: (False, False),
            AddonTiming.AFTER_NODES: (False, True)}[spec.timing], spec.name
    assert {s.name for s in CLUSTER_ADDONS if s.timing is AddonTiming.BEFORE_NODES} >= {"vpc-cni"}


def test_a_row_with_an_identity_gets_a_pod_identity_role_for_exactly_its_service_account(plan):
    for spec in (s for s in CLUSTER_ADDONS if s.identity is not None):
        (association,) = _deployed(plan, spec.name).inputs["podIdentityAssociations"]
        assert association["serviceAccount"] == spec.identity.service_account
        role = plan.recording.resolve(association["roleArn"], "aws:iam/role:Role")
        condition = json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]["Condition"]["StringEquals"]
        assert condition["aws:RequestTag/kubernetes-service-account"] == spec.identity.service_account
        assert condition["aws:RequestTag/kubernetes-namespace"] == spec.identity.namespace
        attached = [r.inputs["policyArn"] for r in plan.recording.by_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
                    if r.parent == role.urn]
        assert sorted(a.split(":iam::aws:policy/")[1] for a in attached) == sorted(spec.identity.managed_policies)


def test_every_helm_release_is_atomic_and_cleans_up_after_a_failure(plan):
    """Helm, `helm upgrade --install` flags: "--atomic: if set, upgrade process rolls back changes
    made in case of failed upgrade"; "--cleanup-on-fail: allow deletion of new resources created in
    this upgrade when upgrade fails". A half-applied controller release is the failure they prevent."""
    releases = plan.recording.by_type(RELEASE)
    assert len(releases) >= 6
    for release in releases:
        assert release.inputs.get("atomic") is True and release.inputs.get("cleanupOnFail") is True, release.name
