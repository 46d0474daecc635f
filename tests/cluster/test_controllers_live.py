"""The controllers the platform relies on, built at the pinned versions, run and reconcile on the
1.32 control plane: kwok makes a node Ready and runs a pod; Karpenter (kwok provider) turns a
pending pod into a NodeClaim and a Node; Kueue admits a queued Job (and its mutating webhook
parks a Job for a missing queue: only the webhook sets ``suspend``); JobSet creates its Jobs;
the Training Operator turns a PyTorchJob into pods with MASTER_ADDR/RANK and its webhook refuses
a job without a ``pytorch`` container; Kubeflow Trainer turns a TrainJob into a JobSet.

``tools/cluster/smoke.sh`` wires each one as tools/cluster/RUNNING.md describes (webhooks by URL,
pre-seeded cert Secrets, CRDs from each module) and counts every check that failed; a controller
that exits, or a sample object that is not reconciled in time, fails this test with its log.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tools.cluster.controlplane import BIN_DIR, missing_tools

ROOT = Path(__file__).resolve().parents[2]
CONTROLLERS = ("kwok", "karpenter", "kueue", "jobset", "training-operator", "trainer")
BINARIES = ("kwok", "karpenter-kwok", "kueue", "jobset", "training-operator", "trainer-controller-manager")


def test_every_pinned_controller_runs_and_reconciles_on_the_control_plane():
    missing = missing_tools(("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl",
                             *BINARIES))
    if missing:
        message = f"cluster tools not built: {', '.join(missing)} (run `make cluster-tools`)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    env = {**os.environ, "PATH": f"{BIN_DIR}:{os.environ['PATH']}"}
    result = subprocess.run(["bash", str(ROOT / "tools" / "cluster" / "smoke.sh"), *CONTROLLERS],
                            capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "smoke: 0 check(s) failed" in output, output[-6000:]
