"""Every version the platform deploys, pinned in one place.

Charts, add-ons, images and AMIs are upgraded here and nowhere else, so a diff of this
file is the upgrade's whole blast radius. Add-on builds and AMI releases are keyed by the
Kubernetes minor (``EKS_RELEASES``): each stack installs the row of its own version.
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import Mapping, Optional

from catalog.prices import HOURS_PER_MONTH, STACK_PRICES  # noqa: F401  (re-exported for the plan)

# -- EKS ---------------------------------------------------------------------------------
DEFAULT_EKS_VERSION = "1.32"


@dataclass(frozen=True)
class EksVersionSupport:
    standard_support_ends: _dt.date
    extended_support_ends: _dt.date


@dataclass(frozen=True)
class EksRelease:
    """Everything that moves with the cluster's Kubernetes minor, in one row.

    support: EKS's calendar. addons: the managed add-on builds for this minor (each stack
    installs the row of its own ``cluster.version``, so dev can move first). ami_release: an
    EKS AL2023 AMI release known to ship this minor; a pinned Karpenter alias (al2023@vYYYYMMDD)
    older than it may have no AMI for the version and no node would launch. verified: when the
    row was last checked against its sources (the plan warns when it gets old).
    """

    standard_support_ends: _dt.date
    extended_support_ends: _dt.date
    addons: Mapping[str, str]
    ami_release: str
    verified: _dt.date
    # Add-ons whose build for this minor no stored source confirms (listed by the plan with the
    # `aws eks describe-addon-versions` command that settles it, UNCONFIRMED_PINS).
    unconfirmed_addons: frozenset = frozenset()

    @property
    def support(self) -> EksVersionSupport:
        return EksVersionSupport(self.standard_support_ends, self.extended_support_ends)


# Add-on builds that no AWS table maps to Kubernetes minors; the same build serves 1.32-1.35.
_UNMAPPED_ADDONS = {
    # No AWS document maps agent builds to Kubernetes versions (aws/eks-pod-identity-agent tags
    # are v0.1.x). This is the 1.32 default build that describe-addon-versions returns, as
    # recorded by public EKS API fixtures and Terraform pins (2025-2026); weaker than a doc.
    "eks-pod-identity-agent": "v1.3.10-eksbuild.1",
    # Driver release v1.53.0 (kubernetes-sigs/aws-ebs-csi-driver CHANGELOG.md, tag of
    # 2025-11-17); its EKS build eksbuild.1 is the one public EKS clusters report ACTIVE. No AWS
    # version table exists for this add-on.
    "aws-ebs-csi-driver": "v1.53.0-eksbuild.1",
    # Driver release v1.7.0 (kubernetes-sigs/aws-fsx-csi-driver tag v1.7.0, Nov 2025); the EKS
    # build is named in the EKS User Guide's hybrid-nodes add-on table ("Amazon FSx CSI driver
    # v1.7.0-eksbuild.1 and above", awsdocs/amazon-eks-user-guide PR #1215,
    # latest/ug/nodes/hybrid-nodes-add-ons.adoc).
    "aws-fsx-csi-driver": "v1.7.0-eksbuild.1",
    # Datasets storage mode s3-mountpoint (dev). Driver v2 is the first with EKS Pod Identity
    # (awslabs/mountpoint-s3-csi-driver README: "v2 introduces ... EKS Pod Identity support");
    # v2.2.2 is a driver release run with Pod Identity in public EKS test notes. The eksbuild
    # suffix is NOT confirmed by any stored source: listed in UNCONFIRMED_PINS.
    "aws-mountpoint-s3-csi-driver": "v2.2.2-eksbuild.1",
    # EFS CSI v2.1.0-eksbuild.1: in public EKS configs beside 1.31/1.32 add-on builds (e.g. kube-proxy
    # v1.32.0-eksbuild.2); no AWS table maps it to 1.33-1.35: listed in UNCONFIRMED_PINS.
    "aws-efs-csi-driver": "v2.1.0-eksbuild.1",
}

# Each of these builds, in each minor's row, is unconfirmed for that minor: AWS publishes no
# per-version table for them (the EKS User Guide has tables for vpc-cni, coredns and kube-proxy
# only) and `describe-addon-versions` cannot run offline. The plan names each one the stack
# deploys, with its command (UNCONFIRMED_PINS); a row moves a build to confirmed only with a source.
_UNCONFIRMED_ADDONS = frozenset(_UNMAPPED_ADDONS)

# One row per Kubernetes minor the platform can run. Sources:
# - support dates: EKS User Guide release calendar (kubernetes-versions.adoc) for <= 1.34;
#   1.35 (EKS release 2026-01-27): endoflife.date/amazon-eks snapshot of Feb 2026. 1.36 is left out
#   until its EKS dates are in a source (`aws eks describe-cluster-versions`).
# - vpc-cni, coredns, kube-proxy for 1.33-1.35: the EKS User Guide tables "latest version of the
#   Amazon EKS add-on type for each Kubernetes version" (managing-vpc-cni, managing-coredns,
#   managing-kube-proxy; docs.amazonaws.cn/eks/latest/userguide/*.md revision listing 1.35:
#   vpc-cni v1.21.1-eksbuild.7, coredns v1.13.2-eksbuild.4, kube-proxy v1.35.3/v1.34.6/v1.33.10).
#   The 1.32 row keeps the builds running today (same tables, earlier revision).
# - ami_release: awslabs/amazon-eks-ami release v20260903 ships AL2023 AMIs for Kubernetes 1.31-1.36
#   ("Source AMI Name (K8s 1.31 - 1.32) / (K8s 1.33 - 1.35) / (K8s 1.36)"); v20251023 is the release
#   prod runs 1.32 on today.
# Check a row with `aws eks describe-addon-versions --kubernetes-version X --addon-name <name>`.
EKS_RELEASES: dict[str, EksRelease] = {
    "1.32": EksRelease(_dt.date(2026, 3, 23), _dt.date(2027, 3, 23), {
        "vpc-cni": "v1.20.1-eksbuild.3", "coredns": "v1.11.4-eksbuild.24", "kube-proxy": "v1.32.9-eksbuild.2",
        **_UNMAPPED_ADDONS}, ami_release="v20251023", verified=_dt.date(2026, 11, 24),
        unconfirmed_addons=_UNCONFIRMED_ADDONS),
    "1.33": EksRelease(_dt.date(2026, 7, 29), _dt.date(2027, 7, 29), {
        "vpc-cni": "v1.21.1-eksbuild.7", "coredns": "v1.13.2-eksbuild.4", "kube-proxy": "v1.33.10-eksbuild.2",
        **_UNMAPPED_ADDONS}, ami_release="v20260903", verified=_dt.date(2026, 11, 25),
        unconfirmed_addons=_UNCONFIRMED_ADDONS),
    "1.34": EksRelease(_dt.date(2026, 12, 2), _dt.date(2027, 12, 2), {
        "vpc-cni": "v1.21.1-eksbuild.7", "coredns": "v1.13.2-eksbuild.4", "kube-proxy": "v1.34.6-eksbuild.2",
        **_UNMAPPED_ADDONS}, ami_release="v20260903", verified=_dt.date(2026, 11, 25),
        unconfirmed_addons=_UNCONFIRMED_ADDONS),
    "1.35": EksRelease(_dt.date(2027, 3, 27), _dt.date(2028, 3, 27), {
        "vpc-cni": "v1.21.1-eksbuild.7", "coredns": "v1.13.2-eksbuild.4", "kube-proxy": "v1.35.3-eksbuild.2",
        **_UNMAPPED_ADDONS}, ami_release="v20260903", verified=_dt.date(2026, 11, 25),
        unconfirmed_addons=_UNCONFIRMED_ADDONS),
}

# Derived views (a version missing from EKS_RELEASES is refused by the config).
EKS_VERSIONS: dict[str, EksVersionSupport] = {version: release.support for version, release in EKS_RELEASES.items()}


def addon_versions(kubernetes_version: str) -> dict[str, str]:
    """The managed add-on builds of one Kubernetes minor."""
    return dict(EKS_RELEASES[kubernetes_version].addons)


def ami_release_date(alias_or_release: str) -> Optional[_dt.date]:
    """v20260903 / al2023@v20260903 -> 2026-09-03; None for @latest or an unparsable release."""
    release = alias_or_release.rsplit("@", 1)[-1]
    if not release.startswith("v") or len(release) < 9 or not release[1:9].isdigit():
        return None
    return _dt.date(int(release[1:5]), int(release[5:7]), int(release[7:9]))


# Control-plane price per cluster-hour (USD), from the one price table; extended support adds $0.50/h.
EKS_STANDARD_USD_PER_HOUR = STACK_PRICES["eks_standard_hour"].usd
EKS_EXTENDED_USD_PER_HOUR = STACK_PRICES["eks_extended_hour"].usd

# The add-on builds of the default version (what components use when no version is passed).
EKS_ADDON_VERSIONS: dict[str, str] = addon_versions(DEFAULT_EKS_VERSION)

# Managed node group AMI family for the static CPU nodes (AL2 ends with 1.32).
SYSTEM_NODE_AMI_TYPE = "AL2023_x86_64_STANDARD"

# -- tracking (MLflow) --------------------------------------------------------------------
# Aurora PostgreSQL 16.x from 16.3 can scale Serverless v2 to 0 ACU (auto-pause).
# The version a new cluster is created with; AWS then applies minor upgrades (the cluster
# ignores later differences, components/tracking.py). AWS retires old minors for creation
# ("Cannot find version 16.x"): keep this at a minor `aws rds describe-db-engine-versions
# --engine aurora-postgresql` still lists.
AURORA_POSTGRESQL_VERSION = "16.6"
# AWS's single-user PostgreSQL password rotation function (Serverless Application Repository),
# per partition: application ARN and semantic version, as aws-cdk-lib pins them
# (packages/aws-cdk-lib/aws-secretsmanager/lib/secret-rotation.ts, POSTGRES_ROTATION_SINGLE_USER).
SECRETS_MANAGER_POSTGRES_ROTATION_APP = {
    "aws": ("arn:aws:serverlessrepo:us-east-1:297356227824:applications/SecretsManagerRDSPostgreSQLRotationSingleUser",
            "1.1.671"),
    "aws-cn": ("arn:aws-cn:serverlessrepo:cn-north-1:193023089310:applications/SecretsManagerRDSPostgreSQLRotationSingleUser",
               "1.1.440"),
    "aws-us-gov": ("arn:aws-us-gov:serverlessrepo:us-gov-west-1:023102451235:applications/"
                   "SecretsManagerRDSPostgreSQLRotationSingleUser", "1.1.383"),
}
# The MLflow server image is built from docker/mlflow (requirements pinned there); the
# stack takes its registry reference, digest-pinned in prod, from `tracking.image`.
MLFLOW_VERSION = "3.17.2"

# -- Helm charts ------------------------------------------------------------------------------
@dataclass(frozen=True)
class HelmChart:
    """One pinned Helm chart: what every release of it installs, from upstream or from a mirror.

    name / version: as the chart's Chart.yaml and its repository's index spell them (``v`` prefix
    included where upstream uses one). repo: upstream's repository, an HTTPS Helm repository or
    an ``oci://`` prefix the chart name is appended to. sha256: the SHA-256 of the chart archive
    (``<name>-<version>.tgz``) a chart mirror must serve; for an OCI registry it is also the
    digest of the manifest's chart layer, since ``helm push`` stores the archive as that layer
    unchanged. None: no archive of this version has been verified here, and a mirror cannot
    serve it until one is (the program refuses the mirror, naming the chart). source: where
    the pinned archive's bytes come from, to check the pin against.
    """

    name: str
    version: str
    repo: str
    sha256: Optional[str]
    source: str

    @property
    def oci(self) -> bool:
        return self.repo.startswith("oci://")

    @property
    def archive(self) -> str:
        """The archive's file name, as `helm package` and `helm pull` write it."""
        return f"{self.name}-{self.version}.tgz"

    @property
    def reference(self) -> str:
        """The chart as `helm install` names it upstream: ``oci://.../name`` or the bare name with ``repo``."""
        return f"{self.repo}/{self.name}" if self.oci else self.name


