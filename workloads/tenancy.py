"""The tenant boundary inside the cluster: what a team may do in its own namespace, and what the
API server refuses whoever asks (pure functions, validated against Kubernetes 1.32).

- A Kubernetes group per team (``mlplatform:team-<name>``), given by the team's EKS access entry
  and bound to a platform ``Role`` in the team namespace: exactly the rights the documented
  ``workloads submit`` and ``argo submit`` paths need, nothing that edits the network
  (NetworkPolicies, Services), nothing that impersonates or grants.
- ``ValidatingAdmissionPolicies`` (admissionregistration.k8s.io/v1, GA since Kubernetes 1.30;
  Kubernetes docs, "Validating Admission Policy") bound to every namespace labelled
  ``mlplatform.io/team``. They read the namespace's own labels (``namespaceObject``), which a
  team cannot edit (Namespaces are cluster-scoped), so one policy serves every team:

  ``pod-identity``     every Pod runs as the team's uid/gid (runAsUser, runAsGroup, fsGroup on
                       the pod; containers may not override them), so files on the shared FSx
                       belong to the team that wrote them.
  ``pod-placement``    no toleration of the system nodes' taint, no selector or affinity on the
                       system-node label, no ``spec.nodeName`` (it skips the scheduler, and the
                       kubelet checks only NoExecute taints), a priority class the team is
                       entitled to, and pod (anti-)affinity to the team's own pods only; on
                       CREATE and UPDATE (an UPDATE may add tolerations).
  ``gpu-pods``         a Pod that requests GPUs (whole, shared or MIG: any ``nvidia.com/``
                       resource) is created only by a job controller (the Job controller, the
                       Training Operator, JobSet), i.e. from a job Kueue admitted, so the
                       per-GPU-type quota of the team's ClusterQueue holds for pods too; and a
                       Pod that requests none may not tolerate the GPU or sharing taint nor
                       select a GPU pool (a GPU-less pod on a GPU node is how a tenant reaches
                       GPUs without quota, security-4 N2).
  ``queue-label``      Jobs, PyTorchJobs, TrainJobs and JobSets carry the team's LocalQueue
                       label (Kueue also manages unlabelled ones: ``manageJobsWithoutQueueName``),
                       their pod templates name an entitled priority class and no node, and a
                       PyTorchJob's ``runPolicy.schedulingPolicy.priorityClass`` (Kueue's source
                       of the workload priority) is entitled too.
  ``pod-queue``        no pod created by a team member names a job (or pod) as its owner, and
                       nobody but Kueue lifts Kueue's admission gate: every team pod is admitted
                       by Kueue against the team's ClusterQueue (plain pods included).
  ``secrets``          no Secret of type ``kubernetes.io/service-account-token``: a long-lived
                       token outlives the member who minted it (security-4 N13).
  ``pod-volumes``      no generic ``ephemeral`` volume: its PVC is created by the ephemeral-volume
                       controller, outside the team's RBAC (no PVC create) and any quota.
  ``services``         no Service of type LoadBalancer or NodePort, no externalIPs.
  ``volume-claims``    a PVC binds a volume the platform made (no class, a volumeName): no
                       dynamically provisioned gp3 volume through Argo Workflows' controller.
  ``disruption-budgets`` no PodDisruptionBudget (it would hold nodes against drains).

The CEL uses the standard CEL macros and functions (``has``, ``all``, ``exists``, ``in``,
``startsWith``, ``size``, ``int``, ``string``) and Kubernetes' quantity library (``quantity``,
``isGreaterThan``: GPU requests are compared as quantities); tests evaluate it with a CEL library
on sample objects, the quantity functions ported from k8s.io/apimachinery's ParseQuantity.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from workloads.gpu_sharing import MIG_PENDING_TAINT, SHARING_LABEL, SHARING_TAINT
from workloads.karpenter import EFA_LABEL, GPU_RESOURCE, GPU_TAINT, GPU_TYPE_LABEL, POOL_LABEL, READINESS_STARTUP_TAINT
from workloads import kueue
from workloads.kueue import QUEUE_LABEL
from workloads.placement import SYSTEM_NODE_LABEL_KEY, SYSTEM_NODE_TAINT
from workloads.problems import accepts_enum_values
from workloads.scheduling import PRIORITY_VALUES, Priority, priority_class_name

VAP_API = "admissionregistration.k8s.io/v1"
TEAM_LABEL = "mlplatform.io/team"
# Labels the platform sets on a team namespace; the policies read them.
POSIX_ID_LABEL = "mlplatform.io/posix-id"
ALLOWED_PRIORITIES_ANNOTATION = "mlplatform.io/allowed-priority-classes"
LOCAL_QUEUE_LABEL = "mlplatform.io/local-queue"
# priority.mlplatform.io/<class>: "allowed" for each class the team is entitled to.
PRIORITY_LABEL_PREFIX = "priority.mlplatform.io/"
# Kueue's WorkloadPriorityClass label (kueue pkg/constants ``WorkloadPriorityClassLabel``).
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
POLICY_PREFIX = "mlplatform-team-"
TEAM_ROLE = "mlplatform-team"
# Service accounts of these namespaces run the controllers that create a job's pods (and a
# TrainJob's JobSet and Jobs): kube-controller-manager's job-controller (kube-system, EKS runs
# it with per-controller service accounts), the Training Operator (kubeflow), Kubeflow Trainer
# and its JobSet controller (kubeflow-system). Nothing of a team runs there.
CONTROLLER_NAMESPACES = ("kube-system", "kubeflow", "kubeflow-system")
# Resources the NVIDIA device plugin serves: nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-*.
NVIDIA_RESOURCE_PREFIX = "nvidia.com/"
# Node labels only GPU nodes carry: the platform's GPU type and EFA labels and the sharing label
# (workloads/karpenter.py GpuPoolSpec.node_labels), Karpenter's GPU instance labels
# (karpenter.k8s.aws/instance-gpu-name, -count, -manufacturer, -memory) and the NVIDIA labels of GPU
# feature discovery and the device plugin's config (nvidia.com/...).
GPU_ONLY_NODE_LABELS = frozenset({GPU_TYPE_LABEL, EFA_LABEL, SHARING_LABEL})
GPU_ONLY_NODE_LABEL_PREFIXES = ("karpenter.k8s.aws/instance-gpu", "karpenter.k8s.aws/instance-accelerator", "nvidia.com/")
# Labels that name a pool: the platform's and Karpenter's (karpenter.sh/nodepool).
POOL_SELECTOR_KEYS = [POOL_LABEL, "karpenter.sh/nodepool"]
# Startup taints a team pod may never tolerate: the GPU readiness and MIG gates (a pod that
# tolerates them lands on a node whose GPUs are unchecked or being repartitioned).
STARTUP_TAINTS = (READINESS_STARTUP_TAINT, MIG_PENDING_TAINT)
# POSIX ids: 65534 is what root squash maps root to (nobody); below 10000 are image users
# (checkov CKV_K8S_40 asks for >= 10000).
POSIX_ID_MIN = 10000
POSIX_ID_MAX = 60000


def team_group(namespace: str) -> str:
    """The Kubernetes group a team's EKS access entry carries (never ``system:``, which EKS refuses)."""
    return f"mlplatform:{namespace}"


