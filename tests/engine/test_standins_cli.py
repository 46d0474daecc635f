"""The stand-in plugins under the real Pulumi CLI (``make engine-tools``), driven by the Automation
API with a file backend and a passphrase: a few AWS resources are created, updated (one of them
replaced), refreshed after one disappears behind Pulumi's back, and destroyed; an ``eks.Cluster``
is constructed against a test control plane, where the real Kubernetes provider applies a ConfigMap
through the kubeconfig the ``eks`` stand-in returns.

Skipped with the reason when the CLI (or, for the cluster, the Kubernetes provider or the control
plane's binaries) is not built.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENGINE_TOOLS = ROOT / ".cache" / "engine-tools"
PULUMI = ENGINE_TOOLS / "bin" / "pulumi"
KUBERNETES_PLUGIN = ENGINE_TOOLS / "bin" / "pulumi-resource-kubernetes"
STANDINS = ROOT / "tools" / "engine" / "standins"
ACCOUNT = "222233334444"

pytestmark = pytest.mark.integration


@pytest.fixture
def cli(tmp_path):
    if not os.access(PULUMI, os.X_OK):
        pytest.skip(f"the Pulumi CLI is not built at {PULUMI} (make engine-tools)")
    (tmp_path / "work").mkdir()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("PULUMI_", "AWS_", "MLP_STANDIN_")) and key != "KUBECONFIG"}
    env.update({
        "PATH": os.pathsep.join([str(PULUMI.parent), str(STANDINS), env.get("PATH", "")]),
        "PYTHONPATH": str(ROOT),
        "PULUMI_HOME": str(tmp_path / "home"),
        "PULUMI_BACKEND_URL": f"file://{tmp_path / 'backend'}",
        "PULUMI_CONFIG_PASSPHRASE": "stand-in tests only",
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        "MLP_STANDIN_PYTHON": sys.executable,
        "MLP_STANDIN_STATE_DIR": str(tmp_path / "standin-state"),
        "STANDIN_TEST_PULUMI_ROOT": str(ENGINE_TOOLS),
        "STANDIN_TEST_WORK_DIR": str(tmp_path / "work"),
    })
    (tmp_path / "backend").mkdir()

    def run(operation: str, **extra: str) -> dict:
        done = subprocess.run([sys.executable, "-m", "tests.engine.standin_cli_program", operation], cwd=ROOT,
                              env={**env, **extra}, capture_output=True, text=True, timeout=900)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        assert done.returncode == 0 and lines, f"exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
        result = json.loads(lines[-1])
        result["log"] = done.stderr
        return result

    run.state = tmp_path / "standin-state"
    run.env = env
    return run


def _ok(result: dict) -> dict:
    assert "error" not in result, result["error"][-6000:] + "\n" + result["log"][-6000:]
    return result


def test_create_update_replace_refresh_destroy(cli):
    first = _ok(cli("up"))
    assert first["summary"].get("create", 0) >= 6, first["summary"]  # stack, provider, component, vpc, subnet, role
    outputs = first["outputs"]
    assert outputs["account"] == ACCOUNT  # the invoke answered with the assumed role's account
    assert outputs["subnetId"].startswith("subnet-")
    assert outputs["roleArn"] == f"arn:aws:iam::{ACCOUNT}:role/{outputs['roleName']}"
    assert outputs["roleName"].startswith("role-")  # the bridge's autoname

    # The same program again: nothing to do (no perpetual diff from autonames or defaults).
    assert _ok(cli("preview"))["summary"].get("same", 0) >= 6 and set(_ok(cli("preview"))["summary"]) == {"same"}

    # Phase 2: the subnet moves (AWS cannot: replaced), the role is retagged (updated in place).
    changed = _ok(cli("up", STANDIN_TEST_PHASE="2"))
    assert changed["summary"].get("replace") == 1 and changed["summary"].get("update") == 1, changed["summary"]
    assert changed["outputs"]["subnetId"] != outputs["subnetId"]
    assert changed["outputs"]["roleArn"] == outputs["roleArn"]

    # The role disappears behind Pulumi's back; a refresh drops it from the stack.
    records = [(path, json.loads(path.read_text())) for path in cli.state.rglob("resources/*.json")]
    (role_file,) = [path for path, record in records if record["type"] == "aws:iam/role:Role"]
    role_file.unlink()
    refreshed = _ok(cli("refresh", STANDIN_TEST_PHASE="2"))
    assert refreshed["summary"].get("delete") == 1, refreshed["summary"]

    destroyed = _ok(cli("destroy", STANDIN_TEST_PHASE="2"))
    assert destroyed["summary"].get("delete", 0) >= 4, destroyed["summary"]
    assert not list(cli.state.rglob("resources/*.json"))


def test_an_invoke_without_a_provider_is_refused_by_the_engine(cli):
    """With ``pulumi:disable-default-providers: [aws, ...]`` the engine refuses a provider-less
    invoke itself (pkg/resource/deploy/default_providers.go); the aws plugin never sees it."""
    result = cli("preview", STANDIN_TEST_PROVIDERLESS_INVOKE="1")
    assert "error" in result
    assert "Default provider for 'aws' disabled" in result["error"] + result["log"]


def test_an_eks_cluster_constructs_onto_the_test_control_plane(cli, tmp_path):
    from tools.cluster.controlplane import CONTROL_PLANE_COMMANDS, ControlPlane, missing_tools

    if not os.access(KUBERNETES_PLUGIN, os.X_OK):
        pytest.skip(f"pulumi-resource-kubernetes is not built at {KUBERNETES_PLUGIN} (make engine-tools)")
    missing = missing_tools(CONTROL_PLANE_COMMANDS)
    if missing:
        pytest.skip(f"control plane tools missing: {missing} (make cluster-tools)")
    with ControlPlane.in_tempdir() as plane:
        up = _ok(cli("up", MLP_STANDIN_KUBECONFIG=str(plane.admin_kubeconfig)))
        outputs = up["outputs"]
        assert outputs["endpoint"] == plane.server
        assert outputs["clusterArn"] == f"arn:aws:eks:us-west-2:{ACCOUNT}:cluster/standin-eks"
        assert outputs["oidcIssuer"].startswith("oidc.eks.us-west-2.amazonaws.com/id/")
        called = json.loads(outputs["calledKubeconfig"])  # Cluster.getKubeconfig through Call
        assert called["clusters"][0]["cluster"]["server"] == plane.server
        # The real Kubernetes provider applied through the kubeconfig pulumi-eks returned.
        probe = json.loads(plane.kubectl("get", "configmap", "standin-probe", "-n", "default", "-o", "json").stdout)
        assert probe["data"] == {"cluster": "standin-eks"}
        deployment = _ok(cli("export", MLP_STANDIN_KUBECONFIG=str(plane.admin_kubeconfig)))["deployment"]
        below = sorted((r["type"], r["urn"].rsplit("::", 1)[-1]) for r in deployment["resources"]
                       if "$eks:index:Cluster$" in r["urn"])
        assert below == sorted([
            ("eks:index:ServiceRole", "eks-eksRole"),
            ("aws:iam/role:Role", "eks-eksRole-role"),
            ("aws:iam/rolePolicyAttachment:RolePolicyAttachment", "eks-eksRole-4b490823"),
            ("aws:eks/cluster:Cluster", "eks-eksCluster"),
            ("pulumi:providers:kubernetes", "eks-eks-k8s"),
        ])
        cluster = next(r for r in deployment["resources"] if r["type"] == "aws:eks/cluster:Cluster")
        assert cluster["inputs"]["kubernetesNetworkConfig"] == {"serviceIpv4Cidr": "172.20.0.0/16", "ipFamily": "ipv4"}
        _ok(cli("destroy", MLP_STANDIN_KUBECONFIG=str(plane.admin_kubeconfig)))
        gone = plane.kubectl("get", "configmap", "standin-probe", "-n", "default", check=False)
        assert gone.returncode != 0 and "NotFound" in gone.stderr