# Archive sources: "release" archives are byte for byte upstream's published archive (the SHA-256 is
# the `digest` of the chart's entry in upstream's index.yaml, so `helm pull` from upstream returns
# the same bytes). "rebuilt" archives are `helm package` (Helm v3.18.6) of the chart's files at the
# named commit plus the edits upstream's release script makes (version/appVersion/image stamping);
# their files are upstream's release, their bytes (tar timestamps) are the platform's own, so a
# mirror must be filled with these archives, not upstream's, or the pin updated after checking
# upstream's archive. Subcharts are inside each archive (kube-prometheus-stack: kube-state-metrics
# 8.4.0, prometheus-node-exporter 4.56.1, grafana 12.11.1, prometheus-windows-exporter 0.12.8).
KARPENTER = HelmChart(
    # Karpenter 1.14.1 supports Kubernetes 1.30-1.36 (EKS 1.32 needs >= 1.2); CRDs pinned in tests.
    "karpenter", "1.14.1", "oci://public.ecr.aws/karpenter",
    "32f5aeaf1edd47fc4788d215fd71a207999eef1eb8944cda9c87ff26b5b9df0c",
    "rebuilt: aws/karpenter-provider-aws tag v1.14.1 (bde0065) charts/karpenter, CRD symlinks resolved, with "
    "the release's Chart.yaml/values.yaml stamping from c88abbb (controller image 1.14.1@sha256:445baef...)")
