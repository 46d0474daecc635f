"""GPUs without a GPU request, from the attacker's seat (security review 4, N2): a pod that
requests no ``nvidia.com/gpu`` but sets ``NVIDIA_VISIBLE_DEVICES=all`` (or runs an image that
does) lands on a GPU node. The attack is that container; what refuses it is the NVIDIA runtime's
configuration the platform puts on every GPU node, with the device plugin's matching strategy.

``visible_devices`` is a line-by-line port of nvidia-container-toolkit
``internal/config/image/cuda_image.go``:

- ``CUDA.VisibleDevices``: "If enabled, try and get the device list from volume mounts first [...]
  Fallback to reading from the environment variable if privileges are correct [...] If the
  container is privileged, or environment variable requests are allowed for unprivileged
  containers, these devices are returned." (the CDI annotation step is left out: the EKS AMI's
  containerd passes no pod annotations to containers, workloads/gpu_runtime.py);
- ``requestsFromMounts``: "Only consider mounts who's host volume is /dev/null [...] Only consider
  container mount points that begin with 'root'";
- ``devicesFromEnvvars``: "Environment variable unset or empty or "void": return nil".

``allocate`` ports k8s-device-plugin v0.17.1 ``internal/plugin/server.go`` (``getAllocateResponse``,
``updateResponseForDeviceListEnvVar``, ``updateResponseForDeviceMounts``). The toolkit's defaults are
``api/config/v1/config.go``: ``AcceptEnvvarUnprivileged: true`` and volume mounts off.
"""
from __future__ import annotations

import email
import re
from pathlib import Path
from typing import Optional

import pytest

from components.gpu_enablement import device_plugin_values, gpu_operator_values
from workloads import gpu_runtime
from workloads.karpenter import AmiFamily, gpu_node_class
from workloads.node_health import node_health_objects
from tests.workloads.test_gpu_manifests import H100, L4, NODE_CLASS, RESERVED

ROOT = Path(__file__).resolve().parents[2]
NODE_GPUS = [f"GPU-{i}" for i in range(8)]
STOCK_TOOLKIT = {"accept-nvidia-visible-devices-envvar-when-unprivileged": True,
                 "accept-nvidia-visible-devices-as-volume-mounts": False}


