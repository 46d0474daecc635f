"""Kueue objects (``kueue.x-k8s.io/v1beta2``) and the Kueue manager configuration.

One ResourceFlavor per GPU pool (its node labels and the GPU taint toleration) and one for the
general CPU pool (where pods that request no GPU are admitted), one ClusterQueue per team in a
shared cohort (nominal GPU quota from config; idle quota is
borrowed by other teams and reclaimed by preemption), one LocalQueue in each team namespace.
The manager runs with ``waitForPodsReady`` so a multi-node job is admitted all-or-nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional, Sequence

import yaml

from workloads.gpu_sharing import SHARING_TAINT
from workloads.karpenter import EFA_RESOURCE, GPU_RESOURCE, GPU_TAINT, POOL_LABEL, CpuPoolSpec, GpuPoolSpec
from workloads.nodefit import slice_pod_size
from workloads.placement import SYSTEM_NODE_LABEL_KEY

KUEUE_API = "kueue.x-k8s.io/v1beta2"
COHORT = "ml-training"
LOCAL_QUEUE_NAME = "training"
# Kueue gives a workload without the queue label the namespace's LocalQueue of this name (kueue
# v0.19.2 pkg/controller/constants ``DefaultLocalQueueName``; pod_webhook.go "Local queue
# defaulting"): a bare pod or an Argo Workflows step pod queues against its team's share unlabelled.
DEFAULT_LOCAL_QUEUE_NAME = "default"
# The scheduling gate Kueue puts on a pod it manages and lifts when it admits it (kueue
# pkg/controller/jobs/pod/constants ``SchedulingGateName``).
ADMISSION_GATE = "kueue.x-k8s.io/admission"
# Who may lift it: Kueue's controller (the chart's ``<release>-controller-manager`` service account;
# release and namespace ``kueue``/``kueue-system``, components/scheduling.py).
KUEUE_CONTROLLER_USER = "system:serviceaccount:kueue-system:kueue-controller-manager"
# The kind each integration manages: Kueue does not gate a pod whose controller owner is one of
# them (kueue v0.19.2 pkg/controller/jobframework/reconciler.go ``FindAncestorJobManagedByKueue``;
# its comment: "same-namespace ownership spoofing is out of scope").
FRAMEWORK_KINDS = {"batch/job": "Job", "kubeflow.org/pytorchjob": "PyTorchJob", "trainer.kubeflow.org/trainjob": "TrainJob",
                   "jobset.x-k8s.io/jobset": "JobSet", "pod": "Pod"}
# Label a TrainingJob / PyTorchJob sets to enter Kueue.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Every team namespace carries it (workloads.scheduling.namespace).
TEAM_NAMESPACE_LABEL = "mlplatform.io/team"


@dataclass(frozen=True)
class FlavorSpec:
    """A GPU pool seen by Kueue."""

    name: str  # the pool name
    node_labels: Mapping[str, str]
    max_gpus: int
    gpus_per_node: int
    cpu_per_gpu: int = 12
    memory_gib_per_gpu: int = 120
    # EFA devices per node (the EFA device plugin's vpc.amazonaws.com/efa); 0 without EFA.
    efa_devices_per_node: int = 0
    # A shared pool: extended resource -> slices per GPU (nvidia.com/gpu.shared: 4, or
    # nvidia.com/mig-1g.10gb: 7). Its quota is in slices, and it offers no whole GPU and no EFA.
    slices_per_gpu: Mapping[str, int] = field(default_factory=dict)
    # The pool's instance types: a shared flavor's CPU and memory quota is its slices' pods as the
    # renderers size them from these (workloads.nodefit.slice_pod_size).
    instance_types: tuple[str, ...] = ()

    @property
    def resource_name(self) -> str:
        return f"gpu-{self.name}"

    @property
    def shared(self) -> bool:
        return bool(self.slices_per_gpu)

    @property
    def slices_per_gpu_total(self) -> int:
        return sum(self.slices_per_gpu.values())

    @property
    def slice_pod(self) -> tuple[int, int]:
        """(CPU millicores, memory GiB) every slice pod of this shared flavor requests."""
        return slice_pod_size(self.instance_types, self.slices_per_gpu_total * self.gpus_per_node)


@dataclass(frozen=True)
class CpuFlavorSpec:
    """The general CPU pool seen by Kueue: where a team's pods that request no GPU are admitted
    (the restore drill, data preparation, evaluation). Without it Kueue gives such a pod the first
    GPU flavor its cpu and memory fit (the flavor assigner tries flavors in the ClusterQueue's
    order and checks only the resources the pod requests), and with it that flavor's GPU pool
    selector and GPU toleration, which the gpu-less-pods admission policy refuses: the pod is
    never created."""

    name: str  # the CPU NodePool's pool name
    node_labels: Mapping[str, str]
    max_cpu: int
    max_memory_gib: int

    @property
    def resource_name(self) -> str:
        return f"cpu-{self.name}"


@dataclass(frozen=True)
class TeamQueueSpec:
    """A team's share: GPUs per flavor (pool name -> GPUs), its nominal share of the general CPU
    pool (cpu, memory GiB; idle shares are borrowed within the cohort) and a fair-sharing weight."""

    team: str
    namespace: str
    gpu_quota: Mapping[str, int]
    fair_sharing_weight: int = 1
    borrowing: bool = True
    general_cpu: int = 0
    general_memory_gib: int = 0


@dataclass(frozen=True)
class Queues:
    """What Kueue and the team namespaces get for a set of teams and pools (``queues_for``).

    flavors: one per GPU pool, in the pools' order.
    cpu_flavor: the general CPU pool's, or None without the pool.
    teams: each team's queue, with its share of the general CPU pool filled in.
    namespace_gpus, namespace_slices: per team, the namespace ResourceQuota that backs its queue:
        whole GPUs and, per shared-pool resource, slices.
    """

    flavors: tuple[FlavorSpec, ...]
    cpu_flavor: Optional[CpuFlavorSpec]
    teams: tuple[TeamQueueSpec, ...]
    namespace_gpus: Mapping[str, int]
    namespace_slices: Mapping[str, Mapping[str, int]]


def flavor_for(pool: GpuPoolSpec) -> FlavorSpec:
    """A GPU pool as a Kueue flavor: its labels, GPU limit, EFA devices per node and slices."""
    return FlavorSpec(name=pool.name, node_labels=pool.node_labels, max_gpus=pool.max_gpus, gpus_per_node=pool.gpus_per_node,
                      efa_devices_per_node=pool.shapes[0].num_efa_network_cards if pool.efa else 0,
                      slices_per_gpu=pool.sharing.slices_per_gpu(), instance_types=tuple(pool.instance_types))


def cpu_flavor_for(pool: Optional[CpuPoolSpec]) -> Optional[CpuFlavorSpec]:
    """The general CPU pool as a Kueue flavor (None without the pool)."""
    if pool is None:
        return None
    return CpuFlavorSpec(name=pool.name, node_labels={POOL_LABEL: pool.name},
                         max_cpu=pool.max_cpu, max_memory_gib=pool.max_memory_gib)


def queues_for(teams: Sequence[TeamQueueSpec], pools: Sequence[GpuPoolSpec], cpu_pool: Optional[CpuPoolSpec]) -> Queues:
    """The flavors, each team's queue and the namespace quotas behind them.

    ``teams``: each team's GPU quota per pool (GPUs, or slices for a shared pool), weight and
    borrowing; their ``general_cpu``/``general_memory_gib`` are replaced by an even split of the
    general CPU pool's limits (what one team leaves idle, another borrows within the cohort, as
    with GPUs; nothing without the pool).

    The namespace quota is a backstop at what Kueue can admit: the team's own GPUs, or the whole
    cohort's when it may borrow. Below that, Kueue would admit a borrowing job whose pods the
    quota then refuses (evicted and requeued until deactivated). A shared pool's quota is in
    slices, and each of its resources may take up to that many.
    """
    shared = {pool.name: pool.sharing for pool in pools if pool.sharing.shared}
    own_gpus = {t.team: sum(n for pool, n in t.gpu_quota.items() if pool not in shared) for t in teams}
    own_slices: dict[str, dict[str, int]] = {}
    for t in teams:
        slices = own_slices.setdefault(t.team, {})
        for pool, n in t.gpu_quota.items():
            if pool in shared:
                for resource in shared[pool].slices_per_gpu():
                    slices[resource] = slices.get(resource, 0) + n
    cohort_gpus = sum(own_gpus.values())
    cohort_slices: dict[str, int] = {}
    for slices in own_slices.values():
        for resource, n in slices.items():
            cohort_slices[resource] = cohort_slices.get(resource, 0) + n
    cpu_flavor = cpu_flavor_for(cpu_pool)
    num_teams = max(1, len(teams))
    cpu_share = ({} if cpu_flavor is None else
                 {"general_cpu": cpu_flavor.max_cpu // num_teams, "general_memory_gib": cpu_flavor.max_memory_gib // num_teams})
    return Queues(
        flavors=tuple(flavor_for(pool) for pool in pools),
        cpu_flavor=cpu_flavor,
        teams=tuple(replace(t, **cpu_share) for t in teams),
        namespace_gpus={t.team: cohort_gpus if t.borrowing else own_gpus[t.team] for t in teams},
        namespace_slices={t.team: dict(cohort_slices) if t.borrowing else own_slices[t.team] for t in teams},
    )


def resource_flavor(flavor: FlavorSpec | CpuFlavorSpec) -> dict[str, Any]:
    if isinstance(flavor, CpuFlavorSpec):
        # The general pool has no taint: nothing to tolerate, only the pool to select.
        return {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": flavor.resource_name},
                "spec": {"nodeLabels": dict(flavor.node_labels)}}
    # Kueue adds these tolerations to admitted pods, so jobs need not know the GPU taint; only a
    # shared flavor tolerates the sharing taint, so only slice requests land on shared nodes.
    taints = [GPU_TAINT, SHARING_TAINT] if flavor.shared else [GPU_TAINT]
    # Kueue writes nodeLabels into the nodeSelector of every pod it admits (kueue v0.19.2
    # pkg/podset/podset.go, FromAssignment then Merge). The team pod-placement policy refuses any
    # selector on the node-role label (workloads/tenancy.py: it is how a pod would reach the
    # system nodes), so with it here every admitted GPU pod was refused; the pool label pins the pool.
    node_labels = {k: v for k, v in flavor.node_labels.items() if k != SYSTEM_NODE_LABEL_KEY}
    return {
        "apiVersion": KUEUE_API,
        "kind": "ResourceFlavor",
        "metadata": {"name": flavor.resource_name},
        "spec": {
            "nodeLabels": node_labels,
            "tolerations": [{"key": t["key"], "operator": "Exists", "effect": t["effect"]} for t in taints],
        },
    }


def slice_resources(flavors: Sequence[FlavorSpec]) -> list[str]:
    return sorted({r for f in flavors for r in f.slices_per_gpu})


_BINARY_SUFFIXES = ("Gi", "Ti", "Pi", "Ei")


def memory_quantity(gib: int) -> str:
    """``gib`` GiB as Kubernetes writes the quantity back (k8s.io/apimachinery resource.Quantity's
    canonical form: binary SI with the largest suffix that keeps an integer, and ``0`` bare).
    Kueue's defaulting webhook re-encodes a ClusterQueue through the typed Quantity, so it stores
    the canonical form; sent any other way ("0Gi") the live object differs from the program's and
    the next `pulumi up` updates it back (seen under the real engine)."""
    if gib == 0:
        return "0"
    value, suffix = gib, 0
    while value % 1024 == 0 and suffix < len(_BINARY_SUFFIXES) - 1:
        value, suffix = value // 1024, suffix + 1
    return f"{value}{_BINARY_SUFFIXES[suffix]}"


def cpu_quantity(millicores: int) -> str:
    """``millicores`` of CPU as Kubernetes writes the quantity back (resource.Quantity's canonical
    decimal form: an integer mantissa with the largest exponent in steps of 3 that keeps it one,
    so 2400m, 24, 3k; ``0`` bare). Like ``memory_quantity``: Kueue's webhook stores the canonical
    form, and any other spelling would be updated back on every `pulumi up`."""
    if millicores == 0:
        return "0"
    value, suffix = millicores, 0
    suffixes = ("m", "", "k", "M", "G", "T", "P", "E")
    while value % 1000 == 0 and suffix < len(suffixes) - 1:
        value, suffix = value // 1000, suffix + 1
    return f"{value}{suffixes[suffix]}"


def _flavor_quota(flavor: FlavorSpec, quota: int, slice_names: Sequence[str]) -> list[dict[str, Any]]:
    """Every covered resource, in the ClusterQueue's order (Kueue requires each flavor to list
    the group's coveredResources in order). A whole-GPU flavor has no slice quota; a shared one
    has no whole GPU and no EFA quota, so neither kind of request is ever admitted to the other
    (Kueue assigns a flavor only where every requested resource fits)."""
    if flavor.shared:
        # ``quota`` is in slices of the pool, each a pod of the one size the renderers give it
        # (workloads.nodefit.slice_pod_size), so the team can run every slice it is granted.
        gpus, efa = 0, 0
        slice_cpu_millicores, slice_memory_gib = flavor.slice_pod
        cpu_millicores, memory = quota * slice_cpu_millicores, quota * slice_memory_gib
        max_slices = {r: n * flavor.max_gpus for r, n in flavor.slices_per_gpu.items()}
        slices = {r: min(quota, max_slices[r]) for r in flavor.slices_per_gpu}
    else:
        gpus = quota
        # Kueue refuses a pod requesting a resource its ClusterQueue does not cover: EFA pods
        # request every EFA device of their node, so the quota follows the GPU quota in nodes.
        efa = gpus // flavor.gpus_per_node * flavor.efa_devices_per_node
        cpu_millicores, memory, slices = gpus * flavor.cpu_per_gpu * 1000, gpus * flavor.memory_gib_per_gpu, {}
    resources = [
        {"name": "cpu", "nominalQuota": cpu_quantity(cpu_millicores)},
        {"name": "memory", "nominalQuota": memory_quantity(memory)},
        {"name": GPU_RESOURCE, "nominalQuota": str(gpus)},
        {"name": EFA_RESOURCE, "nominalQuota": str(efa)},
    ]
    resources += [{"name": r, "nominalQuota": str(slices.get(r, 0))} for r in slice_names]
    return resources


def _cpu_flavor_quota(team: TeamQueueSpec, slice_names: Sequence[str]) -> list[dict[str, Any]]:
    """No GPU, EFA or slice quota (here or anywhere in the cohort), so a pod requesting any of them
    never fits this flavor and Kueue moves on to the GPU flavors."""
    return [{"name": "cpu", "nominalQuota": cpu_quantity(team.general_cpu * 1000)},
            {"name": "memory", "nominalQuota": memory_quantity(team.general_memory_gib)},
            {"name": GPU_RESOURCE, "nominalQuota": "0"},
            {"name": EFA_RESOURCE, "nominalQuota": "0"},
            *({"name": r, "nominalQuota": "0"} for r in slice_names)]


def cluster_queue(team: TeamQueueSpec, flavors: Sequence[FlavorSpec],
                  cpu_flavor: CpuFlavorSpec | None = None) -> dict[str, Any]:
    """``cpu_flavor`` comes first: Kueue assigns the first flavor in order where every requested
    resource fits (kueue v0.19.2 pkg/scheduler/flavorassigner: ``findFlavorForPodSets`` walks
    ``ResourceGroup.Flavors`` in order), so a pod with no GPU request lands on the CPU pool and a
    GPU request, which never fits the CPU flavor's zero GPU quota, goes on to the GPU pools."""
    flavor_entries = []
    slice_names = slice_resources(flavors)
    quotas: list[tuple[str, list[dict[str, Any]]]] = []
    if cpu_flavor is not None:
        quotas.append((cpu_flavor.resource_name, _cpu_flavor_quota(team, slice_names)))
    for flavor in flavors:
        quotas.append((flavor.resource_name, _flavor_quota(flavor, int(team.gpu_quota.get(flavor.name, 0)), slice_names)))
    for resource_name, resources in quotas:
        if not team.borrowing:
            for resource in resources:
                resource["borrowingLimit"] = "0"
        flavor_entries.append({"name": resource_name, "resources": resources})
    return {
        "apiVersion": KUEUE_API,
        "kind": "ClusterQueue",
        "metadata": {"name": team.team},
        "spec": {
            "cohortName": COHORT,
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": team.namespace}},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [{"coveredResources": ["cpu", "memory", GPU_RESOURCE, EFA_RESOURCE, *slice_names],
                                "flavors": flavor_entries}],
            # Borrowed GPUs come back to their owner by preemption; within a team, priority wins.
            "preemption": {
                "reclaimWithinCohort": "Any",
                "borrowWithinCohort": {"policy": "LowerPriority", "maxPriorityThreshold": 100},
                "withinClusterQueue": "LowerPriority",
            },
            "fairSharing": {"weight": str(team.fair_sharing_weight)},
        },
    }