# CRDs as their own release, so Helm upgrades them with the controller (a chart's crds/ are installed
# once and never upgraded); same version as the controller (Karpenter upgrade guide, "CRD Upgrades").
KARPENTER_CRD = HelmChart(
    "karpenter-crd", "1.14.1", "oci://public.ecr.aws/karpenter",
    "05867b24652087a2aef983db06544c23a9eba54e0af8b6a871ff6db7a3e160dd",
    "rebuilt: aws/karpenter-provider-aws tag v1.14.1 (bde0065) charts/karpenter-crd, version stamped as c88abbb does")
NVIDIA_DEVICE_PLUGIN = HelmChart(
    "nvidia-device-plugin", "0.17.1", "https://nvidia.github.io/k8s-device-plugin",
    "542ce451ce5d4611df00959e61c5638b7deeaf65c13daf03914d4688f94ae555",
    "release: NVIDIA/k8s-device-plugin tag v0.17.1 (3c37819) deployments/helm/nvidia-device-plugin")
NVIDIA_GPU_OPERATOR = HelmChart(
    "gpu-operator", "v25.3.0", "https://helm.ngc.nvidia.com/nvidia",
    "c461c3a5a8238f0975eb6e10fa3dd2c8f117bbfa2a6f15017ee80ff5b6345d4a",
    "release: NVIDIA/gpu-operator tag v25.3.0 (b5479aa) deployments/gpu-operator, the archive NVIDIA publishes on "
    "GitHub Pages (stable/gpu-operator-v25.3.0.tgz); NGC's copy not compared")
