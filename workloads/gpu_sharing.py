"""GPU sharing per pool: time-slicing or MIG, and everything that makes a slice schedulable.

A pool declares ``sharing: none | time-slicing | mig``. This module turns that into:

- the NVIDIA device plugin's per-node configuration (k8s-device-plugin v0.17.1 ``api/config/v1``):
  a named config per shared pool, selected on each node by the label
  ``nvidia.com/device-plugin.config`` (the plugin's config-manager sidecar reads it: v0.17.1
  ``cmd/config-manager/main.go`` ``DefaultConfigLabel``). Time-slicing renames the resource to
  ``nvidia.com/gpu.shared`` (``renameByDefault``) and refuses a request for more than one share
  (``failRequestsGreaterThanOne``: a pod asking for two shares would get no more GPU time, only
  a false promise). MIG pools use the ``mixed`` strategy: each profile is its own resource,
  ``nvidia.com/mig-1g.10gb``.
- the MIG manager's mig-parted configuration, a named layout per MIG pool, selected by the
  label ``nvidia.com/mig.config`` (mig-parted ``cmd/nvidia-mig-manager/main.go`` ``MigConfigLabel``);
  the manager reports ``nvidia.com/mig.config.state`` = pending | rebooting | success | failed
  (mig-parted ``deployments/container/reconfigure-mig.sh``).
- a startup taint on MIG nodes, lifted by a small gate DaemonSet only once the manager reports
  ``success`` (and put back whenever the state leaves ``success``);
- a Karpenter NodeOverlay per shared pool, declaring the slices each instance type will offer, so
  a pending ``nvidia.com/mig-1g.10gb`` or ``nvidia.com/gpu.shared`` request launches that pool's
  node (karpenter-provider-aws v1.14.1 ``pkg/apis/crds/karpenter.sh_nodeoverlays.yaml``, alpha,
  behind the ``NodeOverlay`` feature gate).

Why the GPU Operator for MIG: the MIG manager pauses the GPU's Kubernetes clients before it
changes the MIG mode by flipping the ``nvidia.com/gpu.deploy.<operand>`` node labels and waiting
for the operator's DaemonSets (``app=nvidia-device-plugin-daemonset``...) to leave
(reconfigure-mig.sh, "Shutting down all GPU clients in Kubernetes"). Our standalone Helm device
plugin selects on none of those labels, so it would keep the GPU open through the change. The GPU
Operator deploys the MIG manager with its operands wired to those labels; MIG pools therefore need
``gpuEnablement.mode: gpu-operator`` (driver and toolkit stay off: the AMI ships them).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterator, Mapping, Optional, Sequence, Union

import yaml

from catalog.gpu_sharing import MIG_PROFILES, SOURCE as MIG_SOURCE, mig_capable, pack
from workloads.node_agents import own_node_only_policy
from workloads.problems import Problem, accepts_enum_values
from workloads.scan_skips import skip_annotations

GPU_RESOURCE = "nvidia.com/gpu"
SHARED_GPU_RESOURCE = "nvidia.com/gpu.shared"  # ResourceName.DefaultSharedRename() in v0.17.1
DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_STATE_LABEL = "nvidia.com/mig.config.state"
MIG_STATE_SUCCESS = "success"
SHARING_LABEL = "mlplatform.io/gpu-sharing"
# Only pods that asked for a slice (Kueue's shared flavors add the toleration) land on shared
# nodes; without it Karpenter could pick a shared pool for a whole-GPU pod (its simulation still
# counts the instance's nvidia.com/gpu), and the pod would never fit there.
SHARING_TAINT = {"key": SHARING_LABEL, "effect": "NoSchedule"}
MIG_PENDING_TAINT = {"key": "mlplatform.io/mig-pending", "effect": "NoSchedule"}
DEFAULT_CONFIG = "default"
MIG_DISABLED_CONFIG = "all-disabled"
DEVICE_PLUGIN_CONFIGMAP = "mlplatform-device-plugin-configs"
MIG_PARTED_CONFIGMAP = "mlplatform-mig-parted-config"
NODE_OVERLAY_API = "karpenter.sh/v1alpha1"
MAX_TIME_SLICING_REPLICAS = 16
_LAYOUT_ALL = re.compile(r"^all-(?P<profile>[0-9]+g\.[0-9]+gb)$")


class GpuSharing(str, Enum):
    NONE = "none"
    TIME_SLICING = "time-slicing"
    MIG = "mig"


MigLayout = tuple[tuple[str, int], ...]  # (profile, instances per GPU), sorted


def parse_mig_layout(gpu_type: str, value: Union[str, Mapping[str, int], None]) -> MigLayout:
    """``all-1g.10gb`` (every GPU cut into as many of that profile as fit) or a mixed layout
    ``{3g.40gb: 1, 2g.20gb: 1, 1g.10gb: 2}`` (instances per GPU). An invalid layout (which
    ``mig_layout_problems`` reports) gives the empty layout, so the other rules still run."""
    if gpu_type not in MIG_PROFILES or list(mig_layout_problems("", gpu_type, value)):
        return ()
    profiles = MIG_PROFILES[gpu_type]
    if isinstance(value, str):
        name = _LAYOUT_ALL.match(value).group("profile")  # type: ignore[union-attr]
        return ((name, profiles[name].max_instances),)
    return tuple(sorted((str(k), int(v)) for k, v in (value or {}).items()))


def mig_layout_problems(at: str, gpu_type: str, value: Any) -> Iterator[Problem]:
    profiles = MIG_PROFILES[gpu_type]
    allowed = ", ".join(profiles)
    fix_all = f"use all-<profile> with a {gpu_type} profile ({allowed}), or a mapping profile: instances per GPU"
    if isinstance(value, str):
        match = _LAYOUT_ALL.match(value)
        if not match or match.group("profile") not in profiles:
            yield Problem(at, value, f"is not a MIG layout of {gpu_type} (source: {MIG_SOURCE})", fix_all)
        return
    if not isinstance(value, Mapping) or not value:
        yield Problem(at, value, "is not a MIG layout", fix_all)
        return
    bad = False
    for name, count in value.items():
        if name not in profiles:
            bad = True
            yield Problem(f"{at}.{name}", count, f"is not a MIG profile of {gpu_type} (source: {MIG_SOURCE})",
                          f"use one of {allowed}")
        elif not isinstance(count, int) or isinstance(count, bool) or count < 1:
            bad = True
            yield Problem(f"{at}.{name}", count, "is not a number of instances", "use a whole number >= 1")
        elif count > profiles[name].max_instances:
            bad = True
            yield Problem(f"{at}.{name}", count, f"a {gpu_type} GPU holds at most {profiles[name].max_instances} x {name}",
                          f"use at most {profiles[name].max_instances}")
    if not bad and pack(gpu_type, value) is None:
        compute = sum(profiles[n].compute_slices * c for n, c in value.items())
        memory = sum(profiles[n].memory_slices * c for n, c in value.items())
        yield Problem(at, dict(value),
                      f"does not fit one {gpu_type} GPU ({compute}/7 compute and {memory}/8 memory slices, or no placement "
                      f"of these profiles leaves them disjoint; source: {MIG_SOURCE})",
                      "drop an instance or use smaller profiles, e.g. {3g.40gb: 1, 2g.20gb: 1, 1g.10gb: 2} on an 80 GB GPU")


def sharing_problems(path: str, pools: Sequence[Any], *, gpu_operator: bool) -> Iterator[Problem]:
    """Every sharing mistake of the pool list at once. ``pools`` are infra.config.GpuPoolConfig."""
    modes = ", ".join(m.value for m in GpuSharing)
    for index, pool in enumerate(pools):
        at = f"{path}[{index}]"
        mode = GpuSharing(pool.sharing)
        if mode is not GpuSharing.TIME_SLICING and pool.time_slicing_replicas is not None:
            yield Problem(f"{at}.timeSlicingReplicas", pool.time_slicing_replicas, f"only applies to sharing: time-slicing "
                          f"(this pool has sharing: {mode.value})", "remove it, or set sharing: time-slicing")
        if mode is not GpuSharing.MIG and pool.mig_layout is not None:
            yield Problem(f"{at}.migLayout", pool.mig_layout, f"only applies to sharing: mig (this pool has sharing: {mode.value})",
                          "remove it, or set sharing: mig")
        if mode is GpuSharing.NONE:
            continue
        if pool.efa:
            yield Problem(f"{at}.sharing", mode.value, "an EFA pool is for multi-node training, which never runs on a shared GPU",
                          f"set sharing: none on this pool and declare a separate pool without EFA for slices (allowed: {modes})")
        if mode is GpuSharing.TIME_SLICING:
            replicas = pool.time_slicing_replicas
            if replicas is None or not 2 <= replicas <= MAX_TIME_SLICING_REPLICAS:
                yield Problem(f"{at}.timeSlicingReplicas", replicas,
                              "time-slicing needs the number of pods that share each GPU",
                              f"set a whole number from 2 to {MAX_TIME_SLICING_REPLICAS} (e.g. 4)")
        else:
            capable = sorted(MIG_PROFILES)
            if not mig_capable(pool.gpu_type):
                yield Problem(f"{at}.sharing", "mig", f"{pool.gpu_type} GPUs have no MIG (source: {MIG_SOURCE})",
                              f"use sharing: time-slicing, or a MIG-capable gpuType ({', '.join(capable)})")
            elif pool.mig_layout is None:
                yield Problem(f"{at}.migLayout", None, "sharing: mig needs a layout",
                              f"e.g. all-{next(iter(MIG_PROFILES[pool.gpu_type]))} or a mapping of "
                              f"{', '.join(MIG_PROFILES[pool.gpu_type])} to instances per GPU")
            else:
                yield from mig_layout_problems(f"{at}.migLayout", pool.gpu_type, pool.mig_layout)
            if not gpu_operator:
                yield Problem(f"{at}.sharing", "mig",
                              "the MIG manager comes with the GPU Operator (it pauses the operator's device plugin and DCGM "
                              "while it repartitions the GPUs; the standalone device plugin is not paused)",
                              "set gpuEnablement.mode: gpu-operator, or use sharing: time-slicing")


# -- what a shared pool offers -------------------------------------------------------------------------
@accepts_enum_values
@dataclass(frozen=True)
class PoolSharing:
    """A pool's sharing as the renderers need it (built from infra.config.GpuPoolConfig)."""

    mode: GpuSharing = GpuSharing.NONE
    time_slicing_replicas: int = 1
    mig_layout: MigLayout = ()

    @property
    def shared(self) -> bool:
        return self.mode is not GpuSharing.NONE

    def slices_per_gpu(self) -> dict[str, int]:
        """Extended resource -> how many one GPU offers."""
        if self.mode is GpuSharing.TIME_SLICING:
            return {SHARED_GPU_RESOURCE: self.time_slicing_replicas}
        if self.mode is GpuSharing.MIG:
            return {f"nvidia.com/mig-{name}": count for name, count in self.mig_layout}
        return {}

    def slices_per_node(self, gpus_per_node: int) -> dict[str, int]:
        return {r: n * gpus_per_node for r, n in self.slices_per_gpu().items()}

    def describe(self) -> str:
        if self.mode is GpuSharing.TIME_SLICING:
            return f"time-slicing, {self.time_slicing_replicas} pods per GPU ({SHARED_GPU_RESOURCE}; no memory isolation)"
        if self.mode is GpuSharing.MIG:
            return "MIG " + " + ".join(f"{count} x {name}" for name, count in self.mig_layout) + " per GPU (mixed strategy)"
        return "none (whole GPUs)"


