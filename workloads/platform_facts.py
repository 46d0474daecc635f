"""What a training job needs to know about the platform it runs on, read from rendered manifests.

The renderer never hard-codes a pool label, a taint, a queue name or a grace period: it reads
them from the platform's own Kubernetes objects (NodePools, EC2NodeClasses, Kueue ClusterQueues
and LocalQueues, PriorityClasses, the FSx claims, the tracking Secrets, the trainer service
accounts) as the offline plan records them or as the stack deployed them, plus a few resolved
names (checkpoints bucket, region) from the stack outputs.

``facts_from_manifests`` is pure (manifests in, facts out) so a GitOps renderer and an Argo
WorkflowTemplate step can call it the same way the ``submit`` command does.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable, Mapping, Optional, Sequence

from workloads.fsx import CLAIM_NAME
from workloads.gpu_sharing import SHARED_GPU_RESOURCE, SHARING_LABEL
from workloads.tenancy import ALLOWED_PRIORITIES_ANNOTATION, POSIX_ID_LABEL
from workloads.kueue import LOCAL_QUEUE_NAME
from workloads.karpenter import (
    CAPACITY_TYPE_KEY, FAMILY_KEY, GPU_COUNT_KEY, GPU_NAME_KEY, GPU_RESOURCE, GPU_TYPE_LABEL, INSTANCE_TYPE_KEY, POOL_LABEL,
    duration_seconds,
)

# The Secret each team namespace receives from the tracking capability (components/tracking.py
# K8S_SECRET_NAME) and the keys the MLflow client reads.
TRACKING_SECRET_KEYS = ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
TRAINER_SERVICE_ACCOUNT = "trainer"
SLICE_RESOURCES = (SHARED_GPU_RESOURCE,)


@dataclass(frozen=True)
class PoolFacts:
    """A GPU pool as its NodePool (and EC2NodeClass) declare it."""

    name: str
    gpu_type: str
    gpus_per_node: int
    instance_types: tuple[str, ...]
    capacity_types: tuple[str, ...]
    node_labels: Mapping[str, str]
    taints: tuple[Mapping[str, str], ...]
    termination_grace_period_seconds: int
    max_gpus: int = 0  # NodePool limits: the most GPUs the pool launches
    # EFA devices the EFA device plugin advertises per node (= EFA interfaces of the node class).
    efa_devices_per_node: int = 0
    kueue_flavor: Optional[str] = None
    # Kueue quota per GPU of this flavor (ClusterQueue nominalQuota / GPUs): what a pod may request.
    cpu_per_gpu: Optional[float] = None
    memory_gib_per_gpu: Optional[float] = None
    # GPU sharing (workloads.gpu_sharing): none | time-slicing | mig, from the NodePool's label, and
    # the slices one node offers, from the pool's NodeOverlay (extended resource -> count).
    sharing: str = "none"
    slices_per_node: Mapping[str, int] = field(default_factory=dict)

    @property
    def shared(self) -> bool:
        return self.sharing != "none"

    @property
    def efa(self) -> bool:
        return self.efa_devices_per_node > 0

    @property
    def offers_spot(self) -> bool:
        return "spot" in self.capacity_types


@dataclass(frozen=True)
class TeamFacts:
    name: str
    namespace: str
    local_queue: Optional[str]
    gpu_quota: Mapping[str, int]  # kueue flavor name -> nominal GPUs
    borrowing: bool
    default_priority_class: Optional[str]
    has_fsx_claim: bool
    tracking_secret: Optional[str]
    trainer_service_account: Optional[str]
    # The uid/gid its pods must run as (namespace label mlplatform.io/posix-id); None in older plans.
    posix_id: Optional[int] = None
    # Priority classes the team may use (namespace annotation); empty: not recorded.
    allowed_priority_classes: tuple[str, ...] = ()
    # The IAM roles whose EKS access entries carry the team's group (scheduling.teams[].roleArns):
    # what a member names in `aws eks update-kubeconfig --role-arn`. Empty: no access entry.
    role_arns: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlatformFacts:
    stack: str
    region: str
    pools: tuple[PoolFacts, ...]
    teams: tuple[TeamFacts, ...]
    priority_classes: tuple[str, ...]
    fsx_claim_name: str = CLAIM_NAME
    tracking_secret_keys: tuple[str, ...] = TRACKING_SECRET_KEYS
    checkpoints_bucket: Optional[str] = None
    # Sustained write throughput (MB/s) of the checkpoint volume, for the checkpoint-time estimate.
    # The field keeps its first name (facts JSON files carry it); `checkpoint_store` says which
    # file system the figure is for: FSx for Lustre, or EFS under datasets storage s3-mountpoint.
    fsx_write_mb_per_s: Optional[float] = None
    trainer_v2_runtime: Optional[str] = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    checkpoint_store: Optional[str] = None  # "FSx for Lustre" | "EFS"; None in older facts files
    # The CloudWatch log group Fluent Bit ships every container's lines to (components/
    # container_logs.py), None when the stack has container logs off: past attempts' logs.
    container_log_group: Optional[str] = None
    # The EKS cluster (``aws eks update-kubeconfig --name``); None in older facts files.
    cluster_name: Optional[str] = None
    # Where a team member finds the platform's web endpoints (``python -m workloads endpoints``).
    tracking_url: Optional[str] = None  # MLflow, https://<tracking.domainName>
    argocd_url: Optional[str] = None  # Argo CD, https://<gitops.domain>
    grafana: Optional[str] = None  # "in-cluster" | "managed" | None (no monitoring)
    # The bucket and log group names are the deployed ones (stack outputs), not the offline plan's.
    names_deployed: bool = False

    def pool(self, name: str) -> Optional[PoolFacts]:
        return next((p for p in self.pools if p.name == name), None)

    def team(self, name: str) -> Optional[TeamFacts]:
        return next((t for t in self.teams if t.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PlatformFacts":
        pools = tuple(PoolFacts(**{**p, "instance_types": tuple(p["instance_types"]),
                                   "capacity_types": tuple(p["capacity_types"]),
                                   "taints": tuple(p["taints"])}) for p in data["pools"])
        teams = tuple(TeamFacts(**{**t, **{k: tuple(t[k]) for k in ("allowed_priority_classes", "role_arns") if k in t}})
                      for t in data["teams"])
        rest = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k not in ("pools", "teams")}
        return cls(pools=pools, teams=teams, **rest)


# -- reading manifests ------------------------------------------------------------------
def _quantity_gib(value: Any) -> float:
    text = str(value)
    factors = {"Ki": 1 / 1024**2, "Mi": 1 / 1024, "Gi": 1.0, "Ti": 1024.0}
    for suffix, factor in factors.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text) / 1024**3


def _quantity_cores(value: Any) -> float:
    """A CPU quantity ("24", "29400m", "3k") in cores."""
    text = str(value)
    factors = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9}
    if text[-1:] in factors:
        return float(text[:-1]) * factors[text[-1]]
    return float(text)


def _kind(obj: Mapping[str, Any]) -> tuple[str, str]:
    return str(obj.get("apiVersion", "")), str(obj.get("kind", ""))


def _name(obj: Mapping[str, Any]) -> str:
    return (obj.get("metadata") or {}).get("name", "")


def _namespace(obj: Mapping[str, Any]) -> str:
    return (obj.get("metadata") or {}).get("namespace", "")


def _gpu_pools(manifests: Sequence[Mapping[str, Any]], flavors: Mapping[str, Mapping[str, Any]]) -> list[PoolFacts]:
    node_classes = {_name(m): m for m in manifests if _kind(m)[1] == "EC2NodeClass"}
    pools = []
    for m in manifests:
        if _kind(m) != ("karpenter.sh/v1", "NodePool"):
            continue
        template = m["spec"]["template"]
        labels = dict(template.get("metadata", {}).get("labels", {}))
        if GPU_TYPE_LABEL not in labels:
            continue  # the CPU pool
        spec = template["spec"]
        requirements = {r["key"]: list(r.get("values", [])) for r in spec.get("requirements", [])}
        node_class = node_classes.get(spec["nodeClassRef"]["name"], {})
        interfaces = (node_class.get("spec") or {}).get("networkInterfaces") or []
        efa_devices = sum(1 for i in interfaces if i.get("interfaceType") in ("efa", "efa-only"))
        flavor = next((f for f in flavors.values()
                       if all(labels.get(k) == v for k, v in (f["spec"].get("nodeLabels") or {}).items())), None)
        overlay = next((o for o in manifests if _kind(o)[1] == "NodeOverlay" and any(
            r.get("key") == "karpenter.sh/nodepool" and _name(m) in (r.get("values") or [])
            for r in (o.get("spec") or {}).get("requirements", []))), None)
        slices = {k: int(str(v)) for k, v in ((overlay or {}).get("spec") or {}).get("capacity", {}).items()}
        pools.append(PoolFacts(
            name=labels[POOL_LABEL], gpu_type=labels[GPU_TYPE_LABEL],
            gpus_per_node=int(requirements[GPU_COUNT_KEY][0]),
            instance_types=tuple(requirements.get(INSTANCE_TYPE_KEY) or _instance_types(requirements)),
            capacity_types=tuple(requirements.get(CAPACITY_TYPE_KEY, [])),
            node_labels=labels, taints=tuple(dict(t) for t in spec.get("taints", [])),
            termination_grace_period_seconds=duration_seconds(spec.get("terminationGracePeriod")) or 0,
            max_gpus=int(str((m["spec"].get("limits") or {}).get(GPU_RESOURCE, "0"))),
            efa_devices_per_node=efa_devices, kueue_flavor=_name(flavor) if flavor else None,
            sharing=labels.get(SHARING_LABEL, "none"), slices_per_node=slices,
        ))
    return pools


def _instance_types(requirements: Mapping[str, list[str]]) -> list[str]:
    """Non-EFA pools select by GPU name, family and count: list the catalog's matching types."""
    from workloads.gpu_catalog import GPU_TYPES

    families = set(requirements.get(FAMILY_KEY, []))
    count = int(requirements[GPU_COUNT_KEY][0])
    names = set(requirements.get(GPU_NAME_KEY, []))
    return sorted({s.instance_type for g in GPU_TYPES.values() if g.karpenter_gpu_name in names
                   for s in g.shapes if s.family in families and s.num_gpus == count})


