"""Training jobs on the cluster: the operators that run them, each team's trainer identity, and
a ``TrainingJob`` component that applies one rendered job.

- ``TrainingOperators``: Kubeflow Training Operator 1.9 (``kubeflow.org/v1`` PyTorchJob) from its
  upstream kustomize overlay at a pinned commit (verified by ``infra.vendor``) under a local
  overlay that places it on the system nodes and pins its PyTorch init-container image; optionally
  Kubeflow Trainer 2.3 (``TrainJob``) from its Helm chart, and the platform's ClusterTrainingRuntime
  (``workloads.trainjob_runtime``: torch-distributed with a failure policy). Kueue's
  manager config already lists both frameworks (``workloads.kueue.ManagerConfigSpec``).
- ``TeamTrainerAccess``: per team namespace a ``trainer`` ServiceAccount, an IAM role only EKS Pod
  Identity for that service account can assume, allowed only that team's prefix of the
  checkpoints bucket (and the bucket key through S3), and the Pod Identity association.
- ``TrainingJob``: a job spec rendered by ``workloads.trainingjob`` and applied with the
  cluster's Kubernetes provider; a bad spec fails before any resource is registered.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from components.charts import ChartSource
from components.helm_addon import helm_addon, system_ready
from components.cluster import Cluster
from components.k8s import apply_object
from catalog.versions import (
    KUBEFLOW_TRAINER, TRAINING_OPERATOR_INIT_CONTAINER_IMAGE, TRAINING_OPERATOR_OVERLAY_DIR,
    TRAINING_OPERATOR_VERSION,
)
from workloads.jobspec import JobSpec
from workloads.placement import system_pod_placement
from workloads.platform_facts import PlatformFacts, TRAINER_SERVICE_ACCOUNT
from workloads.fsx import CLAIM_NAME
from workloads import trainjob_runtime
from workloads.system_namespaces import unrestricted_policy
from workloads.tenancy import PYTORCH_INIT_CONTAINER_TEMPLATE
from workloads.trainingjob import (CHECKPOINT_KEY_ITEM, CHECKPOINT_KEY_SECRET, TORCH_DISTRIBUTED_RUNTIME, platform_config_map,
                                   render)

# Where the upstream manifests put the operator (overlays/standalone: namespace kubeflow).
TRAINING_OPERATOR_NAMESPACE = "kubeflow"
TRAINING_OPERATOR_DEPLOYMENT = "training-operator"
# Upstream's standalone overlay generates this Secret empty (secretGenerator, no sources: `data: {}`)
# for the operator's cert rotator to fill in place; the Deployment mounts it.
TRAINING_OPERATOR_WEBHOOK_CERT_SECRET = "training-operator-webhook-cert"
TRAINER_NAMESPACE = "kubeflow-system"


def trainer_values(*, replicas: int) -> dict[str, Any]:
    placement = system_pod_placement()
    return {
        "manager": {"replicas": replicas, "nodeSelector": placement["nodeSelector"], "tolerations": placement["tolerations"]},
        # The torch-distributed ClusterTrainingRuntime that TrainJobs reference.
        "runtimes": {"torchDistributed": {"enabled": True},
                     "installer": {"nodeSelector": placement["nodeSelector"], "tolerations": placement["tolerations"]}},
        # TrainJobs run as JobSets; the chart installs the JobSet controller unless one exists. Its
        # subchart places its controller only by its own values (jobset v0.12.0
        # charts/jobset/templates/controller/deployment.yaml: ``.Values.controller.nodeSelector``,
        # ``.tolerations``): without them it waits for a node no pool offers.
        "jobset": {"install": True, "controller": {"nodeSelector": placement["nodeSelector"],
                                                   "tolerations": placement["tolerations"]}},
    }


# The operator reads its PyTorch init-container template from this file when it exists
# (pkg/config/config.go PyTorchInitContainerTemplateFileDefault = "/etc/config/initContainer.yaml";
# pkg/controller.v1/pytorch/initcontainer.go getInitContainerTemplateOrDefault). Upstream's
# template (same command, resources and Go template fields) plus a securityContext, so worker pods
# pass Pod Security "restricted" and the scan: the init container only runs nslookup and sleep.
# It sets no runAsUser: the pod's (the team's) uid applies, which the team admission policy requires.
INIT_CONTAINER_TEMPLATE_DIR = "/etc/config"
INIT_CONTAINER_TEMPLATE_FILE = "initContainer.yaml"
# The namespace's NetworkPolicy, a resource of the same overlay (the namespace is upstream's).
NETWORK_POLICY_FILE = "networkPolicy.yaml"
INIT_CONTAINER_CONFIGMAP = "training-operator-init-container"
# One template for the operator and the tenant policies that must admit its output (workloads.tenancy).
INIT_CONTAINER_TEMPLATE = PYTORCH_INIT_CONTAINER_TEMPLATE
# pkg/config/config.go PyTorchInitContainerMaxTriesDefault
INIT_CONTAINER_MAX_TRIES = 100


def operator_init_containers(master_addr: str) -> list[dict[str, Any]]:
    """The init containers the operator adds to each worker of a multi-node PyTorchJob, rendered
    from ``INIT_CONTAINER_TEMPLATE`` as the operator renders it (for the security scan and tests)."""
    import yaml

    text = (INIT_CONTAINER_TEMPLATE.replace("{{.InitContainerImage}}", TRAINING_OPERATOR_INIT_CONTAINER_IMAGE)
            .replace("{{.MaxTries}}", str(INIT_CONTAINER_MAX_TRIES)).replace("{{.MasterAddr}}", master_addr))
    return yaml.safe_load(text)


# cmd/training-operator.v1/main.go (v1.9.4): the flag that replaces the Docker Hub default
# `alpine:3.10` of the init container added to every worker of a multi-node PyTorchJob.
INIT_CONTAINER_IMAGE_FLAG = "--pytorch-init-container-image"
TRAINING_OPERATOR_CONTAINER = "training-operator"


def operator_deployment_patch() -> dict[str, Any]:
    """Strategic-merge patch of the upstream Deployment (manifests/base/deployment.yaml has no
    placement and no args): static system nodes, pinned init-container image."""
    placement = system_pod_placement()
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": TRAINING_OPERATOR_DEPLOYMENT, "namespace": TRAINING_OPERATOR_NAMESPACE},
        "spec": {"template": {"spec": {
            "nodeSelector": placement["nodeSelector"], "tolerations": placement["tolerations"],
            "containers": [{"name": TRAINING_OPERATOR_CONTAINER,
                            "args": [f"{INIT_CONTAINER_IMAGE_FLAG}={TRAINING_OPERATOR_INIT_CONTAINER_IMAGE}"],
                            "volumeMounts": [{"name": "init-container-template", "mountPath": INIT_CONTAINER_TEMPLATE_DIR,
                                              "readOnly": True}]}],
            "volumes": [{"name": "init-container-template", "configMap": {"name": INIT_CONTAINER_CONFIGMAP}}],
        }}},
    }


def operator_kustomization(upstream_overlay: str) -> dict[str, Any]:
    """The local overlay the Directory builds: upstream's standalone overlay (a path relative to
    this overlay's folder) plus ``operator_deployment_patch``, applied at build time so the
    Deployment is created already placed (no later patch racing its readiness).

    The webhook certificate Secret loses its empty ``data: {}``: the Kubernetes provider stores
    the empty map and then reads it back as absent, so every `pulumi up` planned to replace the
    Secret (``data: add-replace``, seen under the real engine), wiping the certificate the
    operator's rotator had written into it. Without the key the Secret is the same empty Secret
    and nothing differs between runs."""
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        # The namespace's NetworkPolicy comes with it: under the CNI's strict enforcement a pod no
        # policy selects has no network, and kubeflow had none (the operator's webhook is called
        # by the API server; workloads.system_namespaces.unrestricted_policy).
        "resources": [upstream_overlay, NETWORK_POLICY_FILE],
        # The init-container template next to this kustomization (written by infra.vendor).
        "configMapGenerator": [{"name": INIT_CONTAINER_CONFIGMAP, "namespace": TRAINING_OPERATOR_NAMESPACE,
                                "files": [INIT_CONTAINER_TEMPLATE_FILE]}],
        "patches": [{"target": {"group": "apps", "version": "v1", "kind": "Deployment",
                                "name": TRAINING_OPERATOR_DEPLOYMENT},
                     "patch": json.dumps(operator_deployment_patch())},
                    {"target": {"version": "v1", "kind": "Secret", "name": TRAINING_OPERATOR_WEBHOOK_CERT_SECRET},
                     "patch": json.dumps([{"op": "remove", "path": "/data"}])}],
    }


def network_policy_yaml() -> str:
    """The file ``NETWORK_POLICY_FILE`` of the overlay (infra.vendor writes it)."""
    import yaml

    return yaml.safe_dump(unrestricted_policy(TRAINING_OPERATOR_NAMESPACE), sort_keys=False)


# infra.vendor writes the overlay under the project root: the folder that holds components/.
_PROJECT_ROOT = Path(__file__).resolve().parent.parent


def training_operator_overlay_path() -> str:
    """The overlay folder as the Kubernetes provider must be given it.

    The provider builds it in its own working directory (pulumi-kubernetes
    provider/pkg/provider/kustomize/v2/directory.go: ``k.Run(fSys, directoryArgs.Directory)``),
    which is the program's: the folder Pulumi.yaml's ``main`` names (pkg/engine/project.go
    getPwdMain; ``main: infra/`` here), not the project root. So the path is relative to the
    current working directory: ``../build/kustomize/training-operator`` under `pulumi up`, the
    same text on every machine (an absolute path would differ between checkouts and show as a
    change on every `up`)."""
    return os.path.relpath(_PROJECT_ROOT / TRAINING_OPERATOR_OVERLAY_DIR)


@dataclass(frozen=True)
class TrainingOperatorsArgs:
    """cluster: the platform cluster; the operators wait for its static nodes and CoreDNS, as
    every other controller release does (None only in unit tests of the args).
    trainer_v2: also install Kubeflow Trainer 2.3 (TrainJob) with the torch-distributed runtime.
    trainer_replicas: Trainer controller replicas (2 in prod).
    charts: where the charts come from (upstream by default, or the stack's verified chart mirror)."""

    cluster: Optional[Cluster] = None
    trainer_v2: bool = False
    trainer_replicas: int = 1
    charts: ChartSource = ChartSource()


class TrainingOperators(pulumi.ComponentResource):
    def __init__(self, name: str, args: TrainingOperatorsArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:training:TrainingOperators", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, depends_on=system_ready(args.cluster) if args.cluster is not None else [])
        # The local overlay (written with the verified upstream tree by infra.vendor before the
        # program runs) is built by the provider; no git, no remote URL at deploy time.
        self.training_operator = k8s.kustomize.v2.Directory(
            f"{name}-training-operator", directory=training_operator_overlay_path(), opts=child,
        )
        self.trainer: Optional[k8s.helm.v3.Release] = None
        if args.trainer_v2:
            # The namespace and its NetworkPolicy before the release's pods (strict enforcement
            # leaves a pod no policy selects without a network), not Helm's create_namespace.
            namespace = apply_object(f"{name}-trainer-namespace", {
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": TRAINER_NAMESPACE, "labels": {"app.kubernetes.io/managed-by": "pulumi"}}}, child)
            policy = apply_object(f"{name}-trainer-network-policy", unrestricted_policy(TRAINER_NAMESPACE),
                                  pulumi.ResourceOptions(parent=self, depends_on=[namespace]))
            self.trainer = helm_addon(
                f"{name}-trainer", parent=self, cluster=args.cluster, release="kubeflow-trainer", chart=KUBEFLOW_TRAINER,
                source=args.charts, namespace=TRAINER_NAMESPACE,
                values=trainer_values(replicas=args.trainer_replicas), depends_on=[namespace, policy],
            )
            # The runtime TrainJobs reference: torch-distributed with the platform's failure policy.
            self.torch_runtime = apply_object(f"{name}-torch-runtime", trainjob_runtime.cluster_training_runtime(),
                                              pulumi.ResourceOptions(parent=self, depends_on=[self.trainer]))
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
        self.roles: dict[str, aws.iam.Role] = {}
        for namespace in args.namespaces:
            prefix = team_checkpoint_prefix(namespace)
            ns_dep = [args.namespace_resources[namespace]] if namespace in args.namespace_resources else []
            apply_object(f"{name}-{namespace}-sa", trainer_service_account(namespace),
                         pulumi.ResourceOptions(parent=self, depends_on=ns_dep))
            policy = pulumi.Output.all(bucket.arn, bucket.args.kms_key.arn).apply(
                lambda arns, p=prefix: json.dumps(checkpoint_prefix_policy(
                    bucket_arn=arns[0], key_arn=arns[1], prefix=p, region=args.region)))
            trainer = args.cluster.pod_identity(
                f"{name}-{namespace}", namespace=namespace, service_account=TRAINER_SERVICE_ACCOUNT, parent=self,
                tags=args.tags, policies={"checkpoints": policy}, association="association", after_agent=False)
            self.roles[namespace] = trainer.role
            # The deployed names the team's pods and its members' tools read (the bucket's real name).
            apply_object(f"{name}-{namespace}-platform", platform_config_map(namespace, bucket.name),
                         pulumi.ResourceOptions(parent=self, depends_on=ns_dep))
            # 64 random characters from Secrets Manager's generator (an Invoke: not a resource, and
            # a new value on every run, so ignore_changes keeps the first one; rotating it makes
            # the team's existing checkpoints unloadable, see docs/trainer.md).
            key = aws.secretsmanager.get_random_password_output(
                password_length=64, exclude_punctuation=True, opts=pulumi.InvokeOutputOptions(parent=self)).random_password
            # Both fields: the Kubernetes provider's Check moves stringData into data, so the state
            # holds `data` and no `stringData`. Ignoring only stringData removed it from the new
            # inputs (the engine resets an ignored path to the old value, absent) and the Secret
            # was replaced without its key on the second `up` (seen under the real engine).
            apply_object(f"{name}-{namespace}-checkpoint-key", checkpoint_key_secret(namespace, pulumi.Output.secret(key)),
                         pulumi.ResourceOptions(parent=self, depends_on=ns_dep, ignore_changes=["stringData", "data"]))
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