def config_name(pool_name: str) -> str:
    """The device-plugin / mig-parted config name of a pool (never ``default``/``all-disabled``)."""
    return f"pool-{pool_name}"


def node_labels(pool_name: str, sharing: PoolSharing) -> dict[str, str]:
    if not sharing.shared:
        return {}
    labels = {SHARING_LABEL: sharing.mode.value, DEVICE_PLUGIN_CONFIG_LABEL: config_name(pool_name)}
    if sharing.mode is GpuSharing.MIG:
        labels[MIG_CONFIG_LABEL] = config_name(pool_name)
    return labels


def taints(sharing: PoolSharing) -> list[dict[str, str]]:
    return [dict(SHARING_TAINT)] if sharing.shared else []


def startup_taints(sharing: PoolSharing) -> list[dict[str, str]]:
    return [dict(MIG_PENDING_TAINT)] if sharing.mode is GpuSharing.MIG else []


# -- NVIDIA device plugin and MIG manager configuration --------------------------------------------------
def device_plugin_config(sharing: PoolSharing, *, default_mig_strategy: str) -> dict[str, Any]:
    """One named config (k8s-device-plugin v0.17.1 api/config/v1 ``Config``)."""
    if sharing.mode is GpuSharing.MIG:
        return {"version": "v1", "flags": {"migStrategy": "mixed", "failOnInitError": True}}
    config: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": default_mig_strategy, "failOnInitError": True}}
    if sharing.mode is GpuSharing.TIME_SLICING:
        config["sharing"] = {"timeSlicing": {
            "renameByDefault": True, "failRequestsGreaterThanOne": True,
            "resources": [{"name": GPU_RESOURCE, "replicas": sharing.time_slicing_replicas}]}}
    return config


