"""A readiness job per GPU pool, for the platform team to run after a pool is created or changed.

Two whole nodes of the pool, as a PyTorchJob: every pod first runs ``nvidia-smi`` (driver loaded,
every GPU visible, no uncorrected ECC errors), then a 2-node all-reduce
(``trainer.nccl_check``: nccl-tests' all_reduce_perf measurement, run with the same torchrun
rendezvous as training) that fails below the pool's bus-bandwidth floor
(``workloads.instances.busbw_floor_gb_per_s``: a fraction of the instance's network line rate).
A pool whose EFA is not wired (NCCL falls back to TCP) fails the floor.

On an EFA pool it is the pool's gate: every pod tees the run's output and checks NCCL's own
log lines (``trainer.nccl_transport``): every inter-node channel over aws-ofi-nccl's Libfabric
with the ``efa`` provider, with GPUDirect RDMA (``/GDRDMA``) on the instance types that have it,
and a bus bandwidth at or above the instance type's floor (``BUSBW_REFERENCES``). Teams get
quota on a new EFA pool only after it passes (docs/runbooks/gpu-pools.md).

Runs outside Kueue (no queue label) in its own namespace, so it never takes a team's quota.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

from catalog.node_model import gpu_pod_allocatable
from workloads.instances import busbw_floor_gb_per_s
from workloads.karpenter import EFA_RESOURCE, GPU_RESOURCE, GPU_TYPE_LABEL, POOL_LABEL
from workloads.platform_facts import PoolFacts
from workloads.trainingjob import (
    CONTAINER_NAME, DO_NOT_DISRUPT, MASTER_PORT, PORT_NAME, PYTORCHJOB_API, RDMA_FAMILIES, container_security_context, pod_security_context,
)

READINESS_NAMESPACE = "gpu-readiness"
NUM_NODES = 2
RUN_LOG = "/tmp/readiness.log"


class BusbwReference(NamedTuple):
    """A healthy 2-node (2 x 8 GPU) all-reduce bus bandwidth at >= 1 GiB messages, and where it is from."""

    gb_per_s: float
    source: str


# The floor is FLOOR_FRACTION of the reference: below it a link, a NIC or GPUDirect RDMA is off.
FLOOR_FRACTION = 0.75
_P4 = BusbwReference(57.2, "NVIDIA/nccl issue 527 (2022): nccl-tests all_reduce_perf on 2 p4d-class nodes (4 x 100 Gbps "
                           "EFA, FI_EFA_USE_DEVICE_RDMA=1, NCCL 2.9.9): busbw 57.17 GB/s at 1073741824 B; p4de has the "
                           "same network. Issue 25 quotes ~78 GB/s with current NCCL: raise it after your first healthy run")
_P5 = BusbwReference(435.1, "crazyguitar/aws-gpu-communication-benchmark data/nccl_all_reduce.csv: nccl-tests all_reduce_perf "
                            "on 2 p5.48xlarge (16 H100, 32 EFA interfaces): out-of-place busbw 435.14 GB/s at 1024 MB, the "
                            "size this job uses (477.71 GB/s at 8192 MB: issue 25's ~480). p5e/p5en have at least p5's "
                            "3200 Gbps, so p5's figure is their (conservative) reference until measured")
BUSBW_REFERENCES: dict[str, BusbwReference] = {
    "p4d.24xlarge": _P4, "p4de.24xlarge": _P4,
    "p5.48xlarge": _P5, "p5e.48xlarge": _P5, "p5en.48xlarge": _P5,
}


def gate_floor_gb_per_s(instance_type: str, *, efa: bool) -> float:
    """The bus-bandwidth floor of the readiness gate: FLOOR_FRACTION of the instance type's
    measured reference where one exists (EFA), else the line-rate rule of workloads.instances."""
    reference = BUSBW_REFERENCES.get(instance_type) if efa else None
    if reference is None:
        return busbw_floor_gb_per_s(instance_type, efa=efa)
    return round(reference.gb_per_s * FLOOR_FRACTION, 1)


def has_gpudirect_rdma(instance_type: str) -> bool:
    return instance_type.startswith(RDMA_FAMILIES)


def readiness_namespace() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": READINESS_NAMESPACE, "labels": {
        "pod-security.kubernetes.io/enforce": "baseline", "pod-security.kubernetes.io/enforce-version": "v1.32"}}}


def gpu_check_script(pool: PoolFacts, floor: float, instance_type: Optional[str] = None) -> str:
    # nvidia-smi exits non-zero when the driver is not loaded; the query fails the pod when a GPU
    # is missing or reports uncorrected ECC errors.
    instance_type = instance_type or pool.instance_types[0]
    run = ("python -m trainer.launch --nnodes=$PET_NNODES --nproc-per-node=$PET_NPROC_PER_NODE "
           "--node-rank=$PET_NODE_RANK --master-addr=$PET_MASTER_ADDR --master-port=$PET_MASTER_PORT --max-restarts=0 "
           f"-m trainer.nccl_check --size-mib 1024 --min-busbw-gb-per-s {floor}")
    script = (
        "set -eu\n"
        "nvidia-smi\n"
        "gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)\n"
        f"[ \"$gpus\" -eq {pool.gpus_per_node} ] || {{ echo \"expected {pool.gpus_per_node} GPUs, found $gpus\"; exit 1; }}\n"
        "ecc=$(nvidia-smi --query-gpu=ecc.errors.uncorrected.volatile.total --format=csv,noheader | grep -cv '^0$\\|N/A' || true)\n"
        "[ \"$ecc\" -eq 0 ] || { echo \"$ecc GPU(s) with uncorrected ECC errors\"; exit 1; }\n"
    )
    if not pool.efa:
        return script + f"exec {run}\n"
    # NCCL logs to the workers' stdout, which torchrun forwards: keep a copy and read the
    # transport from it. The all-reduce's own exit code is kept (sh has no pipefail).
    gdr = " --require-gdr" if has_gpudirect_rdma(instance_type) else ""
    return script + (
        f"rc=0; {{ {run} || echo $? > {RUN_LOG}.rc; }} 2>&1 | tee {RUN_LOG}\n"
        f"if [ -f {RUN_LOG}.rc ]; then rc=$(cat {RUN_LOG}.rc); fi\n"
        f"python -m trainer.nccl_transport {RUN_LOG} --expect efa{gdr} --min-busbw-gb-per-s {floor} || rc=1\n"
        "exit $rc\n"
    )


def readiness_job(pool: PoolFacts, *, image: str) -> dict[str, Any]:
    instance_type = pool.instance_types[0]
    cpu_millicores, memory_mib = gpu_pod_allocatable(instance_type)
    floor = gate_floor_gb_per_s(instance_type, efa=pool.efa)
    amounts = {GPU_RESOURCE: str(pool.gpus_per_node), "cpu": str(max(1, cpu_millicores // 1000 // 2)),
               "memory": f"{max(1, memory_mib // 1024 // 4)}Gi"}
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
                "command": ["/usr/bin/tini", "--", "sh", "-c"], "args": [gpu_check_script(pool, floor, instance_type)], "env": env,
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