DCGM_EXPORTER = HelmChart(
    # The published 4.1.1 archive is commit d8d43c0, not the git tag 4.2.3-4.1.1 (c0d04b7, which
    # adds internalTrafficPolicy): judge the chart by the archive.
    "dcgm-exporter", "4.1.1", "https://nvidia.github.io/dcgm-exporter/helm-charts",
    "42c57f185a7f74fadd4f4a3cfddbdfcab65fdf378d18e0a4fbec921ea7b09515",
    "release: NVIDIA/dcgm-exporter d8d43c0 deployment/ (image dcgm-exporter:4.2.3-4.1.1-ubuntu22.04)")
# Prometheus operator CRDs (ServiceMonitor and friends) as templates, so Helm upgrades them.
PROMETHEUS_OPERATOR_CRDS = HelmChart(
    "prometheus-operator-crds", "31.0.1", "https://prometheus-community.github.io/helm-charts",
    "ef05887eae81f3fa8d765a4b5d20563625cd102a4a94f1e11e35aa4985b303ca",
    "rebuilt: prometheus-community/helm-charts tag prometheus-operator-crds-31.0.1 (4529d7b), operator v0.93.1")
# kube-prometheus-stack 88.5.3 (2026-08-21): prometheus-operator v0.93.1, the operator the CRDs chart
# above ships. Installed with crds.enabled=false: the CRDs release owns the CRDs.
KUBE_PROMETHEUS_STACK = HelmChart(
    "kube-prometheus-stack", "88.5.3", "https://prometheus-community.github.io/helm-charts",
    "339d625b2df688eb07e668a7a40b479d17274ce73c9584c9aa946f5a9e0ee4b8",
    "rebuilt: prometheus-community/helm-charts tag kube-prometheus-stack-88.5.3 (ea930ba) with its 5 subcharts")
AWS_FOR_FLUENT_BIT = HelmChart(
    # AWS for Fluent Bit 3.2.1: aws/eks-charts #1294.
    "aws-for-fluent-bit", "0.2.0", "https://aws.github.io/eks-charts",
    "666c244b9cfca211be57cf97d9e224157f581d41f413eb89744575fbc9b8980c",
    "release: aws/eks-charts 2942cdc stable/aws-for-fluent-bit")