def device_plugin_configs(pools: Mapping[str, PoolSharing], *, default_mig_strategy: str = "none") -> dict[str, str]:
    """Config name -> YAML, ``default`` for every node without a pool config label."""
    configs = {DEFAULT_CONFIG: device_plugin_config(PoolSharing(), default_mig_strategy=default_mig_strategy)}
    for name, sharing in sorted(pools.items()):
        if sharing.shared:
            configs[config_name(name)] = device_plugin_config(sharing, default_mig_strategy=default_mig_strategy)
    return {k: yaml.safe_dump(v, sort_keys=False) for k, v in configs.items()}


def mig_parted_config(pools: Mapping[str, PoolSharing]) -> dict[str, Any]:
    """mig-parted ``v1`` config: ``all-disabled`` plus a layout per MIG pool (mig-parted
    api/spec/v1: ``mig-configs: {name: [{devices, mig-enabled, mig-devices}]}``)."""
    configs: dict[str, Any] = {MIG_DISABLED_CONFIG: [{"devices": "all", "mig-enabled": False}]}
    for name, sharing in sorted(pools.items()):
        if sharing.mode is GpuSharing.MIG:
            configs[config_name(name)] = [{"devices": "all", "mig-enabled": True,
                                           "mig-devices": {profile: count for profile, count in sharing.mig_layout}}]
    return {"version": "v1", "mig-configs": configs}