def default_posix_id(team: str) -> int:
    """A stable uid/gid for a team that names none: derived from its name (not its position, so
    adding a team never re-owns another team's files). Collisions are refused by the config."""
    return POSIX_ID_MIN + 10000 + zlib.crc32(team.encode()) % (POSIX_ID_MAX - POSIX_ID_MIN - 10000)


def entitled_priority_classes(default: Priority) -> list[str]:
    """A team may use its default priority and every lower one, never a higher one."""
    ceiling = PRIORITY_VALUES[Priority(default)]
    return sorted(priority_class_name(p) for p in Priority if PRIORITY_VALUES[p] <= ceiling)


@accepts_enum_values
@dataclass(frozen=True)
class TeamTenancy:
    """What the policies need to know about one team namespace."""

    namespace: str
    posix_id: int
    default_priority: Priority
    local_queue: str

    def __post_init__(self) -> None:
        if not POSIX_ID_MIN <= self.posix_id <= POSIX_ID_MAX:
            raise ValueError(f"TeamTenancy({self.namespace}).posix_id: {self.posix_id} is outside "
                             f"{POSIX_ID_MIN}-{POSIX_ID_MAX}")

    def namespace_labels(self) -> dict[str, str]:
        return {POSIX_ID_LABEL: str(self.posix_id), LOCAL_QUEUE_LABEL: self.local_queue,
                **{f"{PRIORITY_LABEL_PREFIX}{c}": "allowed" for c in entitled_priority_classes(self.default_priority)}}

    def namespace_annotations(self) -> dict[str, str]:
        # Annotations: label values cannot hold a list.
        return {ALLOWED_PRIORITIES_ANNOTATION: ",".join(entitled_priority_classes(self.default_priority))}


# -- admission policies -------------------------------------------------------------------------
_NS_UID = f"int(namespaceObject.metadata.labels['{POSIX_ID_LABEL}'])"
_ALLOWED = f"namespaceObject.metadata.annotations['{ALLOWED_PRIORITIES_ANNOTATION}']"
_CONTROLLER = " || ".join(f"request.userInfo.username.startsWith('system:serviceaccount:{ns}:')"
                          for ns in CONTROLLER_NAMESPACES)


_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


def _every_container(pod_spec: str, predicate: str) -> str:
    """CEL: ``predicate`` (on ``c``) holds for every container of a pod spec, init and ephemeral
    included. One macro per list, never ``containers + initContainers``: kube-apiserver types each
    list with its own schema type, and its type checker finds no ``_+_`` overload for two of them
    ("found no matching overload for '_+_' applied to '(list(...spec.containers.@idx),
    list(...spec.initContainers.@idx))'", status.typeChecking of the policy; tests/cluster)."""
    first, *optional = _CONTAINER_LISTS
    return "(" + " && ".join([f"{pod_spec}.{first}.all(c, {predicate})",
                              *(f"(!has({pod_spec}.{f}) || {pod_spec}.{f}.all(c, {predicate}))" for f in optional)]) + ")"


