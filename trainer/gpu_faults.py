"""Is this exception a GPU (node) fault? Torch-free: the launcher reads the answer from a rank's report.

A rank that fails on its own is normally a bug (permanent). An error that names a hardware
fault is not: a retry on a healthy node usually succeeds, and the node must not get the job
back. The launcher exits `EXIT_GPU_FAULT` (retryable, counted by
`checkpoint.max_attempts_without_progress` like any retryable exit) and writes the fault into
the pod's termination message, which the GPU readiness agent reads (docs/trainer.md, "GPU faults").

What counts:
- CUDA runtime errors that only hardware or the driver produce (cudaErrorECCUncorrectable,
  cudaErrorDevicesUnavailable, ...; the strings are cudaGetErrorString's, CUDA runtime API
  "Error Handling"), and NCCL's "unhandled cuda error" / "unhandled system error";
- an error that names an NVIDIA Xid whose action in workloads/xid_actions.json is drain, reset
  or replace (NVIDIA's Xid catalog "Resolution Bucket"); an Xid marked `none` is the
  application's own (13, 31, 43, ...) and stays a root cause.
Illegal memory accesses and device-side asserts are not here: they are usually the program's.
"""
from __future__ import annotations

import json
import os
import re
import signal

EXIT_GPU_FAULT = 128 + signal.SIGBUS  # 135: a hardware error, as SIGBUS is for memory

HARDWARE_ERRORS = (
    "uncorrectable ECC error encountered",  # cudaErrorECCUncorrectable (Xid 48/94/95 on the host)
    "CUDA-capable device(s) is/are busy or unavailable",  # cudaErrorDevicesUnavailable
    "GPU has fallen off the bus",  # the driver's Xid 79 text
    "unspecified launch failure",  # cudaErrorLaunchFailure: what a rank sees of Xid 79/62/48 (also a rare kernel bug: bounded retries end that)
    "uncorrectable NVLink error",  # cudaErrorNvlinkUncorrectable
    "hardware stack error",  # cudaErrorHardwareStackError
    "unhandled cuda error",  # NCCL: a CUDA call inside NCCL failed
    "unhandled system error",  # NCCL: the network device (EFA) or the system failed
)
# The driver's "NVRM: Xid (PCI:0000:53:00): 79, pid=..." and a plain "Xid 79".
_XID = re.compile(r"\bXid\b(?:\s*\([^)]*\))?\s*:?\s*(\d{1,3})\b", re.IGNORECASE)
NODE_ACTIONS = ("drain", "reset", "replace")


def _xid_table_path() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(os.path.dirname(here), "workloads", "xid_actions.json")  # /app/workloads in the image


def node_fault_xids(path: str | None = None) -> frozenset[int]:
    """The Xids the platform treats as node faults (drain, reset, replace)."""
    with open(path or _xid_table_path()) as f:
        rows = json.load(f)["xids"]
    return frozenset(int(code) for code, row in rows.items() if row.get("action") in NODE_ACTIONS)


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