# CloudWatch agent + its operator for Container Insights (enhanced observability), the source of the
# GPU-idle alarm's metric: the chart behind EKS add-on v6.2.0-eksbuild.1.
CLOUDWATCH_OBSERVABILITY = HelmChart(
    "amazon-cloudwatch-observability", "6.2.0", "https://aws-observability.github.io/helm-charts",
    "688f3feb46de2ad6595ea5cabf583ae41916afc3604240d91dfc75038c0d1422",
    "rebuilt: aws-observability/helm-charts tag amazon-cloudwatch-observability-6.2.0 (ade4944, the commit "
    "chart-releaser tagged; main's later \"Release 6.2.0 (#315)\" differs)")
# v0.5.6 (Nov 2024, plugin v0.5.4) is the newest archive verified here. It hard-codes
# priorityClassName system-node-critical and builds its node affinity only from
# supportedInstanceLabels (templates/daemonset.yaml): the platform sets those to its EFA label.
EFA_DEVICE_PLUGIN = HelmChart(
    "aws-efa-k8s-device-plugin", "v0.5.6", "https://aws.github.io/eks-charts",
    "c6a7ab4e642cfd68df8f2aaa003e33c6b5c2c499e6fdd3b8f7eedabf31821b80",
    "release: aws/eks-charts 2ce9790 stable/aws-efa-k8s-device-plugin (merge of #1182)")
KUEUE = HelmChart(
    "kueue", "0.19.2", "oci://registry.k8s.io/kueue/charts",
    "d9eb6fcc209e7a7cea3d1679e0735c9cc618b9ac8017e443f581f4eb7bacd0ad",
    "rebuilt: kubernetes-sigs/kueue tag v0.19.2 (8eab687) charts/kueue with hack/helm-chart-package.sh's image "
    "stamping (registry.k8s.io/kueue/*:v0.19.2)")
# Argo CD v3.5.1 (argoproj/argo-helm#4015, release argo-cd-10.3.3), the version of the
# Application/AppProject CRDs the tests validate against.
ARGOCD = HelmChart(
    "argo-cd", "10.3.3", "https://argoproj.github.io/argo-helm", None,
    "argoproj/argo-helm release argo-cd-10.3.3: no archive verified here (the newest reachable is 10.1.1); "
    "pin its upstream index digest before serving it from a mirror")
# Argo Workflows: chart 1.1.1 (release argo-workflows-1.1.1, 2026-08-11: "support Argo Workflows v4.1
# features", argoproj/argo-helm#3977; 1.1.0 moved the app to v4.1.0, #4013). The 1.x line is the one
# whose values.yaml the component's keys were checked against (charts/argo-workflows at 1.0.18);
# 2.0.x is a major bump whose notes could not be read offline.
ARGO_WORKFLOWS = HelmChart(
    "argo-workflows", "1.1.1", "https://argoproj.github.io/argo-helm", None,
    "argoproj/argo-helm release argo-workflows-1.1.1: no archive verified here (the newest reachable is 1.0.18); "
    "pin its upstream index digest before serving it from a mirror")
# Kubeflow Trainer v2 (TrainJob trainer.kubeflow.org/v1alpha1), from its OCI registry (only with
# training.trainerV2).
KUBEFLOW_TRAINER = HelmChart(
    "kubeflow-trainer", "2.3.0", "oci://ghcr.io/kubeflow/charts", None,
    "kubeflow/trainer v2.3.0 charts/kubeflow-trainer: no archive verified here; pin the chart layer digest "
    "ghcr.io serves before serving it from a mirror")

HELM_CHARTS: tuple[HelmChart, ...] = (
    KARPENTER, KARPENTER_CRD, NVIDIA_DEVICE_PLUGIN, NVIDIA_GPU_OPERATOR, DCGM_EXPORTER, PROMETHEUS_OPERATOR_CRDS,
    KUBE_PROMETHEUS_STACK, AWS_FOR_FLUENT_BIT, CLOUDWATCH_OBSERVABILITY, EFA_DEVICE_PLUGIN, KUEUE, ARGOCD,
    ARGO_WORKFLOWS, KUBEFLOW_TRAINER,
)

