"""EKS managed add-ons as data: one row per add-on, created by ``Cluster`` (or ``Cluster.addon``).

A row says when the add-on may be created, what it is configured with and which AWS identity
its service account gets; the build comes from the one pin home (``catalog.versions``,
``EksRelease.addons``, keyed by the cluster's Kubernetes minor), by name. Adding an add-on is
one row here and its build in the pin file (terraform-aws-eks keeps add-ons the same way:
``addons = { coredns = {}, vpc-cni = { before_compute = true } }``, variables.tf).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping, Optional

from workloads.problems import accepts_enum_values


class AddonTiming(str, Enum):
    """When an add-on can be created relative to the static node group."""

    # The nodes wait for it: without the CNI (and kube-proxy) a node never becomes Ready.
    BEFORE_NODES = "before-nodes"
    # Needs only the control plane: a DaemonSet-only add-on reports ACTIVE with no nodes.
    WITH_CONTROL_PLANE = "with-control-plane"
    # It waits for the nodes: EKS reports a Deployment add-on ACTIVE only once its pods run.
    AFTER_NODES = "after-nodes"


@dataclass(frozen=True)
class AddonIdentity:
    """An EKS Pod Identity role for an add-on's service account, with AWS managed policies.

    ``role``: the role's resource-name suffix (``<cluster>-<role>-role``).
    ``managed_policies``: paths after ``arn:<partition>:iam::aws:policy/``.
    """

    role: str
    namespace: str
    service_account: str
    managed_policies: tuple[str, ...] = ()


@accepts_enum_values
@dataclass(frozen=True)
class AddonSpec:
    """One EKS managed add-on: its name, timing, configuration values and Pod Identity."""

    name: str
    timing: AddonTiming = AddonTiming.AFTER_NODES
    configuration: Optional[Mapping[str, Any]] = None
    identity: Optional[AddonIdentity] = None


# The add-ons every cluster gets, in creation order.
CLUSTER_ADDONS: tuple[AddonSpec, ...] = (
    # Without the CNI's policy agent, NetworkPolicy objects (team namespaces' default deny) are
    # accepted by the API server but never enforced. Strict enforcement: in the default
    # "standard" mode a new pod "will start with a default allow policy" until its policies are
    # configured, a window with the internet and every port in the VPC; in "strict" mode it
    # starts with default deny (amazon-vpc-cni-k8s v1.20.1 README, NETWORK_POLICY_ENFORCING_MODE;
    # EKS User Guide, "Restrict Pod network traffic", step 1 "Set up policy enforcement at Pod
    # startup"). The add-on's schema takes it as the chart value env.NETWORK_POLICY_ENFORCING_MODE
    # (charts/aws-vpc-cni values.yaml at v1.20.1). Strict mode also denies a pod that no policy
    # selects: every namespace with pods has one (workloads.system_namespaces.unrestricted_policy
    # where the platform does not shape the traffic), created before those pods.
    AddonSpec("vpc-cni", AddonTiming.BEFORE_NODES, configuration={
        "enableNetworkPolicy": "true", "env": {"NETWORK_POLICY_ENFORCING_MODE": "strict"}}),
    AddonSpec("kube-proxy", AddonTiming.BEFORE_NODES),
    AddonSpec("eks-pod-identity-agent", AddonTiming.WITH_CONTROL_PLANE),
    AddonSpec("coredns"),
    # EKS User Guide, "Store Kubernetes volumes with Amazon EBS" (ebs-csi): the controller's
    # service account ebs-csi-controller-sa in kube-system, AWS managed AmazonEBSCSIDriverPolicy.
    AddonSpec("aws-ebs-csi-driver", identity=AddonIdentity(
        role="ebs-csi", namespace="kube-system", service_account="ebs-csi-controller-sa",
        managed_policies=("service-role/AmazonEBSCSIDriverPolicy",))),
)

# Created by the component that needs it, through ``Cluster.addon`` (it stays that component's child).
# No IAM role: with static volumes only, the controller never calls AWS. Its FSx calls are in
# CreateVolume/DeleteVolume/ControllerExpandVolume (dynamic provisioning and resizing) and
# ValidateVolumeCapabilities, which nothing calls for a static PV; the CSIDriver has
# attachRequired: false, and the node plugin only mounts (Lustre client). Source:
# kubernetes-sigs/aws-fsx-csi-driver pkg/driver/controller.go and docs/install.md ("IAM
# permissions ... to create/delete file systems and volumes").
# Add-ons another component owns (``Datasets``), by storage mode. The FSx and EFS drivers need no
# role here (FSx: the node's; EFS static volumes with access points: "no additional IAM permissions",
# aws-efs-csi-driver examples/kubernetes/access_points). Mountpoint's read-only role has an inline
# policy scoped to one bucket, which a managed-policy row cannot say: ``Datasets`` makes it and its
# Pod Identity association, and the add-on waits for that association.
FSX_CSI_DRIVER = AddonSpec("aws-fsx-csi-driver")
EFS_CSI_DRIVER = AddonSpec("aws-efs-csi-driver")
MOUNTPOINT_S3_CSI_DRIVER = AddonSpec("aws-mountpoint-s3-csi-driver")

ADDONS: dict[str, AddonSpec] = {spec.name: spec for spec in (*CLUSTER_ADDONS, FSX_CSI_DRIVER, EFS_CSI_DRIVER,
                                                             MOUNTPOINT_S3_CSI_DRIVER)}
