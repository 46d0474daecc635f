"""Every version the platform deploys, pinned in one place.

Charts, add-ons, images and AMIs are upgraded here and nowhere else, so a diff of this
file is the upgrade's whole blast radius. Add-on versions are the EKS 1.32 builds.
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass

from workloads.prices import HOURS_PER_MONTH, STACK_PRICES  # noqa: F401  (re-exported for the plan)

# -- EKS ---------------------------------------------------------------------------------
DEFAULT_EKS_VERSION = "1.32"


@dataclass(frozen=True)
class EksVersionSupport:
    standard_support_ends: _dt.date
    extended_support_ends: _dt.date


# AWS's published support calendar; a version missing here is refused by the config.
EKS_VERSIONS: dict[str, EksVersionSupport] = {
    "1.30": EksVersionSupport(_dt.date(2025, 7, 23), _dt.date(2026, 7, 23)),
    "1.31": EksVersionSupport(_dt.date(2025, 11, 26), _dt.date(2026, 11, 26)),
    "1.32": EksVersionSupport(_dt.date(2026, 3, 23), _dt.date(2027, 3, 23)),
    "1.33": EksVersionSupport(_dt.date(2026, 7, 29), _dt.date(2027, 7, 29)),
    "1.34": EksVersionSupport(_dt.date(2026, 12, 2), _dt.date(2027, 12, 2)),
}

# Control-plane price per cluster-hour (USD), from the one price table; extended support adds $0.50/h.
EKS_STANDARD_USD_PER_HOUR = STACK_PRICES["eks_standard_hour"].usd
EKS_EXTENDED_USD_PER_HOUR = STACK_PRICES["eks_extended_hour"].usd

# EKS managed add-ons for Kubernetes 1.32, each build with where it is published. AWS's user
# guide lists "the latest version of the Amazon EKS add-on type for each Kubernetes version"
# for vpc-cni, coredns and kube-proxy; the other add-ons have no such table, so their builds
# are cited from AWS's own pages or repositories. Check a change with
# `aws eks describe-addon-versions --kubernetes-version 1.32 --addon-name <name>`.
EKS_ADDON_VERSIONS: dict[str, str] = {
    # EKS User Guide, "Assign IPs to Pods with the Amazon VPC CNI" (managing-vpc-cni), version
    # table row 1.32 (docs.aws.amazon.com/ja_jp/eks/latest/userguide/pod-networking.html).
    "vpc-cni": "v1.20.1-eksbuild.3",
    # EKS User Guide, "Manage CoreDNS" (managing-coredns.html), version table row 1.32.
    "coredns": "v1.11.4-eksbuild.24",
    # EKS User Guide, "Manage kube-proxy" (managing-kube-proxy.html), version table row 1.32
    # (docs.amazonaws.cn/eks/latest/userguide/managing-kube-proxy.html, same table revision
    # as the docs.aws.amazon.com page listing 1.33 v1.33.5-eksbuild.2).
    "kube-proxy": "v1.32.9-eksbuild.2",
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
}

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

# -- GPU capacity and scheduling ------------------------------------------------------------
# Karpenter 1.14.1 supports Kubernetes 1.30-1.36 (EKS 1.32 needs >= 1.2); CRDs pinned in tests.
KARPENTER_CHART = "oci://public.ecr.aws/karpenter/karpenter"
KARPENTER_VERSION = "1.14.1"
# CRDs as their own release, so Helm upgrades them with the controller (a chart's crds/ are
# installed once and never upgraded); same version as the controller (Karpenter upgrade guide,
# "CRD Upgrades").
KARPENTER_CRD_CHART = "oci://public.ecr.aws/karpenter/karpenter-crd"
NVIDIA_DEVICE_PLUGIN_REPO = "https://nvidia.github.io/k8s-device-plugin"
NVIDIA_DEVICE_PLUGIN_VERSION = "0.17.1"
NVIDIA_GPU_OPERATOR_REPO = "https://helm.ngc.nvidia.com/nvidia"
NVIDIA_GPU_OPERATOR_VERSION = "v25.3.0"
DCGM_EXPORTER_REPO = "https://nvidia.github.io/dcgm-exporter/helm-charts"
DCGM_EXPORTER_VERSION = "4.1.1"
# Prometheus operator CRDs (ServiceMonitor and friends) as templates, so Helm upgrades them:
# prometheus-community/helm-charts tag prometheus-operator-crds-31.0.1 (operator v0.93.1).
PROMETHEUS_OPERATOR_CRDS_REPO = "https://prometheus-community.github.io/helm-charts"
PROMETHEUS_OPERATOR_CRDS_VERSION = "31.0.1"
# kube-prometheus-stack 88.5.3 (tag kube-prometheus-stack-88.5.3, commit ea930ba, 2026-08-21):
# prometheus-operator v0.93.1, the operator the CRDs chart above ships; subcharts
# kube-state-metrics 8.4.0, prometheus-node-exporter 4.56.1, grafana 12.11.1. Installed with
# crds.enabled=false: the CRDs release owns the CRDs.
PROMETHEUS_COMMUNITY_REPO = PROMETHEUS_OPERATOR_CRDS_REPO
KUBE_PROMETHEUS_STACK_VERSION = "88.5.3"
EKS_CHARTS_REPO = "https://aws.github.io/eks-charts"
# aws-for-fluent-bit chart 0.2.0 (AWS for Fluent Bit 3.2.1): aws/eks-charts #1294, commit 2942cdc.
AWS_FOR_FLUENT_BIT_VERSION = "0.2.0"
# CloudWatch agent + its operator for Container Insights (enhanced observability), the source of
# the GPU-idle alarm's metric: aws-observability/helm-charts chart amazon-cloudwatch-observability
# 6.2.0 ("Release 6.2.0", #315, 2026-06-10), the chart behind EKS add-on v6.2.0-eksbuild.1.
CLOUDWATCH_OBSERVABILITY_REPO = "https://aws-observability.github.io/helm-charts"
CLOUDWATCH_OBSERVABILITY_VERSION = "6.2.0"
EFA_DEVICE_PLUGIN_VERSION = "v0.5.6"
KUEUE_CHART = "oci://registry.k8s.io/kueue/charts/kueue"
KUEUE_VERSION = "0.19.2"
# Default EKS AMI release for Karpenter pools when a stack does not pin one (prod must pin).
KARPENTER_AMI_ALIAS_PROD_EXAMPLE = "al2023@v20251023"

# -- training jobs -------------------------------------------------------------------------
# Kubeflow Training Operator 1.9.x (PyTorchJob kubeflow.org/v1) ships no Helm chart; its
# documented install is the kustomize overlay `manifests/overlays/standalone` at a release tag
# (the repository is now kubeflow/trainer; v1.9.x tags stay). Built by Pulumi's kustomize
# Directory at deploy time (remote build syntax: repo//path?ref=tag). CRD pinned in tests: 1.9.4.
TRAINING_OPERATOR_VERSION = "v1.9.4"
TRAINING_OPERATOR_KUSTOMIZE = f"https://github.com/kubeflow/trainer//manifests/overlays/standalone?ref={TRAINING_OPERATOR_VERSION}"
# Kubeflow Trainer v2 (TrainJob trainer.kubeflow.org/v1alpha1), Helm chart from its OCI registry.
TRAINER_CHART = "oci://ghcr.io/kubeflow/charts/kubeflow-trainer"
TRAINER_VERSION = "2.3.0"
# One-shot setup Jobs (team checkpoint directories on FSx); Docker's official image mirrored on
# ECR Public. Pin its digest in prod.
BUSYBOX_IMAGE = "public.ecr.aws/docker/library/busybox:1.37.0"

# -- GitOps (Argo CD, Argo Workflows) ---------------------------------------------------------
ARGO_HELM_REPO = "https://argoproj.github.io/argo-helm"
# argo-cd chart 10.3.3 ships Argo CD v3.5.1 (argoproj/argo-helm#4015, release argo-cd-10.3.3),
# the version of the Application/AppProject CRDs the tests validate against.
ARGOCD_CHART_VERSION = "10.3.3"
ARGOCD_APP_VERSION = "v3.5.1"
# Argo Workflows: chart 1.1.1 (release argo-workflows-1.1.1, 2026-08-11: "support Argo Workflows
# v4.1 features", argoproj/argo-helm#3977; 1.1.0 moved the app to v4.1.0, #4013). The 1.x line is
# the one whose values.yaml the component's keys were checked against (charts/argo-workflows at
# 1.0.18); 2.0.x is a major bump whose notes could not be read offline. The image tag is pinned
# to v4.1.2, the patch release whose WorkflowTemplate CRD the tests validate against.
ARGO_WORKFLOWS_CHART_VERSION = "1.1.1"
ARGO_WORKFLOWS_APP_VERSION = "v4.1.2"