def local_queue(team: TeamQueueSpec, name: str = LOCAL_QUEUE_NAME) -> dict[str, Any]:
    """The team's LocalQueue ``name`` into its ClusterQueue: ``training`` for jobs (their label
    names it), ``default`` for the pods nothing labels (Kueue's plain-pod integration)."""
    return {
        "apiVersion": KUEUE_API,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": team.namespace},
        "spec": {"clusterQueue": team.team},
    }


KUEUE_CONFIG_API = "config.kueue.x-k8s.io/v1beta2"


@dataclass(frozen=True)
class ManagerConfigSpec:
    wait_for_pods_ready_timeout: str = "10m"
    requeue_backoff_limit: int = 5
    # "pod": every pod of a team namespace that no managed job owns (a bare pod, an Argo Workflows
    # step) is gated until Kueue admits it against the team's ClusterQueue, so bare pods take the
    # team's share of the CPU pool, not the whole pool (Kueue docs, "Run Plain Pods").
    frameworks: Sequence[str] = field(
        default_factory=lambda: ("batch/job", "kubeflow.org/pytorchjob", "trainer.kubeflow.org/trainjob", "jobset.x-k8s.io/jobset",
                                 "pod")
    )


def manager_config(spec: ManagerConfigSpec = ManagerConfigSpec()) -> dict[str, Any]:
    """Kueue's Configuration: all-or-nothing admission and fair sharing across the cohort.

    ``config.kueue.x-k8s.io/v1beta2``, the version the pinned chart's default config uses (kueue
    v0.19.2 charts/kueue/values.yaml ``managerConfig.controllerManagerConfigYaml``). Kueue decodes
    it strictly (pkg/config/config.go: ``serializer.NewCodecFactory(scheme,
    serializer.EnableStrict)``), and v1beta2 has no ``enable`` switches: ``waitForPodsReady`` and
    ``fairSharing`` are on when present (apis/config/v1beta2/configuration_types.go).
    """
    return {
        "apiVersion": KUEUE_CONFIG_API,
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": ":8081"},
        "metrics": {"bindAddress": ":8443"},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        # Every job in a team namespace is Kueue's, labelled or not (an unlabelled one waits
        # forever instead of bypassing the quota); the team admission policy also refuses it.
        # Controllers' namespaces stay unmanaged (Kueue docs, "Setup manageJobsWithoutQueueName").
        "manageJobsWithoutQueueName": True,
        "managedJobsNamespaceSelector": {"matchExpressions": [{"key": TEAM_NAMESPACE_LABEL, "operator": "Exists"}]},
        # A job whose pods are not all Ready within the timeout is evicted and requeued, so a
        # multi-node job never holds half its GPUs while waiting for the rest.
        "waitForPodsReady": {
            "timeout": spec.wait_for_pods_ready_timeout,
            "blockAdmission": True,
            "requeuingStrategy": {"timestamp": "Eviction", "backoffLimitCount": spec.requeue_backoff_limit},
        },
        "fairSharing": {"preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]},
        "integrations": {"frameworks": list(spec.frameworks)},
    }


def manager_config_yaml(spec: ManagerConfigSpec = ManagerConfigSpec()) -> str:
    return yaml.safe_dump(manager_config(spec), sort_keys=False)