# The names the components and tests used before the table; each is the table's value.
KARPENTER_CHART = KARPENTER.reference
KARPENTER_VERSION = KARPENTER.version
KARPENTER_CRD_CHART = KARPENTER_CRD.reference
NVIDIA_DEVICE_PLUGIN_REPO = NVIDIA_DEVICE_PLUGIN.repo
NVIDIA_DEVICE_PLUGIN_VERSION = NVIDIA_DEVICE_PLUGIN.version
NVIDIA_GPU_OPERATOR_REPO = NVIDIA_GPU_OPERATOR.repo
NVIDIA_GPU_OPERATOR_VERSION = NVIDIA_GPU_OPERATOR.version
DCGM_EXPORTER_REPO = DCGM_EXPORTER.repo
DCGM_EXPORTER_VERSION = DCGM_EXPORTER.version
PROMETHEUS_OPERATOR_CRDS_REPO = PROMETHEUS_OPERATOR_CRDS.repo
PROMETHEUS_OPERATOR_CRDS_VERSION = PROMETHEUS_OPERATOR_CRDS.version
PROMETHEUS_COMMUNITY_REPO = KUBE_PROMETHEUS_STACK.repo
KUBE_PROMETHEUS_STACK_VERSION = KUBE_PROMETHEUS_STACK.version
EKS_CHARTS_REPO = AWS_FOR_FLUENT_BIT.repo
AWS_FOR_FLUENT_BIT_VERSION = AWS_FOR_FLUENT_BIT.version
CLOUDWATCH_OBSERVABILITY_REPO = CLOUDWATCH_OBSERVABILITY.repo
CLOUDWATCH_OBSERVABILITY_VERSION = CLOUDWATCH_OBSERVABILITY.version
EFA_DEVICE_PLUGIN_VERSION = EFA_DEVICE_PLUGIN.version
KUEUE_CHART = KUEUE.reference
KUEUE_VERSION = KUEUE.version
TRAINER_CHART = KUBEFLOW_TRAINER.reference
TRAINER_VERSION = KUBEFLOW_TRAINER.version
ARGO_HELM_REPO = ARGOCD.repo
ARGOCD_CHART_VERSION = ARGOCD.version
ARGOCD_APP_VERSION = "v3.5.1"
ARGO_WORKFLOWS_CHART_VERSION = ARGO_WORKFLOWS.version
# The image tag is pinned to v4.1.2, the patch release whose WorkflowTemplate CRD the tests validate against.
ARGO_WORKFLOWS_APP_VERSION = "v4.1.2"

# -- GPU capacity and scheduling ------------------------------------------------------------
# The MIG manager image that operator release deploys (gpu-operator v25.3.0 values.yaml
# migManager.repository/image/version); it carries kubectl (its reconfigure-mig.sh calls it), so
# the MIG gate DaemonSet (workloads.gpu_sharing) runs on the same pinned image.
NVIDIA_MIG_MANAGER_IMAGE = "nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0.12.1-ubuntu20.04"
# Default EKS AMI release for Karpenter pools when a stack does not pin one (prod must pin).
KARPENTER_AMI_ALIAS_PROD_EXAMPLE = "al2023@v20251023"

# -- training jobs -------------------------------------------------------------------------
# Kubeflow Training Operator 1.9.x (PyTorchJob kubeflow.org/v1) ships no Helm chart; its
# documented install is the kustomize overlay `manifests/overlays/standalone` at a release tag
# (the repository is now kubeflow/trainer; v1.9.x tags stay). No remote build at deploy time
# (it needs `git` and trusts a movable tag): infra/vendor.py fetches the tag's commit archive,
# keeps `manifests/` only if its git tree id is the pinned one, and the platform's local overlay
# on top of it is what the kustomize Directory builds. CRD pinned in tests: 1.9.4.
TRAINING_OPERATOR_VERSION = "v1.9.4"
# `git rev-parse v1.9.4^{commit}` and `git rev-parse v1.9.4:manifests` in a clone of kubeflow/trainer.
TRAINING_OPERATOR_COMMIT = "4445c12aa62e4345b0c2c6ac9b215a70eca46ed7"
TRAINING_OPERATOR_MANIFESTS_TREE = "4aed050ca9c1e7e0e4d4220563b4c57e9a903759"
TRAINING_OPERATOR_ARCHIVE_URL = f"https://codeload.github.com/kubeflow/trainer/tar.gz/{TRAINING_OPERATOR_COMMIT}"
# Relative to the project root (infra.vendor writes them there); build/ is ignored by git. Pulumi runs the
# program and its providers in `main` (infra/), so the Directory gets a path relative to that
# (components.training.training_operator_overlay_path).
TRAINING_OPERATOR_VENDOR_DIR = f"build/vendor/kubeflow-trainer-{TRAINING_OPERATOR_COMMIT[:12]}/manifests"
TRAINING_OPERATOR_OVERLAY_DIR = "build/kustomize/training-operator"
# Verified chart archives fetched from the stack's chart mirror (infra/chart_mirror.py), one
# `<name>-<version>.tgz` each; Helm releases install them by this path (components/charts.py).
CHART_ARCHIVE_DIR = "build/charts"
# The Training Operator's PyTorch init container (`--pytorch-init-container-image`; upstream's default is Docker Hub's
# `alpine:3.10`, pkg/config/config.go): Docker's official busybox mirrored on ECR Public, pinned by
# the digest of its image index (the same digest Docker Hub serves for docker.io/library/busybox:1.37.0,
# as pinned in public repositories). busybox has the `sh`, `seq` and `nslookup` the init
# container's command uses (pkg/controller.v1/pytorch/initcontainer.go). Confirm before a deploy:
# `docker buildx imagetools inspect public.ecr.aws/docker/library/busybox:1.37.0` (plan warning).
BUSYBOX_IMAGE = ("public.ecr.aws/docker/library/busybox:1.37.0"
                 "@sha256:bdf57e528e45e4433820e045b29b4597825a1c9e38353532d90a01445013f82e")