def any_mig(pools: Mapping[str, PoolSharing]) -> bool:
    return any(s.mode is GpuSharing.MIG for s in pools.values())


def device_plugin_chart_config(pools: Mapping[str, PoolSharing]) -> dict[str, Any]:
    """``config`` of the nvidia-device-plugin chart (0.17.1 values.yaml: ``map`` builds the chart's
    ConfigMap, ``default`` names the config of unlabelled nodes); empty when no pool shares."""
    if not any(s.shared for s in pools.values()):
        return {}
    return {"config": {"map": device_plugin_configs(pools), "default": DEFAULT_CONFIG}}


def gpu_operator_sharing_values(pools: Mapping[str, PoolSharing]) -> dict[str, Any]:
    """GPU Operator (v25.3.0 values.yaml) values for shared pools: ``devicePlugin.config``
    (create/name/default/data), ``mig.strategy`` and ``migManager.config``."""
    if not any(s.shared for s in pools.values()):
        return {}
    values: dict[str, Any] = {"devicePlugin": {"config": {
        "create": True, "name": DEVICE_PLUGIN_CONFIGMAP, "default": DEFAULT_CONFIG,
        # The operator passes MIG_STRATEGY from mig.strategy to every plugin; mixed also serves
        # whole GPUs as nvidia.com/gpu, so one value fits MIG and non-MIG nodes.
        "data": device_plugin_configs(pools, default_mig_strategy="mixed" if any_mig(pools) else "none")}}}
    if any_mig(pools):
        values["mig"] = {"strategy": "mixed"}
        values["migManager"] = {"enabled": True, "config": {
            "create": True, "name": MIG_PARTED_CONFIGMAP, "default": MIG_DISABLED_CONFIG,
            "data": {"config.yaml": yaml.safe_dump(mig_parted_config(pools), sort_keys=False)}}}
    return values