def _any_container(pod_spec: str, predicate: str) -> str:
    """CEL: ``predicate`` (on ``c``) holds for some container of a pod spec (see _every_container)."""
    first, *optional = _CONTAINER_LISTS
    return "(" + " || ".join([f"{pod_spec}.{first}.exists(c, {predicate})",
                              *(f"(has({pod_spec}.{f}) && {pod_spec}.{f}.exists(c, {predicate}))" for f in optional)]) + ")"


def _priority_ok(pod_spec: str) -> str:
    # One namespace label per entitled class: a map lookup, exact, no string parsing. No class
    # named: the cluster default (training-default, globalDefault), which every team may use;
    # on a Pod the Priority admission plugin has already filled it in before validation.
    return (f"!has({pod_spec}.priorityClassName) || "
            f"('{PRIORITY_LABEL_PREFIX}' + {pod_spec}.priorityClassName) in namespaceObject.metadata.labels")


def _policy(name: str, *, resources: Sequence[tuple[str, str, str]], validations: list[dict[str, Any]],
            match_conditions: Sequence[dict[str, str]] = (), operations: Sequence[str] = ("CREATE", "UPDATE"),
            ) -> list[dict[str, Any]]:
    """A policy and its binding to every team namespace (Deny: refuse, and audit the refusal)."""
    full = f"{POLICY_PREFIX}{name}"
    rules = [{"apiGroups": [group], "apiVersions": [version], "resources": [resource], "operations": list(operations)}
             for group, version, resource in resources]
    spec: dict[str, Any] = {
        # Fail closed: an error in evaluation refuses the request.
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": rules},
        "validations": validations,
    }
    if match_conditions:
        spec["matchConditions"] = list(match_conditions)
    return [
        {"apiVersion": VAP_API, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": full}, "spec": spec},
        {"apiVersion": VAP_API, "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": full},
         "spec": {"policyName": full, "validationActions": ["Deny", "Audit"],
                  "matchResources": {"namespaceSelector": {"matchExpressions": [
                      {"key": TEAM_LABEL, "operator": "Exists"}]}}}},
    ]


def _pod_identity() -> list[dict[str, Any]]:
    sc = "object.spec.securityContext"
    ids = ("runAsUser", "runAsGroup", "fsGroup")
    pod_ids = " && ".join(f"has({sc}.{f}) && {sc}.{f} == {_NS_UID}" for f in ids)
    container_ids = _every_container("object.spec", (
        f"!has(c.securityContext) || ("
        f"(!has(c.securityContext.runAsUser) || c.securityContext.runAsUser == {_NS_UID}) && "
        f"(!has(c.securityContext.runAsGroup) || c.securityContext.runAsGroup == {_NS_UID}))"))
    groups = (f"!has({sc}.supplementalGroups) || {sc}.supplementalGroups.all(g, g == {_NS_UID})")
    return _policy("pod-identity", resources=[("", "v1", "pods")], operations=("CREATE",), validations=[
        {"expression": f"has({sc}) && {pod_ids}",
         "messageExpression": f"'pods in ' + namespaceObject.metadata.name + ' run as uid, gid and fsGroup ' + "
                              f"namespaceObject.metadata.labels['{POSIX_ID_LABEL}'] + ' (the team\\'s files on FSx)'",
         "reason": "Forbidden"},
        {"expression": container_ids, "message": "a container may not run as another uid or gid than the team's",
         "reason": "Forbidden"},
        {"expression": groups, "message": "supplementalGroups may only hold the team's gid", "reason": "Forbidden"},
    ])


def _own_namespace_pod_terms(pod_spec: str) -> str:
    """CEL: every pod (anti-)affinity term of the spec looks at pods of its own namespace only: no
    ``namespaceSelector`` (an empty one selects every namespace) and ``namespaces``, if set,
    naming only the pod's own (Kubernetes API: PodAffinityTerm; the default is the pod's
    namespace)."""
    term_ok = "(!has({t}.namespaceSelector) && (!has({t}.namespaces) || {t}.namespaces.all(n, n == namespaceObject.metadata.name)))"

    def kind_ok(kind: str) -> str:
        base = f"{pod_spec}.affinity.{kind}"
        required = f"{base}.requiredDuringSchedulingIgnoredDuringExecution"
        preferred = f"{base}.preferredDuringSchedulingIgnoredDuringExecution"
        return (f"(!has({base}) || ((!has({required}) || {required}.all(t, {term_ok.format(t='t')})) && "
                f"(!has({preferred}) || {preferred}.all(w, {term_ok.format(t='w.podAffinityTerm')}))))")
    return f"(!has({pod_spec}.affinity) || ({kind_ok('podAffinity')} && {kind_ok('podAntiAffinity')}))"


CROSS_NAMESPACE_AFFINITY_MESSAGE = (
    "pod affinity and anti-affinity look at the team's own pods only (no namespaceSelector, no other namespace in "
    "namespaces): another team's pods are not yours to follow or to push away")


