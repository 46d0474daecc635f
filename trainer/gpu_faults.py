"""Is this exception a GPU (node) fault? Torch-free: the launcher reads the answer from a rank's report.

A rank that fails on its own is normally a bug (permanent). An error that names a hardware
fault is not: a retry on a healthy node usually succeeds, and the node must not get the job
back. The launcher exits `EXIT_GPU_FAULT` (retryable, counted by
`checkpoint.max_attempts_without_progress` like any retryable exit) and writes the fault into
the pod's termination message, which the GPU readiness agent reads (docs/trainer.md, "GPU faults").

What counts:
- CUDA runtime errors that only hardware or the driver produce (cudaErrorECCUncorrectable,
  cudaErrorDevicesUnavailable, ...; the strings are cudaGetErrorString's, CUDA runtime API
  "Error Handling"), and NCCL's "unhandled cuda error". NCCL's "unhandled system error" is
  not one by itself: it is also what an exhausted /dev/shm, RLIMIT_MEMLOCK (EFA) or file
  descriptor limit produce, pod configuration that cordoning node after node would not mend;
  it counts only with an Xid of its own;
- an error that names an NVIDIA Xid whose action in workloads/xid_actions.json is drain, reset
  or replace (NVIDIA's Xid catalog "Resolution Bucket"); an Xid marked `none` is the
  application's own (13, 31, 43, ...) and stays a root cause.
Illegal memory accesses and device-side asserts are not here: they are usually the program's.

The termination message is defined here once, for both sides: the launcher writes it
(`termination_message`) and the node's readiness agent parses it (`parse_termination_message`;
workloads/node_health_agent.py, which imports this file from its ConfigMap). Standard library
only, for that reason.
"""
from __future__ import annotations

import json
import os
import re
import signal
from typing import Iterable, Mapping, NamedTuple, Optional

EXIT_GPU_FAULT = 128 + signal.SIGBUS  # 135: a hardware error, as SIGBUS is for memory

HARDWARE_ERRORS = (
    "uncorrectable ECC error encountered",  # cudaErrorECCUncorrectable (Xid 48/94/95 on the host)
    "CUDA-capable device(s) is/are busy or unavailable",  # cudaErrorDevicesUnavailable
    "GPU has fallen off the bus",  # the driver's Xid 79 text
    "unspecified launch failure",  # cudaErrorLaunchFailure: what a rank sees of Xid 79/62/48 (also a rare kernel bug: bounded retries end that)
    "uncorrectable NVLink error",  # cudaErrorNvlinkUncorrectable
    "hardware stack error",  # cudaErrorHardwareStackError
    "unhandled cuda error",  # NCCL: a CUDA call inside NCCL failed
)
# The Xid the host logs for the error a rank sees, where there is one (NVIDIA Xid catalog;
# cudaErrorECCUncorrectable is a double-bit error, Xid 48; cudaErrorNvlinkUncorrectable, Xid 74).
# The readiness agent acts on that Xid's row of workloads/xid_actions.json; an error with no
# Xid of its own ("unspecified launch failure" is also what a kernel bug looks like) gets the
# table's `drain`: cordoned, and a person decides.
HARDWARE_ERROR_XIDS = {
    "uncorrectable ECC error encountered": 48,
    "GPU has fallen off the bus": 79,
    "uncorrectable NVLink error": 74,
}
# The driver's "NVRM: Xid (PCI:0000:53:00): 79, pid=..." and a plain "Xid 79".
_XID = re.compile(r"\bXid\b(?:\s*\([^)]*\))?\s*:?\s*(\d{1,3})\b", re.IGNORECASE)
NODE_ACTIONS = ("drain", "reset", "replace")


def _xid_table_path() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(os.path.dirname(here), "workloads", "xid_actions.json")  # /app/workloads in the image


def xid_actions(path: str | None = None) -> dict[int, str]:
    """Each Xid of workloads/xid_actions.json and its action (none, drain, reset, replace)."""
    with open(path or _xid_table_path()) as f:
        rows = json.load(f)["xids"]
    return {int(code): row.get("action", "none") for code, row in rows.items()}


def node_fault_xids(path: str | None = None) -> frozenset[int]:
    """The Xids the platform treats as node faults (drain, reset, replace)."""
    return frozenset(code for code, action in xid_actions(path).items() if action in NODE_ACTIONS)


