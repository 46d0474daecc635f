"""The policy pack starts the way the Pulumi engine starts it, and its references are right.

pulumi/pulumi ``sdk/python/dist/pulumi-analyzer-policy-python`` runs
``<pack>/.venv/bin/python -u -m pulumi.policy <engine-address> <pack>``; ``pulumi.policy`` then
runpy-runs the pack's ``__main__.py``, whose ``PolicyPack(...)`` starts the analyzer's gRPC server,
writes its port on stdout ("sys.stdout.buffer.write(f"{port}\\n")", pulumi_policy/policy.py) and
never returns. So the test starts that command in a venv made by ``infra.plan.deploy`` from the pack's
own requirements.txt, reads the port, asks the server for its policies, then stops the process.
"""
from __future__ import annotations

import os
import select
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from infra.plan import deploy
from policypack.rules import RULES

ROOT = Path(__file__).resolve().parents[2]

# CIS Amazon EKS Benchmark 1.8.0 as kube-bench numbers it (cfg/eks-1.8.0/managedservices.yaml,
# policies.yaml, controlplane.yaml): the ids and titles the pack may cite.
CIS_EKS_1_8_0 = {
    "2.1.1": "Enable audit Logs",
    "4.1": "RBAC and Service Accounts",
    "5.1": "Image Registry and Image Scanning",
    "5.2.1": "Prefer using dedicated Amazon EKS Service Accounts",
    "5.3.1": "Ensure Kubernetes Secrets are encrypted using Customer Master Keys (CMKs) managed in AWS KMS",
    "5.4.1": "Restrict Access to the Control Plane Endpoint",
    "5.4.2": "Ensure clusters are created with Private Endpoint Enabled and Public Access Disabled",
}


def _cited(rule_name: str) -> set[str]:
    rule = next(rule for rule in RULES if rule.name == rule_name)
    return set(re.findall(r"CIS EKS (\d+(?:\.\d+)*)", rule.references))


def test_cis_references_match_the_benchmark_numbering():
    for rule in RULES:
        for cis in _cited(rule.name):
            assert cis in CIS_EKS_1_8_0, f"{rule.name} cites CIS EKS {cis}, not a 1.8.0 recommendation"
    assert _cited("eks-public-endpoint-restricted") == {"5.4.1"}
    assert _cited("eks-private-endpoint-in-prod") == {"5.4.2"}
    assert _cited("imdsv2-hop-limit-1") == set()           # 4.1 is RBAC; the benchmark has no IMDS item
    assert _cited("pod-identity-trust-scoped") == {"5.2.1"}  # 5.1 is the image registry
    assert _cited("no-wildcard-admin") == set()


def test_fsx_rule_does_not_cite_the_ontap_check():
    """checkov CKV_AWS_178: "Ensure fx ontap file system is encrypted by KMS using a customer managed Key",
    supported_resources = ['aws_fsx_ontap_file_system']."""
    for rule in RULES:
        assert "CKV_AWS_178" not in rule.references, rule.name


def _fresh_pack(tmp_path: Path) -> Path:
    pack = tmp_path / "policypack"
    shutil.copytree(ROOT / "policypack", pack, ignore=shutil.ignore_patterns(".venv", "__pycache__"))
    # A copy without any venv: __main__.py puts the copy's parent on sys.path for `policypack.pack`.
    return pack


def test_the_pack_starts_in_a_fresh_venv_and_serves_its_policies(tmp_path):
    import grpc
    from google.protobuf import empty_pb2
    from pulumi.runtime.proto import analyzer_pb2_grpc

    pack = _fresh_pack(tmp_path)
    problems = deploy.install_policy_pack(pack)
    if problems:
        message = "cannot install the pack's requirements here: " + "; ".join(problems)
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    python = deploy.policy_pack_python(pack)
    process = subprocess.Popen([str(python), "-u", "-m", "pulumi.policy", "127.0.0.1:1", str(pack)], cwd=pack, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # The server writes its port, then blocks forever: wait for that line, not for the process.
        ready, _, _ = select.select([process.stdout], [], [], 120)
        assert ready, "the pack printed no port within 120 s"
        port_line = process.stdout.readline().decode().strip()
        assert port_line.isdigit(), (port_line, process.stderr.read1(4000) if process.poll() is not None else "")
        with grpc.insecure_channel(f"127.0.0.1:{port_line}") as channel:
            info = analyzer_pb2_grpc.AnalyzerStub(channel).GetAnalyzerInfo(empty_pb2.Empty(), timeout=30)
        assert info.name == "ml-training-platform"
        assert sorted(policy.name for policy in info.policies) == sorted(rule.name for rule in RULES)
    finally:
        process.terminate()
        process.wait(timeout=30)