def _pod_placement_validations(pod_spec: str, *, what: str) -> list[dict[str, Any]]:
    taint = SYSTEM_NODE_TAINT["key"]
    label = SYSTEM_NODE_LABEL_KEY
    startup = [t["key"] for t in STARTUP_TAINTS]
    terms = f"{pod_spec}.affinity.nodeAffinity"
    affinity_clean = (
        f"!has({pod_spec}.affinity) || !has({terms}) || ("
        f"(!has({terms}.requiredDuringSchedulingIgnoredDuringExecution) || "
        f"{terms}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms.all(t, "
        f"!has(t.matchExpressions) || t.matchExpressions.all(e, e.key != '{label}'))) && "
        f"(!has({terms}.preferredDuringSchedulingIgnoredDuringExecution) || "
        f"{terms}.preferredDuringSchedulingIgnoredDuringExecution.all(p, "
        f"!has(p.preference.matchExpressions) || p.preference.matchExpressions.all(e, e.key != '{label}'))))")
    return [
        {"expression": (f"!has({pod_spec}.tolerations) || {pod_spec}.tolerations.all(t, "
                        f"!has(t.key) ? !(has(t.operator) && t.operator == 'Exists') : t.key != '{taint}')"),
         "message": f"{what} may not tolerate the system nodes' taint {taint} (nor every taint)", "reason": "Forbidden"},
        {"expression": f"!has({pod_spec}.tolerations) || {pod_spec}.tolerations.all(t, !has(t.key) || !(t.key in {startup!r}))",
         "message": (f"{what} may not tolerate the platform's startup taints {', '.join(startup)}: they keep pods off a "
                     "GPU node until its checks pass"),
         "reason": "Forbidden"},
        {"expression": f"!has({pod_spec}.nodeSelector) || !('{label}' in {pod_spec}.nodeSelector)",
         "message": f"{what} may not select the system nodes ({label})", "reason": "Forbidden"},
        {"expression": affinity_clean, "message": f"{what} may not use node affinity on {label}", "reason": "Forbidden"},
        # The scheduler binds through pods/binding (a subresource these rules do not match), so
        # only a request that names a node itself sets nodeName; the kubelet then admits the pod
        # checking NoExecute taints only (kubernetes pkg/kubelet/lifecycle/predicate.go).
        {"expression": f"!has({pod_spec}.nodeName) || {pod_spec}.nodeName == ''",
         "message": f"{what} may not name its node (spec.nodeName): the scheduler places team pods", "reason": "Forbidden"},
        {"expression": _priority_ok(pod_spec),
         "messageExpression": (f"'{what} must name one of the priority classes ' + {_ALLOWED} + "
                               "' (the team\\'s entitlement)'"),
         "reason": "Forbidden"},
        # Co-location is a weapon between tenants: affinity to another team's pods picks whose
        # node an attacker shares (a noisy or faulty neighbour on a shared GPU node), and the
        # scheduler also applies an existing pod's required anti-affinity to incoming pods
        # (kube-scheduler InterPodAffinity ``satisfyExistingPodsAntiAffinity``), so one pod with
        # anti-affinity to every namespace's pods and topologyKey zone keeps other teams out of
        # a zone. Within the team (spreading its own workers) nothing changes.
        {"expression": _own_namespace_pod_terms(pod_spec), "message": f"{what}: {CROSS_NAMESPACE_AFFINITY_MESSAGE}",
         "reason": "Forbidden"},
    ]


def _pod_placement() -> list[dict[str, Any]]:
    # UPDATE too: Kubernetes lets an update add tolerations (ValidatePodUpdate: "spec.tolerations
    # (only additions to existing tolerations)"), and a gated pod's selector and affinity. The
    # nodeName rule holds on UPDATE as well: a pod's nodeName is set by pods/binding, never by an
    # UPDATE of the pod (ValidatePodUpdate refuses the change), so a bound pod is only refused if
    # it was created with it, which CREATE already refused.
    return _policy("pod-placement", resources=[("", "v1", "pods")],
                   validations=_pod_placement_validations("object.spec", what="a pod"),
                   match_conditions=[_NOT_BOUND])


# A bound pod's UPDATE (labels, Kueue's finalizer, graceful deletion) carries the nodeName the
# scheduler set through pods/binding: placement was decided at binding time, so it is not
# re-validated (the CREATE and the pending-pod UPDATEs were).
_NOT_BOUND = {"name": "not-a-bound-pod-update",
              "expression": "request.operation != 'UPDATE' || !has(oldObject.spec.nodeName) || oldObject.spec.nodeName == ''"}


def _requests_gpu(pod_spec: str) -> str:
    """CEL: some container requests a GPU of any kind (``nvidia.com/gpu``, ``nvidia.com/gpu.shared``,
    ``nvidia.com/mig-<profile>``): every NVIDIA resource the device plugin serves, in a quantity
    above zero. ``nvidia.com/gpu: "0"`` asks for no device: the device plugin allocates none and
    Kueue fits it in any quota, so such a pod is GPU-less and held to the GPU-less rules.

    The quantity is compared with the Kubernetes CEL quantity library (``quantity()``,
    ``isGreaterThan``; k8s.io/apiserver pkg/cel/library/quantity.go, in the base environment
    since compatibility version 1.28: pkg/cel/environment/base.go), so "0", "0m", "0.0" and
    "0Ki" are all zero. Limits too: on a Pod the API server defaults missing requests from limits,
    on a template nothing does yet."""
    def any_nvidia(field: str) -> str:
        return (f"(has(c.resources.{field}) && c.resources.{field}.exists(r, r.startsWith('{NVIDIA_RESOURCE_PREFIX}') && "
                f"quantity(string(c.resources.{field}[r])).isGreaterThan(quantity('0'))))")
    return _any_container(pod_spec, f"has(c.resources) && ({any_nvidia('requests')} || {any_nvidia('limits')})")


