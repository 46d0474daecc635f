"""GPU node readiness agent: keeps a new GPU node out of service until its hardware checks pass.

Runs as a DaemonSet pod on every GPU node (manifests: ``workloads/node_health.py``), in an image
with the DCGM tools and ``python3`` (docker/node-health/Dockerfile); ``nvidia-smi`` and the driver
libraries come from the NVIDIA container runtime (``NVIDIA_VISIBLE_DEVICES=all``). Standard
library only: this file is mounted into that image from a ConfigMap.

Every GPU NodePool starts its nodes with the startup taint ``READINESS_TAINT`` (Karpenter
``startupTaints``). On start the agent checks, in order:

- GPU count: ``Attached GPUs`` of ``nvidia-smi -q`` equals the instance type's GPU count;
- ECC: every GPU has ECC enabled, no volatile uncorrectable errors, no pending row remap and no
  row-remap failure (the same ``nvidia-smi -q`` report; both the row-remapper and the older
  page-retirement layouts are read);
- ``dcgmi diag -r 1`` passes (every test ``Pass``/``Skip``, exit code 0);
- EFA pools: the number of EFA devices under /sys/class/infiniband equals the instance type's.

All pass: the agent removes the taint and sets the node condition ``AcceleratedHardwareReady``
True. Any fails: the node keeps the taint, is cordoned, labelled with the failure classes, an
Event and a log line say why, and ``AcceleratedHardwareReady`` goes False: Karpenter's node
repair (feature gate ``NodeRepair``; the AWS provider's repair policy deletes the NodeClaim of a
node whose ``AcceleratedHardwareReady`` has been False for 10 minutes) replaces it. A failure of
the agent's own tools (``tool-error``) cordons and labels but does not mark the hardware
unhealthy: a broken image must not make Karpenter replace every node it lands on.

Every ``--deep-interval-hours`` the agent runs ``dcgmi diag -r 2`` when the node's GPUs are idle:
it re-adds the readiness taint first (so nothing new lands during the run), then checks that no
compute process holds a GPU, and backs off if one does.

In between it watches the pods of its own node (``fieldSelector=spec.nodeName=<node>``). A
container that terminated with the trainer's GPU-fault exit code (135) and a GPU-fault
termination message (the format of ``trainer/gpu_faults.py``, mounted next to this file) reports
a fault of this node. The report is a claim: the container writes its own termination message,
so any pod on the node could send it. The agent acts only on what the host itself recorded
(``HostRecord``): an NVRM Xid the driver wrote into the kernel log while that container ran, or
a GPU that nvidia-smi (NVML) or /sys report failed now. Confirmed: it cordons the node and labels
it ``gpu-fault``, and where the host's Xid calls for a reset or a replacement
(``workloads/xid_actions.json``) sets ``AcceleratedHardwareReady`` False so Karpenter's node
repair replaces it; for ``drain`` a person decides (docs/runbooks/gpu-health.md). An Event and a
log line name the pod, rank, GPU, the claimed fault and the host's record. Not confirmed: an
Event (``GpuFaultNotConfirmed``) and a log line, and the node stays in service.
Once per fault: the node's ``GPU_FAULTS_ANNOTATION`` records the faults already acted on, so a
restarted agent does not act twice. The agent never restarts or deletes anything: the job's own
retry (the Training Operator recreates the pod, now off this node) recovers, bounded by the
trainer's ``checkpoint.max_attempts_without_progress``.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import json
import os
import re
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Optional, Sequence

# The trainer's termination-message format and exit code, one definition for both sides: in the
# image this is the ConfigMap's copy (workloads/node_health.py mounts it at trainer/gpu_faults.py
# beside this file), in the repository the trainer's own. Standard library only, as this file.
from trainer.gpu_faults import (
    ACTION_SEVERITY, EXIT_GPU_FAULT, NODE_ACTIONS, FaultLine, node_action, parse_termination_message, xid_actions,
)

READINESS_TAINT = {"key": "node.mlplatform.io/gpu-not-ready", "effect": "NoSchedule"}
HEALTH_CONDITION = "AcceleratedHardwareReady"
FAILURE_LABEL = "node.mlplatform.io/gpu-health-failure"
EFA_LABEL = "mlplatform.io/efa"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
COMPONENT = "mlplatform-gpu-node-health"

# Failure classes: each is a label value fragment, a log field and a test fixture.
GPU_COUNT = "gpu-count"
ECC_DISABLED = "ecc-disabled"
ECC_UNCORRECTABLE = "ecc-uncorrectable"
ROW_REMAP_PENDING = "row-remap-pending"
ROW_REMAP_FAILURE = "row-remap-failure"
DCGM_DIAG = "dcgm-diag"
EFA_COUNT = "efa-count"
TOOL_ERROR = "tool-error"
GPU_FAULT = "gpu-fault"  # a job's container reported a GPU fault on this node (trainer exit 135)
HARDWARE_FAILURES = (GPU_COUNT, ECC_DISABLED, ECC_UNCORRECTABLE, ROW_REMAP_PENDING, ROW_REMAP_FAILURE, DCGM_DIAG, EFA_COUNT)
GPU_FAULTS_ANNOTATION = "node.mlplatform.io/gpu-faults"  # JSON list of the fault keys acted on
GPU_FAULTS_KEPT = 16  # keys kept in the annotation: a node is replaced long before this many


class Failure(NamedTuple):
    kind: str
    detail: str


# ---------------------------------------------------------------- nvidia-smi -q

def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def parse_tree(lines: Sequence[str]) -> dict[str, Any]:
    """``nvidia-smi -q``'s indented ``Key : value`` blocks as nested dicts (sections hold dicts)."""
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(-1, root)]
    for raw in lines:
        if not raw.strip() or raw.strip().startswith("="):
            continue
        level = _indent(raw)
        while stack[-1][0] >= level:
            stack.pop()
        key, sep, value = raw.strip().partition(":")
        parent = stack[-1][1]
        if sep and value.strip():
            parent[key.strip()] = value.strip()
        else:
            child: dict[str, Any] = {}
            parent[key.strip()] = child
            stack.append((level, child))
    return root