def gpu_fault(exc: BaseException | str, xids: frozenset[int] | None = None) -> str | None:
    """A one-line description of the GPU fault this error names, or None."""
    text = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    lowered = text.lower()
    for needle in HARDWARE_ERRORS:
        if needle.lower() in lowered:
            return f"GPU fault: {needle}"
    for match in _XID.finditer(text):
        code = int(match.group(1))
        if code in (xids if xids is not None else node_fault_xids()):
            return f"GPU fault: Xid {code}"
    return None


# ---------------------------------------------------------------- NCCL's watchdog

# What torch's NCCL watchdog logs before it aborts the process (SIGABRT: no Python exception,
# no rank report): torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, `LOG(ERROR) << logPrefix()
# << "Process group watchdog thread terminated with exception: " << e.what()`, where the
# prefix is "[PG ID <id> PG GUID <guid>(<name>) Rank <r>] ", and c10's logging may put
# "[rank<r>]:" first. torchrun runs workers with TORCH_NCCL_ASYNC_ERROR_HANDLING=1 (tear down on
# error) and the watchdog rethrows CUDA errors by default, so a sticky CUDA error (Xid 48, 79)
# is often seen there first.
_WATCHDOG = re.compile(r"watchdog thread terminated with exception:\s*(?P<error>.*)$", re.IGNORECASE)
_PREFIX_RANK = re.compile(r"Rank (\d+)\]")
_LOG_RANK = re.compile(r"^\[rank(\d+)\]:")


def watchdog_faults(lines: Iterable[str], xids: frozenset[int] | None = None) -> dict[int, str]:
    """{global rank: GPU fault} for the NCCL watchdog's last words in a worker's log that name
    one (the default process group's rank is the global rank)."""
    found: dict[int, str] = {}
    for line in lines:
        match = _WATCHDOG.search(line)
        if not match:
            continue
        rank = _PREFIX_RANK.search(line) or _LOG_RANK.search(line)
        fault = gpu_fault(match.group("error"), xids)
        if rank and fault:
            found.setdefault(int(rank.group(1)), fault)
    return found


# ---------------------------------------------------------------- the termination message

# One line per faulty rank; the kubelet keeps at most 4096 bytes of the file.
TERMINATION_MESSAGE_LIMIT = 4096
_LINE = "gpu-fault node={node} rank={rank} local_rank={local_rank}: {fault}"
_LINE_RE = re.compile(r"^gpu-fault node=(?P<node>\S+) rank=(?P<rank>\S+) local_rank=(?P<local_rank>\S+): "
                      r"(?P<fault>GPU fault: .+?)\s*$")


class FaultLine(NamedTuple):
    """One rank's GPU fault as the termination message names it. ``local_rank`` is the GPU's
    index among the container's visible devices."""
    node: str
    rank: str
    local_rank: str
    fault: str

    @property
    def xid(self) -> Optional[int]:
        """The Xid this fault names, or the one the host logs for it; None when neither."""
        match = _XID.search(self.fault)
        if match:
            return int(match.group(1))
        return next((xid for needle, xid in HARDWARE_ERROR_XIDS.items() if needle.lower() in self.fault.lower()), None)


def termination_message(node: str, reports: Iterable[Mapping]) -> str:
    """The launcher's termination message: a line per rank report carrying ``gpu_fault``."""
    lines = [_LINE.format(node=node or "?", rank=r.get("rank"), local_rank=r.get("local_rank", "?"), fault=r["gpu_fault"])
             for r in reports if r.get("gpu_fault")]
    return "\n".join(lines)[:TERMINATION_MESSAGE_LIMIT]


def parse_termination_message(text: str | None) -> list[FaultLine]:
    """The fault lines of a termination message; other lines (a truncated one, log output from
    ``FallbackToLogsOnError``) are not faults."""
    found = []
    for line in (text or "").splitlines():
        match = _LINE_RE.match(line.strip())
        if match:
            found.append(FaultLine(**match.groupdict()))
    return found


ACTION_SEVERITY = ("none", "drain", "reset", "replace")


def node_action(lines: Iterable[FaultLine], actions: Mapping[int, str]) -> str:
    """What the node needs after these faults, by workloads/xid_actions.json: the most severe
    action of their Xids; ``drain`` for a fault with no Xid or one the table does not list (the
    trainer already judged it a node fault, so never ``none``)."""
    found = ["drain" if line.xid is None or actions.get(line.xid, "none") == "none" else actions[line.xid]
             for line in lines]
    return max(found, key=ACTION_SEVERITY.index) if found else "none"