def _selects_gpu_pool(pod_spec: str, gpu_pools: Sequence[str]) -> str:
    """CEL: the pod selects nodes by a label only GPU nodes carry, or by a GPU pool's name."""
    keys = sorted(GPU_ONLY_NODE_LABELS)
    prefixes = list(GPU_ONLY_NODE_LABEL_PREFIXES)
    # The platform's pool label holds the pool name, Karpenter's the NodePool's (GpuPoolSpec.resource_name).
    pools = sorted({*gpu_pools, *(f"gpu-{p}" for p in gpu_pools)})

    def gpu_key(k: str) -> str:
        return f"({k} in {keys!r} || {' || '.join(f'{k}.startsWith({p!r})' for p in prefixes)})"

    by_selector = (f"(has({pod_spec}.nodeSelector) && {pod_spec}.nodeSelector.exists(k, {gpu_key('k')} || "
                   f"(k in {POOL_SELECTOR_KEYS!r} && {pod_spec}.nodeSelector[k] in {pools!r})))")
    # An expression on a pool key may name CPU pools only (In); NotIn, Exists or Gt on it could
    # match a GPU pool.
    expression = (f"{gpu_key('e.key')} || (e.key in {POOL_SELECTOR_KEYS!r} && "
                  f"!(e.operator == 'In' && has(e.values) && e.values.all(v, !(v in {pools!r}))))")
    terms = f"{pod_spec}.affinity.nodeAffinity"
    required = f"{terms}.requiredDuringSchedulingIgnoredDuringExecution"
    preferred = f"{terms}.preferredDuringSchedulingIgnoredDuringExecution"
    by_affinity = (f"(has({pod_spec}.affinity) && has({terms}) && ("
                   f"(has({required}) && {required}.nodeSelectorTerms.exists(t, has(t.matchExpressions) && "
                   f"t.matchExpressions.exists(e, {expression}))) || "
                   f"(has({preferred}) && {preferred}.exists(p, has(p.preference.matchExpressions) && "
                   f"p.preference.matchExpressions.exists(e, {expression})))))")
    return f"({by_selector} || {by_affinity})"


def _gpu_pods(gpu_pools: Sequence[str]) -> list[dict[str, Any]]:
    requests_gpu = _requests_gpu("object.spec")
    gpu_taints = sorted({GPU_TAINT["key"], SHARING_TAINT["key"]})
    tolerates_gpu = f"(has(object.spec.tolerations) && object.spec.tolerations.exists(t, has(t.key) && t.key in {gpu_taints!r}))"
    bare = _policy("gpu-pods", resources=[("", "v1", "pods")], operations=("CREATE",), validations=[
        {"expression": f"!({requests_gpu}) || {_CONTROLLER}",
         "message": ("a pod that requests GPUs is created by a job controller from a job Kueue admitted: "
                     "submit a PyTorchJob, TrainJob or Job with the team's queue label"),
         "reason": "Forbidden"},
    ])
    # Whoever creates it (a team member, or a job controller from a template Kueue admitted to a
    # GPU flavor): a pod without a GPU request has no business on a GPU node. There the NVIDIA
    # runtime is the last line (GPU nodes ignore NVIDIA_VISIBLE_DEVICES from unprivileged
    # containers, workloads/karpenter.py); this keeps such pods off GPU nodes in the first place,
    # so they neither make Karpenter launch one nor take its CPU and memory from a GPU job.
    gpu_less = _policy("gpu-less-pods", resources=[("", "v1", "pods")], match_conditions=[_NOT_BOUND], validations=[
        {"expression": f"{requests_gpu} || !{tolerates_gpu}",
         "message": (f"a pod that requests no GPU may not tolerate the GPU nodes' taints {', '.join(gpu_taints)}: "
                     f"request {GPU_RESOURCE} (or a GPU slice) through a job, or drop the toleration"),
         "reason": "Forbidden"},
        {"expression": f"{requests_gpu} || !{_selects_gpu_pool('object.spec', gpu_pools)}",
         "message": ("a pod that requests no GPU may not select a GPU pool's nodes (GPU pool names, "
                     f"{', '.join(sorted(GPU_ONLY_NODE_LABELS))}, {', '.join(GPU_ONLY_NODE_LABEL_PREFIXES)}*): "
                     f"select the CPU pool ({POOL_LABEL}) instead"),
         "reason": "Forbidden"},
    ])
    return [*bare, *gpu_less]


# The job kinds Kueue manages (workloads.kueue.ManagerConfigSpec.frameworks) and where each
# keeps its pod template(s), as CEL lists of pod specs.
JOB_KINDS: tuple[tuple[str, str, str, str], ...] = (
    ("batch", "v1", "jobs", "[object.spec.template.spec]"),
    ("kubeflow.org", "v1", "pytorchjobs",
     "object.spec.pytorchReplicaSpecs.map(k, object.spec.pytorchReplicaSpecs[k].template.spec)"),
    ("jobset.x-k8s.io", "v1alpha2", "jobsets", "object.spec.replicatedJobs.map(r, r.template.spec.template.spec)"),
    ("trainer.kubeflow.org", "v1alpha1", "trainjobs", "[]"),
)


