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
from components.versions import (
    BUSYBOX_IMAGE, TRAINER_CHART, TRAINER_VERSION, TRAINING_OPERATOR_KUSTOMIZE, TRAINING_OPERATOR_VERSION,
)
from workloads.jobspec import JobSpec
from workloads.placement import system_pod_placement
from workloads.platform_facts import PlatformFacts, TRAINER_SERVICE_ACCOUNT
from workloads.fsx import CLAIM_NAME
from workloads.trainingjob import (
    CHECKPOINT_KEY_ITEM, CHECKPOINT_KEY_SECRET, TORCH_DISTRIBUTED_RUNTIME, checkpoint_root_job, render,
)

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


def checkpoint_key_secret(namespace: str, key: pulumi.Input[str]) -> dict[str, Any]:
    """The team's checkpoint signing key (trainer/trust.py): its trainers sign every checkpoint
    manifest with it and refuse to load one it does not verify. Only the team's namespace holds
    it, so another team can neither forge a checkpoint nor read the key."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": CHECKPOINT_KEY_SECRET, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "pulumi", "mlplatform.io/role": "trainer"}},
            "stringData": {CHECKPOINT_KEY_ITEM: key}}


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
    fsx: the component owning the namespaces' FSx claims (the setup Job mounts them), or None.
    setup_placement: nodeSelector/tolerations of the one-shot setup Job (the CPU pool)."""

    cluster: Cluster
    checkpoints_bucket: Any
    namespaces: Sequence[str]
    region: str
    namespace_resources: Mapping[str, pulumi.Resource] = field(default_factory=dict)
    fsx: Optional[pulumi.Resource] = None
    setup_placement: Mapping[str, Any] = field(default_factory=dict)
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
            # 64 random characters from Secrets Manager's generator (an Invoke: not a resource, and
            # a new value on every run, so ignore_changes keeps the first one; rotating it makes
            # the team's existing checkpoints unloadable, see docs/trainer.md).
            key = aws.secretsmanager.get_random_password_output(
                password_length=64, exclude_punctuation=True, opts=pulumi.InvokeOutputOptions(parent=self)).random_password
            apply_object(f"{name}-{namespace}-checkpoint-key", checkpoint_key_secret(namespace, pulumi.Output.secret(key)),
                         pulumi.ResourceOptions(parent=self, depends_on=ns_dep, ignore_changes=["stringData"]))
            if args.fsx is not None:
                # The team's checkpoint directory, owned by the trainer's uid (see checkpoint_root_job).
                apply_object(f"{name}-{namespace}-checkpoint-root",
                             checkpoint_root_job(namespace, claim_name=CLAIM_NAME, image=BUSYBOX_IMAGE,
                                                 placement=dict(args.setup_placement)),
                             pulumi.ResourceOptions(parent=self, depends_on=[args.fsx, *ns_dep]))
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
