"""One stack's cluster: a control plane, its nodes, and the stack's layer installed as the program
installs it, with every controller the charts deploy running from its pinned binary.

    with StackCluster("dev", plan, schemas) as cluster:
        cluster.kubectl("get", "pods", "-A")

The install follows the program's order (its ``depends_on``): CRDs; namespaces; the system nodes
of the managed node groups; each Helm release's manifest, in Helm's install order, then wait until
its workloads are ready (the program's releases are ``atomic``: Helm waits); the Training
Operator's overlay; then the plan's objects (Kueue's queues need Kueue's webhooks, which need Kueue)
and the GitOps render. Karpenter, Kueue and the Training Operator run as the pods their
Deployments create, through the kubelet (tools/cluster/kubelet.py), as their service accounts;
their webhooks and Kueue's visibility API are called through the charts' own Services.
"""
from __future__ import annotations

import argparse
import os
import pickle
import signal
import sys
import time
from pathlib import Path
from typing import Any, Optional

from tools.cluster import layer as layer_mod
from tools.cluster.api import eventually
from tools.cluster.aws import AwsStandIns
from tools.cluster.controlplane import ControlPlane
from tools.cluster.layer import Layer, apply, stack_layer
from tools.cluster.nodes import Nodes, register, system_nodes_from_groups

RELEASE_READY_S = 360
QUEUES_READY_S = 240


class InstallError(RuntimeError):
    pass