def _queue_label() -> list[dict[str, Any]]:
    label_ok = (f"has(object.metadata.labels) && '{QUEUE_LABEL}' in object.metadata.labels && "
                f"object.metadata.labels['{QUEUE_LABEL}'] == namespaceObject.metadata.labels['{LOCAL_QUEUE_LABEL}']")
    out = []
    for group, version, resource, templates in JOB_KINDS:
        validations = [{
            "expression": label_ok,
            "messageExpression": (f"'{resource} in ' + namespaceObject.metadata.name + ' carry the label {QUEUE_LABEL}: ' + "
                                  f"namespaceObject.metadata.labels['{LOCAL_QUEUE_LABEL}'] + ' (Kueue admits them against the team\\'s quota)'"),
            "reason": "Forbidden"}]
        # Kueue takes a workload's priority from a WorkloadPriorityClass label first, then (for
        # kubeflow jobs) runPolicy.schedulingPolicy.priorityClass, then the pod templates (Kueue
        # v0.19.2 pkg/controller/jobs/kubeflow/kubeflowjob/kubeflowjob_controller.go
        # ``PriorityClass``; pkg/util/priority): each source is held to the team's entitlement.
        validations.append({
            "expression": f"!has(object.metadata.labels) || !('{KUEUE_PRIORITY_LABEL}' in object.metadata.labels)",
            "message": (f"{resource} may not set {KUEUE_PRIORITY_LABEL}: the workload's priority comes from its pods' "
                        "priority class, which the team's entitlement bounds"),
            "reason": "Forbidden"})
        if resource == "pytorchjobs":
            policy = "object.spec.runPolicy.schedulingPolicy"
            validations.append({
                "expression": (f"!has(object.spec.runPolicy) || !has(object.spec.runPolicy.schedulingPolicy) || "
                               f"!has({policy}.priorityClass) || "
                               f"('{PRIORITY_LABEL_PREFIX}' + {policy}.priorityClass) in namespaceObject.metadata.labels"),
                "messageExpression": (f"'runPolicy.schedulingPolicy.priorityClass (Kueue\\'s priority for the job) must be one "
                                      f"of ' + {_ALLOWED}"),
                "reason": "Forbidden"})
        if templates != "[]":
            validations.append({
                "expression": f"{templates}.all(s, {_priority_ok('s')})",
                "messageExpression": f"'pod templates must name one of the priority classes ' + {_ALLOWED}",
                "reason": "Forbidden"})
            validations.append({
                "expression": f"{templates}.all(s, !has(s.nodeName) || s.nodeName == '')",
                "message": "pod templates may not name a node (spec.nodeName): the scheduler places team pods",
                "reason": "Forbidden"})
            validations.append({
                "expression": f"{templates}.all(s, {_own_namespace_pod_terms('s')})",
                "message": f"pod templates: {CROSS_NAMESPACE_AFFINITY_MESSAGE}",
                "reason": "Forbidden"})
        # A TrainJob names no priority class (Trainer 2.3.0's runtimePatches pod spec has no
        # priorityClassName field); its JobSet's templates are checked when Trainer creates it.
        out += _policy(f"queue-label-{resource}", resources=[(group, version, resource)], validations=validations,
                       # The controllers create a TrainJob's JobSet and its Jobs: the queue label sits on the TrainJob.
                       match_conditions=[{"name": "not-a-job-controller", "expression": f"!({_CONTROLLER})"}])
    return out


def _services() -> list[dict[str, Any]]:
    return _policy("services", resources=[("", "v1", "services")], validations=[
        {"expression": "!has(object.spec.type) || !(object.spec.type in ['LoadBalancer', 'NodePort'])",
         "message": "team namespaces publish nothing outside the cluster: no LoadBalancer or NodePort Service",
         "reason": "Forbidden"},
        {"expression": "!has(object.spec.externalIPs) || size(object.spec.externalIPs) == 0",
         "message": "team namespaces may not set externalIPs", "reason": "Forbidden"},
    ])


def _secrets() -> list[dict[str, Any]]:
    # A legacy token Secret never expires and survives the removal of the member who minted it
    # (the team Role writes Secrets); pods get short-lived projected tokens instead.
    return _policy("secrets", resources=[("", "v1", "secrets")], validations=[
        {"expression": "!has(object.type) || object.type != 'kubernetes.io/service-account-token'",
         "message": ("team namespaces hold no long-lived service account tokens (type kubernetes.io/service-account-token): "
                     "use `kubectl create token` (short-lived) or a projected token volume"),
         "reason": "Forbidden"},
    ])


