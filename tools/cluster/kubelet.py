"""The kubelet of the test cluster's simulated nodes: pods as processes where a binary exists.

    python -m tools.cluster.kubelet CONFIG.json     (started inside the machine by tools/cluster/nodes.py)

It does what a kubelet does for every node annotated ``kwok.x-k8s.io/node=fake`` (the annotation
Karpenter's kwok provider puts on each node it writes; the harness's own nodes carry it too):
registers the node Ready and renews its Lease (the node lifecycle controller's heartbeat), and runs
the pods bound to it:

- a pod whose container image is one the platform deploys and this machine has built (Kueue,
  Karpenter, the Training Operator, JobSet, Kubeflow Trainer: ``runners`` in the config) is
  *run*: a network namespace with a veth on the machine's pod bridge and the pod's IP, the pod's
  volumes written as a kubelet writes them (ConfigMaps and Secrets kept in sync, the projected
  service account token requested from the TokenRequest API and bound to the pod, so the process
  authenticates as the pod's service account and the chart's RBAC decides what it may do), its
  environment resolved (``valueFrom``, ``$(VAR)``), and the real binary started with the
  container's own command line. Readiness follows the container's readiness probe; a container
  that exits is restarted (``restartPolicy: Always``) or ends the pod; deleting the pod sends
  SIGTERM, waits its grace period, then SIGKILL, reports the exit code, and removes the pod;
- a trainer container (``python -m trainer.launch``) runs ``tools/cluster/workload.py``: the
  trainer's preemption contract, so a drain's SIGTERM ends it with the trainer's own 143;
- any other pod is simulated as kwok's ``fast`` pod stages do: Running and Ready at once with an
  IP, completed at once when a Job owns it, deleted at once when deleted; a test ends one with the labels of ``POD_COMPLETE_LABEL`` /
  ``POD_FAILED_LABEL`` (kwok's own chaos-stage label and exit-code annotation).

Beside it, what a node's own agents do, event-driven (a watch, no polling):

- device plugins: a node starts with no ``nvidia.com/*`` or ``vpc.amazonaws.com/efa`` resource
  (the kubelet registers cpu, memory and pods; Karpenter's kwok provider is built to do the same,
  tools/cluster/karpenter); the resources appear once the chart's device-plugin pod is Ready on
  the node, with the counts the plugin would advertise (GPUs and EFA devices of the instance
  type; time-slicing replicas and the ``.shared`` rename from the plugin's own config map; MIG
  slices from the MIG manager's layout);
- startup taints: each is removed once its owner's pod (a CSI driver's node plugin, the GPU
  readiness agent, the MIG gate) is Ready on the node (``STARTUP_TAINT_OWNERS`` in
  workloads/karpenter.py, with the upstream code each owner runs).
"""
from __future__ import annotations

import base64
import itertools
import json
import os
import queue
import re
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any, Optional

from tools.cluster import procs
from tools.cluster.api import Api, ApiError, Informer

KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
# A test ends a simulated container with these (kwok's chaos stage names, kept so a test reads the
# same whichever simulator runs the pod).
POD_FAILED_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"
POD_FAILED_EXIT_CODE = "pod-container-running-failed.stage.kwok.x-k8s.io/exit-code"
POD_COMPLETE_LABEL = "pod-complete.stage.mlplatform.io"
TRAINER_ENTRY_POINT = "trainer.launch"
RESTART_BACKOFF_S = (1, 2, 4, 8, 10)


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def log(message: str) -> None:
    print(f"{datetime.now().strftime('%H:%M:%S.%f')[:-3]} {message}", flush=True)


# --- pod IPs --------------------------------------------------------------------------------------

class IpPool:
    def __init__(self, cidr: str, gateway: str):
        self.hosts = (str(ip) for ip in IPv4Network(cidr).hosts() if str(ip) != gateway)
        self.free: list[str] = []

    def take(self) -> str:
        return self.free.pop() if self.free else next(self.hosts)

    def give(self, ip: str) -> None:
        self.free.append(ip)


# --- volumes --------------------------------------------------------------------------------------

def write_atomic(directory: Path, files: dict[str, bytes], mode: int = 0o644) -> bool:
    """Write ``files`` as the kubelet's AtomicWriter does: a timestamped directory, a ``..data``
    symlink swapped in one rename, each key a symlink into ``..data``. False when unchanged."""
    directory.mkdir(parents=True, exist_ok=True)
    current = directory / "..data"
    if current.exists():
        old = {p.relative_to(current.resolve()).as_posix(): p.read_bytes()
               for p in current.resolve().rglob("*") if p.is_file()}
        if old == files:
            return False
    stamp = directory / f"..{time.time_ns()}"
    stamp.mkdir()
    for name, data in files.items():
        target = stamp / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(mode)
    stamp.chmod(0o755)
    link = directory / "..data_tmp"
    if link.is_symlink():
        link.unlink()
    link.symlink_to(stamp.name)
    previous = current.resolve() if current.exists() else None
    os.replace(link, current)
    for name in {n.split("/")[0] for n in files}:
        entry = directory / name
        if not entry.is_symlink() and not entry.exists():
            entry.symlink_to(f"..data/{name}")
    if previous is not None and previous != stamp:
        shutil.rmtree(previous, ignore_errors=True)
    return True


class MissingSource(RuntimeError):
    """A ConfigMap or Secret a volume needs does not exist (yet): the pod waits, as on a kubelet."""


# --- pod state ------------------------------------------------------------------------------------

@dataclass
class Container:
    name: str
    image: str
    process: Optional[procs.Process] = None
    started_at: Optional[str] = None
    restarts: int = 0
    ready: bool = False
    exit_code: Optional[int] = None
    finished_at: Optional[str] = None
    last_terminated: Optional[dict] = None
    restart_due: float = 0.0
    control: Optional[Path] = None
    runner: Optional[dict] = None