class GpuReport(NamedTuple):
    attached: Optional[int]
    gpus: dict[str, dict[str, Any]]  # bus id -> that GPU's sections


def parse_nvidia_smi_q(text: str) -> GpuReport:
    lines = text.splitlines()
    attached = None
    gpus: dict[str, dict[str, Any]] = {}
    current: Optional[str] = None
    body: list[str] = []

    def close() -> None:
        if current is not None:
            gpus[current] = parse_tree(body)

    for line in lines:
        match = re.match(r"^Attached GPUs\s*:\s*(\d+)", line)
        if match:
            attached = int(match.group(1))
            continue
        match = re.match(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*$", line)
        if match:
            close()
            current, body = match.group(1), []
            continue
        if current is not None and line.startswith(" "):
            body.append(line)
    close()
    return GpuReport(attached, gpus)


def _number(value: Any) -> int:
    try:
        return int(str(value).split()[0])
    except (ValueError, IndexError):
        return 0  # "N/A" (not supported) counts as nothing reported


def _uncorrectable(volatile: Any) -> int:
    """Sum of a ``Volatile`` ECC section's uncorrectable counters, in either driver layout:
    R5xx+ (``SRAM Uncorrectable Parity``, ``DRAM Uncorrectable``...) or the older
    ``Double Bit`` > ``Device Memory``/``Total``."""
    if not isinstance(volatile, dict):
        return 0
    total = 0
    for key, value in volatile.items():
        if key == "Double Bit" and isinstance(value, dict):
            total += _number(value.get("Total", 0))
        elif "Uncorrectable" in key and not isinstance(value, dict):
            total += _number(value)
    return total


def check_gpus(text: str, expected_gpus: int) -> list[Failure]:
    report = parse_nvidia_smi_q(text)
    if report.attached is None:
        return [Failure(TOOL_ERROR, "nvidia-smi -q printed no 'Attached GPUs' line")]
    failures = []
    if report.attached != expected_gpus or len(report.gpus) != expected_gpus:
        failures.append(Failure(GPU_COUNT, f"expected {expected_gpus} GPUs, nvidia-smi reports {report.attached} "
                                           f"attached and {len(report.gpus)} listed"))
    for bus_id, gpu in sorted(report.gpus.items()):
        mode = gpu.get("ECC Mode", {}).get("Current", "N/A")
        if mode == "Disabled":
            failures.append(Failure(ECC_DISABLED, f"GPU {bus_id}: ECC mode is Disabled"))
        errors = _uncorrectable(gpu.get("ECC Errors", {}).get("Volatile"))
        if errors:
            failures.append(Failure(ECC_UNCORRECTABLE, f"GPU {bus_id}: {errors} volatile uncorrectable ECC errors"))
        remap = gpu.get("Remapped Rows", {})
        if isinstance(remap, dict):
            if remap.get("Remapping Failure Occurred") == "Yes":
                failures.append(Failure(ROW_REMAP_FAILURE, f"GPU {bus_id}: row remapping failed (no spare rows)"))
            if remap.get("Pending") == "Yes":
                failures.append(Failure(ROW_REMAP_PENDING, f"GPU {bus_id}: a row remap is pending a GPU reset"))
        retired = gpu.get("Retired Pages", {})
        if isinstance(retired, dict) and retired.get("Pending Page Blacklist", retired.get("Pending")) == "Yes":
            failures.append(Failure(ROW_REMAP_PENDING, f"GPU {bus_id}: a page retirement is pending a GPU reset"))
    return failures


# ---------------------------------------------------------------- dcgmi diag

def parse_dcgmi_diag(text: str) -> list[tuple[str, str]]:
    """(test, result) rows of ``dcgmi diag``'s table, e.g. ``| GPU Memory | Fail - All |``.
    ``Warning``/``Info`` rows are attached to the test above them; dcgmi wraps long text onto
    rows with an empty first column, mid-word, so those are joined without a separator."""
    rows: list[tuple[str, str]] = []
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) != 4 or cells[0] or cells[3].strip():
            continue  # not a "| name | result |" row (borders, section rules, other output)
        name, result = cells[1].strip(), cells[2][1:].rstrip()
        if name.startswith("-") or name in ("Diagnostic",):
            continue
        if not rows:
            if name:
                rows.append((name, result.strip()))
            continue
        last_name, last_result = rows[-1]
        if not name:
            rows[-1] = (last_name, last_result + result)
        elif name in ("Warning", "Info"):
            rows[-1] = (last_name, f"{last_result}; {result.strip()}")
        else:
            rows.append((name, result.strip()))
    return rows


