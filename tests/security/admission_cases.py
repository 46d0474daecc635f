"""Admission attacks of security review 4 (N2, N3, N10, N13, audit-3 L3) as data: one request
per row, from the attacker's seat, and the policy that must refuse it.

Each ``Case`` is what a client sends to the API server: the user (username and groups), the
operation, the object (and, for an UPDATE, the object as it stood before), in a team namespace
rendered by the platform. ``refused_by`` names the ValidatingAdmissionPolicy that must refuse it
(``None``: the request is legitimate and must be admitted, so that the refusals mean something).

The same rows are evaluated two ways:
- here, with cel-python, by ``tests/security/test_admission_attacks.py``;
- against a real kube-apiserver (1.32) with the policies applied (``tenancy.admission_policies``)
  and the namespaces created (``scheduling.namespace``): create ``before`` as a cluster admin for an
  UPDATE row, then send the request impersonating ``user`` (``kubectl --as USER --as-group G``)
  with ``--dry-run=server`` for CREATE; the refusal's message starts with
  ``ValidatingAdmissionPolicy 'mlplatform-team-<name>' ... denied request``. No node is needed:
  the pods stay pending, as they must for the UPDATE rows.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Optional

from infra.config import load_platform_config
from infra.gpu_capacity import queues, team_specs
from tests.conftest import stack_config
from workloads import kueue, scheduling, tenancy
from workloads.fsx import team_pod_volumes, team_volume_mounts
from workloads.trainingjob import container_security_context, pod_security_context

CONFIG = load_platform_config(stack_config("prod"))
SPECS = {ns.namespace: ns for ns, _ in team_specs(CONFIG)}
NAMESPACES = {ns: scheduling.namespace(spec) for ns, spec in SPECS.items()}
A, B = sorted(SPECS)[:2]  # attacker, victim
GPU_POOLS = tuple(p.name for p in CONFIG.gpu_pools)
POLICIES = tenancy.admission_policies(gpu_pools=GPU_POOLS)
UID = {ns: int(obj["metadata"]["labels"][tenancy.POSIX_ID_LABEL]) for ns, obj in NAMESPACES.items()}
ENTITLED = NAMESPACES[A]["metadata"]["annotations"][tenancy.ALLOWED_PRIORITIES_ANNOTATION].split(",")
ABOVE = [c for c in scheduling.all_priority_class_names() if c not in ENTITLED]
WHOLE_GPU_POOL = next(p.name for p in CONFIG.gpu_pools if p.sharing.value == "none")
MIG_POOL = next(p for p in CONFIG.gpu_pools if p.sharing.value == "mig")
CPU_POOL = CONFIG.cpu_pool_spec.name

TEAM_USER = {"username": "arn:aws:sts::444455556666:assumed-role/a-ml/alice",
             "groups": [tenancy.team_group(A), "system:authenticated"]}
JOB_CONTROLLER = {"username": "system:serviceaccount:kube-system:job-controller",
                  "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]}
TRAINING_OPERATOR = {"username": "system:serviceaccount:kubeflow:training-operator",
                     "groups": ["system:serviceaccounts", "system:serviceaccounts:kubeflow", "system:authenticated"]}
# Kueue's chart (its RBAC) is not applied on the test control plane: there its identity is granted
# through system:masters, as tools/cluster/controllers.py runs it; admission policies still see its name.
KUEUE = {"username": kueue.KUEUE_CONTROLLER_USER,
         "groups": ["system:serviceaccounts", "system:serviceaccounts:kueue-system", "system:masters"]}
# Argo Workflows' controller creates a Workflow's PVCs and PDB with its own ClusterRole; the chart is
# not applied on the test control plane, so there it is granted through system:masters (admission
# policies see every request, masters' included).
ARGO_CONTROLLER = {"username": "system:serviceaccount:argo-workflows:argo-workflows-workflow-controller",
                   "groups": ["system:serviceaccounts", "system:serviceaccounts:argo-workflows", "system:masters"]}
DEPLOY_ROLE = {"username": "arn:aws:sts::222233334444:assumed-role/mlp-pulumi-deploy/pulumi", "groups": ["system:masters"]}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
SYSTEM_NODE = "ip-10-0-1-23.us-west-2.compute.internal"


@dataclass(frozen=True)
class Case:
    finding: str  # the review's id
    name: str
    attack: str
    obj: dict[str, Any]
    user: dict[str, Any] = field(default_factory=lambda: TEAM_USER)
    operation: str = "CREATE"
    before: Optional[dict[str, Any]] = None  # the stored object an UPDATE changes
    refused_by: Optional[str] = None  # the policy (without the mlplatform-team- prefix); None = admitted
    # Where a layer the API server runs before the admission policies stops the row on a real
    # cluster, the words it refuses with (the policy alone is evaluated by test_admission_attacks.py).
    refused_first_on_cluster: Optional[str] = None

    @property
    def namespace(self) -> dict[str, Any]:
        return NAMESPACES[self.obj["metadata"]["namespace"]]


# -- the objects the platform renders, then the attacker's change -----------------------------------
def pod(*, gpus: int | str = 0, slice_resource: Optional[str] = None, env: Optional[list] = None, **spec_changes: Any) -> dict[str, Any]:
    """``gpus``: the nvidia.com/gpu request (and limit); a string is sent as written, "0" included."""
    uid = UID[A]
    resources: dict[str, dict[str, str]] = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
    for part in resources.values():
        if gpus or isinstance(gpus, str):
            part["nvidia.com/gpu"] = str(gpus)
        if slice_resource:
            part[slice_resource] = "1"
    container: dict[str, Any] = {"name": "main", "image": "trainer:1", "resources": resources,
                                 "securityContext": container_security_context(uid), "volumeMounts": team_volume_mounts(A)}
    if env:
        container["env"] = env
    spec = {"priorityClassName": scheduling.priority_class_name(scheduling.Priority.DEFAULT),
            "securityContext": pod_security_context(uid), "containers": [container], "volumes": team_pod_volumes()}
    spec.update(spec_changes)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": A}, "spec": spec}


def gpu_job_pod(**spec_changes: Any) -> dict[str, Any]:
    """A worker pod as the Training Operator creates it from a job Kueue admitted to a GPU flavor:
    Kueue writes the ResourceFlavor's ``nodeLabels`` into the pod template's nodeSelector and its
    tolerations into its tolerations when it starts the job (kueue v0.19.2
    pkg/podset/podset.go ``Merge``), so the selector is the stack's own flavor's."""
    flavor = kueue.resource_flavor(next(f for f in queues(CONFIG).flavors if f.name == WHOLE_GPU_POOL))["spec"]
    placement = {"nodeSelector": dict(flavor["nodeLabels"]), "tolerations": [dict(t) for t in flavor["tolerations"]]}
    return pod(gpus=8, **{**placement, **spec_changes})


def bound(obj: dict[str, Any], node: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["spec"]["nodeName"] = node
    return out


def with_labels(obj: dict[str, Any], **labels: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"].setdefault("labels", {}).update(labels)
    return out


def job(kind: str = "PyTorchJob", *, labels: Optional[dict[str, str]] = None, run_policy: Optional[dict] = None,
        **template_changes: Any) -> dict[str, Any]:
    template = {"spec": {**pod()["spec"], **template_changes}}
    meta = {"name": "j", "namespace": A, "labels": {kueue.QUEUE_LABEL: kueue.LOCAL_QUEUE_NAME, **(labels or {})}}
    if kind == "Job":
        # A Job's pods must say how they restart (the real API server refuses the Job otherwise,
        # before any admission policy sees it: tests/cluster/test_admission_cases_live.py).
        template["spec"].setdefault("restartPolicy", "Never")
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": {"template": template}}
    # The Training Operator's webhook refuses a replica without a container named ``pytorch``
    # (training-operator v1.9.4 pkg/webhooks/pytorch/pytorchjob_webhook.go validatePyTorchReplicaSpecs).
    template["spec"]["containers"] = [{**c, "name": "pytorch"} if i == 0 else c
                                      for i, c in enumerate(template["spec"]["containers"])]
    spec: dict[str, Any] = {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": template}}}
    if run_policy is not None:
        spec["runPolicy"] = run_policy
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": meta, "spec": spec}


def secret(type_: str) -> dict[str, Any]:
    obj = {"apiVersion": "v1", "kind": "Secret", "type": type_, "metadata": {"name": "s", "namespace": A}}
    if type_ == "kubernetes.io/service-account-token":
        obj["metadata"]["annotations"] = {"kubernetes.io/service-account.name": "pipeline-runner"}
    return obj


def claim(size: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "work", "namespace": A},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}, **spec}}


def _affinity(key: str, values: list[str], operator: str = "In") -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": key, "operator": operator, **({"values": values} if values else {})}]}]}}}


ALL_GPUS = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]


def _pod_affinity(kind: str = "podAffinity", *, namespaces: Optional[list[str]] = None,
                  namespace_selector: Optional[dict] = None, topology: str = "kubernetes.io/hostname",
                  preferred: bool = False) -> dict[str, Any]:
    term: dict[str, Any] = {"labelSelector": {"matchLabels": {"training.kubeflow.org/replica-type": "worker"}},
                            "topologyKey": topology}
    if namespaces is not None:
        term["namespaces"] = namespaces
    if namespace_selector is not None:
        term["namespaceSelector"] = namespace_selector
    if preferred:
        return {kind: {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]}}
    return {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def owned_by(obj: dict[str, Any], kind: str, api_version: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"]["ownerReferences"] = [{"apiVersion": api_version, "kind": kind, "name": "mine",
                                           "uid": "1d6f7c3e-0000-4000-8000-000000000001", "controller": True}]
    return out


def gated(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["spec"]["schedulingGates"] = [{"name": kueue.ADMISSION_GATE}]
    return out

# Kueue's pod webhook gates every pod of a team namespace that no job it manages owns (kueue v0.19.2
# pod_webhook.go Default: ``gate(&pod.pod)``), and the API server refuses a gated pod a node
# (k8s.io/kubernetes pkg/apis/core/validation: "cannot be set until all schedulingGates have been cleared").
NODE_NAME_ON_A_GATED_POD = "spec.nodeName: Forbidden: cannot be set until all schedulingGates have been cleared"

CASES: list[Case] = [
    # -- legitimate requests (must be admitted) ----------------------------------------------------
    Case("baseline", "cpu-pod", "the platform's CPU pod, as a team member creates it", pod()),
    Case("baseline", "cpu-pipeline-pod", "a pipeline step on the CPU pool", pod(nodeSelector={"mlplatform.io/pool": CPU_POOL})),
    Case("baseline", "gpu-worker", "a GPU worker from an admitted PyTorchJob", gpu_job_pod(), user=TRAINING_OPERATOR),
    Case("baseline", "mig-worker", "a MIG-slice worker from an admitted Job",
         pod(slice_resource="nvidia.com/mig-1g.10gb", nodeSelector={"mlplatform.io/pool": MIG_POOL.name},
             tolerations=[dict(GPU_TOLERATION), {"key": "mlplatform.io/gpu-sharing", "operator": "Exists", "effect": "NoSchedule"}]),
         user=JOB_CONTROLLER),
    Case("baseline", "bound-gpu-worker-relabelled", "Kueue or the operator relabels a running GPU worker",
         with_labels(bound(gpu_job_pod(), "gpu-node-1"), x="y"), user=TRAINING_OPERATOR, operation="UPDATE",
         before=bound(gpu_job_pod(), "gpu-node-1")),
    Case("baseline", "pytorchjob-entitled-priority", "a PyTorchJob naming an entitled Kueue priority",
         job(run_policy={"schedulingPolicy": {"priorityClass": ENTITLED[0]}})),
    Case("baseline", "opaque-secret", "a team Secret (the MLflow password)", secret("Opaque")),

    # -- N2: GPUs without a GPU request ---------------------------------------------------------------
    Case("N2", "cpu-pod-on-gpu-pool", "a bare GPU-less pod that tolerates the GPU taint, selects the H100 pool "
         "and asks the runtime for every GPU (NVIDIA_VISIBLE_DEVICES=all)",
         pod(env=ALL_GPUS, tolerations=[dict(GPU_TOLERATION)], nodeSelector={"mlplatform.io/pool": WHOLE_GPU_POOL}),
         refused_by="gpu-less-pods"),
    Case("N2", "cpu-pod-tolerates-gpu-taint", "the same with the toleration alone (Karpenter picks a GPU pool)",
         pod(env=ALL_GPUS, tolerations=[dict(GPU_TOLERATION)]), refused_by="gpu-less-pods"),
    Case("N2", "cpu-pod-karpenter-nodepool", "select the GPU NodePool by Karpenter's label",
         pod(nodeSelector={"karpenter.sh/nodepool": f"gpu-{WHOLE_GPU_POOL}"}), refused_by="gpu-less-pods"),
    Case("N2", "cpu-pod-gpu-affinity", "require the GPU type by node affinity",
         pod(affinity=_affinity("mlplatform.io/gpu-type", [WHOLE_GPU_POOL])), refused_by="gpu-less-pods"),
    Case("N2", "cpu-pod-instance-gpu-label", "select any node with a GPU by Karpenter's instance label",
         pod(affinity=_affinity("karpenter.k8s.aws/instance-gpu-count", [], "Exists")), refused_by="gpu-less-pods"),
    Case("N2", "cpu-pod-pool-notin", "select every pool but the CPU one (NotIn)",
         pod(affinity=_affinity("mlplatform.io/pool", [CPU_POOL], "NotIn")), refused_by="gpu-less-pods"),
    Case("N2", "cpu-pod-sharing-taint", "tolerate the shared pools' taint",
         pod(tolerations=[{"key": "mlplatform.io/gpu-sharing", "operator": "Exists"}]), refused_by="gpu-less-pods"),
    Case("N2", "cpu-job-pod-on-gpu-node", "a GPU-less Job pod (the job controller creates it from the team's template)",
         pod(env=ALL_GPUS, tolerations=[dict(GPU_TOLERATION)], nodeSelector={"mlplatform.io/pool": WHOLE_GPU_POOL}),
         user=JOB_CONTROLLER, refused_by="gpu-less-pods"),
    Case("N2", "pending-pod-adds-gpu-toleration", "create a pending GPU-less pod, then add the GPU toleration by UPDATE",
         pod(tolerations=[dict(GPU_TOLERATION)]), operation="UPDATE", before=pod(), refused_by="gpu-less-pods"),
    Case("N2", "bare-mig-slice-pod", "a bare pod requesting a MIG slice (outside Kueue's quota)",
         pod(slice_resource="nvidia.com/mig-1g.10gb"), refused_by="gpu-pods"),
    Case("N2", "bare-shared-gpu-pod", "a bare pod requesting a time-sliced GPU (outside Kueue's quota)",
         pod(slice_resource="nvidia.com/gpu.shared"), refused_by="gpu-pods"),

    # A zero GPU request is no GPU request: the device plugin allocates nothing, Kueue fits it in any
    # quota (v0.19.2 flavorassigner.go skips zero quantities only for resources the ClusterQueue does
    # not cover), and EKS's ExtendedResourceToleration plugin adds the GPU toleration for the key
    # whatever its quantity. Such a pod is held to the GPU-less rules.
    Case("zero-gpu", "zero-gpu-job-pod-on-h100", "a Job pod asking for nvidia.com/gpu: \"0\" on the H100 pool, with the "
         "GPU toleration and NVIDIA_VISIBLE_DEVICES=all (the job controller creates it from the team's template)",
         pod(gpus="0", env=ALL_GPUS, tolerations=[dict(GPU_TOLERATION)], nodeSelector={"mlplatform.io/pool": WHOLE_GPU_POOL}),
         user=JOB_CONTROLLER, refused_by="gpu-less-pods"),
    Case("zero-gpu", "zero-gpu-pytorchjob-worker", "the same as a PyTorchJob worker the Training Operator creates",
         pod(gpus="0", env=ALL_GPUS, tolerations=[dict(GPU_TOLERATION)], nodeSelector={"mlplatform.io/pool": WHOLE_GPU_POOL}),
         user=TRAINING_OPERATOR, refused_by="gpu-less-pods"),
    Case("zero-gpu", "zero-gpu-bare-pod-tolerates-gpu", "a bare team pod asking for nvidia.com/gpu: \"0\" with the GPU toleration",
         pod(gpus="0", env=ALL_GPUS, tolerations=[dict(GPU_TOLERATION)]), refused_by="gpu-less-pods"),

    # -- co-location: choosing (or refusing) another team's node ------------------------------------
    Case("baseline", "spread-own-workers", "a team's workers spread over nodes by anti-affinity to its own pods",
         pod(affinity=_pod_affinity("podAntiAffinity")), user=TRAINING_OPERATOR),
    Case("baseline", "affinity-own-namespace-named", "affinity to the team's own pods, its namespace named",
         pod(affinity=_pod_affinity(namespaces=[A]))),
    Case("co-location", "gpu-worker-follows-team-b", "a GPU worker with required podAffinity to team B's workers "
         "(namespaceSelector on team B, topologyKey hostname), to share and then fault B's node",
         gpu_job_pod(affinity=_pod_affinity(namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": B}})),
         user=TRAINING_OPERATOR, refused_by="pod-placement"),
    Case("co-location", "affinity-namespaces-list", "the same by listing team B's namespace",
         pod(affinity=_pod_affinity(namespaces=[A, B])), refused_by="pod-placement"),
    Case("co-location", "preferred-affinity-to-team-b", "the same as a preferred term",
         pod(affinity=_pod_affinity(namespaces=[B], preferred=True)), refused_by="pod-placement"),
    Case("co-location", "anti-affinity-every-namespace-zone", "required anti-affinity to every namespace's pods by zone "
         "(the scheduler then keeps other teams' new pods out of that zone)",
         pod(affinity=_pod_affinity("podAntiAffinity", namespace_selector={}, topology="topology.kubernetes.io/zone")),
         refused_by="pod-placement"),
    Case("co-location", "pytorchjob-template-follows-team-b", "a PyTorchJob whose template follows team B's pods",
         job(affinity=_pod_affinity(namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": B}})),
         refused_by="queue-label-pytorchjobs"),

    # -- Kueue for every pod: no way around the admission gate ----------------------------------------
    Case("baseline", "job-controller-pod-owned-by-its-job", "the job controller creates a Job's pod, owned by the Job",
         owned_by(pod(), "Job", "batch/v1"), user=JOB_CONTROLLER),
    Case("baseline", "kueue-lifts-its-gate", "Kueue admits a bare pod: it lifts the admission gate",
         pod(), user=KUEUE, operation="UPDATE", before=gated(pod())),
    Case("kueue-bypass", "bare-pod-claims-a-job-owner", "a bare pod naming the team's own Job as its controller, which "
         "Kueue trusts and does not gate", owned_by(pod(), "Job", "batch/v1"), refused_by="pod-queue"),
    Case("kueue-bypass", "bare-pod-claims-a-pod-owner", "a bare pod owned by another of the team's pods (Kueue manages "
         "pods, so their dependants are skipped)", owned_by(pod(), "Pod", "v1"), refused_by="pod-queue"),
    Case("kueue-bypass", "team-lifts-the-admission-gate", "a team member removes Kueue's admission gate from a gated pod",
         pod(), operation="UPDATE", before=gated(pod()), refused_by="pod-queue"),

    # -- N3: system nodes and chosen nodes ------------------------------------------------------------
    Case("N3", "nodename-system-node", "skip the scheduler: spec.nodeName of a system node",
         pod(nodeName=SYSTEM_NODE), refused_by="pod-placement", refused_first_on_cluster=NODE_NAME_ON_A_GATED_POD),
    Case("N3", "nodename-gpu-node", "pin a GPU-less pod onto the node running team B's job",
         pod(env=ALL_GPUS, nodeName="gpu-node-of-team-b"), refused_by="pod-placement",
         refused_first_on_cluster=NODE_NAME_ON_A_GATED_POD),
    Case("N3", "pending-pod-adds-system-toleration", "create a pending pod selecting the system node group, "
         "then add the CriticalAddonsOnly toleration by UPDATE",
         pod(nodeSelector={"eks.amazonaws.com/nodegroup": "mlp-prod-system"},
             tolerations=[{"key": "CriticalAddonsOnly", "operator": "Exists"}]),
         operation="UPDATE", before=pod(nodeSelector={"eks.amazonaws.com/nodegroup": "mlp-prod-system"}),
         refused_by="pod-placement"),
    Case("N3", "job-template-nodename", "a Job whose pod template names a node",
         job("Job", nodeName=SYSTEM_NODE), refused_by="queue-label-jobs"),
    Case("N3", "pytorchjob-template-nodename", "a PyTorchJob whose template names a node",
         job(nodeName=SYSTEM_NODE), refused_by="queue-label-pytorchjobs"),
    Case("N3", "startup-taint-toleration", "tolerate the GPU readiness taint to land on an unchecked node",
         gpu_job_pod(tolerations=[dict(GPU_TOLERATION), {"key": "node.mlplatform.io/gpu-not-ready", "operator": "Exists"}]),
         user=TRAINING_OPERATOR, refused_by="pod-placement"),

    # -- N10: Kueue priority from a field the policy did not check --------------------------------------
    Case("N10", "pytorchjob-scheduling-priority", "a PyTorchJob with runPolicy.schedulingPolicy.priorityClass above "
         "the entitlement (its templates keep the default)",
         job(run_policy={"schedulingPolicy": {"priorityClass": ABOVE[-1]}}), refused_by="queue-label-pytorchjobs"),
    Case("N10", "kueue-workload-priority-label", "a Job naming a Kueue WorkloadPriorityClass",
         job("Job", labels={tenancy.KUEUE_PRIORITY_LABEL: ABOVE[-1]}), refused_by="queue-label-jobs"),

    # -- N13: credentials that outlive membership ----------------------------------------------------
    Case("N13", "service-account-token-secret", "mint a never-expiring token Secret for pipeline-runner",
         secret("kubernetes.io/service-account-token"), refused_by="secrets"),

    # -- storage and drains through Argo Workflows' controller ----------------------------------------
    Case("baseline", "platform-fsx-claim", "the platform's claim on the team's FSx volume",
         claim("1200Gi", storageClassName="", volumeName="mlp-prod-datasets-team-applied-claimed"), user=DEPLOY_ROLE),
    Case("workflow-volumes", "workflow-claim-64ti-gp3", "a Workflow's volumeClaimTemplate of 64 TiB gp3, created by "
         "the workflow controller", claim("64Ti", storageClassName="gp3"), user=ARGO_CONTROLLER, refused_by="volume-claims"),
    Case("workflow-volumes", "workflow-claim-default-class", "the same without a class (the default class fills it in)",
         claim("64Ti"), user=ARGO_CONTROLLER, refused_by="volume-claims"),
    Case("workflow-volumes", "workflow-pdb", "a Workflow's spec.podDisruptionBudget, holding its nodes against drains",
         {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "wf", "namespace": A},
          "spec": {"minAvailable": 1, "selector": {"matchLabels": {"workflows.argoproj.io/workflow": "wf"}}}},
         user=ARGO_CONTROLLER, refused_by="disruption-budgets"),

    # -- audit 3 L3: storage outside quota ----------------------------------------------------------
    Case("L3", "generic-ephemeral-volume", "a 64 TiB gp3 volume through a generic ephemeral volume",
         pod(volumes=[*team_pod_volumes(), {"name": "big", "ephemeral": {"volumeClaimTemplate": {"spec": {
             "accessModes": ["ReadWriteOnce"], "storageClassName": "gp3",
             "resources": {"requests": {"storage": "64Ti"}}}}}}]), refused_by="pod-volumes"),
]
