"""GPUs reach a container only through the device plugin (security review 4, N2).

The NVIDIA container runtime decides which GPUs a container gets (nvidia-container-toolkit
``internal/config/image/cuda_image.go`` ``CUDA.VisibleDevices``), in this order:

1. CDI devices named in ``cdi.k8s.io/`` annotations. containerd copies pod annotations into a
   container's OCI spec only when its runtime lists them in ``pod_annotations``, and the EKS AMI's
   containerd config lists none (amazon-eks-ami ``nodeadm/internal/containerd/config.template.toml``).
2. With ``accept-nvidia-visible-devices-as-volume-mounts``: the devices named by mounts under
   ``/var/run/nvidia-container-devices/`` (a pod spec cannot mount there: only the kubelet does, from
   the device plugin's Allocate response).
3. ``NVIDIA_VISIBLE_DEVICES`` from the environment, but for an unprivileged container only with
   ``accept-nvidia-visible-devices-envvar-when-unprivileged`` (a container without CAP_SYS_ADMIN is
   unprivileged to the toolkit, ``internal/config/image/privileged.go``).

The toolkit's default accepts the variable from anyone (``AcceptEnvvarUnprivileged: true``,
``api/config/v1/config.go``), the AL2023 NVIDIA AMI installs that default and makes ``nvidia``
containerd's default runtime, so any pod on a GPU node that sets ``NVIDIA_VISIBLE_DEVICES=all``
(or whose image does: pytorch/pytorch sets it) gets every GPU of the node. The platform sets, on
every GPU node:

- the toolkit (``/etc/nvidia-container-runtime/config.toml``, keys of
  ``internal/config/config.go`` ``Config``): ``accept-nvidia-visible-devices-envvar-when-unprivileged
  = false`` and ``accept-nvidia-visible-devices-as-volume-mounts = true``, with ``nvidia-ctk config
  --in-place --set KEY=VALUE`` (``cmd/nvidia-ctk/config/config.go``) from the EC2NodeClass user data;
- the device plugin: ``deviceListStrategy: volume-mounts`` (k8s-device-plugin v0.17.1: chart value
  ``deviceListStrategy`` -> env ``DEVICE_LIST_STRATEGY``, ``templates/daemonset-device-plugin.yml``;
  ``internal/plugin/server.go`` ``updateResponseForDeviceMounts``: one ``/dev/null`` mount per
  allocated device at ``/var/run/nvidia-container-devices/<id>``, and ``NVIDIA_VISIBLE_DEVICES`` set
  to that directory). The GPU Operator takes it as ``devicePlugin.env`` (gpu-operator
  ``controllers/object_controls.go`` ``TransformDevicePlugin`` sets ``DEVICE_LIST_STRATEGY`` itself
  only with CDI on, then applies the user's env).

The node-health agent keeps ``NVIDIA_VISIBLE_DEVICES=all``: it runs with SYS_ADMIN, privileged to
the toolkit. Team pods cannot add SYS_ADMIN (Pod Security ``restricted``).
"""
from __future__ import annotations

from typing import Any

TOOLKIT_CONFIG_PATH = "/etc/nvidia-container-runtime/config.toml"
# The toolkit's config.toml keys and the values GPU nodes run with.
TOOLKIT_SETTINGS: dict[str, bool] = {
    "accept-nvidia-visible-devices-envvar-when-unprivileged": False,
    "accept-nvidia-visible-devices-as-volume-mounts": True,
}
DEVICE_LIST_STRATEGY = "volume-mounts"
DEVICE_LIST_STRATEGY_ENV = "DEVICE_LIST_STRATEGY"
# Where the device plugin's mounts name the allocated devices (v0.17.1 internal/plugin/server.go
# ``deviceListAsVolumeMountsContainerPathRoot``).
DEVICE_MOUNT_ROOT = "/var/run/nvidia-container-devices"
USER_DATA_BOUNDARY = "MLPLATFORM-GPU-RUNTIME"


def toolkit_script() -> str:
    """The shell script a GPU node runs before the kubelet starts (cloud-init runs user-data
    scripts before nodeadm's ``run`` phase starts the kubelet). It fails the boot loudly rather
    than leave a node that hands GPUs to whoever asks."""
    sets = " ".join(f"--set {key}={str(value).lower()}" for key, value in TOOLKIT_SETTINGS.items())
    return (
        "#!/bin/bash\n"
        "# GPUs only through the device plugin: the NVIDIA runtime ignores NVIDIA_VISIBLE_DEVICES from\n"
        "# unprivileged containers and takes the device plugin's volume mounts (workloads/gpu_runtime.py).\n"
        "set -euo pipefail\n"
        f"nvidia-ctk config --config-file {TOOLKIT_CONFIG_PATH} --in-place {sets}\n"
    )


def al2023_user_data() -> str:
    """EC2NodeClass ``userData`` for AL2023 GPU nodes: a MIME multi-part archive, which Karpenter
    merges with its own NodeConfig part (Karpenter docs, EC2NodeClass "spec.userData", AL2023)."""
    return (
        "MIME-Version: 1.0\n"
        f'Content-Type: multipart/mixed; boundary="{USER_DATA_BOUNDARY}"\n'
        "\n"
        f"--{USER_DATA_BOUNDARY}\n"
        'Content-Type: text/x-shellscript; charset="us-ascii"\n'
        "\n"
        f"{toolkit_script()}"
        "\n"
        f"--{USER_DATA_BOUNDARY}--\n"
    )


def device_plugin_values() -> dict[str, Any]:
    """nvidia-device-plugin chart values (0.17.1 values.yaml ``deviceListStrategy``)."""
    return {"deviceListStrategy": DEVICE_LIST_STRATEGY}


# GPU Operator v25.3.0 values.yaml ``devicePlugin.env``, in order. Helm replaces a list value
# whole, so the override repeats upstream's entries and changes only the strategy (upstream:
# envvar). CDI stays off (``cdi.enabled: false``): with it on, the operator would set the
# strategy to ``envvar,cdi-annotations`` itself (controllers/object_controls.go).
_GPU_OPERATOR_DEVICE_PLUGIN_ENV = (
    ("PASS_DEVICE_SPECS", "true"),
    ("FAIL_ON_INIT_ERROR", "true"),
    (DEVICE_LIST_STRATEGY_ENV, DEVICE_LIST_STRATEGY),
    ("DEVICE_ID_STRATEGY", "uuid"),
    # The plugin's own container (privileged) sees every GPU to advertise them.
    ("NVIDIA_VISIBLE_DEVICES", "all"),
    ("NVIDIA_DRIVER_CAPABILITIES", "all"),
)


def gpu_operator_device_plugin_env() -> list[dict[str, str]]:
    """GPU Operator ``devicePlugin.env`` (v25.3.0): upstream's list with the volume-mounts strategy."""
    return [{"name": name, "value": value} for name, value in _GPU_OPERATOR_DEVICE_PLUGIN_ENV]