# -- Karpenter ---------------------------------------------------------------------------------------------
def node_overlay(pool_name: str, node_pool_name: str, instance_types: Sequence[str], gpus_per_node: int,
                 sharing: PoolSharing, *, pool_label: str) -> Optional[dict[str, Any]]:
    """The slices a node of this pool will advertise, for Karpenter's scheduling simulation.

    Without it Karpenter only knows the instance's ``nvidia.com/gpu`` and never launches a node
    for a pending slice request. The overlay adds capacity to instance types only: it launches
    nothing by itself, so a pool with no pending slice request stays at zero nodes.
    """
    if not sharing.shared:
        return None
    return {
        "apiVersion": NODE_OVERLAY_API,
        "kind": "NodeOverlay",
        "metadata": {"name": f"{node_pool_name}-slices", "labels": {pool_label: pool_name}},
        "spec": {
            # Scoped to this NodePool: the overlay controller matches each instance type together with
            # karpenter.sh/nodepool=<pool> and the pool's template labels (kubernetes-sigs/karpenter
            # 6e7eab7a0f48, the core of v1.14.1: pkg/controllers/nodeoverlay/controller.go
            # getOverlaidOfferings), so the dev l4 pool's identical g6 types gain no shared slices.
            "requirements": [
                {"key": "karpenter.sh/nodepool", "operator": "In", "values": [node_pool_name]},
                {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": sorted(instance_types)},
            ],
            "capacity": {r: str(n) for r, n in sharing.slices_per_node(gpus_per_node).items()},
        },
    }


# -- the MIG gate --------------------------------------------------------------------------------------------
MIG_GATE_NAME = "mig-ready-gate"


def mig_gate_script() -> str:
    """Lift the MIG startup taint once the MIG manager reports success; put it back whenever the
    state leaves success (a new layout is being applied). Runs ``kubectl`` on its own node only."""
    taint = MIG_PENDING_TAINT["key"]
    effect = MIG_PENDING_TAINT["effect"]
    return (
        "set -u\n"
        'node="${NODE_NAME:?NODE_NAME is not set}"\n'
        "while :; do\n"
        f"  state=$(kubectl get node \"$node\" -o 'jsonpath={{.metadata.labels.nvidia\\.com/mig\\.config\\.state}}') || state=unreadable\n"
        f"  tainted=$(kubectl get node \"$node\" -o 'jsonpath={{.spec.taints[?(@.key==\"{taint}\")].key}}') || tainted=unknown\n"
        f"  if [ \"$state\" = \"{MIG_STATE_SUCCESS}\" ]; then\n"
        "    if [ -n \"$tainted\" ] && [ \"$tainted\" != unknown ]; then\n"
        f"      kubectl taint node \"$node\" '{taint}:{effect}-' && echo \"MIG layout applied ({MIG_STATE_LABEL}=success): {taint} lifted\"\n"
        "    fi\n"
        "  else\n"
        "    if [ -z \"$tainted\" ]; then\n"
        f"      kubectl taint node \"$node\" \"{taint}=${{state:-none}}:{effect}\" --overwrite "
        f"&& echo \"{MIG_STATE_LABEL}=${{state:-<unset>}}: {taint} put back\"\n"
        "    fi\n"
        "    [ \"$state\" = failed ] && echo \"MIG manager reports failed: the node stays tainted; see the runbook (docs/runbooks/gpu-pools.md)\" >&2\n"
        "  fi\n"
        '  [ -n "${GATE_ONCE:-}" ] && exit 0\n'
        '  sleep "${POLL_SECONDS:-10}"\n'
        "done\n"
    )


# What the gate fails by design, each a checkov pod check (the security scan reads these).
MIG_GATE_CHECKOV_SKIPS = (
    ("CKV_K8S_8", "a watch loop with no server: its liveness is its process (restartPolicy Always)"),
    ("CKV_K8S_9", "no Service routes to it: readiness gates nothing"),
    ("CKV_K8S_38", "the gate lifts its node's taint with its service account token"),
    ("CKV_K8S_43", "the MIG manager image the pinned GPU Operator release deploys, by the same tag (catalog/versions.py)"),
)


def mig_gate_objects(namespace: str, image: str, tolerations: Sequence[Mapping[str, str]]) -> list[dict[str, Any]]:
    """ServiceAccount, ClusterRole (get/patch nodes), binding, the own-node-only admission policy
    and the DaemonSet on MIG nodes."""
    labels = {"app.kubernetes.io/name": MIG_GATE_NAME, "app.kubernetes.io/part-of": "mlplatform"}
    skips = skip_annotations(MIG_GATE_CHECKOV_SKIPS)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": MIG_GATE_NAME, "namespace": namespace, "labels": labels}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": MIG_GATE_NAME, "labels": labels},
         "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": MIG_GATE_NAME, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": MIG_GATE_NAME},
         "subjects": [{"kind": "ServiceAccount", "name": MIG_GATE_NAME, "namespace": namespace}]},
        # The ClusterRole's patch reaches every Node: admission narrows it to the gate's own.
        *own_node_only_policy(f"{MIG_GATE_NAME}-own-node-only", [(namespace, MIG_GATE_NAME)], labels=labels),
        {"apiVersion": "apps/v1", "kind": "DaemonSet",
         "metadata": {"name": MIG_GATE_NAME, "namespace": namespace, "labels": labels, "annotations": skips},
         "spec": {
             "selector": {"matchLabels": {"app.kubernetes.io/name": MIG_GATE_NAME}},
             "template": {
                 "metadata": {"labels": labels, "annotations": dict(skips)},
                 "spec": {
                     "serviceAccountName": MIG_GATE_NAME,
                     "priorityClassName": "system-node-critical",
                     "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                         {"matchExpressions": [{"key": SHARING_LABEL, "operator": "In", "values": [GpuSharing.MIG.value]}]}]}}},
                     "tolerations": [dict(t) for t in tolerations],
                     "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534,
                                         "seccompProfile": {"type": "RuntimeDefault"}},
                     "containers": [{
                         "name": "gate", "image": image, "imagePullPolicy": "Always",
                         "command": ["/bin/bash", "-c", mig_gate_script()],
                         "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                                 {"name": "HOME", "value": "/tmp"}],
                         "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}},
                         "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                             "capabilities": {"drop": ["ALL"]}},
                         "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                     }],
                     "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "16Mi"}}],
                 },
             },
         }},
    ]