def _pod_queue() -> list[dict[str, Any]]:
    """Every team pod goes through Kueue: Kueue's plain-pod integration gates each pod that no
    managed job owns (workloads/kueue.py), and two ways around the gate are closed here.

    - An owner it trusts: Kueue does not gate a pod whose controller owner is a kind it manages,
      after checking only that an object of that name and uid exists in the namespace (kueue
      v0.19.2 reconciler.go ``FindAncestorJobManagedByKueue``: "same-namespace ownership spoofing
      is out of scope"). A team member could name its own Job. Only the job controllers create
      pods owned by jobs.
    - The gate itself: a scheduling gate may be removed by any pod update (Kubernetes
      ValidatePodUpdate allows removals), and the team Role updates pods. Only Kueue lifts it."""
    kinds = sorted(set(kueue.FRAMEWORK_KINDS.values()))
    owners_ok = (f"{_CONTROLLER} || !has(object.metadata.ownerReferences) || "
                 f"object.metadata.ownerReferences.all(o, !(o.kind in {kinds!r}))")
    gate = kueue.ADMISSION_GATE
    kept = (f"request.operation != 'UPDATE' || request.userInfo.username == '{kueue.KUEUE_CONTROLLER_USER}' || "
            f"!has(oldObject.spec.schedulingGates) || !oldObject.spec.schedulingGates.exists(g, g.name == '{gate}') || "
            f"(has(object.spec.schedulingGates) && object.spec.schedulingGates.exists(g, g.name == '{gate}'))")
    return _policy("pod-queue", resources=[("", "v1", "pods")], validations=[
        {"expression": f"request.operation != 'CREATE' || {owners_ok}",
         "message": (f"a pod may name a {', '.join(kinds)} as its owner only when that object's controller creates it: "
                     "Kueue admits such pods through their job; create the job instead"),
         "reason": "Forbidden"},
        {"expression": kept,
         "message": f"only Kueue lifts the scheduling gate {gate}: the pod starts when Kueue admits it against the team's quota",
         "reason": "Forbidden"},
    ])


def _pod_volumes() -> list[dict[str, Any]]:
    # Pod Security `restricted` admits generic ephemeral volumes; their PVC is created by the
    # ephemeral-volume controller, so neither the team's RBAC (no PVC create) nor a quota bounds it.
    return _policy("pod-volumes", resources=[("", "v1", "pods")], operations=("CREATE",), validations=[
        {"expression": "!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.ephemeral))",
         "message": ("team pods may not use generic ephemeral volumes (an EBS volume outside the team's quota): "
                     "use emptyDir, or the team's FSx claim"),
         "reason": "Forbidden"},
    ])


def _volume_claims() -> list[dict[str, Any]]:
    # The team Role creates no PVCs, but Argo Workflows' controller does, for a Workflow's
    # volumeClaimTemplates, with its own ClusterRole (argo-helm workflow-controller-cluster-roles:
    # persistentvolumeclaims create/delete): a gp3 volume of any size, outside the team's quota,
    # Retained in prod. The only claims a team namespace needs are the platform's, bound to the
    # FSx volumes made for it (workloads.fsx: storageClassName "" and volumeName, pre-bound by the
    # volume's claimRef). The DefaultStorageClass admission plugin fills an unset class with gp3
    # before this policy sees it.
    return _policy("volume-claims", resources=[("", "v1", "persistentvolumeclaims")], operations=("CREATE",), validations=[
        {"expression": ("has(object.spec.storageClassName) && object.spec.storageClassName == '' && "
                        "has(object.spec.volumeName) && object.spec.volumeName != ''"),
         "message": ("a claim in a team namespace binds a volume the platform made (storageClassName \"\" and volumeName); "
                     "no dynamically provisioned volumes here: use emptyDir, or the team's FSx claim"),
         "reason": "Forbidden"},
    ])


def _disruption_budgets() -> list[dict[str, Any]]:
    # A PodDisruptionBudget holds a node against voluntary drains (Karpenter's consolidation and
    # node repair, EKS upgrades); Argo Workflows creates one for a Workflow's
    # spec.podDisruptionBudget with its own rights. Training tolerates drains by checkpointing.
    return _policy("disruption-budgets", resources=[("policy", "v1", "poddisruptionbudgets")], validations=[
        {"expression": "false",
         "message": ("team namespaces hold no PodDisruptionBudget: it would block the drains that replace and upgrade "
                     "nodes; jobs survive a drain by resuming from their checkpoint"),
         "reason": "Forbidden"},
    ])


# A dev pod's name (and so its pod's: the Job controller's pods are <job>-<random>); the only pods
# a team member may port-forward to (workloads/devpod.py).
DEV_POD_PREFIX = "devpod-"
TEAM_GROUP_PREFIX = "mlplatform:team-"


def _port_forward() -> list[dict[str, Any]]:
    """Port-forward for a team member reaches its dev pods only (the notebook on their loopback).

    RBAC cannot narrow ``pods/portforward`` to some pods of a namespace (a rule names resources,
    not labels), so the team Role grants it and this policy narrows it: a CONNECT to
    ``pods/portforward`` whose pod name does not start with ``devpod-`` is refused. ValidatingAdmission-
    Policy matches CONNECT operations; for a connect request ``request.name`` is the pod's name
    (admissionregistration.k8s.io/v1 ``RuleWithOperations``; AdmissionRequest ``name``). Training
    pods keep what the review of the team access model required: no exec, attach, ephemeral
    containers, and no port-forward into them (their names are the job's, which the job spec never
    lets start with ``devpod-``). Platform engineers (no team group) are not matched."""
    return _policy("port-forward", resources=[("", "v1", "pods/portforward")], operations=("CONNECT",),
                   match_conditions=[{"name": "a-team-member",
                                      "expression": f"request.userInfo.groups.exists(g, g.startsWith('{TEAM_GROUP_PREFIX}'))"}],
                   validations=[{
                       "expression": f"request.name.startsWith('{DEV_POD_PREFIX}')",
                       "messageExpression": (f"'team members port-forward only to their dev pods (names {DEV_POD_PREFIX}*, "
                                             "python -m workloads dev), not to ' + request.name"),
                       "reason": "Forbidden"}])