def check_dcgmi_diag(text: str, returncode: int, level: int) -> list[Failure]:
    rows = parse_dcgmi_diag(text)
    failed = [f"{name}: {result}" for name, result in rows if result.startswith("Fail")]
    if failed:
        return [Failure(DCGM_DIAG, f"dcgmi diag -r {level}: " + " | ".join(failed))]
    if returncode != 0:
        if not rows:
            return [Failure(TOOL_ERROR, f"dcgmi diag -r {level} exited {returncode}: {text.strip()[-300:]}")]
        return [Failure(DCGM_DIAG, f"dcgmi diag -r {level} exited {returncode}")]
    if not any(result.startswith("Pass") for _, result in rows):
        return [Failure(TOOL_ERROR, f"dcgmi diag -r {level} printed no result table")]
    return []


# ---------------------------------------------------------------- EFA

def count_efa_devices(sys_class_infiniband: str = "/sys/class/infiniband") -> int:
    """EFA devices: the RDMA devices whose driver is ``efa`` (EC2 names them rdmapNsM)."""
    try:
        names = os.listdir(sys_class_infiniband)
    except FileNotFoundError:
        return 0
    count = 0
    for name in names:
        driver = os.path.join(sys_class_infiniband, name, "device", "driver")
        if os.path.basename(os.path.realpath(driver)) == "efa":
            count += 1
    return count


def check_efa(found: int, expected: int) -> list[Failure]:
    if found != expected:
        return [Failure(EFA_COUNT, f"expected {expected} EFA devices, /sys/class/infiniband has {found}")]
    return []


# ---------------------------------------------------------------- decisions (pure)

def failure_label_value(failures: Sequence[Failure]) -> str:
    """A label value (<= 63 chars of [A-Za-z0-9_.-]) naming the failure classes."""
    kinds = sorted({f.kind for f in failures})
    return ".".join(kinds)[:63].strip(".-_")


def hardware_failed(failures: Sequence[Failure]) -> bool:
    return any(f.kind in HARDWARE_FAILURES for f in failures)


