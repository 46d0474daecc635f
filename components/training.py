"""Training jobs on the cluster: the operators that run them, each team's trainer identity, and
a ``TrainingJob`` component that applies one rendered job.

- ``TrainingOperators``: Kubeflow Training Operator 1.9 (``kubeflow.org/v1`` PyTorchJob) from its
  upstream kustomize overlay at a pinned tag, moved onto the system nodes; optionally Kubeflow
  Trainer 2.3 (``TrainJob``) from its Helm chart with the ``torch-distributed`` runtime. Kueue's
  manager config already lists both frameworks (``workloads.kueue.ManagerConfigSpec``).
- ``TeamTrainerAccess``: per team namespace a ``trainer`` ServiceAccount, an IAM role only EKS Pod
  Identity for that service account can assume, allowed only that team's prefix of the
  checkpoints bucket (and the bucket key through S3), and the Pod Identity association.
- ``TrainingJob``: a job spec rendered by ``workloads.trainingjob`` and applied with the
  cluster's Kubernetes provider; a bad spec fails before any resource is registered.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from components.cluster import Cluster, pod_identity_role
from components.k8s import apply_object
from components.versions import TRAINER_CHART, TRAINER_VERSION, TRAINING_OPERATOR_KUSTOMIZE, TRAINING_OPERATOR_VERSION
from workloads.jobspec import JobSpec
from workloads.placement import system_pod_placement
from workloads.platform_facts import PlatformFacts, TRAINER_SERVICE_ACCOUNT
from workloads.trainingjob import TORCH_DISTRIBUTED_RUNTIME, render

# Where the upstream manifests put the operator (overlays/standalone: namespace kubeflow).
TRAINING_OPERATOR_NAMESPACE = "kubeflow"
TRAINING_OPERATOR_DEPLOYMENT = "training-operator"
TRAINER_NAMESPACE = "kubeflow-system"


def trainer_values(*, replicas: int) -> dict[str, Any]:
    placement = system_pod_placement()
    return {
        "manager": {"replicas": replicas, "nodeSelector": placement["nodeSelector"], "tolerations": placement["tolerations"]},
        # The torch-distributed ClusterTrainingRuntime that TrainJobs reference.
        "runtimes": {"torchDistributed": {"enabled": True},
                     "installer": {"nodeSelector": placement["nodeSelector"], "tolerations": placement["tolerations"]}},
        # TrainJobs run as JobSets; the chart installs the JobSet controller unless one exists.
        "jobset": {"install": True},
    }


def operator_placement_patch() -> dict[str, Any]:
    """Server-side-apply patch of the upstream Deployment: run it on the static system nodes."""
    placement = system_pod_placement()
    return {
        "metadata": {"name": TRAINING_OPERATOR_DEPLOYMENT, "namespace": TRAINING_OPERATOR_NAMESPACE,
                     # The kustomize install owns the Deployment; take over only these fields.
                     "annotations": {"pulumi.com/patchForce": "true"}},
        "spec": {"template": {"spec": {"nodeSelector": placement["nodeSelector"], "tolerations": placement["tolerations"]}}},
    }


@dataclass(frozen=True)
class TrainingOperatorsArgs:
    """trainer_v2: also install Kubeflow Trainer 2.3 (TrainJob) with the torch-distributed runtime.
    trainer_replicas: Trainer controller replicas (2 in prod)."""

    trainer_v2: bool = False
    trainer_replicas: int = 1


class TrainingOperators(pulumi.ComponentResource):
    def __init__(self, name: str, args: TrainingOperatorsArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:training:TrainingOperators", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        # Upstream's supported install of 1.9.x is this kustomize overlay; it is built at deploy
        # time from the pinned tag (nothing upstream is copied into this repository).
        self.training_operator = k8s.kustomize.v2.Directory(
            f"{name}-training-operator", directory=TRAINING_OPERATOR_KUSTOMIZE, opts=child,
        )
        self.placement = k8s.apps.v1.DeploymentPatch(
            f"{name}-training-operator-placement", **operator_placement_patch(),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.training_operator]),
        )
        self.trainer: Optional[k8s.helm.v3.Release] = None
        if args.trainer_v2:
            self.trainer = k8s.helm.v3.Release(
                f"{name}-trainer", name="kubeflow-trainer", chart=TRAINER_CHART, version=TRAINER_VERSION,
                namespace=TRAINER_NAMESPACE, create_namespace=True, values=trainer_values(replicas=args.trainer_replicas),
                atomic=True, cleanup_on_fail=True, timeout=600, opts=child,
            )
        self.register_outputs({
            "training_operator_version": TRAINING_OPERATOR_VERSION,
            "trainer_v2_runtime": TORCH_DISTRIBUTED_RUNTIME if args.trainer_v2 else None,
        })


# -- per-team trainer identity -------------------------------------------------------------------
def team_checkpoint_prefix(namespace: str) -> str:
    """A team's prefix in the checkpoints bucket (FSx /checkpoints/<namespace>/ exports there)."""
    return f"{namespace}/"