def admission_policies(gpu_pools: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Every policy and binding; cluster-scoped, one set for all team namespaces.

    gpu_pools: the GPU pools' names (their ``mlplatform.io/pool`` label values); a pod that
        requests no GPU may not select them.
    """
    return [*_pod_identity(), *_pod_placement(), *_gpu_pods(gpu_pools), *_pod_queue(), *_pod_volumes(), *_queue_label(),
            *_secrets(), *_services(), *_volume_claims(), *_disruption_budgets(),
            *_port_forward()]


# -- RBAC ---------------------------------------------------------------------------------------
# (apiGroup, resources, verbs). Reading Kueue's objects shows why a job waits.
_WRITE = ["get", "list", "watch", "create", "update", "patch", "delete"]
_READ = ["get", "list", "watch"]
TEAM_RULES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("", ("pods",), tuple(_WRITE)),
    ("", ("pods/log",), ("get", "list")),
    # The dev pod's notebook (kubectl port-forward: GET the pod, then connect to pods/portforward,
    # authorized as create, or get over WebSockets); the port-forward policy admits dev pods only.
    ("", ("pods/portforward",), ("get", "create")),
    ("", ("configmaps", "secrets"), tuple(_WRITE)),
    # The platform creates the FSx claims; teams read them (no gp3 volumes of their own).
    ("", ("persistentvolumeclaims", "events", "serviceaccounts", "resourcequotas", "limitranges", "services"), tuple(_READ)),
    ("batch", ("jobs",), tuple(_WRITE)),
    ("kubeflow.org", ("pytorchjobs",), tuple(_WRITE)),
    ("trainer.kubeflow.org", ("trainjobs",), tuple(_WRITE)),
    # `argo submit --from workflowtemplate/...`, `argo logs`, `argo stop`: workflows and their templates.
    ("argoproj.io", ("workflows",), tuple(_WRITE)),
    ("argoproj.io", ("workflowtemplates",), tuple(_READ)),
    ("kueue.x-k8s.io", ("localqueues", "workloads"), tuple(_READ)),
    # The platform's record of every run (workloads/run_records.py): read, never written, by the team.
    ("mlplatform.io", ("runrecords",), tuple(_READ)),
    ("events.k8s.io", ("events",), tuple(_READ)),
)


def team_role(namespace: str) -> dict[str, Any]:
    rules = [{"apiGroups": [group], "resources": list(resources), "verbs": list(verbs)}
             for group, resources, verbs in TEAM_RULES]
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": TEAM_ROLE, "namespace": namespace, "labels": {"app.kubernetes.io/managed-by": "pulumi"}},
            "rules": rules}


def team_role_binding(namespace: str) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": TEAM_ROLE, "namespace": namespace, "labels": {"app.kubernetes.io/managed-by": "pulumi"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": TEAM_ROLE},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": team_group(namespace)}]}


def rbac_allows(rules: Sequence[Mapping[str, Any]], *, verb: str, group: str, resource: str) -> bool:
    """Kubernetes RBAC's rule match (pkg/apis/rbac/v1 helpers ``VerbMatches``, ``APIGroupMatches``,
    ``ResourceMatches``): a rule allows a request when its verbs, API groups and resources each
    contain the request's or ``*``. Subresources are matched whole (``pods/exec`` is not ``pods``)."""
    for rule in rules:
        if ((verb in rule.get("verbs", ()) or "*" in rule.get("verbs", ()))
                and (group in rule.get("apiGroups", ()) or "*" in rule.get("apiGroups", ()))
                and (resource in rule.get("resources", ()) or "*" in rule.get("resources", ()))
                and not rule.get("resourceNames")):
            return True
    return False



# -- the Training Operator's init container ------------------------------------------------------
# Training Operator v1.9 adds an `init-pytorch` container to every worker of a PyTorchJob with a
# Master (pkg/controller.v1/pytorch/initcontainer.go ``initContainerTemplate``): it has no
# securityContext, so Pod Security `restricted` refuses the worker pod. The operator reads a
# replacement from ``--pytorch-init-container-template-file`` (cmd/training-operator.v1/main.go);
# this is upstream's template with the restricted fields added (same Go template variables).
PYTORCH_INIT_CONTAINER_TEMPLATE_FLAG = "--pytorch-init-container-template-file"
PYTORCH_INIT_CONTAINER_TEMPLATE = """\
- name: init-pytorch
  image: {{.InitContainerImage}}
  imagePullPolicy: IfNotPresent
  resources:
    limits:
      cpu: 100m
      memory: 20Mi
    requests:
      cpu: 50m
      memory: 10Mi
  securityContext:
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    runAsNonRoot: true
    capabilities:
      drop: ["ALL"]
    seccompProfile:
      type: RuntimeDefault
  command: ['sh', '-c', 'err=1;for i in $(seq {{.MaxTries}}); do if nslookup {{.MasterAddr}}; then err=0 && break; fi;echo waiting for master; sleep 2; done; exit $err']
"""