def _has_tracking_keys(secret: Mapping[str, Any]) -> bool:
    data = secret.get("stringData") or secret.get("data")
    # A recorded plan shows secret data as a placeholder string: the name is the contract then.
    return not isinstance(data, Mapping) or set(TRACKING_SECRET_KEYS) <= set(data)


def facts_from_manifests(
    manifests: Iterable[Mapping[str, Any]],
    *,
    stack: str,
    region: str,
    tracking_secret_name: str,
    checkpoints_bucket: Optional[str] = None,
    fsx_write_mb_per_s: Optional[float] = None,
    trainer_v2_runtime: Optional[str] = None,
    checkpoint_store: Optional[str] = None,
) -> PlatformFacts:
    """Platform facts from the platform's Kubernetes objects (as rendered / recorded)."""
    manifests = [m for m in manifests if isinstance(m, Mapping)]
    flavors = {_name(m): m for m in manifests if _kind(m)[1] == "ResourceFlavor"}
    pools = _gpu_pools(manifests, flavors)
    cluster_queues = [m for m in manifests if _kind(m)[1] == "ClusterQueue"]
    local_queues = [m for m in manifests if _kind(m)[1] == "LocalQueue"]
    namespaces = [m for m in manifests if _kind(m) == ("v1", "Namespace")]

    # CPU and memory per GPU of each flavor, from any ClusterQueue that grants GPUs on it.
    ratios: dict[str, tuple[float, float]] = {}
    for cq in cluster_queues:
        for group in cq["spec"].get("resourceGroups", []):
            for flavor in group.get("flavors", []):
                quota = {r["name"]: r["nominalQuota"] for r in flavor.get("resources", [])}
                gpus = float(str(quota.get(GPU_RESOURCE, "0")))
                if gpus > 0 and "cpu" in quota and "memory" in quota:
                    ratios.setdefault(flavor["name"], (_quantity_cores(quota["cpu"]) / gpus, _quantity_gib(quota["memory"]) / gpus))
    pools = [replace(p, cpu_per_gpu=ratios[p.kueue_flavor][0], memory_gib_per_gpu=ratios[p.kueue_flavor][1])
             if p.kueue_flavor in ratios else p for p in pools]

    teams = []
    for ns in namespaces:
        labels = ns["metadata"].get("labels") or {}
        team = labels.get("mlplatform.io/team")
        if not team:
            continue
        name = _name(ns)
        cq = next((c for c in cluster_queues
                   if (c["spec"].get("namespaceSelector") or {}).get("matchLabels", {}).get("kubernetes.io/metadata.name") == name), None)
        quota: dict[str, int] = {}
        borrowing = True
        if cq:
            for group in cq["spec"].get("resourceGroups", []):
                for flavor in group.get("flavors", []):
                    for r in flavor.get("resources", []):
                        if r["name"] == GPU_RESOURCE:
                            quota[flavor["name"]] = max(quota.get(flavor["name"], 0), int(float(str(r["nominalQuota"]))))
                            if str(r.get("borrowingLimit", "")) == "0":
                                borrowing = False
                        elif r["name"] in SLICE_RESOURCES or r["name"].startswith("nvidia.com/mig-"):
                            # A shared flavor's quota is in slices (its whole-GPU quota is 0).
                            quota[flavor["name"]] = max(quota.get(flavor["name"], 0), int(float(str(r["nominalQuota"]))))
        # Jobs name the team's own LocalQueue; the namespace's default one (for unlabelled pods)
        # feeds the same ClusterQueue, and the plan's order between the two is not fixed.
        lq = min((q for q in local_queues if _namespace(q) == name
                  and cq is not None and q["spec"].get("clusterQueue") == _name(cq)),
                 key=lambda q: (_name(q) != LOCAL_QUEUE_NAME, _name(q)), default=None)
        in_ns = [m for m in manifests if _namespace(m) == name]
        teams.append(TeamFacts(
            name=team, namespace=name, local_queue=_name(lq) if lq else None, gpu_quota=quota, borrowing=borrowing,
            default_priority_class=labels.get("mlplatform.io/default-priority-class"),
            has_fsx_claim=any(_kind(m)[1] == "PersistentVolumeClaim" and _name(m) == CLAIM_NAME for m in in_ns),
            tracking_secret=next((_name(m) for m in in_ns if _kind(m)[1] == "Secret" and _name(m) == tracking_secret_name
                                  and _has_tracking_keys(m)), None),
            trainer_service_account=next((_name(m) for m in in_ns if _kind(m)[1] == "ServiceAccount"
                                          and _name(m) == TRAINER_SERVICE_ACCOUNT), None),
            posix_id=int(labels[POSIX_ID_LABEL]) if str(labels.get(POSIX_ID_LABEL, "")).isdigit() else None,
            allowed_priority_classes=tuple(c for c in str((ns["metadata"].get("annotations") or {}).get(
                ALLOWED_PRIORITIES_ANNOTATION, "")).split(",") if c),
        ))
    priority_classes = tuple(sorted(_name(m) for m in manifests if _kind(m)[1] == "PriorityClass"))
    return PlatformFacts(
        stack=stack, region=region, pools=tuple(sorted(pools, key=lambda p: p.name)),
        teams=tuple(sorted(teams, key=lambda t: t.name)), priority_classes=priority_classes,
        checkpoints_bucket=checkpoints_bucket, fsx_write_mb_per_s=fsx_write_mb_per_s,
        trainer_v2_runtime=trainer_v2_runtime, checkpoint_store=checkpoint_store,
    )