def visible_devices(env: dict[str, str], mounts: list[tuple[str, str]], *, privileged: bool, toolkit: dict[str, bool]) -> list[str]:
    """The GPUs the runtime gives a container (ids, or every GPU of the node for ``all``)."""
    if toolkit["accept-nvidia-visible-devices-as-volume-mounts"]:
        root = gpu_runtime.DEVICE_MOUNT_ROOT
        from_mounts = []
        for source, destination in mounts:
            if source == "/dev/null" and destination.startswith(root):
                device = destination[len(root):].strip("/")
                if device:
                    from_mounts.append(device)
        if from_mounts:
            return from_mounts
    requested = [d.strip() for d in env.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if not requested or "void" in requested:
        return []
    if privileged or toolkit["accept-nvidia-visible-devices-envvar-when-unprivileged"]:
        return list(NODE_GPUS) if requested == ["all"] else requested
    return []  # "Ignoring devices requested by environment variable(s) in unprivileged container"


def allocate(strategy: str, ids: list[str]) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """The device plugin's Allocate response for one container: (envs, mounts)."""
    envs: dict[str, str] = {}
    mounts: list[tuple[str, str]] = []
    if strategy == "envvar":
        envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(ids)
    elif strategy == "volume-mounts":
        envs["NVIDIA_VISIBLE_DEVICES"] = gpu_runtime.DEVICE_MOUNT_ROOT
        mounts = [("/dev/null", f"{gpu_runtime.DEVICE_MOUNT_ROOT}/{i}") for i in ids]
    else:
        raise AssertionError(strategy)
    return envs, mounts


def node_toolkit(user_data: Optional[str]) -> dict[str, bool]:
    """The toolkit settings a node boots with: the stock config, then the user data's ``--set``s."""
    settings = dict(STOCK_TOOLKIT)
    if user_data is None:
        return settings
    message = email.message_from_string(user_data)
    scripts = [p.get_payload() for p in message.walk() if p.get_content_type() == "text/x-shellscript"]
    for script in scripts:
        for line in script.splitlines():
            if line.startswith("nvidia-ctk config ") and "--in-place" in line:
                assert f"--config-file {gpu_runtime.TOOLKIT_CONFIG_PATH}" in line
                for key, value in re.findall(r"--set ([a-z-]+)=(true|false)", line):
                    settings[key] = value == "true"
    return settings


def image_env(dockerfile: Path) -> dict[str, str]:
    """The ENV the image's own layers set last (a FROM's env is what the base image says)."""
    env = {"NVIDIA_VISIBLE_DEVICES": "all"}  # pytorch/pytorch Dockerfile, stage official
    for line in dockerfile.read_text().splitlines():
        match = re.match(r"ENV (NVIDIA_VISIBLE_DEVICES)=(\S*)", line)
        if match:
            env[match.group(1)] = match.group(2)
    return env


ATTACKER_ENV = {"NVIDIA_VISIBLE_DEVICES": "all"}


def test_the_port_reproduces_the_attack_on_a_stock_node():
    """Otherwise every refusal below would be trivially true: on the AMI's stock toolkit the
    GPU-less, unprivileged attacker gets all eight GPUs."""
    assert visible_devices(ATTACKER_ENV, [], privileged=False, toolkit=STOCK_TOOLKIT) == NODE_GPUS


@pytest.mark.parametrize("pool", [H100, L4], ids=lambda p: p.name)
def test_gpu_less_pod_asking_for_every_gpu_gets_none_on_a_platform_node(pool):
    user_data = gpu_node_class(pool, NODE_CLASS)["spec"].get("userData")
    assert user_data is not None, f"{pool.name}: the AL2023 GPU node boots the stock NVIDIA runtime (no userData)"
    toolkit = node_toolkit(user_data)
    assert visible_devices(ATTACKER_ENV, [], privileged=False, toolkit=toolkit) == []
    # Naming the devices one by one does not help either.
    assert visible_devices({"NVIDIA_VISIBLE_DEVICES": "GPU-0,GPU-1"}, [], privileged=False, toolkit=toolkit) == []


@pytest.mark.parametrize("pool", [H100, L4], ids=lambda p: p.name)
def test_a_gpu_pod_gets_exactly_its_devices_through_the_plugin(pool):
    """The device plugin's strategy matches the node: a pod that requested two GPUs gets those
    two (with the plugin's upstream default, envvar, it would get none on a hardened node)."""
    toolkit = node_toolkit(gpu_node_class(pool, NODE_CLASS)["spec"]["userData"])
    strategy = device_plugin_values()["deviceListStrategy"]
    envs, mounts = allocate(strategy, ["GPU-3", "GPU-5"])
    # The Allocate response's env overrides the image's (the container's env wins over the image config).
    env = {**image_env(ROOT / "trainer" / "Dockerfile"), **envs}
    assert visible_devices(env, mounts, privileged=False, toolkit=toolkit) == ["GPU-3", "GPU-5"]
    envs, mounts = allocate("envvar", ["GPU-3"])
    assert visible_devices(envs, mounts, privileged=False, toolkit=toolkit) == [], "the strategy matters"


def test_the_gpu_operator_device_plugin_uses_volume_mounts_and_keeps_upstreams_env():
    env = gpu_operator_values(service_monitor=False)["devicePlugin"]["env"]
    names = [e["name"] for e in env]
    # Helm replaces the list whole: upstream's v25.3.0 entries all stay.
    assert names == ["PASS_DEVICE_SPECS", "FAIL_ON_INIT_ERROR", "DEVICE_LIST_STRATEGY", "DEVICE_ID_STRATEGY",
                     "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"]
    assert {e["name"]: e["value"] for e in env}["DEVICE_LIST_STRATEGY"] == "volume-mounts"


def test_the_trainer_image_asks_for_no_gpu_by_default():
    """The image's half: even on a node with the stock runtime, a GPU-less pod of the trainer
    image no longer inherits pytorch/pytorch's NVIDIA_VISIBLE_DEVICES=all."""
    env = image_env(ROOT / "trainer" / "Dockerfile")
    assert visible_devices(env, [], privileged=False, toolkit=STOCK_TOOLKIT) == []


def test_the_node_health_agent_still_sees_every_gpu():
    """It runs with SYS_ADMIN, which makes it privileged to the toolkit
    (internal/config/image/privileged.go: CAP_SYS_ADMIN in the bounding set)."""
    (ds,) = [o for o in node_health_objects(image="registry.example/gpu-node-health:1") if o["kind"] == "DaemonSet"]
    (container,) = [c for c in ds["spec"]["template"]["spec"]["containers"]
                    if any(e.get("name") == "NVIDIA_VISIBLE_DEVICES" for e in c.get("env", []))]
    assert "SYS_ADMIN" in container["securityContext"]["capabilities"]["add"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    toolkit = node_toolkit(gpu_node_class(H100, NODE_CLASS)["spec"]["userData"])
    assert visible_devices(env, [], privileged=True, toolkit=toolkit) == NODE_GPUS


def test_bottlerocket_pools_take_no_shell_user_data():
    """Bottlerocket's NVIDIA variant already runs with both settings (its
    nvidia-container-toolkit-config-k8s template defaults); shell user data would be invalid TOML there."""
    assert AmiFamily(RESERVED.ami_alias.split("@")[0]) is AmiFamily.BOTTLEROCKET
    assert "userData" not in gpu_node_class(RESERVED, NODE_CLASS)["spec"]


def test_the_script_fails_the_boot_on_error():
    script = gpu_runtime.toolkit_script()
    assert script.startswith("#!/bin/bash\n") and "set -euo pipefail" in script