def checkpoint_prefix_policy(*, bucket_arn: str, key_arn: str, prefix: str, region: str) -> dict[str, Any]:
    """Read/write objects under one prefix of the checkpoints bucket, list only that prefix, and
    use the bucket's KMS key only through S3 (IAM User Guide, "Amazon S3: Allows IAM users access
    to their S3 home directory"; KMS condition kms:ViaService)."""
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "ListTeamPrefix", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": bucket_arn,
         "Condition": {"StringLike": {"s3:prefix": [prefix, f"{prefix}*"]}}},
        {"Sid": "TeamObjects", "Effect": "Allow",
         "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
         "Resource": f"{bucket_arn}/{prefix}*"},
        {"Sid": "BucketKeyThroughS3", "Effect": "Allow", "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
         "Resource": key_arn, "Condition": {"StringEquals": {"kms:ViaService": f"s3.{region}.amazonaws.com"}}},
    ]}


def team_directory_metadata(posix_id: int) -> dict[str, str]:
    """S3 user metadata FSx imports as a directory's owner, group and mode (st_mode: S_IFDIR 040000
    plus 0750: the team reads and writes, nobody else enters)."""
    return {"file-owner": str(posix_id), "file-group": str(posix_id), "file-permissions": "040750"}


def trainer_service_account(namespace: str) -> dict[str, Any]:
    # The token stays mounted: EKS Pod Identity authenticates the pod with its service account
    # token, and users report credential failures with automountServiceAccountToken: false
    # (PeerDB-io/peerdb-enterprise#43). The account has no RBAC bindings.
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": TRAINER_SERVICE_ACCOUNT, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "pulumi", "mlplatform.io/role": "trainer"}}}


@dataclass(frozen=True)
class TeamTrainerAccessArgs:
    """cluster: the EKS cluster (its ARN scopes the trust, its name the associations).
    checkpoints_bucket: ``components.bucket.SecureBucket`` of checkpoints (arn, KMS key).
    namespaces: team namespaces (they must exist).
    namespace_resources: the Namespace objects, to order the ServiceAccounts after them.
    region: the bucket's region (KMS via-service condition).
    fsx: the component owning the namespaces' FSx claims, or None.
    posix_ids: namespace -> the team's uid/gid; its FSx directory is created owned by it.
    checkpoints_dra_prefix: the S3 prefix of the /checkpoints data repository association."""

    cluster: Cluster
    checkpoints_bucket: Any
    namespaces: Sequence[str]
    region: str
    namespace_resources: Mapping[str, pulumi.Resource] = field(default_factory=dict)
    fsx: Optional[pulumi.Resource] = None
    posix_ids: Mapping[str, int] = field(default_factory=dict)
    checkpoints_dra_prefix: str = ""
    tags: Mapping[str, str] = field(default_factory=dict)


