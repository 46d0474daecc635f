"""Fixtures for the job client: dev facts, a fake API, and the controllers' seat (pods as the
Training Operator v1.9.4 / JobSet v0.12.0 create them, Kueue Workloads, Karpenter nodes)."""
from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import yaml

from tests.jobs.fake_kube import FakeKubeApi, now

ROOT = Path(__file__).resolve().parents[2]


def use_fake_kubectl(tmp_path: Path, monkeypatch) -> Path:
    """The fake kubectl first on PATH, a kubeconfig, and the state file it reads and writes
    (returned: ``kube.save`` it before calling the CLI)."""
    from tests.jobs import fake_kubectl

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_kubectl.install(bin_dir)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    state = tmp_path / "state.json"
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("FAKE_KUBE_STATE", str(state))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # list --sweep reads MLflow only when asked
    return state
SMOKE = ROOT / "examples" / "jobs" / "l4-dev-smoke.yaml"
MULTINODE = ROOT / "examples" / "jobs" / "a10g-multinode-ddp.yaml"


@pytest.fixture(scope="session")
def dev_facts(dev_plan):
    from jobs.facts import facts_from_plan

    return facts_from_plan(dev_plan)


@pytest.fixture(scope="session")
def v2_facts(dev_facts):
    from workloads.trainingjob import TORCH_DISTRIBUTED_RUNTIME

    return dataclasses.replace(dev_facts, trainer_v2_runtime=TORCH_DISTRIBUTED_RUNTIME)


@pytest.fixture
def kube(schemas):
    return FakeKubeApi(str(schemas))


def raw_spec(path: Path = SMOKE, **changes) -> dict:
    return {**yaml.safe_load(path.read_text()), **changes}


def owner_ref(job: dict) -> dict:
    return {"apiVersion": job["apiVersion"], "kind": job["kind"], "name": job["metadata"]["name"],
            "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def add_node(kube: FakeKubeApi, name: str, instance_type: str, capacity_type: str, gpus: int) -> dict:
    return kube.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "node.kubernetes.io/instance-type": instance_type, "karpenter.sh/capacity-type": capacity_type}},
        "status": {"capacity": {"nvidia.com/gpu": str(gpus)}}})


def operator_pods(kube: FakeKubeApi, job: dict, *, node: str = "ip-10-0-1-1", logs=None, started_at: str = None,
                  suffix: str = "") -> list[dict]:
    """The pods a job's controller creates, Running, each with its log lines.

    PyTorchJob (Training Operator v1.9.4): ``<job>-<replica type lowercased>-<index>``
    (pkg/controller.v1/common/util.go:51) with the v1 labels (common_types.go:25-34) and a
    controller ownerReference. TrainJob (Trainer v2.3.0 -> JobSet v0.12.0 -> Indexed Job): pods
    of the replicated job ``node`` labelled with the JobSet's name (= the TrainJob's) and the
    completion index; their owner is the child Job, which the JobSet owns, which the TrainJob
    owns; here the TrainJob owns them directly, the same for a foreground deletion."""
    started_at = started_at or now()
    pods = []
    if job["kind"] == "PyTorchJob":
        for rtype, replica in job["spec"]["pytorchReplicaSpecs"].items():
            for index in range(replica["replicas"]):
                template = copy.deepcopy(replica["template"])
                labels = {**template["metadata"]["labels"], "training.kubeflow.org/job-name": job["metadata"]["name"],
                          "training.kubeflow.org/replica-type": rtype.lower(),
                          "training.kubeflow.org/replica-index": str(index),
                          "training.kubeflow.org/operator-name": "pytorchjob-controller"}
                if rtype == "Master":
                    labels["training.kubeflow.org/job-role"] = "master"
                pods.append(({"name": f"{job['metadata']['name']}-{rtype.lower()}-{index}{suffix}", "labels": labels,
                              "annotations": template["metadata"].get("annotations", {})}, template["spec"], "pytorch"))
    else:
        trainer = job["spec"]["trainer"]
        for index in range(trainer["numNodes"]):
            spec = {"containers": [{"name": "node", "image": trainer["image"], "command": trainer["command"],
                                    "args": trainer["args"], "env": trainer["env"],
                                    "resources": trainer["resourcesPerNode"]}],
                    "restartPolicy": "OnFailure", "terminationGracePeriodSeconds": 75}
            labels = {"jobset.sigs.k8s.io/jobset-name": job["metadata"]["name"],
                      "jobset.sigs.k8s.io/replicatedjob-name": "node", "jobset.sigs.k8s.io/job-index": "0",
                      "batch.kubernetes.io/job-completion-index": str(index)}
            pods.append(({"name": f"{job['metadata']['name']}-node-0-{index}-x{suffix or 'abcd'}", "labels": labels}, spec, "node"))
    out = []
    for meta, spec, container in pods:
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {**meta, "namespace": job["metadata"]["namespace"], "ownerReferences": [owner_ref(job)]},
               "spec": {**spec, "nodeName": node},
               "status": {"phase": "Running", "containerStatuses": [{
                   "name": container, "ready": True, "restartCount": 0, "image": "x", "imageID": "",
                   "state": {"running": {"startedAt": started_at}}}]}}
        rank_logs = None if logs is None else logs(meta["name"])
        out.append(kube.add(pod, logs=rank_logs))
    return out


def kueue_workload(kube: FakeKubeApi, job: dict, conditions: list[dict], flavors: dict = None) -> dict:
    """Kueue v0.19.2's Workload for a job: owned by it, labelled with its uid
    (pkg/controller/jobframework/reconciler.go:1355)."""
    obj = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
           "metadata": {"name": f"{job['kind'].lower()}-{job['metadata']['name']}-1a2b3",
                        "namespace": job["metadata"]["namespace"],
                        "labels": {"kueue.x-k8s.io/job-uid": job["metadata"]["uid"]},
                        "ownerReferences": [owner_ref(job)]},
           "status": {"conditions": conditions}}
    if flavors:
        obj["status"]["admission"] = {"clusterQueue": "research",
                                      "podSetAssignments": [{"name": "master", "flavors": flavors}]}
    return kube.add(obj)


def set_conditions(kube: FakeKubeApi, job: dict, *types: str, message: str = "") -> dict:
    stored = kube.find(kube.resource_of(job), job["metadata"]["name"], job["metadata"]["namespace"])
    stored["status"] = {"conditions": [{"type": t, "status": "True", "reason": t, "message": message,
                                        "lastTransitionTime": f"2026-11-25T10:0{i}:00Z"} for i, t in enumerate(types)]}
    return stored
