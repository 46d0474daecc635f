"""The GPU node readiness agent's manifests: pure functions, spec in, Kubernetes objects out.

Every GPU NodePool starts its nodes with ``READINESS_TAINT`` (a Karpenter startup taint; see
``workloads/karpenter.py``). This DaemonSet runs ``workloads/node_health_agent.py`` (mounted from a
ConfigMap) on every GPU node; the agent lifts the taint only when the node's GPUs, ECC state,
``dcgmi diag -r 1`` and EFA devices check out, and otherwise cordons, labels and reports the node
and sets ``AcceleratedHardwareReady=False`` so Karpenter's node repair replaces it.

It also watches its node's pods and marks the node when a trainer container ends with a GPU
fault (exit 135 and the termination message of ``trainer/gpu_faults.py``, which the ConfigMap
carries next to the agent, with ``workloads/xid_actions.json``) and the host confirms it: the
driver's Xid in the kernel log (read with CAP_SYSLOG) or a GPU nvidia-smi reports failed. A
report the host does not confirm is an Event only: a container writes its own termination message.

Least privilege: its own ServiceAccount; cluster-wide only ``get``/``patch`` on nodes,
``patch`` on ``nodes/status`` and ``list``/``watch`` on pods (RBAC cannot narrow a
ServiceAccount to "its own node": the NodeRestriction admission plugin only limits kubelets,
and RBAC ignores field selectors), and ``create`` on Events in the ``default`` namespace, where
node events live. Its node writes are held to its own node by an admission policy
(``workloads/node_agents.py``).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from trainer import gpu_faults
from workloads import node_health_agent, xid
from workloads.scan_skips import skip_annotations
from workloads.gpu_catalog import GPU_TYPES
from workloads.gpu_sharing import MIG_PENDING_TAINT, MIG_STATE_LABEL, MIG_STATE_SUCCESS, SHARING_LABEL, SHARING_TAINT
from workloads.node_agents import own_node_only_policy
from workloads.karpenter import GPU_TAINT, NODE_ROLE_LABEL, READINESS_STARTUP_TAINT, STORAGE_STARTUP_TAINTS

NAMESPACE = "gpu-system"
NAME = "gpu-node-health"
AGENT_FILE = "node_health_agent.py"
INSTANCES_FILE = "instances.json"
# The agent imports trainer.gpu_faults (the termination-message format), which reads the Xid
# table from ../workloads/: the ConfigMap's keys (no "/" allowed) are mounted at these paths.
GPU_FAULTS_FILE, GPU_FAULTS_PATH = "gpu_faults.py", "trainer/gpu_faults.py"
XID_TABLE_FILE, XID_TABLE_PATH = "xid_actions.json", "workloads/xid_actions.json"
MOUNT_PATH = "/opt/mlplatform"
HOST_SYS = "/host/sys"
LABELS = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": "ml-training-platform"}
DEFAULT_DEEP_INTERVAL_HOURS = 24.0


def instance_expectations() -> dict[str, dict[str, int]]:
    """What a healthy node of each catalog instance type shows: GPUs and EFA devices (one EFA
    interface per network card, the EC2NodeClass layout of ``efa_network_interfaces``)."""
    return {shape.instance_type: {"gpus": shape.num_gpus, "efa_devices": shape.num_efa_network_cards}
            for gpu in GPU_TYPES.values() for shape in gpu.shapes}


def agent_source() -> str:
    return Path(node_health_agent.__file__).read_text(encoding="utf-8")


def _meta(name: str, namespace: str | None = NAMESPACE) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(LABELS)}
    if namespace:
        meta["namespace"] = namespace
    return meta


def rbac_objects() -> list[dict[str, Any]]:
    subject = [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]
    events = skip_annotations([("CKV_K8S_21", "a Node's Events are recorded in the default namespace; only events create")])
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(NAME)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": _meta(NAME, None), "rules": [
            # get: Node.spec.taints has no merge key, so lifting one taint means reading the list
            # and patching it back (guarded by a JSON-patch test). patch: taint, cordon, label.
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
            {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
            # list/watch: its node's pods (fieldSelector spec.nodeName), for a trainer container's
            # GPU-fault exit. Not get: nothing by name; not pods/log, exec or any write.
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
        ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": _meta(NAME, None),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME}, "subjects": subject},
        # A Node's Events live in the default namespace (the kubelet records them there, involvedObject
        # a cluster-scoped Node), so the agent's do too; the Role grants events create only.
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {**_meta(NAME, "default"), "annotations": events},
         "rules": [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {**_meta(NAME, "default"), "annotations": events},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": NAME}, "subjects": subject},
        # The ClusterRole's patch reaches every Node: admission narrows it to the agent's own.
        *own_node_only_policy(f"{NAME}-own-node-only", [(NAMESPACE, NAME)], labels=LABELS),
    ]


def config_map() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(NAME), "data": {
        AGENT_FILE: agent_source(),
        INSTANCES_FILE: json.dumps(instance_expectations(), indent=1, sort_keys=True) + "\n",
        GPU_FAULTS_FILE: Path(gpu_faults.__file__).read_text(encoding="utf-8"),
        XID_TABLE_FILE: Path(xid.XID_TABLE_FILE).read_text(encoding="utf-8"),
    }}


def config_map_items() -> list[dict[str, str]]:
    """Each ConfigMap key at its path under MOUNT_PATH: the agent imports trainer.gpu_faults."""
    return [{"key": AGENT_FILE, "path": AGENT_FILE}, {"key": INSTANCES_FILE, "path": INSTANCES_FILE},
            {"key": GPU_FAULTS_FILE, "path": GPU_FAULTS_PATH}, {"key": XID_TABLE_FILE, "path": XID_TABLE_PATH}]


def tolerations() -> list[dict[str, Any]]:
    # The readiness taint is the one this agent lifts; GPU and storage taints as every GPU node agent.
    # Shared and MIG nodes carry their own taints too: without them the agent would never run
    # there and those pools would never lose the readiness taint.
    # Cordoned nodes need nothing: DaemonSet pods tolerate node.kubernetes.io/unschedulable.
    return [{"key": t["key"], "operator": "Exists", "effect": t["effect"]}
            for t in (GPU_TAINT, *STORAGE_STARTUP_TAINTS, READINESS_STARTUP_TAINT, SHARING_TAINT, MIG_PENDING_TAINT)]


# What the agent needs by design, each a checkov pod check it fails (the security scan reads these).
AGENT_CHECKOV_SKIPS = (
    ("CKV_K8S_8", "a node agent with no server: its liveness is its process (restartPolicy Always)"),
    ("CKV_K8S_9", "no Service routes to it: readiness gates nothing"),
    ("CKV_K8S_23", "dcgmi diag and nv-hostengine open the GPU device nodes as root"),
    ("CKV_K8S_40", "runs as root for the GPU device nodes (see CKV_K8S_23)"),
    ("CKV_K8S_25", "adds SYS_ADMIN (DCGM diagnostics) and SYSLOG (reads the driver's Xid lines from the kernel log) only"),
    ("CKV_K8S_39", "DCGM diagnostics need SYS_ADMIN in a container, as NVIDIA's DCGM exporter does for profiling"),
    ("CKV_K8S_29", "the container sets its securityContext (root, SYS_ADMIN only, no privilege escalation)"),
    ("CKV_K8S_31", "dcgmi diag stress plugins are not verified under RuntimeDefault seccomp (NVIDIA runs them privileged)"),
    ("CKV_K8S_22", "nv-hostengine writes its pid, socket and log into the image's /var"),
    ("CKV_K8S_38", "the agent patches its node (taint, label, condition) and watches its pods with its service account token"),
    ("CKV_K8S_43", "dev names an immutable ECR tag; prod's config refuses anything but a digest (gpuEnablement.nodeHealthImage)"),
)


def node_affinity() -> dict[str, Any]:
    """Every GPU node, but a MIG node only once the MIG manager reports success (aws-readiness-4 R4).

    The agent starts a persistent ``nv-hostengine`` that holds the GPUs open. NVML's
    ``nvmlDeviceSetMigMode`` fails with NVML_ERROR_IN_USE when a GPU is not idle, and the MIG
    manager (mig-parted v0.12.1 reconfigure-mig.sh) pauses only the GPU Operator's own clients
    before a mode change; so on a MIG node the agent waits for
    ``nvidia.com/mig.config.state=success``. Terms are ORed (Kubernetes NodeSelector): not a MIG
    pool (NotIn also matches an unlabelled node), or a MIG pool whose reconfiguration succeeded.
    The DaemonSet controller re-evaluates a node when its labels change."""
    gpu = {"key": NODE_ROLE_LABEL, "operator": "In", "values": ["gpu"]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [gpu, {"key": SHARING_LABEL, "operator": "NotIn", "values": ["mig"]}]},
        {"matchExpressions": [gpu, {"key": MIG_STATE_LABEL, "operator": "In", "values": [MIG_STATE_SUCCESS]}]},
    ]}}}


def daemon_set(*, image: str, deep_interval_hours: float = DEFAULT_DEEP_INTERVAL_HOURS) -> dict[str, Any]:
    """``image``: DCGM tools (dcgmi, nv-hostengine) and python3, by digest (docker/node-health)."""
    command = (
        # dcgmi talks to a host engine; this pod runs its own (no hostNetwork: no clash with the
        # DCGM exporter's embedded one). nv-hostengine daemonizes and returns once it listens.
        "nv-hostengine && exec python3 " + f"{MOUNT_PATH}/{AGENT_FILE} --instances {MOUNT_PATH}/{INSTANCES_FILE} "
        f"--sys-class-infiniband {HOST_SYS}/class/infiniband --deep-interval-hours {deep_interval_hours:g}"
    )
    skips = skip_annotations(AGENT_CHECKOV_SKIPS)
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {**_meta(NAME), "annotations": skips},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "20%"}},
            "template": {
                "metadata": {"labels": dict(LABELS), "annotations": dict(skips)},
                "spec": {
                    "serviceAccountName": NAME,
                    "priorityClassName": "system-node-critical",
                    "affinity": node_affinity(),
                    "tolerations": tolerations(),
                    "terminationGracePeriodSeconds": 10,
                    "containers": [{
                        "name": "agent", "image": image, "imagePullPolicy": "Always",
                        "command": ["/bin/sh", "-c", command],
                        "env": [
                            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                            # No nvidia.com/gpu request (the agent must see every GPU, and it must
                            # not take one): the NVIDIA runtime maps all GPUs from this variable.
                            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
                        ],
                        # dcgmi diag's load runs on the GPUs; one core bounds its host side.
                        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
                        # DCGM's diagnostics need SYS_ADMIN (as the DCGM exporter does); SYSLOG lets the
                        # agent read the kernel log through syslog(2) (kernel.dmesg_restrict), where the
                        # driver records Xids: the host's word on a GPU fault a container reports. No
                        # privileged mode.
                        "securityContext": {"runAsUser": 0, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": False,
                                            "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN", "SYSLOG"]}},
                        "volumeMounts": [
                            {"name": "agent", "mountPath": MOUNT_PATH, "readOnly": True},
                            # EFA devices: /sys/class/infiniband's entries link into /sys/devices,
                            # so the whole of /sys, read-only.
                            {"name": "sys", "mountPath": HOST_SYS, "readOnly": True},
                        ],
                    }],
                    "volumes": [
                        {"name": "agent", "configMap": {"name": NAME, "items": config_map_items()}},
                        {"name": "sys", "hostPath": {"path": "/sys", "type": "Directory"}},
                    ],
                },
            },
        },
    }


def node_health_objects(*, image: str, deep_interval_hours: float = DEFAULT_DEEP_INTERVAL_HOURS) -> list[dict[str, Any]]:
    return [*rbac_objects(), config_map(), daemon_set(image=image, deep_interval_hours=deep_interval_hours)]


def karpenter_node_repair_settings() -> Mapping[str, Any]:
    """Karpenter Helm ``settings`` that turn node repair on (chart 1.14.1
    ``settings.featureGates.nodeRepair``, default false, rendered into the controller's
    ``FEATURE_GATES`` as ``NodeRepair=``)."""
    return {"featureGates": {"nodeRepair": True}}