@dataclass
class PodState:
    uid: str
    namespace: str
    name: str
    node: str
    ip: str
    mode: str  # "run" or "sim"
    directory: Path
    pause: Optional[procs.Process] = None
    containers: dict[str, Container] = field(default_factory=dict)
    terminating_until: Optional[float] = None
    finished: bool = False
    started: bool = False
    start_error: str = ""
    next_probe: float = 0.0
    next_sync: float = 0.0
    outcome_sent: Optional[str] = None
    owns_ip: bool = True


class Kubelet:
    def __init__(self, config: dict):
        self.config = config
        self.workdir = Path(config["workdir"])
        self.api = Api.from_kubeconfig(Path(config["kubeconfig"]))
        self.events: "queue.Queue[tuple]" = queue.Queue()
        self.stop = threading.Event()
        self.nodes: dict[str, dict] = {}
        self.pods: dict[str, PodState] = {}
        self.objects: dict[str, dict] = {}  # uid -> latest pod object
        self.ips = IpPool(config["pod_cidr"], config["pod_gateway"])
        self.veths = itertools.count(1)
        self.probe_context = ssl.create_default_context()
        self.probe_context.check_hostname = False
        self.probe_context.verify_mode = ssl.CERT_NONE
        self.device_resources: dict[str, dict[str, str]] = {}  # node -> resources we advertised
        self.owners = {o["key"]: o for o in config.get("startup_taint_owners", [])}
        self.leased: set[str] = set()
        self.next_lease = 0.0

    # -- main loop --------------------------------------------------------------------------------
    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop.set())
        threading.Thread(target=Informer(self.api, "/api/v1/nodes",
                                         lambda k, o: self.events.put(("node", k, o))).run,
                         args=(self.stop,), daemon=True).start()
        threading.Thread(target=Informer(self.api, "/api/v1/pods",
                                         lambda k, o: self.events.put(("pod", k, o)),
                                         fieldSelector="spec.nodeName!=").run,
                         args=(self.stop,), daemon=True).start()
        parent = os.getppid()
        last_tick = 0.0
        while not self.stop.is_set() and os.getppid() == parent:
            try:
                event = self.events.get(timeout=0.25)
            except queue.Empty:
                event = None
            try:
                if event is not None:
                    self.handle(event)
                if time.monotonic() - last_tick >= 0.5:
                    last_tick = time.monotonic()
                    self.tick()
            except Exception:  # noqa: BLE001 - one bad pod must not stop the node
                log(f"error handling {event[0] if event else 'tick'}: {traceback.format_exc()}")
        for state in list(self.pods.values()):
            self.kill(state)
        return 0

    def handle(self, event: tuple) -> None:
        kind = event[0]
        if kind == "node":
            _, change, node = event
            name = node["metadata"]["name"]
            if change == "DELETED":
                self.nodes.pop(name, None)
                self.leased.discard(name)
                for state in [s for s in self.pods.values() if s.node == name]:
                    self.kill(state)  # the instance is gone, and its processes with it
                return
            self.nodes[name] = node
            if self.managed(name):
                self.register_node(node)
                self.node_agents(name)
        elif kind == "pod":
            _, change, pod = event
            uid = pod["metadata"]["uid"]
            if change == "DELETED":
                self.objects.pop(uid, None)
                state = self.pods.pop(uid, None)
                if state is not None:
                    self.kill(state)
                    self.forget(state)
                    self.node_agents(state.node)
                return
            self.objects[uid] = pod
            if self.managed(pod["spec"].get("nodeName", "")):
                self.reconcile(pod)
                self.node_agents(pod["spec"]["nodeName"])
        elif kind == "exit":
            _, uid, name, code = event
            self.container_exited(uid, name, code)

    # -- nodes: registration and heartbeats ---------------------------------------------------------
    NODE_CONDITIONS = (("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
                       ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                       ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                       ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                       ("NetworkUnavailable", "False", "RouteCreated", "RouteController created a route"))
    LEASE_SECONDS = 40

    def register_node(self, node: dict) -> None:
        """What a kubelet reports when it registers (kwok v0.8.0 ``stage/node/fast/node-initialize``,
        the same fields): the node conditions, addresses, node info and phase, once; its Lease
        then keeps it Ready (``renew_leases``)."""
        conditions = {c["type"]: c for c in node.get("status", {}).get("conditions", [])}
        if conditions.get("Ready", {}).get("status") == "True" and node["metadata"]["name"] in self.leased:
            return
        if conditions.get("Ready", {}).get("status") == "True" and \
                conditions.get("Ready", {}).get("reason") == "KubeletReady":
            self.leased.add(node["metadata"]["name"])
            return
        stamp = now()
        name = node["metadata"]["name"]
        status = {"conditions": [{"type": t, "status": v, "reason": r, "message": m, "lastHeartbeatTime": stamp,
                                  "lastTransitionTime": stamp} for t, v, r, m in self.NODE_CONDITIONS],
                  "addresses": [{"type": "InternalIP", "address": self.config.get("node_ip", "10.0.0.10")},
                                {"type": "Hostname", "address": name}],
                  "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                  "nodeInfo": {"architecture": "amd64", "bootID": "", "containerRuntimeVersion": "mlplatform-kubelet",
                               "kernelVersion": "", "kubeProxyVersion": "", "kubeletVersion": "v1.32.13",
                               "machineID": "", "operatingSystem": "linux", "osImage": "", "systemUUID": ""},
                  "phase": "Running"}
        try:
            self.api.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": status},
                             "application/strategic-merge-patch+json")
            self.leased.add(name)
            self.renew_lease(node)
            log(f"node {name}: registered Ready")
        except ApiError as exc:
            if exc.status != 404:
                raise

    def renew_lease(self, node: dict) -> None:
        """The node's Lease in kube-node-lease, renewed as the kubelet does (every 10 s of 40):
        the node lifecycle controller reads it as the node's heartbeat."""
        name = node["metadata"]["name"]
        renew = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": name, "namespace": "kube-node-lease",
                              "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name,
                                                   "uid": node["metadata"]["uid"]}]},
                 "spec": {"holderIdentity": name, "leaseDurationSeconds": self.LEASE_SECONDS, "renewTime": renew}}
        try:
            self.api.apply(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}", lease,
                           manager="mlplatform-kubelet")
        except ApiError as exc:
            if exc.status not in (404, 409, 422):
                raise

    def managed(self, node_name: str) -> bool:
        node = self.nodes.get(node_name)
        if node is None:
            return False
        key, value = KWOK_NODE_ANNOTATION
        return (node["metadata"].get("annotations") or {}).get(key) == value

    # -- pods -----------------------------------------------------------------------------------------
    def reconcile(self, pod: dict) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        uid = meta["uid"]
        state = self.pods.get(uid)
        if state is None:
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                return
            state = self.admit(pod)
            self.pods[uid] = state
        if meta.get("deletionTimestamp"):
            self.terminate(state, pod)
            return
        if state.finished:
            return
        if state.mode == "sim":
            if not state.started:
                state.started = True
                self.write_status(pod, self.sim_running_status(pod, state))
            self.sim_outcome(pod, state)
        else:
            if not state.started:
                self.start_pod(pod, state)
            self.run_outcome(pod, state)

    def admit(self, pod: dict) -> PodState:
        meta, spec = pod["metadata"], pod["spec"]
        runners = {c["name"]: self.runner_for(c) for c in spec["containers"]}
        mode = "run" if any(runners.values()) else "sim"
        host_network = spec.get("hostNetwork", False)
        ip = self.node_ip(spec["nodeName"]) if host_network else self.ips.take()
        directory = self.workdir / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        state = PodState(meta["uid"], meta["namespace"], meta["name"], spec["nodeName"], ip, mode, directory,
                         owns_ip=not host_network)
        for container in spec["containers"]:
            state.containers[container["name"]] = Container(container["name"], container.get("image", ""),
                                                            runner=runners[container["name"]])
        if mode == "run":
            log(f"pod {meta['namespace']}/{meta['name']} on {spec['nodeName']}: runs "
                + ", ".join(f"{n}={r['name']}" for n, r in runners.items() if r))
        return state

    def runner_for(self, container: dict) -> Optional[dict]:
        image = container.get("image", "")
        repository = image.split("@")[0].rsplit(":", 1)[0] if ":" in image.split("/")[-1] or "@" in image else image
        for runner in self.config.get("runners", []):
            if runner.get("image") and repository == runner["image"]:
                return runner
            if runner.get("command_contains") and runner["command_contains"] in (container.get("command") or []) + \
                    (container.get("args") or []):
                return runner
        return None

    def node_ip(self, node_name: str) -> str:
        node = self.nodes.get(node_name) or {}
        for address in node.get("status", {}).get("addresses", []):
            if address["type"] == "InternalIP":
                return address["address"]
        return self.config.get("node_ip", "10.0.0.10")

    # -- simulated pods (kwok's fast stages) --
    def sim_running_status(self, pod: dict, state: PodState) -> dict:
        stamp = now()
        spec = pod["spec"]
        conditions = [{"type": t, "status": "True", "lastTransitionTime": stamp}
                      for t in ("Initialized", "Ready", "ContainersReady")]
        conditions += [{"type": g["conditionType"], "status": "True", "lastTransitionTime": stamp}
                       for g in spec.get("readinessGates", [])]
        status = {
            "phase": "Running", "startTime": stamp, "conditions": conditions,
            "hostIP": self.node_ip(state.node), "hostIPs": [{"ip": self.node_ip(state.node)}],
            "podIP": state.ip, "podIPs": [{"ip": state.ip}],
            "containerStatuses": [{"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": True,
                                   "restartCount": 0, "started": True, "state": {"running": {"startedAt": stamp}}}
                                  for c in spec["containers"]],
        }
        if spec.get("initContainers"):
            status["initContainerStatuses"] = [self.init_status(c, stamp) for c in spec["initContainers"]]
        return status

    @staticmethod
    def init_status(container: dict, stamp: str) -> dict:
        if container.get("restartPolicy") == "Always":  # a sidecar
            return {"name": container["name"], "image": container.get("image", ""), "imageID": "", "ready": True,
                    "restartCount": 0, "started": True, "state": {"running": {"startedAt": stamp}}}
        return {"name": container["name"], "image": container.get("image", ""), "imageID": "", "ready": True,
                "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                                            "startedAt": stamp, "finishedAt": stamp}}}

    def sim_outcome(self, pod: dict, state: PodState) -> None:
        labels = pod["metadata"].get("labels") or {}
        annotations = pod["metadata"].get("annotations") or {}
        if labels.get(POD_COMPLETE_LABEL) == "true":
            code = 0
        elif labels.get(POD_FAILED_LABEL) == "true":
            code = int(annotations.get(POD_FAILED_EXIT_CODE, "1"))
        elif any(r.get("kind") == "Job" for r in pod["metadata"].get("ownerReferences") or []):
            # kwok v0.8.0 kustomize/stage/pod/fast/pod-complete.yaml: a Running pod owned by a Job
            # (`.metadata.ownerReferences.[].kind In [Job]`) ends Succeeded, every container exit 0.
            # Helm waits for its hook Jobs (a chart's admission-webhook certificate jobs) to complete.
            code = 0
        else:
            return
        for container in state.containers.values():
            container.exit_code, container.finished_at = code, now()
        state.finished = True
        self.write_status(pod, self.final_status(pod, state))

    def final_status(self, pod: dict, state: PodState) -> dict:
        stamp = now()
        codes = [c.exit_code if c.exit_code is not None else 137 for c in state.containers.values()]
        phase = "Succeeded" if all(code == 0 for code in codes) else "Failed"
        statuses = []
        for container in state.containers.values():
            code = container.exit_code if container.exit_code is not None else 137
            terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                          "startedAt": container.started_at or stamp, "finishedAt": container.finished_at or stamp}
            message = self.termination_message(state, container)
            if message:
                terminated["message"] = message
            statuses.append({"name": container.name, "image": container.image, "imageID": "", "ready": False,
                             "restartCount": container.restarts, "started": False, "state": {"terminated": terminated}})
        return {"phase": phase, "containerStatuses": statuses,
                "conditions": [{"type": t, "status": "False", "lastTransitionTime": stamp, "reason": "PodCompleted"}
                               for t in ("Ready", "ContainersReady")]}

    @staticmethod
    def termination_message(state: PodState, container: Container) -> str:
        path = state.directory / "termination" / container.name
        try:
            return path.read_text()[:4096]
        except OSError:
            return ""

    def write_status(self, pod: dict, status: dict) -> None:
        meta = pod["metadata"]
        try:
            self.api.request("PATCH", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                             {"metadata": {"uid": meta["uid"]}, "status": status},
                             "application/strategic-merge-patch+json")
        except ApiError as exc:
            if exc.status not in (404, 409, 422):
                raise

    # -- run pods --
    def start_pod(self, pod: dict, state: PodState) -> None:
        try:
            if state.pause is None:
                self.sandbox(state)
            if any(c.runner and c.runner["kind"] == "binary" for c in state.containers.values()):
                self.write_volumes(pod, state, initial=True)
                for container in pod["spec"]["containers"]:
                    if state.containers[container["name"]].runner:
                        self.container_env(pod, state, container)  # a missing key: wait, as a kubelet does
        except MissingSource as exc:
            if state.start_error != str(exc):
                state.start_error = str(exc)
                log(f"pod {state.namespace}/{state.name}: waiting: {exc}")
                self.write_status(pod, {"phase": "Pending", "podIP": state.ip, "podIPs": [{"ip": state.ip}],
                                        "hostIP": self.node_ip(state.node),
                                        "containerStatuses": [self.waiting_status(c, "ContainerCreating", str(exc))
                                                              for c in state.containers.values()]})
            return
        state.started = True
        for container in pod["spec"]["containers"]:
            self.start_container(pod, state, container)
        self.write_status(pod, self.run_status(pod, state))

    @staticmethod
    def waiting_status(container: Container, reason: str, message: str = "") -> dict:
        return {"name": container.name, "image": container.image, "imageID": "", "ready": False,
                "restartCount": container.restarts, "started": False,
                "state": {"waiting": {"reason": reason, **({"message": message[:500]} if message else {})}}}

    def sandbox(self, state: PodState) -> None:
        """The pod's network namespace, held by a sleeping process, with a veth on the bridge."""
        state.directory.mkdir(parents=True, exist_ok=True)
        own = os.readlink("/proc/self/ns/net")
        state.pause = procs.spawn("pause", ["unshare", "--net", "sleep", "infinity"], state.directory / "pause.log")
        deadline = time.monotonic() + 10
        netns = f"/proc/{state.pause.pid}/ns/net"
        while os.readlink(netns) == own:
            if time.monotonic() > deadline or not state.pause.alive():
                raise RuntimeError("the pod's network namespace did not appear")
            time.sleep(0.01)
        veth = f"vp{next(self.veths):06x}"
        procs.run(["ip", "-batch", "-"], input="\n".join([
            f"link add {veth} type veth peer name eth0 netns {state.pause.pid}",
            f"link set {veth} master {self.config['bridge']}", f"link set {veth} up"]) + "\n")
        procs.run(["nsenter", f"--net={netns}", "ip", "-batch", "-"], input="\n".join([
            "link set lo up", f"addr add {state.ip}/{self.config['pod_prefix']} dev eth0", "link set eth0 up",
            f"route add default via {self.config['pod_gateway']}"]) + "\n")

    def start_container(self, pod: dict, state: PodState, container: dict) -> None:
        record = state.containers[container["name"]]
        runner = record.runner
        if runner is None:  # a container nothing here can run (a sidecar): simulated running
            record.started_at, record.ready = now(), True
            return
        env = self.container_env(pod, state, container, strict=runner["kind"] == "binary")
        mounts = self.container_mounts(pod, state, container) if runner["kind"] == "binary" else []
        termination = state.directory / "termination"
        termination.mkdir(parents=True, exist_ok=True)
        (termination / container["name"]).touch()
        if runner["kind"] == "workload":
            record.control = state.directory / "control" / container["name"]
            record.control.parent.mkdir(parents=True, exist_ok=True)
            record.control.unlink(missing_ok=True)
            Path(f"{record.control}.ready").unlink(missing_ok=True)
            env.update({"MLP_WORKLOAD_CONTROL": str(record.control),
                        "TRAINER_TERMINATION_LOG": str(termination / container["name"]),
                        "PYTHONPATH": runner["pythonpath"], "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                        "PYTHONDONTWRITEBYTECODE": "1"})
            env.pop("TRAINER_EXIT_STATUS_DIR", None)
            spec = {"chroot": False, "tmp": str(state.directory / "tmp" / container["name"]), "mounts": [],
                    "workingDir": runner["pythonpath"], "env": env,
                    "argv": [runner["python"], "-m", runner["module"]]}
        else:
            command = container.get("command") or [runner.get("entrypoint", f"/usr/local/bin/{runner['name']}")]
            argv = [self.expand(a, env) for a in command + (container.get("args") or [])]
            env = {**env, **runner.get("env", {})}
            mounts += [{"source": m["source"], "path": m["path"], "readOnly": m.get("readOnly", True)}
                       for m in runner.get("mounts", [])]
            mounts.append({"source": str(termination / container["name"]),
                           "path": container.get("terminationMessagePath", "/dev/termination-log")})
            spec = {"chroot": True, "rootfs": str(state.directory / "rootfs" / container["name"]),
                    "mounts": mounts, "env": env, "argv": argv, "workingDir": container.get("workingDir"),
                    "binary": {"source": runner["binary"], "path": argv[0]}}
        spec_path = state.directory / f"container-{container['name']}.json"
        spec_path.write_text(json.dumps(spec, indent=1))
        argv = ["nsenter", f"--net=/proc/{state.pause.pid}/ns/net", "--", "unshare", "--mount", "--propagation",
                "private", "--", sys.executable, "-m", "tools.cluster.container", str(spec_path)]
        record.process = procs.spawn(container["name"], argv, self.log_path(state, container["name"]),
                                     env={"PYTHONPATH": self.config["pythonpath"]}, inherit_env=False,
                                     cwd=state.directory)
        record.started_at, record.ready, record.exit_code = now(), False, None
        threading.Thread(target=self.wait_exit, args=(state.uid, container["name"], record.process),
                         daemon=True).start()
        log(f"pod {state.namespace}/{state.name}: started {container['name']} ({runner['name']}) pid "
            f"{record.process.pid} at {state.ip}")

    def log_path(self, state: PodState, container: str) -> Path:
        """Container logs outlive the pod (tests read them after a pod is gone)."""
        return self.workdir / "logs" / f"{state.namespace}_{state.name}_{state.uid[:8]}_{container}.log"

    def wait_exit(self, uid: str, name: str, process: procs.Process) -> None:
        code = process.popen.wait()
        self.events.put(("exit", uid, name, code if code >= 0 else 128 - code))

    def container_exited(self, uid: str, name: str, code: int) -> None:
        state = self.pods.get(uid)
        pod = self.objects.get(uid)
        if state is None or pod is None:
            return
        record = state.containers[name]
        record.exit_code, record.finished_at, record.ready = code, now(), False
        log(f"pod {state.namespace}/{state.name}: {name} exited {code}")
        policy = pod["spec"].get("restartPolicy", "Always")
        if state.terminating_until is not None:
            self.maybe_finish_termination(pod, state)
            return
        restart = policy == "Always" or (policy == "OnFailure" and code != 0)
        if restart:
            record.last_terminated = {"terminated": {"exitCode": code, "reason": "Error" if code else "Completed",
                                                     "startedAt": record.started_at, "finishedAt": record.finished_at}}
            record.restart_due = time.monotonic() + RESTART_BACKOFF_S[min(record.restarts, len(RESTART_BACKOFF_S) - 1)]
            record.restarts += 1
            self.write_status(pod, self.run_status(pod, state))
            return
        if all(c.process is None or c.exit_code is not None for c in state.containers.values()):
            state.finished = True
            self.write_status(pod, self.final_status(pod, state))

    def run_status(self, pod: dict, state: PodState) -> dict:
        stamp = now()
        statuses = []
        for container in state.containers.values():
            if container.process is None and container.runner is not None:
                statuses.append(self.waiting_status(container, "ContainerCreating"))
                continue
            if container.exit_code is not None and container.restart_due:
                status = self.waiting_status(container, "CrashLoopBackOff")
            else:
                status = {"name": container.name, "image": container.image, "imageID": "",
                          "ready": container.ready, "restartCount": container.restarts, "started": True,
                          "state": {"running": {"startedAt": container.started_at or stamp}}}
            if container.last_terminated:
                status["lastState"] = container.last_terminated
            statuses.append(status)
        ready = all(s["ready"] for s in statuses)
        status = {"phase": "Running", "startTime": stamp, "hostIP": self.node_ip(state.node),
                  "hostIPs": [{"ip": self.node_ip(state.node)}], "podIP": state.ip, "podIPs": [{"ip": state.ip}],
                  "containerStatuses": statuses,
                  "conditions": [{"type": "Initialized", "status": "True", "lastTransitionTime": stamp},
                                 {"type": "ContainersReady", "status": str(ready), "lastTransitionTime": stamp},
                                 {"type": "Ready", "status": str(ready), "lastTransitionTime": stamp},
                                 *({"type": g["conditionType"], "status": "True", "lastTransitionTime": stamp}
                                   for g in pod["spec"].get("readinessGates", []))]}
        if pod["spec"].get("initContainers"):
            status["initContainerStatuses"] = [self.init_status(c, stamp) for c in pod["spec"]["initContainers"]]
        return status

    def run_outcome(self, pod: dict, state: PodState) -> None:
        """A test's outcome for a trainer workload: told through its control file."""
        labels = pod["metadata"].get("labels") or {}
        annotations = pod["metadata"].get("annotations") or {}
        if labels.get(POD_COMPLETE_LABEL) == "true":
            order = "complete"
        elif labels.get(POD_FAILED_LABEL) == "true":
            order = f"exit {int(annotations.get(POD_FAILED_EXIT_CODE, '1'))}"
        else:
            return
        if state.outcome_sent == order:
            return
        state.outcome_sent = order
        for container in state.containers.values():
            if container.control is not None:
                container.control.write_text(order)

    # -- termination --
    def terminate(self, state: PodState, pod: dict) -> None:
        if state.mode == "sim" or not any(c.process is not None and c.process.alive() for c in state.containers.values()):
            self.kill(state)
            if state.mode == "run" and not state.finished:
                state.finished = True
                self.write_status(pod, self.final_status(pod, state))
            self.delete_pod(pod)
            return
        if state.terminating_until is None:
            grace = pod["metadata"].get("deletionGracePeriodSeconds")
            grace = 30 if grace is None else int(grace)
            state.terminating_until = time.monotonic() + grace
            log(f"pod {state.namespace}/{state.name}: deleting, SIGTERM (grace {grace} s)")
            for container in state.containers.values():
                if container.process is not None and container.process.alive():
                    container.process.signal(signal.SIGTERM)

    def maybe_finish_termination(self, pod: dict, state: PodState) -> None:
        if any(c.process is not None and c.process.alive() for c in state.containers.values()):
            return
        if not state.finished:
            state.finished = True
            self.write_status(pod, self.final_status(pod, state))
        self.delete_pod(pod)

    def delete_pod(self, pod: dict) -> None:
        meta = pod["metadata"]
        self.api.delete(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                        {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}})

    def kill(self, state: PodState) -> None:
        for container in state.containers.values():
            if container.process is not None and container.process.alive():
                container.process.stop(grace_s=2)
        if state.pause is not None:
            state.pause.stop(grace_s=2)
            state.pause = None

    def forget(self, state: PodState) -> None:
        if state.owns_ip:
            self.ips.give(state.ip)
        shutil.rmtree(state.directory, ignore_errors=True)

    # -- periodic --
    def tick(self) -> None:
        clock = time.monotonic()
        if clock >= self.next_lease:
            self.next_lease = clock + self.LEASE_SECONDS / 4
            for name in list(self.leased):
                node = self.nodes.get(name)
                if node is not None:
                    self.renew_lease(node)
        for state in list(self.pods.values()):
            pod = self.objects.get(state.uid)
            if pod is None:
                continue
            if state.mode == "run" and not state.started and not pod["metadata"].get("deletionTimestamp"):
                self.start_pod(pod, state)
                continue
            if state.terminating_until is not None:
                if clock >= state.terminating_until:
                    for container in state.containers.values():
                        if container.process is not None and container.process.alive():
                            log(f"pod {state.namespace}/{state.name}: grace period over, SIGKILL {container.name}")
                            container.process.signal(signal.SIGKILL)
                continue
            if state.mode != "run" or state.finished:
                continue
            for container in pod["spec"]["containers"]:
                record = state.containers[container["name"]]
                if record.exit_code is not None and record.restart_due and clock >= record.restart_due:
                    record.restart_due = 0.0
                    self.start_container(pod, state, container)
                    self.write_status(pod, self.run_status(pod, state))
            if clock >= state.next_sync:
                state.next_sync = clock + 3
                try:
                    self.write_volumes(pod, state)
                except MissingSource:
                    pass
            if clock >= state.next_probe:
                state.next_probe = clock + 1
                self.probe(pod, state)

    def probe(self, pod: dict, state: PodState) -> None:
        changed = False
        for container in pod["spec"]["containers"]:
            record = state.containers[container["name"]]
            if record.process is None or not record.process.alive():
                continue
            if record.control is not None:  # the trainer stand-in: ready once its contract is in place
                ready = Path(f"{record.control}.ready").exists()
            else:
                ready = self.probe_once(container.get("readinessProbe"), container, state)
            if ready != record.ready:
                record.ready, changed = ready, True
                log(f"pod {state.namespace}/{state.name}: {container['name']} ready={ready}")
        if changed:
            self.write_status(pod, self.run_status(pod, state))

    def probe_once(self, probe: Optional[dict], container: dict, state: PodState) -> bool:
        if not probe:
            return True
        ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
        if "httpGet" in probe:
            get = probe["httpGet"]
            port = get["port"] if isinstance(get["port"], int) else ports.get(get["port"], 0)
            scheme = get.get("scheme", "HTTP").lower()
            url = f"{scheme}://{get.get('host') or state.ip}:{port}{get.get('path', '/')}"
            try:
                with urllib.request.urlopen(url, timeout=1, context=self.probe_context if scheme == "https" else None) as r:
                    return 200 <= r.status < 400
            except Exception:  # noqa: BLE001 - any failure is "not ready"
                return False
        if "tcpSocket" in probe:
            import socket

            port = probe["tcpSocket"]["port"]
            port = port if isinstance(port, int) else ports.get(port, 0)
            try:
                socket.create_connection((state.ip, port), timeout=1).close()
                return True
            except OSError:
                return False
        return True  # exec and grpc probes: nothing to run them in; taken as passing

    # -- environment and volumes ------------------------------------------------------------------
    @staticmethod
    def expand(value: str, env: dict[str, str]) -> str:
        """``$(VAR)`` expansion as the kubelet does it (``$$`` escapes; unknown names stay)."""
        def sub(match: re.Match) -> str:
            if match.group(0) == "$$":
                return "$"
            return env.get(match.group(1), match.group(0))
        return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", sub, value)

    def field_value(self, pod: dict, state: PodState, path: str) -> str:
        meta = pod["metadata"]
        simple = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"], "metadata.uid": meta["uid"],
                  "spec.nodeName": state.node, "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
                  "status.podIP": state.ip, "status.hostIP": self.node_ip(state.node),
                  "status.podIPs": state.ip, "status.hostIPs": self.node_ip(state.node)}
        if path in simple:
            return simple[path]
        match = re.match(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        if match:
            return (meta.get(match.group(1)) or {}).get(match.group(2), "")
        return ""

    @staticmethod
    def resource_value(container: dict, ref: dict) -> str:
        resource = ref["resource"]
        kind, name = resource.split(".", 1)
        value = (container.get("resources", {}).get(kind) or {}).get(name)
        if value is None:
            return "0"
        divisor = ref.get("divisor", "1")
        if name == "cpu":
            millis = int(value[:-1]) if str(value).endswith("m") else int(float(value) * 1000)
            per = int(divisor[:-1]) if str(divisor).endswith("m") else int(float(divisor) * 1000)
            return str(-(-millis // (per or 1000)))  # a zero divisor is 1 (resourcehelper.ExtractContainerResourceValue)
        units = {"Ki": 1024, "Mi": 1024 ** 2, "Gi": 1024 ** 3, "Ti": 1024 ** 4, "k": 1000, "M": 1000 ** 2, "G": 1000 ** 3}

        def amount(text: str) -> int:
            for suffix, factor in units.items():
                if str(text).endswith(suffix):
                    return int(float(str(text)[:-len(suffix)]) * factor)
            return int(float(text))
        return str(-(-amount(value) // (amount(divisor) or 1)))

    def key_from(self, namespace: str, kind: str, ref: dict) -> Optional[str]:
        plural = "configmaps" if kind == "configMap" else "secrets"
        obj = self.api.get_or_none(f"/api/v1/namespaces/{namespace}/{plural}/{ref['name']}")
        if obj is None:
            if ref.get("optional"):
                return None
            raise MissingSource(f"{kind} {namespace}/{ref['name']} not found")
        data = obj.get("data") or {}
        if ref["key"] not in data:
            if ref.get("optional"):
                return None
            raise MissingSource(f"key {ref['key']} not in {kind} {namespace}/{ref['name']}")
        value = data[ref["key"]]
        return base64.b64decode(value).decode() if kind == "secret" else value

    def container_env(self, pod: dict, state: PodState, container: dict, strict: bool = True) -> dict[str, str]:
        """The container's environment; ``strict``: a missing ConfigMap or Secret key makes the
        pod wait (a kubelet's CreateContainerConfigError); else the variable is left out (the
        trainer stand-in reads none of the job's secrets)."""
        try:
            return self._container_env(pod, state, container)
        except MissingSource:
            if strict:
                raise
            return self._container_env(pod, state, container, skip_missing=True)

    def _container_env(self, pod: dict, state: PodState, container: dict, skip_missing: bool = False) -> dict[str, str]:
        namespace = pod["metadata"]["namespace"]
        host, port = self.config["pod_api_server"].removeprefix("https://").split(":")
        env: dict[str, str] = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port,
                               "KUBERNETES_SERVICE_PORT_HTTPS": port, "HOSTNAME": pod["metadata"]["name"],
                               "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}
        for source in container.get("envFrom", []):
            kind = "configMap" if "configMapRef" in source else "secret"
            ref = source.get("configMapRef") or source.get("secretRef")
            plural = "configmaps" if kind == "configMap" else "secrets"
            obj = self.api.get_or_none(f"/api/v1/namespaces/{namespace}/{plural}/{ref['name']}")
            if obj is None:
                if ref.get("optional") or skip_missing:
                    continue
                raise MissingSource(f"{kind} {namespace}/{ref['name']} not found")
            for key, value in (obj.get("data") or {}).items():  # noqa: B007
                env[source.get("prefix", "") + key] = base64.b64decode(value).decode() if kind == "secret" else value
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = self.expand(item["value"], env)
                continue
            source = item.get("valueFrom", {})
            value: Optional[str] = ""
            if "fieldRef" in source:
                value = self.field_value(pod, state, source["fieldRef"]["fieldPath"])
            elif "resourceFieldRef" in source:
                value = self.resource_value(container, source["resourceFieldRef"])
            elif "configMapKeyRef" in source or "secretKeyRef" in source:
                kind = "configMap" if "configMapKeyRef" in source else "secret"
                try:
                    value = self.key_from(namespace, kind, source[f"{kind}KeyRef"])
                except MissingSource:
                    if not skip_missing:
                        raise
                    value = None
            if value is not None:
                env[item["name"]] = value
        return env

    def volume_dir(self, state: PodState, name: str) -> Path:
        return state.directory / "volumes" / name

    def write_volumes(self, pod: dict, state: PodState, initial: bool = False) -> None:
        namespace = pod["metadata"]["namespace"]
        for volume in pod["spec"].get("volumes", []):
            directory = self.volume_dir(state, volume["name"])
            if "emptyDir" in volume:
                directory.mkdir(parents=True, exist_ok=True)
            elif "configMap" in volume or "secret" in volume:
                kind = "configMap" if "configMap" in volume else "secret"
                source = volume[kind]
                files = self.source_files(namespace, kind, source.get("name") or source.get("secretName"),
                                          source.get("items"), source.get("optional", False))
                mode = source.get("defaultMode", 0o644)
                if write_atomic(directory, files, mode) and not initial:
                    log(f"pod {state.namespace}/{state.name}: volume {volume['name']} updated")
            elif "projected" in volume:
                files: dict[str, bytes] = {}
                for source in volume["projected"].get("sources", []):
                    if "serviceAccountToken" in source:
                        token_file = directory / ".token"
                        if initial or not token_file.exists():
                            token_file.parent.mkdir(parents=True, exist_ok=True)
                            token_file.write_text(self.token(pod, source["serviceAccountToken"]))
                        files[source["serviceAccountToken"]["path"]] = token_file.read_bytes()
                    elif "configMap" in source or "secret" in source:
                        kind = "configMap" if "configMap" in source else "secret"
                        files.update(self.source_files(namespace, kind, source[kind]["name"], source[kind].get("items"),
                                                       source[kind].get("optional", False)))
                    elif "downwardAPI" in source:
                        for item in source["downwardAPI"].get("items", []):
                            files[item["path"]] = self.field_value(pod, state, item["fieldRef"]["fieldPath"]).encode()
                write_atomic(directory, files, volume["projected"].get("defaultMode", 0o644))
            elif "downwardAPI" in volume:
                files = {item["path"]: self.field_value(pod, state, item["fieldRef"]["fieldPath"]).encode()
                         for item in volume["downwardAPI"].get("items", []) if "fieldRef" in item}
                write_atomic(directory, files)
            elif "hostPath" in volume:
                path = self.workdir / "nodes" / state.node / volume["hostPath"]["path"].lstrip("/")
                path.mkdir(parents=True, exist_ok=True)
                if directory.is_symlink() or not directory.exists():
                    directory.parent.mkdir(parents=True, exist_ok=True)
                    if not directory.is_symlink():
                        directory.symlink_to(path)
            else:
                directory.mkdir(parents=True, exist_ok=True)

    def source_files(self, namespace: str, kind: str, name: str, items: Optional[list], optional: bool) -> dict[str, bytes]:
        plural = "configmaps" if kind == "configMap" else "secrets"
        obj = self.api.get_or_none(f"/api/v1/namespaces/{namespace}/{plural}/{name}")
        if obj is None:
            if optional:
                return {}
            raise MissingSource(f"{kind} {namespace}/{name} not found")
        data = {k: (base64.b64decode(v) if kind == "secret" else v.encode()) for k, v in (obj.get("data") or {}).items()}
        if kind == "configMap":
            data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
        if items:
            return {item["path"]: data[item["key"]] for item in items if item["key"] in data}
        return data

    def token(self, pod: dict, source: dict) -> str:
        meta = pod["metadata"]
        account = pod["spec"].get("serviceAccountName", "default")
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                   "spec": {"audiences": [source["audience"]] if source.get("audience") else None,
                            "expirationSeconds": int(source.get("expirationSeconds", 3607)),
                            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}}}
        if request["spec"]["audiences"] is None:
            del request["spec"]["audiences"]
        answer = self.api.create(f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{account}/token", request)
        return answer["status"]["token"]

    def container_mounts(self, pod: dict, state: PodState, container: dict) -> list[dict]:
        mounts = []
        for mount in container.get("volumeMounts", []):
            source = self.volume_dir(state, mount["name"])
            if mount.get("subPath"):
                source = (source / mount["subPath"]).resolve()
            else:
                source = source.resolve()
            mounts.append({"source": str(source), "path": mount["mountPath"], "readOnly": mount.get("readOnly", False)})
        return mounts

    # -- node agents ------------------------------------------------------------------------------
    def pods_on(self, node: str) -> list[dict]:
        return [p for p in self.objects.values() if p["spec"].get("nodeName") == node]

    @staticmethod
    def ready(pod: dict) -> bool:
        return (not pod["metadata"].get("deletionTimestamp")
                and any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", [])))

    @staticmethod
    def owned_by(pod: dict, namespace: str, daemonset: str) -> bool:
        return pod["metadata"]["namespace"] == namespace and any(
            r.get("kind") == "DaemonSet" and r.get("name") == daemonset
            for r in pod["metadata"].get("ownerReferences", []))

    def node_agents(self, node_name: str) -> None:
        node = self.nodes.get(node_name)
        if node is None or not self.managed(node_name):
            return
        pods = [p for p in self.pods_on(node_name) if self.ready(p)]
        self.label_node(node, pods)
        self.lift_taints(node, pods)
        self.device_plugins(node, pods)

    def label_node(self, node: dict, pods: list[dict]) -> None:
        """Labels node agents publish once they run: node-feature-discovery's and the GPU
        Operator's (``node_labels``), and the MIG manager's state once it applied the layout."""
        labels = node["metadata"].get("labels") or {}
        facts = self.config.get("instance_facts", {}).get(labels.get("node.kubernetes.io/instance-type", ""), {})
        wanted: dict[str, str] = {}
        for rule in self.config.get("node_labels", []):
            if rule.get("gpu_nodes_only") and not facts.get("gpus"):
                continue
            if any(self.owned_by(p, rule["namespace"], rule["daemonset"]) for p in pods):
                wanted.update(rule["labels"])
        for rule in self.config.get("mig_managers", []):
            if labels.get(rule["config_label"]) and any(self.owned_by(p, rule["namespace"], rule["daemonset"]) for p in pods):
                wanted[rule["state_label"]] = "success"
        missing = {k: v for k, v in wanted.items() if labels.get(k) != v}
        if not missing:
            return
        name = node["metadata"]["name"]
        try:
            self.api.merge_patch(f"/api/v1/nodes/{name}", {"metadata": {"labels": missing}})
            log(f"node {name}: labelled {missing}")
        except ApiError as exc:
            if exc.status != 404:
                raise

    def lift_taints(self, node: dict, pods: list[dict]) -> None:
        taints = node["spec"].get("taints") or []
        keep = []
        for taint in taints:
            owner = self.owners.get(taint["key"])
            if owner and any(self.owned_by(p, owner["namespace"], owner["daemonset"]) for p in pods):
                continue
            keep.append(taint)
        if len(keep) == len(taints):
            return
        name = node["metadata"]["name"]
        patch = [{"op": "test", "path": "/spec/taints", "value": taints},
                 {"op": "replace", "path": "/spec/taints", "value": keep}]
        try:
            self.api.json_patch(f"/api/v1/nodes/{name}", patch)
            log(f"node {name}: lifted {sorted({t['key'] for t in taints} - {t['key'] for t in keep})}")
        except ApiError as exc:
            if exc.status not in (404, 409, 422):
                raise

    def device_plugins(self, node: dict, pods: list[dict]) -> None:
        name = node["metadata"]["name"]
        labels = node["metadata"].get("labels") or {}
        facts = self.config.get("instance_facts", {}).get(labels.get("node.kubernetes.io/instance-type", ""), {})
        wanted: dict[str, str] = {}
        for plugin in self.config.get("device_plugins", []):
            if not any(self.owned_by(p, plugin["namespace"], plugin["daemonset"]) for p in pods):
                continue
            wanted.update(advertised(plugin, labels, facts))
        advertised_before = self.device_resources.get(name, {})
        if wanted == advertised_before:
            return
        status = node.get("status", {})
        capacity, allocatable = dict(status.get("capacity") or {}), dict(status.get("allocatable") or {})
        for resource in advertised_before:
            if resource not in wanted:  # the plugin is gone: the kubelet keeps the name at zero
                capacity[resource] = allocatable[resource] = "0"
        capacity.update(wanted)
        allocatable.update(wanted)
        try:
            self.api.merge_patch(f"/api/v1/nodes/{name}/status", {"status": {"capacity": capacity, "allocatable": allocatable}})
        except ApiError as exc:
            if exc.status == 404:
                return
            raise
        self.device_resources[name] = wanted
        log(f"node {name}: device plugins advertise {wanted}")


def advertised(plugin: dict, labels: dict[str, str], facts: dict[str, int]) -> dict[str, str]:
    """What a device plugin advertises on a node (see each kind's source in tools/cluster/nodes.py)."""
    kind = plugin["kind"]
    gpus = int(facts.get("gpus", 0))
    if kind == "efa":
        efa = int(facts.get("efa", 0))
        return {"vpc.amazonaws.com/efa": str(efa)} if efa else {}
    if not gpus:
        return {}
    if kind == "nvidia":
        config_name = labels.get(plugin.get("config_label", ""), plugin.get("default_config", ""))
        config = plugin.get("configs", {}).get(config_name) or {}
        sharing = ((config.get("sharing") or {}).get("timeSlicing") or {})
        for resource in sharing.get("resources") or []:
            if resource.get("name") == "nvidia.com/gpu" and int(resource.get("replicas", 1)) > 1:
                renamed = resource.get("rename") or ("nvidia.com/gpu.shared" if sharing.get("renameByDefault") else "nvidia.com/gpu")
                return {renamed: str(gpus * int(resource["replicas"]))}
        migs = plugin.get("mig_layouts", {}).get(labels.get(plugin.get("mig_label", ""), ""))
        if migs is not None:
            if labels.get(plugin.get("mig_state_label", "")) != "success":
                return {}
            return {f"nvidia.com/mig-{profile}": str(gpus * count) for profile, count in migs.items()}
        return {"nvidia.com/gpu": str(gpus)}
    return {}


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    config = json.loads(Path(args[0]).read_text())
    return Kubelet(config).run()


if __name__ == "__main__":
    sys.exit(main())