def taints_without_readiness(taints: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [t for t in taints if not (t.get("key") == READINESS_TAINT["key"] and t.get("effect") == READINESS_TAINT["effect"])]


def taint_patch(node: dict[str, Any], *, present: bool) -> Optional[list[dict[str, Any]]]:
    """A JSON patch adding or removing the readiness taint, guarded by a ``test`` of the taints
    read (Node.spec.taints has no merge key: a patch replaces the whole list, so a concurrent
    change must fail the patch rather than be lost). None when nothing changes."""
    taints = list(node.get("spec", {}).get("taints") or [])
    kept = taints_without_readiness(taints)
    wanted = kept + [dict(READINESS_TAINT)] if present else kept
    if wanted == taints or (present and len(kept) < len(taints)):
        return None
    ops: list[dict[str, Any]] = []
    if "taints" in node.get("spec", {}):
        ops.append({"op": "test", "path": "/spec/taints", "value": taints})
    ops.append({"op": "add", "path": "/spec/taints", "value": wanted})
    return ops


def failure_node_patch(failures: Sequence[Failure]) -> dict[str, Any]:
    """Cordon and label (merge patch)."""
    return {"metadata": {"labels": {FAILURE_LABEL: failure_label_value(failures)}}, "spec": {"unschedulable": True}}


def failure_classes(node: dict[str, Any]) -> set[str]:
    value = (node.get("metadata", {}).get("labels") or {}).get(FAILURE_LABEL, "")
    return {kind for kind in value.split(".") if kind}


def healthy_node_patch(node: dict[str, Any]) -> Optional[dict[str, Any]]:
    """Drop a failure label left by an earlier check (the cordon stays: a person lifts it). A
    GPU fault a job reported stays: a passing diagnostic does not clear a fault seen under load."""
    classes = failure_classes(node)
    if not classes:
        return None
    kept = ".".join(sorted(classes & {GPU_FAULT})) or None
    return {"metadata": {"labels": {FAILURE_LABEL: kept}}} if kept != ".".join(sorted(classes)) else None


def condition_patch(healthy: bool, message: str, now: dt.datetime, reason: Optional[str] = None) -> dict[str, Any]:
    """Status merge patch: conditions merge on ``type``, so the kubelet's own stay."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"status": {"conditions": [{
        "type": HEALTH_CONDITION, "status": "True" if healthy else "False",
        "reason": reason or ("GpuReadinessChecksPassed" if healthy else "GpuReadinessChecksFailed"),
        "message": message[:1000], "lastHeartbeatTime": stamp, "lastTransitionTime": stamp,
    }]}}


def failure_event(node_name: str, node_uid: str, failures: Sequence[Failure], now: dt.datetime) -> dict[str, Any]:
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{node_name}.gpu-health-", "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid},
        "reason": "GpuReadinessFailed", "type": "Warning",
        "message": "; ".join(f"{f.kind}: {f.detail}" for f in failures)[:1024],
        "source": {"component": COMPONENT, "host": node_name},
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
    }


# ---------------------------------------------------------------- GPU faults a job reported (pure)

class GpuFault(NamedTuple):
    """A container of a pod on this node that ended with the trainer's GPU-fault exit."""
    key: str  # pod uid / container / container id (or finish time): one per termination
    pod: str  # namespace/name
    pod_uid: str
    container: str
    lines: tuple[FaultLine, ...]
    action: str  # drain, reset or replace (workloads/xid_actions.json's meaning)
    started: str = ""  # the container's startedAt and finishedAt (RFC 3339), as the kubelet wrote them
    finished: str = ""
    host: str = ""  # what the host recorded that confirms it (HostEvidence.describe); "" while only claimed

    def describe(self) -> str:
        ranks = "; ".join(f"rank {line.rank} GPU {line.local_rank} (local rank): {line.fault}"
                          f"{'' if line.xid is None else f' [Xid {line.xid}]'}" for line in self.lines)
        host = f"; host: {self.host}" if self.host else ""
        return f"pod {self.pod} container {self.container} exited {EXIT_GPU_FAULT}: {ranks}{host}"


def _terminations(status: dict[str, Any]) -> Iterator[dict[str, Any]]:
    # state: the container's end (restartPolicy Never: how a PyTorchJob's ExitCode policy runs
    # pods); lastState: an earlier end of a container the kubelet restarted in place.
    for field in ("state", "lastState"):
        terminated = (status.get(field) or {}).get("terminated")
        if terminated:
            yield terminated


def pod_gpu_faults(pod: dict[str, Any], node_name: str, actions: Mapping[int, str]) -> list[GpuFault]:
    """The GPU faults this pod's containers reported on ``node_name``: exit code 135 and a
    termination message in trainer/gpu_faults.py's format, both. Another exit (143 after a spot
    notice, 137, 1) or 135 without the message is the job's business, not the node's."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if spec.get("nodeName") != node_name:
        return []
    faults = []
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        for terminated in _terminations(status):
            lines = tuple(parse_termination_message(terminated.get("message")))
            if terminated.get("exitCode") != EXIT_GPU_FAULT or not lines:
                continue
            which = terminated.get("containerID") or terminated.get("finishedAt") or str(status.get("restartCount", 0))
            faults.append(GpuFault(f"{meta.get('uid')}/{status.get('name')}/{which}",
                                   f"{meta.get('namespace')}/{meta.get('name')}", meta.get("uid", ""), status.get("name", ""),
                                   lines, node_action(lines, actions), str(terminated.get("startedAt") or ""),
                                   str(terminated.get("finishedAt") or "")))
    return faults


def recorded_faults(node: dict[str, Any]) -> list[str]:
    try:
        value = json.loads((node.get("metadata", {}).get("annotations") or {}).get(GPU_FAULTS_ANNOTATION, "[]"))
    except ValueError:
        return []
    return [key for key in value if isinstance(key, str)] if isinstance(value, list) else []


def gpu_fault_node_patch(node: dict[str, Any], fault: GpuFault) -> Optional[dict[str, Any]]:
    """Cordon, add ``gpu-fault`` to the failure label and record the fault (merge patch,
    conditional on the node's resourceVersion so a concurrent record is not lost). None when
    the node already records this fault: once per fault."""
    recorded = recorded_faults(node)
    if fault.key in recorded:
        return None
    meta = node.get("metadata", {})
    keys = (recorded + [fault.key])[-GPU_FAULTS_KEPT:]
    patch: dict[str, Any] = {"metadata": {
        "labels": {FAILURE_LABEL: ".".join(sorted(failure_classes(node) | {GPU_FAULT}))[:63]},
        "annotations": {GPU_FAULTS_ANNOTATION: json.dumps(keys, separators=(",", ":"))}},
        "spec": {"unschedulable": True}}
    if meta.get("resourceVersion"):
        patch["metadata"]["resourceVersion"] = meta["resourceVersion"]
    return patch


def replaces_node(fault: GpuFault) -> bool:
    """reset and replace: on this platform both mean a new node (workloads/xid_actions.json)."""
    return fault.action in ("reset", "replace")


def gpu_fault_event(node_name: str, node_uid: str, fault: GpuFault, now: dt.datetime) -> dict[str, Any]:
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    then = ("AcceleratedHardwareReady=False: Karpenter replaces the node" if replaces_node(fault)
            else "a person decides (docs/runbooks/gpu-health.md)")
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{node_name}.gpu-fault-", "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid},
        "reason": "GpuFaultReported", "type": "Warning",
        "message": f"{fault.describe()}; action {fault.action}: cordoned, {then}"[:1024],
        "source": {"component": COMPONENT, "host": node_name},
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
    }


# ---------------------------------------------------------------- what the host recorded

# The driver's Xid report in the kernel log (NVIDIA, "XID Errors": "NVRM: Xid (PCI:0000:3b:00): 79,
# pid=..., GPU has fallen off the bus."), behind the kernel's printk timestamp (seconds since boot)
# and, from syslog(2), the "<level>" prefix. The PCI id is required in full: a line a process could
# make the kernel print with a name it chose (a segfault report starts with the process's 15-byte
# comm) cannot carry one.
_KERNEL_XID = re.compile(r"^(?:<\d+>)?\[\s*(?P<uptime>\d+\.\d+)\]\s+NVRM: Xid "
                         r"\((?P<pci>PCI:[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\):\s*(?P<xid>\d{1,3})\b")
# Kernel time and the kubelet's container times differ by clock reading and rounding (finishedAt
# has whole seconds); the fault comes before the exit it causes.
WINDOW_BEFORE_S = 5.0
WINDOW_AFTER_S = 60.0
NO_START_LOOKBACK_S = 3600.0
NVML_CACHE_S = 30.0


class KernelXid(NamedTuple):
    uptime_s: float  # the kernel's timestamp: seconds since boot
    pci: str
    xid: int


def parse_kernel_xids(text: str) -> list[KernelXid]:
    """The NVRM Xid lines of a kernel log (syslog(2) or dmesg -r format); lines without the
    kernel's timestamp cannot be placed in time and are left out."""
    found = []
    for line in text.splitlines():
        match = _KERNEL_XID.match(line.strip())
        if match:
            found.append(KernelXid(float(match["uptime"]), match["pci"], int(match["xid"])))
    return found


def _rfc3339(value: str) -> Optional[float]:
    if not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class HostEvidence(NamedTuple):
    """What the node recorded about its GPUs while a container ran, and their state now."""
    xids: tuple[KernelXid, ...]
    failures: tuple[Failure, ...]
    window: tuple[float, float]  # wall-clock seconds searched in the kernel log

    def action(self, actions: Mapping[int, str]) -> str:
        """The most severe node action the host's own record calls for: each logged Xid's row of
        workloads/xid_actions.json, and a replacement for hardware nvidia-smi reports failed now
        (as the readiness checks decide); ``none`` when the host recorded nothing."""
        found = [actions.get(x.xid, "none") for x in self.xids]
        if hardware_failed(self.failures):
            found.append("replace")
        found = [a for a in found if a in NODE_ACTIONS]
        return max(found, key=ACTION_SEVERITY.index) if found else "none"

    def describe(self) -> str:
        parts = [f"kernel log Xid {x.xid} on {x.pci} at {x.uptime_s:.0f}s after boot" for x in self.xids]
        parts += [f"{f.kind}: {f.detail}" for f in self.failures if f.kind in HARDWARE_FAILURES]
        return "; ".join(parts) if parts else "nothing"


SYSLOG_ACTION_READ_ALL = 3  # syslog(2): read the whole kernel ring buffer
SYSLOG_ACTION_SIZE_BUFFER = 10


def read_kernel_log() -> str:
    """The kernel's ring buffer through syslog(2) (glibc ``klogctl``): the host's log, not the
    container's (the kernel log has no namespace). Needs CAP_SYSLOG where kernel.dmesg_restrict
    is 1; the DaemonSet adds it. No device node is needed (unlike /dev/kmsg, which a container
    without privileges cannot open: it is not in the runtime's device list)."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = libc.klogctl(SYSLOG_ACTION_SIZE_BUFFER, None, 0)
    if size <= 0:
        raise OSError(ctypes.get_errno(), "klogctl(SYSLOG_ACTION_SIZE_BUFFER) failed")
    buffer = ctypes.create_string_buffer(size)
    read = libc.klogctl(SYSLOG_ACTION_READ_ALL, buffer, size)
    if read < 0:
        raise OSError(ctypes.get_errno(), "klogctl(SYSLOG_ACTION_READ_ALL) failed: CAP_SYSLOG missing?")
    return buffer.raw[:read].decode("utf-8", "replace")


def boot_wall_time_s() -> float:
    """Wall-clock time of boot for the printk timestamps (the kernel's local clock, which
    CLOCK_MONOTONIC follows; a container shares the host's)."""
    return time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)


class HostRecord:
    """The node's own record of its GPUs, which no pod on it can write: the driver's Xid lines in
    the kernel log, and what nvidia-smi (NVML) and /sys report now. A GPU fault a container
    reports counts only when this record confirms a fault on this node."""

    def __init__(self, *, expected_gpus: int, expected_efa: int, run: "Runner | None" = None,
                 kernel_log: Callable[[], str] = read_kernel_log, boot_wall_s: Callable[[], float] = boot_wall_time_s,
                 sys_class_infiniband: str = "/sys/class/infiniband") -> None:
        self.expected_gpus, self.expected_efa = expected_gpus, expected_efa
        self.run = run or run_command
        self.kernel_log, self.boot_wall_s, self.sys_class_infiniband = kernel_log, boot_wall_s, sys_class_infiniband
        self._nvml: Optional[tuple[float, tuple[Failure, ...]]] = None

    def gpu_failures(self) -> tuple[Failure, ...]:
        """nvidia-smi -q and the EFA count now (a lost GPU, uncorrectable ECC, a pending or failed
        row remap, a missing EFA device); kept NVML_CACHE_S, so a burst of reports runs it once."""
        if self._nvml is not None and time.monotonic() - self._nvml[0] < NVML_CACHE_S:
            return self._nvml[1]
        code, out = self.run(["nvidia-smi", "-q"], 120)
        failures = check_gpus(out, self.expected_gpus) if code == 0 else [Failure(TOOL_ERROR, f"nvidia-smi -q exited {code}")]
        if self.expected_efa:
            failures += check_efa(count_efa_devices(self.sys_class_infiniband), self.expected_efa)
        self._nvml = (time.monotonic(), tuple(sorted(set(failures))))
        return self._nvml[1]

    def evidence(self, started: str, finished: str, actions: Mapping[int, str]) -> HostEvidence:
        """The host's record for a container that ran from ``started`` to ``finished``: node-action
        Xids the kernel logged in that window, and the GPUs' failures now."""
        end = _rfc3339(finished) or time.time()
        start = _rfc3339(started) or end - NO_START_LOOKBACK_S
        window = (start - WINDOW_BEFORE_S, end + WINDOW_AFTER_S)
        try:
            boot, logged = self.boot_wall_s(), parse_kernel_xids(self.kernel_log())
        except OSError as error:
            log(host="kernel-log", result="error", error=str(error)[:300])
            boot, logged = 0.0, []
        xids = tuple(x for x in logged if window[0] <= boot + x.uptime_s <= window[1]
                     and actions.get(x.xid, "none") in NODE_ACTIONS)
        return HostEvidence(xids, self.gpu_failures(), window)


def confirmed(fault: GpuFault, host: HostRecord, actions: Mapping[int, str]) -> tuple[Optional[GpuFault], HostEvidence]:
    """The fault as the host confirms it (its action the host record's, not the container's
    claim), or None when the host recorded no GPU fault: a container's termination message is
    written by the container, so any pod on the node could claim one."""
    evidence = host.evidence(fault.started, fault.finished, actions)
    action = evidence.action(actions)
    if action == "none":
        return None, evidence
    return fault._replace(action=action, host=evidence.describe()), evidence


def unconfirmed_event(node_name: str, node_uid: str, fault: GpuFault, evidence: HostEvidence, now: dt.datetime) -> dict[str, Any]:
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    since = dt.datetime.fromtimestamp(evidence.window[0], dt.timezone.utc).strftime("%H:%M:%SZ")
    until = dt.datetime.fromtimestamp(evidence.window[1], dt.timezone.utc).strftime("%H:%M:%SZ")
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{node_name}.gpu-fault-unconfirmed-", "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid},
        "reason": "GpuFaultNotConfirmed", "type": "Warning",
        "message": (f"{fault.describe()}; the host recorded no GPU fault (no NVRM Xid in the kernel log {since}-{until}, "
                    f"nvidia-smi reports the GPUs healthy): the node stays in service")[:1024],
        "source": {"component": COMPONENT, "host": node_name},
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
    }


