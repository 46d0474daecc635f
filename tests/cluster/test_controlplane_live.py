"""The control plane on its own: it starts, answers, and leaves nothing behind however its owner
ends.

``python -m tools.cluster.controlplane up`` is the entry point a developer (and the Pulumi engine
tests) use; it is started here as a process of its own and then SIGKILLed, as a CI timeout or the
OOM killer would end a test run. Its processes (etcd, kube-apiserver, the controller manager, the
scheduler, the machine holding their namespaces) must die with it (the kernel's parent-death
signal, tools/cluster/procs.py), and the next plane started must remove the directory it left.
Two planes run side by side on the same fixed ports, each in its own network namespace.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tools.cluster import controlplane
from tools.cluster.api import eventually

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _tools():
    missing = controlplane.missing_tools(controlplane.CONTROL_PLANE_COMMANDS)
    if missing:
        message = f"cluster tools not built: {', '.join(missing)} (run `make cluster-tools`)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def _processes_of(workdir: Path) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(workdir) in cmdline:
            found.append(f"{entry.name} {cmdline[:120]}")
    return found


def test_a_killed_owner_leaves_no_process_and_its_directory_is_swept(tmp_path):
    log = tmp_path / "up.log"
    with log.open("w") as out:
        owner = subprocess.Popen([sys.executable, "-m", "tools.cluster.controlplane", "up"], cwd=ROOT, stdout=out,
                                 stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        line = eventually(lambda: next((l for l in log.read_text().splitlines() if "export KUBECONFIG=" in l), None),
                          "the control plane is ready", 300, interval_s=1, diagnose=log.read_text)
        workdir = Path(line.split("=", 1)[1]).parents[1]
        assert _processes_of(workdir), "no process of the plane found while it runs"
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
        eventually(lambda: not _processes_of(workdir), f"every process of {workdir} gone after its owner's SIGKILL", 30,
                   diagnose=lambda: "\n".join(_processes_of(workdir)))
        assert workdir.exists(), "nothing could remove the directory of a SIGKILLed owner"
        controlplane.sweep_abandoned(workdir.parent)
        assert not workdir.exists(), f"{workdir} was not swept though its owner is gone"
    finally:
        if owner.poll() is None:
            owner.kill()


def test_two_planes_run_side_by_side_on_the_same_ports():
    with controlplane.ControlPlane.in_tempdir() as first, controlplane.ControlPlane.in_tempdir() as second:
        assert first.api_port != second.api_port
        for plane in (first, second):
            assert plane.api.get("/version")["gitVersion"] == "v1.32.13"
        first.kubectl("create", "namespace", "only-in-first")
        assert second.api.get_or_none("/api/v1/namespaces/only-in-first") is None