TRAINING_OPERATOR_INIT_CONTAINER_IMAGE = BUSYBOX_IMAGE

# -- pins no primary source confirms ------------------------------------------------------------
@dataclass(frozen=True)
class UnconfirmedPin:
    """A pinned version whose availability no AWS document states: the offline plan lists it with
    the command that confirms it (``{region}`` is the stack's region) whenever the plan deploys it.

    resource_type / match: the planned resource that deploys it (its input ``match[0]`` equals
    ``match[1]``), so the warning appears only when the pin is used."""

    what: str
    value: str
    why: str
    check: str
    resource_type: str
    match: tuple[str, str]
    # Only for stacks at this Kubernetes minor (add-on builds are per minor); None: every stack.
    kubernetes_version: Optional[str] = None


_ADDON_UNCONFIRMED_WHY = {
    "aws-fsx-csi-driver": "named only in the EKS hybrid-nodes add-on table; no table maps it to Kubernetes versions",
    "eks-pod-identity-agent": "no AWS document maps agent builds to Kubernetes versions",
    "aws-ebs-csi-driver": "no AWS version table exists for this add-on",
    "aws-mountpoint-s3-csi-driver": "driver release v2.2.2 exists; its eksbuild suffix is not in any stored source",
    "aws-efs-csi-driver": "seen beside 1.32 builds in public configs; no AWS table maps it to Kubernetes versions",
}


def _addon_pins() -> tuple[UnconfirmedPin, ...]:
    return tuple(
        UnconfirmedPin(
            f"{name} add-on", release.addons[name], _ADDON_UNCONFIRMED_WHY[name],
            "aws eks describe-addon-versions --region {region} --kubernetes-version {eks} --addon-name "
            + name + " --query 'addons[].addonVersions[].addonVersion'",
            "aws:eks/addon:Addon", ("addonName", name), kubernetes_version=version)
        for version, release in EKS_RELEASES.items() for name in sorted(release.unconfirmed_addons))


UNCONFIRMED_PINS: tuple[UnconfirmedPin, ...] = _addon_pins() + (
    UnconfirmedPin(
        "Aurora PostgreSQL engine version", AURORA_POSTGRESQL_VERSION,
        "AWS retires old minors for creation; no release-calendar row found for it",
        "aws rds describe-db-engine-versions --region {region} --engine aurora-postgresql --engine-version {value} "
        "--query 'DBEngineVersions[].[EngineVersion,Status]'",
        "aws:rds/cluster:Cluster", ("engineVersion", AURORA_POSTGRESQL_VERSION)),
    UnconfirmedPin(
        "busybox image digest (setup Jobs, Training Operator init container)", BUSYBOX_IMAGE,
        "the digest is taken from public pins of docker.io/library/busybox:1.37.0, not read from ECR Public",
        "docker buildx imagetools inspect public.ecr.aws/docker/library/busybox:1.37.0 --format '{{{{json .Manifest.Digest}}}}'",
        "kubernetes:kustomize/v2:Directory", ("directory", TRAINING_OPERATOR_OVERLAY_DIR)),
)