# -- cost -----------------------------------------------------------------------------------------------------
def slice_fraction(sharing: PoolSharing, resource: str) -> float:
    """The share of one GPU a slice of ``resource`` is: 1/replicas for time-slicing; for MIG the
    profile's compute slices out of 7 (a 3g slice is 3/7 of the GPU's SMs)."""
    if sharing.mode is GpuSharing.TIME_SLICING:
        return 1.0 / sharing.time_slicing_replicas
    if sharing.mode is GpuSharing.MIG:
        profile = resource.removeprefix("nvidia.com/mig-")
        return int(profile.split("g.", 1)[0]) / 7
    return 1.0


def usd_per_slice_hour(instance_usd_per_hour: float, gpus_per_node: int, sharing: PoolSharing, resource: str) -> float:
    return instance_usd_per_hour / gpus_per_node * slice_fraction(sharing, resource)


def slice_memory_gib(gpu_type: str, gpu_memory_gib: float, sharing: PoolSharing, resource: str) -> float:
    """GPU memory one slice can use: the MIG profile's memory; a time-slice shares the whole GPU's
    memory with the other pods (no isolation), so its fair share is memory / replicas."""
    if sharing.mode is GpuSharing.MIG:
        return MIG_PROFILES[gpu_type][resource.removeprefix("nvidia.com/mig-")].memory_gib
    if sharing.mode is GpuSharing.TIME_SLICING:
        return gpu_memory_gib / sharing.time_slicing_replicas
    return float(gpu_memory_gib)