# ---------------------------------------------------------------- running the tools

Runner = Callable[[Sequence[str], int], tuple[int, str]]


def run_command(argv: Sequence[str], timeout_s: int) -> tuple[int, str]:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        return 127, f"{argv[0]}: not found in the image"
    except subprocess.TimeoutExpired:
        return 124, f"{' '.join(argv)}: no answer in {timeout_s} s"
    return done.returncode, done.stdout + done.stderr


def run_checks(*, expected_gpus: int, expected_efa: int, diag_level: int, run: Runner = run_command,
               sys_class_infiniband: str = "/sys/class/infiniband") -> list[Failure]:
    failures: list[Failure] = []
    # The full -q report: "Attached GPUs", then per GPU its ECC Mode, ECC Errors, Retired Pages
    # and Remapped Rows sections.
    code, out = run(["nvidia-smi", "-q"], 120)
    failures += check_gpus(out, expected_gpus) if code == 0 else [Failure(TOOL_ERROR, f"nvidia-smi -q exited {code}: {out.strip()[-300:]}")]
    # -r 1 takes seconds; -r 2 a few minutes on 8 GPUs.
    code, out = run(["dcgmi", "diag", "-r", str(diag_level)], 600 if diag_level == 1 else 1800)
    failures += check_dcgmi_diag(out, code, diag_level)
    if expected_efa:
        failures += check_efa(count_efa_devices(sys_class_infiniband), expected_efa)
    return sorted(set(failures))