class StackCluster:
    def __init__(self, stack: str, schemas: Path, plan=None, plane: Optional[ControlPlane] = None):
        self.stack, self.schemas, self.plan = stack, schemas, plan
        self.plane = plane
        self.layer: Optional[Layer] = None
        self.aws: Optional[AwsStandIns] = None
        self.nodes: Optional[Nodes] = None
        self.timings: dict[str, float] = {}

    # -- lifecycle --
    def __enter__(self) -> "StackCluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "StackCluster":
        started = time.monotonic()
        self.layer = stack_layer(self.stack, self.schemas, plan=self.plan)
        self._mark("layer", started)
        if self.plane is None:
            self.plane = ControlPlane.in_tempdir()
            self.plane.start()
        self._mark("control plane", started)
        self.aws = AwsStandIns(self.layer, self.plane.workdir / "aws")
        self.nodes = Nodes(self.plane, self.aws.prepare()).start()
        self.install()
        self._mark("install", started)
        return self

    def stop(self) -> None:
        if self.plane is not None and not self.attached:
            self.plane.stop()

    attached = False
    STATE = "stack-cluster.pickle"
    ENV = "MLPLATFORM_CLUSTER_{stack}"

    def save(self) -> Path:
        """Write what another process needs to use this running cluster (``attach``)."""
        path = self.plane.workdir / self.STATE
        path.write_bytes(pickle.dumps({"stack": self.stack, "layer": self.layer, "aws": self.aws,
                                       "api_port": self.plane.api_port}))
        return path

    @classmethod
    def attach(cls, workdir: Path) -> "StackCluster":
        """A cluster another process started and keeps running (``python -m tools.cluster.stack
        up``): for iterating on one test without starting a plane each time. Stopping it is its
        owner's business."""
        state = pickle.loads((workdir / cls.STATE).read_bytes())
        cluster = cls(state["stack"], Path("."), plane=ControlPlane(workdir, keep_workdir=True))
        cluster.plane.api_port = state["api_port"]
        cluster.layer, cluster.aws, cluster.attached = state["layer"], state["aws"], True
        return cluster

    def _mark(self, what: str, since: float) -> None:
        self.timings[what] = round(time.monotonic() - since, 1)

    # -- access --
    def kubectl(self, *args, **kwargs):
        return self.plane.kubectl(*args, **kwargs)

    @property
    def api(self):
        return self.plane.api

    @property
    def controllers(self) -> "StackCluster":
        """The name earlier tests used for the running controllers: this cluster."""
        return self

    def aws_instance_facts(self, instance_type: str) -> dict[str, int]:
        from tools.cluster.aws import instance_facts

        return instance_facts().get(instance_type, {"gpus": 0, "efa": 0})

    def logs(self, lines: int = 15) -> str:
        """The last lines of every machine process and every container the kubelet ran."""
        parts = [f"--- {p.name}\n{p.tail(lines)}" for p in self.plane.processes]
        container_logs = self.plane.workdir / "kubelet" / "logs"
        for path in sorted(container_logs.glob("*.log")) if container_logs.is_dir() else []:
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- container {path.stem}\n" + "\n".join(text))
        return "\n".join(parts)

    # -- install --
    def install(self) -> None:
        layer, plane, aws = self.layer, self.plane, self.aws
        apply(plane, layer.crds + [aws.kwok_crd()])
        plane.kubectl("wait", "--for=condition=Established", "--timeout=120s", "crd", "--all", timeout_s=150)
        apply(plane, layer.namespaces)
        register(plane, system_nodes_from_groups(layer.node_groups))
        # The stand-ins first: Karpenter's KWOKNodeClasses and their RBAC exist when it starts.
        apply(plane, aws.objects())
        aws.node_class_status(plane)
        for release in layer.releases:
            apply(plane, release.objects)
        apply(plane, layer.overlay_objects)
        self.wait_workloads_ready([o for r in layer.releases for o in r.objects] + layer.overlay_objects + aws.objects())
        apply(plane, [aws.transform(o) for o in layer.plan_objects])
        apply(plane, layer.gitops_objects)
        self.wait_queues_and_pools()

    def wait_workloads_ready(self, objects: list[dict[str, Any]], timeout_s: float = RELEASE_READY_S) -> None:
        """What Helm's ``--wait`` (an atomic release) waits for: each Deployment's and
        StatefulSet's replicas ready, each DaemonSet's scheduled pods ready."""
        workloads = [(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]) for o in objects
                     if o.get("kind") in ("Deployment", "StatefulSet", "DaemonSet")]

        def pending() -> list[str]:
            waiting = []
            for kind, namespace, name in workloads:
                plural = {"Deployment": "deployments", "StatefulSet": "statefulsets", "DaemonSet": "daemonsets"}[kind]
                obj = self.api.get_or_none(f"/apis/apps/v1/namespaces/{namespace}/{plural}/{name}")
                status = (obj or {}).get("status", {})
                if obj is None:
                    waiting.append(f"{kind} {namespace}/{name}: missing")
                elif kind == "DaemonSet":
                    if status.get("numberReady", 0) < status.get("desiredNumberScheduled", 0):
                        waiting.append(f"{kind} {namespace}/{name}: {status.get('numberReady', 0)}/"
                                       f"{status.get('desiredNumberScheduled', 0)} ready")
                elif status.get("readyReplicas", 0) < (obj["spec"].get("replicas") or 1):
                    waiting.append(f"{kind} {namespace}/{name}: {status.get('readyReplicas', 0)}/"
                                   f"{obj['spec'].get('replicas') or 1} ready")
            return waiting

        try:
            eventually(lambda: not pending(), "every release's workloads ready", timeout_s, interval_s=2,
                       diagnose=lambda: "\n".join(pending()) + "\n" + self.logs(10))
        except TimeoutError as exc:
            raise InstallError(str(exc)) from None

    def wait_queues_and_pools(self, timeout_s: float = QUEUES_READY_S) -> None:
        def ready() -> bool:
            queues = self.api.get("/apis/kueue.x-k8s.io/v1beta2/clusterqueues")["items"]
            pools = self.api.get("/apis/karpenter.sh/v1/nodepools")["items"]
            return bool(queues and pools and all(_condition(o, "Active") for o in queues)
                        and all(_condition(o, "Ready") for o in pools))

        def diagnose() -> str:
            return "\n".join([self.kubectl("get", "clusterqueues,nodepools", "-o", "wide", check=False).stdout,
                              self.logs(10)])
        try:
            eventually(ready, "every ClusterQueue Active and every NodePool Ready", timeout_s, interval_s=2,
                       diagnose=diagnose)
        except TimeoutError as exc:
            raise InstallError(str(exc)) from None


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m tools.cluster.stack up dev``: start a stack's cluster, print how to use it, keep
    it until ^C. Tests then run against it with ``MLPLATFORM_CLUSTER_dev=<workdir>``."""
    parser = argparse.ArgumentParser(prog="python -m tools.cluster.stack")
    parser.add_argument("command", choices=["up"])
    parser.add_argument("stack")
    args = parser.parse_args(argv)
    from infra.plan import build_plan
    from tools.schemas import schemas_dir

    root = Path(__file__).resolve().parents[2]
    # SIGTERM (a background job ignores SIGINT) stops the cluster as ^C does: everything, then its directory.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with StackCluster(args.stack, schemas_dir(root), plan=build_plan(args.stack, root)) as cluster:
        cluster.save()
        print(f"{args.stack} cluster ready ({cluster.timings}):\n  export KUBECONFIG={cluster.plane.admin_kubeconfig}\n"
              f"  export {cls_env(args.stack)}={cluster.plane.workdir}", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    return 0


def cls_env(stack: str) -> str:
    return StackCluster.ENV.format(stack=stack)


def _condition(obj: dict[str, Any], kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in obj.get("status", {}).get("conditions", []))


if __name__ == "__main__":
    sys.exit(main())
