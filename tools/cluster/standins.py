"""Stand-ins for what AWS runs behind the platform's Kubernetes objects (docs/testing.md lists them).

Each stand-in reproduces one upstream behaviour, named with its source, and nothing more:

- kwok nodes and pods: simulated kubelets (node heartbeats, pod phases) from the pinned kwok module's
  own "fast" stages.
- A node launched for a NodePool, where Karpenter's kwok provider is not running: the labels,
  taints and startup taints Karpenter puts on a NodeClaim's node (karpenter v1.14.1
  pkg/controllers/nodeclaim/lifecycle/launch.go and registration.go: template labels, the
  ``karpenter.sh/nodepool`` label, ``taints`` + ``startupTaints``), and the extended resources its
  device plugins advertise.
- The owners of startup taints: each CSI driver's node plugin removes its ``agent-not-ready``
  taint once it runs on the node (aws-fsx-csi-driver pkg/driver/node.go ``removeNotReadyTaint``,
  aws-efs-csi-driver and aws-ebs-csi-driver the same function, mountpoint-s3-csi-driver v2
  ``s3.csi.aws.com/agent-not-ready``); the platform's agents (gpu-node-health, mig-ready-gate)
  lift theirs after their checks pass. Here a taint is lifted when its owner is deployed by the
  stack and, for a DaemonSet of ours, when that DaemonSet's pod is Ready on the node (the real
  DaemonSet controller, scheduler and kwok decide that), never otherwise.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

import yaml

KWOK_MODULE = ("sigs.k8s.io/kwok", "v0.8.0")
KWOK_ANNOTATION = {"kwok.x-k8s.io/node": "fake"}


@dataclass(frozen=True)
class TaintOwner:
    """What removes one startup taint in a customer's cluster."""

    key: str
    addon: Optional[str] = None                      # an EKS add-on whose node plugin lifts it
    daemonset: Optional[tuple[str, str]] = None      # (namespace, name) of a DaemonSet of ours
    source: str = ""


STARTUP_TAINT_OWNERS: dict[str, TaintOwner] = {o.key: o for o in (
    TaintOwner("fsx.csi.aws.com/agent-not-ready", addon="aws-fsx-csi-driver",
               source="kubernetes-sigs/aws-fsx-csi-driver pkg/driver/constants.go:11, node.go removeNotReadyTaint; chart node.tolerateAllTaints: true"),
    TaintOwner("efs.csi.aws.com/agent-not-ready", addon="aws-efs-csi-driver",
               source="kubernetes-sigs/aws-efs-csi-driver pkg/driver/driver.go AgentNotReadyNodeTaintKey (\"taints to be removed on driver startup\"); chart node.tolerateAllTaints: true"),
    TaintOwner("ebs.csi.aws.com/agent-not-ready", addon="aws-ebs-csi-driver",
               source="kubernetes-sigs/aws-ebs-csi-driver pkg/driver/node.go removeNotReadyTaint"),
    TaintOwner("s3.csi.aws.com/agent-not-ready", addon="aws-mountpoint-s3-csi-driver",
               source="awslabs/mountpoint-s3-csi-driver v2.2.2 pkg/driver/node/taint.go AgentNotReadyNodeTaintKey, started at pkg/driver/driver.go:196; chart node.tolerateAllTaints: true"),
    TaintOwner("node.mlplatform.io/gpu-not-ready", daemonset=("gpu-system", "gpu-node-health"),
               source="workloads/node_health_agent.py (lifts it when every check passes)"),
    TaintOwner("mlplatform.io/mig-pending", daemonset=("gpu-system", "mig-ready-gate"),
               source="workloads/gpu_sharing.py mig-ready-gate (lifts it at mig.config.state=success)"),
)}


def kwok_config(module_dir: Path) -> str:
    """kwok's configuration: the Stage objects of its own ``fast`` node and pod stages."""
    docs: list[dict[str, Any]] = []
    for folder in ("kustomize/stage/node/fast", "kustomize/stage/pod/fast"):
        for path in sorted((module_dir / folder).glob("*.yaml")):
            if path.name == "kustomization.yaml":
                continue
            docs.extend(d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict) and d.get("kind") == "Stage")
    docs.extend(signalled_pod_stages(module_dir))
    # No KwokConfiguration document: kwok then builds its own with every default set
    # (pkg/apis/config/v1alpha1/zz_generated.defaults.go); one given here is not defaulted.
    return yaml.safe_dump_all(docs, sort_keys=False)


# A test ends a simulated container by labelling its pod (kwok's chaos stages are label-driven).
POD_FAILED_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"
POD_FAILED_EXIT_CODE = "pod-container-running-failed.stage.kwok.x-k8s.io/exit-code"
POD_FAILED_REASON = "pod-container-running-failed.stage.kwok.x-k8s.io/reason"
POD_COMPLETE_LABEL = "pod-complete.stage.mlplatform.io"