class TeamTrainerAccess(pulumi.ComponentResource):
    def __init__(self, name: str, args: TeamTrainerAccessArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:training:TeamTrainerAccess", name, None, opts)
        bucket = args.checkpoints_bucket
        cluster_arn = args.cluster.eks_cluster.eks_cluster.arn
        self.roles: dict[str, aws.iam.Role] = {}
        for namespace in args.namespaces:
            prefix = team_checkpoint_prefix(namespace)
            ns_dep = [args.namespace_resources[namespace]] if namespace in args.namespace_resources else []
            apply_object(f"{name}-{namespace}-sa", trainer_service_account(namespace),
                         pulumi.ResourceOptions(parent=self, depends_on=ns_dep))
            role = pod_identity_role(f"{name}-{namespace}", cluster_arn=cluster_arn, namespace=namespace,
                                     service_account=TRAINER_SERVICE_ACCOUNT, parent=self, tags=args.tags)
            policy = pulumi.Output.all(bucket.arn, bucket.args.kms_key.arn).apply(
                lambda arns, p=prefix: json.dumps(checkpoint_prefix_policy(
                    bucket_arn=arns[0], key_arn=arns[1], prefix=p, region=args.region)))
            aws.iam.RolePolicy(f"{name}-{namespace}-checkpoints", role=role.id, policy=policy,
                               opts=pulumi.ResourceOptions(parent=role))
            aws.eks.PodIdentityAssociation(
                f"{name}-{namespace}-association", cluster_name=args.cluster.cluster_name, namespace=namespace,
                service_account=TRAINER_SERVICE_ACCOUNT, role_arn=role.arn, tags=dict(args.tags),
                opts=pulumi.ResourceOptions(parent=self),
            )
            self.roles[namespace] = role
            if args.fsx is not None:
                # The team's directory /checkpoints/<ns>, owned by the team's uid, mode 0750,
                # with no root pod: a directory object with POSIX metadata in the linked bucket,
                # which the association's auto-import (NEW) creates on the file system (FSx for
                # Lustre User Guide, "POSIX metadata support for data repositories": a key ending
                # in "/" is a directory; x-amz-meta-file-owner/-group/-permissions). The team's
                # volume mounts exactly this directory (workloads.fsx), and root is squashed.
                posix_id = args.posix_ids[namespace]
                aws.s3.BucketObjectv2(
                    f"{name}-{namespace}-directory", bucket=bucket.name,
                    key=f"{args.checkpoints_dra_prefix.strip('/') + '/' if args.checkpoints_dra_prefix.strip('/') else ''}{prefix}",
                    content="", metadata=team_directory_metadata(posix_id), tags=dict(args.tags),
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[args.fsx]))
        self.register_outputs({"role_arns": {ns: r.arn for ns, r in self.roles.items()}})


# -- one job -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainingJobArgs:
    """spec: the job spec; facts: the platform it runs on (``infra.training.platform_facts``);
    cluster: its Kubernetes provider applies the job."""

    spec: JobSpec
    facts: PlatformFacts
    cluster: Cluster


class TrainingJob(pulumi.ComponentResource):
    def __init__(self, name: str, args: TrainingJobArgs, opts: Optional[pulumi.ResourceOptions] = None):
        # Render first: a bad spec raises JobSpecError (every problem) before anything is registered.
        manifest = render(args.spec, args.facts)
        super().__init__("mlplatform:training:TrainingJob", name, None, opts)
        self.manifest = manifest
        self.job = apply_object(f"{name}-{manifest['kind'].lower()}", manifest,
                                pulumi.ResourceOptions(parent=self, provider=args.cluster.k8s_provider))
        self.register_outputs({"kind": manifest["kind"], "namespace": manifest["metadata"]["namespace"],
                               "name": manifest["metadata"]["name"]})