def gpus_busy(run: Runner = run_command) -> bool:
    code, out = run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], 60)
    return code != 0 or bool(out.strip())


# ---------------------------------------------------------------- Kubernetes API (in-cluster)

class KubeApi:
    TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    CA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"

    def __init__(self, base_url: Optional[str] = None, token_path: str = TOKEN, context: Optional[ssl.SSLContext] = None) -> None:
        if base_url is None:
            host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            base_url = f"https://{host}:{port}"
            context = context or ssl.create_default_context(cafile=self.CA)
        self.base, self.token_path, self.context = base_url, token_path, context

    def _call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        with open(self.token_path, encoding="utf-8") as f:  # re-read: projected tokens rotate
            token = f.read().strip()
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method, headers={
            "Authorization": f"Bearer {token}", "Content-Type": content_type, "Accept": "application/json"})
        with urllib.request.urlopen(request, context=self.context, timeout=30) as response:
            return json.loads(response.read() or b"null")

    def node(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/api/v1/nodes/{name}")

    def patch_node(self, name: str, patch: Any, *, json_patch: bool = False) -> None:
        self._call("PATCH", f"/api/v1/nodes/{name}", patch,
                   "application/json-patch+json" if json_patch else "application/merge-patch+json")

    def patch_node_status(self, name: str, patch: Any) -> None:
        self._call("PATCH", f"/api/v1/nodes/{name}/status", patch, "application/strategic-merge-patch+json")

    def create_event(self, event: dict[str, Any]) -> None:
        self._call("POST", "/api/v1/namespaces/default/events", event)

    @staticmethod
    def _pods_path(node_name: str, **params: Any) -> str:
        return "/api/v1/pods?" + urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={node_name}", **params})

    def list_pods(self, node_name: str) -> tuple[list[dict[str, Any]], str]:
        """This node's pods (every namespace) and the list's resourceVersion to watch from."""
        answer = self._call("GET", self._pods_path(node_name))
        return answer.get("items") or [], answer["metadata"]["resourceVersion"]

    def watch_pods(self, node_name: str, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        """The watch events (``{"type", "object"}``, one JSON line each) of this node's pods; the
        server ends the stream after ``timeout_s``."""
        with open(self.token_path, encoding="utf-8") as f:
            token = f.read().strip()
        path = self._pods_path(node_name, watch="true", resourceVersion=resource_version,
                               allowWatchBookmarks="true", timeoutSeconds=str(timeout_s))
        request = urllib.request.Request(self.base + path, headers={"Authorization": f"Bearer {token}",
                                                                     "Accept": "application/json"})
        with urllib.request.urlopen(request, context=self.context, timeout=timeout_s + 30) as response:
            for line in response:
                if line.strip():
                    yield json.loads(line)


def log(**fields: Any) -> None:
    print(json.dumps({"time": dt.datetime.now(dt.timezone.utc).isoformat(), **fields}, sort_keys=True), flush=True)


def set_taint(api: KubeApi, name: str, *, present: bool) -> None:
    for _ in range(5):  # the test op fails when someone else changed the taints meanwhile
        patch = taint_patch(api.node(name), present=present)
        if patch is None:
            return
        try:
            api.patch_node(name, patch, json_patch=True)
            return
        except urllib.error.HTTPError as error:
            if error.code != 422:
                raise
    raise RuntimeError(f"could not {'add' if present else 'remove'} the readiness taint on {name}")


def report(api: KubeApi, name: str, failures: Sequence[Failure], diag_level: int) -> None:
    now = dt.datetime.now(dt.timezone.utc)
    node = api.node(name)
    if not failures:
        set_taint(api, name, present=False)
        cleanup = healthy_node_patch(node)
        if cleanup:
            api.patch_node(name, cleanup)
        if GPU_FAULT in failure_classes(node):
            log(node=name, level=diag_level, result="pass", note="a job's GPU fault stays recorded: a person lifts it")
            return
        api.patch_node_status(name, condition_patch(True, f"dcgmi diag -r {diag_level}, ECC, GPU and EFA counts passed", now))
        log(node=name, level=diag_level, result="pass")
        return
    patch = failure_node_patch(failures)
    if GPU_FAULT in failure_classes(node):  # a recorded GPU fault stays in the label
        patch["metadata"]["labels"][FAILURE_LABEL] = failure_label_value([*failures, Failure(GPU_FAULT, "")])
    api.patch_node(name, patch)
    if hardware_failed(failures):
        api.patch_node_status(name, condition_patch(False, "; ".join(f"{f.kind}: {f.detail}" for f in failures), now))
    api.create_event(failure_event(name, node["metadata"]["uid"], failures, now))
    log(node=name, level=diag_level, result="fail", failures=[f._asdict() for f in failures],
        repair="karpenter replaces the node" if hardware_failed(failures) else "none (agent tool error)")


def mark_gpu_fault(api: KubeApi, name: str, fault: GpuFault) -> bool:
    """Act on one GPU fault: True when this call marked the node, False when it already was."""
    node = api.node(name)
    if gpu_fault_node_patch(node, fault) is None:
        log(node=name, gpu_fault=fault.key, result="already recorded")
        return False
    now = dt.datetime.now(dt.timezone.utc)
    event = gpu_fault_event(name, node["metadata"].get("uid", ""), fault, now)
    if replaces_node(fault):  # before the record: a recorded fault is never acted on again
        api.patch_node_status(name, condition_patch(False, event["message"], now, reason="GpuFaultReported"))
    for _ in range(5):  # a 409: the node changed between the read and the patch; decide again
        patch = gpu_fault_node_patch(node, fault)
        if patch is None:
            return False
        try:
            api.patch_node(name, patch)
            break
        except urllib.error.HTTPError as error:
            if error.code != 409:
                raise
        node = api.node(name)
    else:
        raise RuntimeError(f"could not record GPU fault {fault.key} on {name}: the node kept changing")
    api.create_event(event)
    log(node=name, result="gpu-fault", pod=fault.pod, container=fault.container, action=fault.action,
        faults=[{"rank": line.rank, "gpu": line.local_rank, "xid": line.xid, "fault": line.fault} for line in fault.lines],
        repair="karpenter replaces the node" if replaces_node(fault) else "cordoned; a person decides")
    return True


class GpuFaultWatch:
    """Watches this node's pods and marks the node once per GPU fault a container reports and the
    host's own record confirms; an unconfirmed report is an Event, never a cordon."""

    def __init__(self, api: KubeApi, name: str, actions: Mapping[int, str], host: HostRecord, *,
                 retry_s: float = 10.0) -> None:
        self.api, self.name, self.actions, self.host, self.retry_s = api, name, actions, host, retry_s
        self.resource_version: Optional[str] = None
        self.handled: set[str] = set()

    def handle(self, pod: dict[str, Any]) -> None:
        for claimed in pod_gpu_faults(pod, self.name, self.actions):
            if claimed.key in self.handled:
                continue
            try:
                fault, evidence = confirmed(claimed, self.host, self.actions)
                if fault is None:
                    node = self.api.node(self.name)
                    now = dt.datetime.now(dt.timezone.utc)
                    self.api.create_event(unconfirmed_event(self.name, node["metadata"].get("uid", ""), claimed, evidence, now))
                    log(node=self.name, result="gpu-fault-unconfirmed", pod=claimed.pod, container=claimed.container,
                        claimed=claimed.action, host=evidence.describe())
                else:
                    mark_gpu_fault(self.api, self.name, fault)
                self.handled.add(claimed.key)
            except (urllib.error.URLError, OSError, RuntimeError, ValueError) as error:
                # Not retried in a loop: the pod's next event or the next list sees it again.
                log(node=self.name, gpu_fault=claimed.key, result="error", error=str(error)[:300])

    def run(self, seconds: float) -> None:
        """List (when there is no resourceVersion to resume from), then watch, for ``seconds``."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) >= 1:
            try:
                if self.resource_version is None:
                    pods, self.resource_version = self.api.list_pods(self.name)
                    for pod in pods:
                        self.handle(pod)
                started = time.monotonic()
                for event in self.api.watch_pods(self.name, self.resource_version, max(1, min(int(left), 300))):
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":  # 410 Gone: the version is too old; list again
                        self.resource_version = None
                        break
                    self.resource_version = obj.get("metadata", {}).get("resourceVersion", self.resource_version)
                    # DELETED too: under restartPolicy ExitCode the Training Operator deletes a pod
                    # that failed with a retryable code at once (training-operator
                    # pkg/controller.v1/common/pod.go: "Need to restart the pod" -> DeletePod), and
                    # the deleted object still carries the container's end.
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        self.handle(obj)
                if time.monotonic() - started < 1:  # a stream that closes at once: not a busy loop
                    time.sleep(min(self.retry_s, max(0.0, deadline - time.monotonic())))
            except (urllib.error.URLError, OSError, ValueError, KeyError) as error:
                log(node=self.name, watch="pods", result="error", error=str(error)[:300])
                if isinstance(error, urllib.error.HTTPError) and error.code == 410:
                    self.resource_version = None
                time.sleep(min(self.retry_s, max(0.0, deadline - time.monotonic())))


def expectations(node: dict[str, Any], instances: dict[str, Any]) -> tuple[int, int]:
    labels = node["metadata"].get("labels") or {}
    instance_type = labels.get(INSTANCE_TYPE_LABEL, "")
    if instance_type not in instances:
        raise SystemExit(f"instance type {instance_type!r} of node {node['metadata']['name']} is not in the agent's table; "
                         f"add it to the GPU catalog and redeploy")
    facts = instances[instance_type]
    efa = facts["efa_devices"] if labels.get(EFA_LABEL) == "true" else 0
    return facts["gpus"], efa


def startup(api: KubeApi, name: str, instances: dict[str, Any], *, run: Runner = run_command,
            sys_class_infiniband: str = "/sys/class/infiniband") -> tuple[int, int]:
    """The start-up gate: check the node at level 1 and report. Returns the expected counts."""
    gpus, efa = expectations(api.node(name), instances)
    failures = run_checks(expected_gpus=gpus, expected_efa=efa, diag_level=1, run=run, sys_class_infiniband=sys_class_infiniband)
    report(api, name, failures, 1)
    return gpus, efa


def deep_check(api: KubeApi, name: str, gpus: int, efa: int, *, run: Runner = run_command,
               sys_class_infiniband: str = "/sys/class/infiniband") -> bool:
    """``dcgmi diag -r 2`` on idle GPUs; False (nothing run, taint restored) when a job holds one.
    The taint goes on first and the idle check follows, so no pod can land in between."""
    set_taint(api, name, present=True)
    if gpus_busy(run):
        set_taint(api, name, present=False)
        log(node=name, level=2, result="skipped", reason="a compute process holds a GPU")
        return False
    report(api, name, run_checks(expected_gpus=gpus, expected_efa=efa, diag_level=2, run=run,
                                 sys_class_infiniband=sys_class_infiniband), 2)
    return True


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="node_health_agent")
    parser.add_argument("--instances", required=True, help="JSON: instance type -> {gpus, efa_devices}")
    parser.add_argument("--sys-class-infiniband", default="/sys/class/infiniband")
    parser.add_argument("--deep-interval-hours", type=float, default=24.0)
    parser.add_argument("--busy-retry-minutes", type=float, default=30.0)
    parser.add_argument("--xid-table", default=None, help="workloads/xid_actions.json (default: beside trainer/gpu_faults.py)")
    args = parser.parse_args(argv)
    with open(args.instances, encoding="utf-8") as f:
        instances = json.load(f)
    name = os.environ["NODE_NAME"]
    api = KubeApi()
    gpus, efa = startup(api, name, instances, sys_class_infiniband=args.sys_class_infiniband)
    host = HostRecord(expected_gpus=gpus, expected_efa=efa, sys_class_infiniband=args.sys_class_infiniband)
    faults = GpuFaultWatch(api, name, xid_actions(args.xid_table), host)
    next_deep = time.monotonic() + args.deep_interval_hours * 3600
    while True:
        faults.run(max(60.0, next_deep - time.monotonic()))
        ran = deep_check(api, name, gpus, efa, sys_class_infiniband=args.sys_class_infiniband)
        next_deep = time.monotonic() + (args.deep_interval_hours * 3600 if ran else args.busy_retry_minutes * 60)


if __name__ == "__main__":
    sys.exit(main())