def signalled_pod_stages(module_dir: Path) -> list[dict[str, Any]]:
    """Stages that end a Running pod when a test says so, as kwok's own stages end one.

    - kwok's ``chaos/pod-container-running-failed`` verbatim: a pod labelled
      ``pod-container-running-failed.stage.kwok.x-k8s.io=true`` goes to phase Failed with its
      containers ``terminated`` at the exit code of the annotation ``.../exit-code`` (143: the
      trainer's answer to SIGTERM; 2: a permanent error), as a kubelet reports a container that
      exited.
    - kwok's ``fast/pod-complete`` with its selector on a label instead of a Job owner: kwok's own
      stage completes only pods owned by a batch Job, and a PyTorchJob's pods are owned by the
      PyTorchJob, so without it they would run forever. Same status template (phase Succeeded,
      exit code 0).
    """
    failed = [d for d in yaml.safe_load_all((module_dir / "kustomize/stage/pod/chaos/pod-container-running-failed.yaml").read_text())
              if isinstance(d, dict)]
    complete = [d for d in yaml.safe_load_all((module_dir / "kustomize/stage/pod/fast/pod-complete.yaml").read_text())
                if isinstance(d, dict)][0]
    complete["metadata"]["name"] = "pod-complete-on-label"
    expressions = [e for e in complete["spec"]["selector"]["matchExpressions"] if "ownerReferences" not in e["key"]]
    expressions.append({"key": f'.metadata.labels["{POD_COMPLETE_LABEL}"]', "operator": "In", "values": ["true"]})
    complete["spec"]["selector"]["matchExpressions"] = expressions
    return [*failed, complete]


def start_kwok(plane) -> None:
    """kwok for nodes annotated ``kwok.x-k8s.io/node=fake`` (Karpenter's kwok provider annotates
    every node it writes); once per control plane."""
    from tools.cluster.controlplane import free_port, tool_path
    from tools.cluster.layer import go_module_dir

    if any(p.name == "kwok" and p.alive() for p in plane.processes):
        return

    config = plane.workdir / "kwok.yaml"
    config.write_text(kwok_config(go_module_dir(*KWOK_MODULE)))
    plane.spawn_controller("kwok", [
        str(tool_path("kwok")), f"--kubeconfig={plane.admin_kubeconfig}", f"--config={config}",
        "--manage-all-nodes=false", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        "--cidr=10.244.0.1/16", "--node-ip=10.0.0.10", f"--server-address=127.0.0.1:{free_port()}",
    ])


def _requirement_labels(requirements: Iterable[dict[str, Any]]) -> dict[str, str]:
    labels = {}
    for requirement in requirements:
        if requirement.get("operator") == "In" and requirement.get("values"):
            labels[requirement["key"]] = requirement["values"][0]
    return labels


def node_for_pool(pool: dict[str, Any], name: str, capacity: dict[str, str]) -> dict[str, Any]:
    """The Node Karpenter registers for a NodeClaim of ``pool`` (see the module docstring)."""
    template = pool["spec"]["template"]
    spec = template["spec"]
    labels = {**_requirement_labels(spec.get("requirements", [])), **template.get("metadata", {}).get("labels", {}),
              "karpenter.sh/nodepool": pool["metadata"]["name"], "kubernetes.io/hostname": name,
              "type": "kwok"}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": dict(KWOK_ANNOTATION)},
        "spec": {"taints": [*spec.get("taints", []), *spec.get("startupTaints", [])]},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


class TaintLifter:
    """Removes each startup taint whose owner is deployed and ready on the node (a thread)."""

    def __init__(self, plane, addons: Iterable[str], daemonsets: Iterable[tuple[str, str]], interval_s: float = 0.5):
        self.plane, self.addons, self.daemonsets = plane, set(addons), set(daemonsets)
        self.interval_s = interval_s
        self.lifted: list[tuple[str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "TaintLifter":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def owner_ready(self, owner: TaintOwner, node: str, pods: list[dict[str, Any]]) -> bool:
        if owner.addon is not None:
            return owner.addon in self.addons
        if owner.daemonset is None or owner.daemonset not in self.daemonsets:
            return False
        namespace, name = owner.daemonset
        for pod in pods:
            meta = pod["metadata"]
            if (meta.get("namespace") == namespace and pod["spec"].get("nodeName") == node
                    and any(ref.get("kind") == "DaemonSet" and ref.get("name") == name for ref in meta.get("ownerReferences", []))
                    and any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))):
                return True
        return False

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.lift_once()
            except Exception:  # noqa: BLE001 - a transient API error must not end the stand-in
                pass
            self._stop.wait(self.interval_s)

    def lift_once(self) -> None:
        nodes = json.loads(self.plane.kubectl("get", "nodes", "-o", "json").stdout)["items"]
        pods = json.loads(self.plane.kubectl("get", "pods", "-A", "-o", "json").stdout)["items"]
        for node in nodes:
            name = node["metadata"]["name"]
            taints = node["spec"].get("taints", [])
            keep = [t for t in taints if not (t["key"] in STARTUP_TAINT_OWNERS
                                              and self.owner_ready(STARTUP_TAINT_OWNERS[t["key"]], name, pods))]
            if len(keep) != len(taints):
                removed = [t["key"] for t in taints if t not in keep]
                patch = [{"op": "test", "path": "/spec/taints", "value": taints},
                         {"op": "replace", "path": "/spec/taints", "value": keep}]
                if self.plane.kubectl("patch", "node", name, "--type=json", "-p", json.dumps(patch),
                                      check=False).returncode == 0:
                    self.lifted.extend((name, key) for key in removed)


def wait_for(predicate, what: str, timeout_s: float = 60.0, interval_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s: {what}")
