"""A readiness job per GPU pool, for the platform team to run after a pool is created or changed.

Two whole nodes of the pool, as a PyTorchJob: every pod first runs ``nvidia-smi`` (driver loaded,
every GPU visible, no uncorrected ECC errors), then a 2-node all-reduce
(``trainer.nccl_check``: nccl-tests' all_reduce_perf measurement, run with the same torchrun
rendezvous as training) that fails below the pool's bus-bandwidth floor
(``workloads.instances.busbw_floor_gb_per_s``: a fraction of the instance's network line rate).
A pool whose EFA is not wired (NCCL falls back to TCP) fails the floor.

Runs outside Kueue (no queue label) in its own namespace, so it never takes a team's quota.
"""
from __future__ import annotations

from typing import Any

from workloads.instances import busbw_floor_gb_per_s, instance
from workloads.karpenter import EFA_RESOURCE, GPU_RESOURCE, GPU_TYPE_LABEL, POOL_LABEL
from workloads.platform_facts import PoolFacts
from workloads.trainingjob import (
    CONTAINER_NAME, DO_NOT_DISRUPT, MASTER_PORT, PORT_NAME, PYTORCHJOB_API, RDMA_FAMILIES, container_security_context, pod_security_context,
)

READINESS_NAMESPACE = "gpu-readiness"
NUM_NODES = 2


def readiness_namespace() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": READINESS_NAMESPACE, "labels": {
        "pod-security.kubernetes.io/enforce": "baseline", "pod-security.kubernetes.io/enforce-version": "v1.32"}}}


def gpu_check_script(pool: PoolFacts, floor: float) -> str:
    # nvidia-smi exits non-zero when the driver is not loaded; the query fails the pod when a GPU
    # is missing or reports uncorrected ECC errors.
    return (
        "set -eu\n"
        "nvidia-smi\n"
        "gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)\n"
        f"[ \"$gpus\" -eq {pool.gpus_per_node} ] || {{ echo \"expected {pool.gpus_per_node} GPUs, found $gpus\"; exit 1; }}\n"
        "ecc=$(nvidia-smi --query-gpu=ecc.errors.uncorrected.volatile.total --format=csv,noheader | grep -cv '^0$\\|N/A' || true)\n"
        "[ \"$ecc\" -eq 0 ] || { echo \"$ecc GPU(s) with uncorrected ECC errors\"; exit 1; }\n"
        "exec python -m trainer.launch --nnodes=$PET_NNODES --nproc-per-node=$PET_NPROC_PER_NODE "
        "--node-rank=$PET_NODE_RANK --master-addr=$PET_MASTER_ADDR --master-port=$PET_MASTER_PORT --max-restarts=0 "
        f"-m trainer.nccl_check --size-mib 1024 --min-busbw-gb-per-s {floor}\n"
    )


def readiness_job(pool: PoolFacts, *, image: str) -> dict[str, Any]:
    instance_type = pool.instance_types[0]
    facts = instance(instance_type)
    floor = busbw_floor_gb_per_s(instance_type, efa=pool.efa)
    amounts = {GPU_RESOURCE: str(pool.gpus_per_node), "cpu": str(max(1, facts.allocatable_cpu // 2)),
               "memory": f"{max(1, facts.allocatable_memory_gib // 4)}Gi"}
    if pool.efa:
        amounts[EFA_RESOURCE] = str(pool.efa_devices_per_node)
    env = [{"name": "NCCL_DEBUG", "value": "INFO"}]  # the log shows which transport NCCL chose
    if pool.efa:
        env += [{"name": "FI_PROVIDER", "value": "efa"}]
        if instance_type.startswith(RDMA_FAMILIES):
            env += [{"name": "FI_EFA_USE_DEVICE_RDMA", "value": "1"}]
    template = {
        "metadata": {"labels": {"app.kubernetes.io/name": "gpu-readiness", "mlplatform.io/pool": pool.name},
                     "annotations": {DO_NOT_DISRUPT: "true"}},
        "spec": {
            "nodeSelector": {POOL_LABEL: pool.node_labels[POOL_LABEL], GPU_TYPE_LABEL: pool.node_labels[GPU_TYPE_LABEL]},
            "tolerations": [{"key": t["key"], "operator": "Exists", "effect": t["effect"]} for t in pool.taints],
            "securityContext": pod_security_context(),
            "terminationGracePeriodSeconds": 30,
            "containers": [{
                "name": CONTAINER_NAME, "image": image, "imagePullPolicy": "IfNotPresent",
                "command": ["/usr/bin/tini", "--", "sh", "-c"], "args": [gpu_check_script(pool, floor)], "env": env,
                "ports": [{"name": PORT_NAME, "containerPort": MASTER_PORT, "protocol": "TCP"}],
                "resources": {"requests": dict(amounts), "limits": dict(amounts)},
                "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
                "securityContext": container_security_context(),
            }],
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}],
        },
    }
    import copy

    return {
        "apiVersion": PYTORCHJOB_API,
        "kind": "PyTorchJob",
        "metadata": {"name": f"readiness-{pool.name}", "namespace": READINESS_NAMESPACE,
                     "labels": {"mlplatform.io/pool": pool.name, "app.kubernetes.io/name": "gpu-readiness"},
                     "annotations": {"mlplatform.io/busbw-floor-gb-per-s": str(floor),
                                     "mlplatform.io/instance-type": instance_type}},
        "spec": {
            "nprocPerNode": str(pool.gpus_per_node),
            # A failed check is an answer, not something to retry.
            "runPolicy": {"backoffLimit": 0, "activeDeadlineSeconds": 1800, "ttlSecondsAfterFinished": 86400,
                          "cleanPodPolicy": "Running"},
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "restartPolicy": "Never", "template": template},
                "Worker": {"replicas": NUM_NODES - 1, "restartPolicy": "Never", "template": copy.deepcopy(template)},
            },
        },
    }
