"""Stand-ins for what AWS and EKS run behind the platform's objects (docs/testing.md lists each).

Each reproduces one upstream behaviour, named with its source, and nothing more:

- EC2 for Karpenter: the kwok provider's instance types from ``catalog/`` (GPUs, vCPUs, memory,
  EFA devices, the AWS provider's ``karpenter.k8s.aws/*`` labels, a spot and an on-demand offering
  at the catalog's prices), a ``KWOKNodeClass`` for each EC2NodeClass (the kwok provider manages
  no other kind), each NodePool pointed at it, and the spot interruption queue as a directory
  (tools/cluster/karpenter/cmd/karpenter-kwok-aws).
- EKS add-ons' node plugins: the storage CSI drivers' node DaemonSets (what lifts their startup
  taints, ``workloads.karpenter.STARTUP_TAINT_OWNERS``), placed by the real DaemonSet controller.
- The GPU Operator's work (prod): its node labels once the node-feature-discovery worker runs on
  a GPU node, its device plugin and MIG manager DaemonSets with the ClusterPolicy's tolerations,
  and the MIG manager's verdict.
- The device plugins' resources: read by the kubelet's node agents from the chart's own
  configuration (tools/cluster/kubelet.py ``advertised``).
"""
from __future__ import annotations

import copy
import datetime as dt
import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from tools.cluster.layer import Layer, go_module_dir
from tools.cluster.nodes import ZONES, NodeSetup

KARPENTER_MODULE = ("sigs.k8s.io/karpenter", "v1.14.1")
KWOK_NODE_CLASS = {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass"}
# Zones of the stand-in offerings: labels only, nothing in the stacks selects a zone. Spot is
# offered in every zone: Karpenter picks a multi-node job's zone before its price (the job's pods
# require one zone; with none of them bound yet, v1.14.1 scheduling/topologygroup.go
# nextDomainAffinity takes "a domain at random"), so a zone without spot would decide a spot job's
# capacity type by chance. A test takes spot capacity away with ``AwsStandIns.exhaust``.
STAND_IN_ZONES = ZONES
# Where the Karpenter pod finds the stand-in's files (mounted by the kubelet).
INSTANCE_TYPES_PATH = "/var/lib/mlplatform/instance-types.json"
SPOOL_PATH = "/var/lib/mlplatform/sqs"
CAPACITY_FILE = "capacity.json"
KARPENTER_SERVICE_ACCOUNT = ("karpenter", "karpenter")

GPU_OPERATOR_NAMESPACE = "gpu-system"
# The GPU Operator's node labels (gpu-operator v25.3.0 controllers/state_manager.go: a node with an
# NVIDIA PCI device, as node-feature-discovery reports it, gets nvidia.com/gpu.present and one
# nvidia.com/gpu.deploy.<operand> label per operand, which the operand DaemonSets select).
NFD_NVIDIA_LABEL = "feature.node.kubernetes.io/pci-10de.present"
OPERATOR_LABELS = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.device-plugin": "true",
                   "nvidia.com/gpu.deploy.mig-manager": "true", "nvidia.com/gpu.deploy.dcgm-exporter": "true"}


def aws_instance_labels(instance_type: str, shape=None) -> dict[str, str]:
    """The ``karpenter.k8s.aws/*`` labels the AWS provider gives an instance type
    (karpenter-provider-aws pkg/providers/instancetype/types.go ``computeRequirements``), for the
    ones the catalog knows."""
    family, size = instance_type.split(".", 1)
    category = family[0]
    generation = "".join(c for c in family[1:] if c.isdigit())
    labels = {"karpenter.k8s.aws/instance-family": family, "karpenter.k8s.aws/instance-size": size,
              "karpenter.k8s.aws/instance-category": category, "karpenter.k8s.aws/instance-generation": generation}
    if shape is not None:
        labels.update({"karpenter.k8s.aws/instance-cpu": str(shape.vcpus),
                       "karpenter.k8s.aws/instance-memory": str(shape.memory_gib * 1024)})
    return labels


def catalog_instance_types() -> list[dict[str, Any]]:
    """Every GPU instance type of ``catalog.gpus`` in the kwok provider's file format
    (karpenter kwok/cloudprovider/helpers.go ``InstanceTypeOptions``): resources as the device
    plugins advertise them (``nvidia.com/gpu``, ``vpc.amazonaws.com/efa`` one per EFA network
    card; Karpenter plans with them, the node gets them from the device plugin), an on-demand
    offering and a spot one per zone, at the catalog's prices. The offerings carry
    the AWS provider's labels, which the kwok provider turns into well-known labels."""
    from catalog import gpus
    from catalog.prices import price

    types = []
    gpu_of = {s.instance_type: g for g in gpus.GPU_TYPES.values() for s in g.shapes}
    for name, shape in sorted(gpus.instance_shapes().items()):
        gpu = gpu_of[name]
        labels = aws_instance_labels(name, shape)
        labels.update({"karpenter.k8s.aws/instance-gpu-name": gpu.karpenter_gpu_name,
                       "karpenter.k8s.aws/instance-gpu-count": str(shape.num_gpus),
                       "karpenter.k8s.aws/instance-gpu-memory": str(gpu.gpu_memory_gib * 1024)})
        resources = {"cpu": str(shape.vcpus), "memory": f"{shape.memory_gib}Gi", "pods": "110",
                     "nvidia.com/gpu": str(shape.num_gpus)}
        if shape.num_efa_network_cards:
            resources["vpc.amazonaws.com/efa"] = str(shape.num_efa_network_cards)
        usd = price(name)
        offerings = []
        for capacity_type, cost in (("on-demand", usd.on_demand_usd_per_hour), ("spot", usd.spot_usd_per_hour)):
            for zone in STAND_IN_ZONES:
                requirements = [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": [capacity_type]},
                                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [zone]}]
                requirements += [{"key": k, "operator": "In", "values": [v]} for k, v in sorted(labels.items())]
                offerings.append({"Price": cost, "Available": True, "Requirements": requirements})
        types.append({"name": name, "architecture": "amd64", "operatingSystems": ["linux"],
                      "resources": resources, "offerings": offerings})
    return types


def instance_facts() -> dict[str, dict[str, int]]:
    """What each instance type's hardware gives its device plugins: GPUs and EFA devices."""
    from catalog import gpus

    return {name: {"gpus": shape.num_gpus, "efa": shape.num_efa_network_cards}
            for name, shape in gpus.instance_shapes().items()}


def unlaunchable_pools(pools: list[dict[str, Any]], instance_types: list[dict[str, Any]]) -> list[str]:
    """Pools no instance type satisfies (a pool Karpenter could never launch a node for)."""
    problems = []
    for pool in pools:
        requirements = pool["spec"]["template"]["spec"].get("requirements", [])
        if not any(_offers(it, requirements) for it in instance_types):
            problems.append(f"{pool['metadata']['name']}: no catalog instance type meets {requirements}")
    return problems


def _offers(instance_type: dict[str, Any], requirements: list[dict[str, Any]]) -> bool:
    for offering in instance_type["offerings"]:
        labels = {r["key"]: r["values"][0] for r in offering["Requirements"]}
        labels.update({"kubernetes.io/arch": instance_type["architecture"], "kubernetes.io/os": "linux",
                       "node.kubernetes.io/instance-type": instance_type["name"]})
        if all(_meets(labels.get(r["key"]), r) for r in requirements):
            return True
    return False


def _meets(value: Optional[str], requirement: dict[str, Any]) -> bool:
    op, values = requirement["operator"], requirement.get("values", [])
    if op == "In":
        return value in values
    if op == "NotIn":
        return value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt"):
        if value is None or not value.isdigit():
            return False
        return int(value) > int(values[0]) if op == "Gt" else int(value) < int(values[0])
    return False


def kwok_node_pool(pool: dict[str, Any]) -> dict[str, Any]:
    """The stack's NodePool pointed at a KWOKNodeClass of its EC2NodeClass's name; everything
    else (requirements, labels, taints, startup taints, limits, disruption) unchanged."""
    pool = copy.deepcopy(pool)
    ref = pool["spec"]["template"]["spec"]["nodeClassRef"]
    pool["spec"]["template"]["spec"]["nodeClassRef"] = {**KWOK_NODE_CLASS, "name": ref["name"]}
    return pool


@dataclass
class AwsStandIns:
    """The stand-ins for one stack's control plane (files under ``<plane>/aws``)."""

    layer: Layer
    workdir: Path
    notes: list[str] = field(default_factory=list)

    @property
    def spool(self) -> Path:
        return self.workdir / "sqs"

    @property
    def interruption_queue(self) -> Optional[str]:
        return ((self.layer.helm_values.get("karpenter") or {}).get("settings") or {}).get("interruptionQueue")

    # -- before the nodes start --
    def prepare(self) -> NodeSetup:
        from workloads.karpenter import STARTUP_TAINT_OWNERS

        self.workdir.mkdir(parents=True, exist_ok=True)
        self.spool.mkdir(parents=True, exist_ok=True)
        types = catalog_instance_types()
        gpu_pools = [p for p in self.layer.of_kind("NodePool")
                     if any(r["key"].startswith("karpenter.k8s.aws/instance-gpu")
                            for r in p["spec"]["template"]["spec"].get("requirements", []))]
        problems = unlaunchable_pools(gpu_pools, types)
        if problems:
            raise RuntimeError(f"{self.layer.stack}: GPU pools Karpenter could never launch:\n" + "\n".join(problems))
        (self.workdir / "instance-types.json").write_text(json.dumps(types, indent=1))
        owners = [{"key": o.key, "namespace": o.daemonset[0], "daemonset": o.daemonset[1]}
                  for o in STARTUP_TAINT_OWNERS.values()]
        return NodeSetup(
            taint_owners=owners, device_plugins=self.device_plugins(), instance_facts=instance_facts(),
            node_labels=self.operator_node_labels(), mig_managers=self.mig_managers(),
            runner_env={"karpenter": {"INSTANCE_TYPES_FILE_PATH": INSTANCE_TYPES_PATH,
                                      "MLPLATFORM_INTERRUPTION_SPOOL": SPOOL_PATH,
                                      "MLPLATFORM_CAPACITY_FILE": f"{SPOOL_PATH}/{CAPACITY_FILE}"}},
            runner_mounts={"karpenter": [
                {"source": str(self.workdir / "instance-types.json"), "path": INSTANCE_TYPES_PATH},
                {"source": str(self.spool), "path": SPOOL_PATH, "readOnly": False}]})

    # -- objects the stand-ins add --
    def objects(self) -> list[dict[str, Any]]:
        """KWOKNodeClass CRD-backed objects and RBAC, the CSI node plugins, the GPU Operator's operands."""
        docs = []
        classes = sorted({p["spec"]["template"]["spec"]["nodeClassRef"]["name"] for p in self.layer.of_kind("NodePool")})
        docs += [{"apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass", "metadata": {"name": n}}
                 for n in classes]
        namespace, account = KARPENTER_SERVICE_ACCOUNT
        # What the stand-in asks beyond the chart's RBAC (templates/clusterrole*.yaml), and only
        # that: the kwok provider reads KWOKNodeClasses where the AWS provider reads EC2NodeClasses,
        # and it writes the Node of a new instance itself, which on EC2 the instance's kubelet does.
        docs += [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                  "metadata": {"name": "karpenter-kwok-stand-in"},
                  "rules": [{"apiGroups": ["karpenter.kwok.sh"], "resources": ["kwoknodeclasses"],
                             "verbs": ["get", "list", "watch"]},
                            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["create"]}]},
                 {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                  "metadata": {"name": "karpenter-kwok-stand-in"},
                  "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                              "name": "karpenter-kwok-stand-in"},
                  "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]}]
        docs += self.csi_node_plugins()
        docs += self.gpu_operator_operands()
        return docs

    def kwok_crd(self) -> dict[str, Any]:
        path = go_module_dir(*KARPENTER_MODULE) / "kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml"
        return yaml.safe_load(path.read_text())

    def transform(self, obj: dict[str, Any]) -> dict[str, Any]:
        return kwok_node_pool(obj) if obj.get("kind") == "NodePool" else obj

    def node_class_status(self, plane) -> None:
        """Nothing in the kwok provider sets a KWOKNodeClass's status; core Karpenter keeps a
        NodePool NotReady until its NodeClass reports Ready=True (RUNNING.md, Karpenter)."""
        now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        ready = {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "",
                                            "lastTransitionTime": now, "observedGeneration": 1}]}}
        for pool in self.layer.of_kind("NodePool"):
            name = pool["spec"]["template"]["spec"]["nodeClassRef"]["name"]
            plane.api.merge_patch(f"/apis/karpenter.kwok.sh/v1alpha1/kwoknodeclasses/{name}/status", ready)

    # -- EKS add-ons' node plugins --
    def csi_node_plugins(self) -> list[dict[str, Any]]:
        """The node DaemonSet of each storage add-on whose taint a pool may carry: scheduled by
        the real DaemonSet controller with the add-on chart's node tolerations
        (``node.tolerateAllTaints: true``, the default of the FSx, EFS and Mountpoint charts:
        ``- operator: Exists``), or the add-on's ``configurationValues`` ``node.tolerations``."""
        from workloads.karpenter import STARTUP_TAINT_OWNERS

        docs = []
        for owner in STARTUP_TAINT_OWNERS.values():
            if owner.addon is None or owner.addon not in self.layer.addon_config:
                continue
            node = (self.layer.addon_config[owner.addon] or {}).get("node") or {}
            tolerations = node.get("tolerations") if "tolerations" in node else [{"operator": "Exists"}]
            if node.get("tolerateAllTaints") is False and "tolerations" not in node:
                tolerations = []
            namespace, name = owner.daemonset
            labels = {"app": name, "app.kubernetes.io/name": owner.addon}
            docs.append({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": namespace,
                                                                                   "labels": labels},
                         "spec": {"selector": {"matchLabels": labels}, "template": {
                             "metadata": {"labels": labels},
                             "spec": {"nodeSelector": {"kubernetes.io/os": "linux"},
                                      "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                                          "nodeSelectorTerms": [{"matchExpressions": [
                                              {"key": "eks.amazonaws.com/compute-type", "operator": "NotIn",
                                               "values": ["fargate", "hybrid"]}]}]}}},
                                      "priorityClassName": "system-node-critical", "tolerations": tolerations,
                                      "containers": [{"name": "node-plugin", "image": f"eks-addon/{owner.addon}:node",
                                                      "env": [{"name": "CSI_NODE_NAME", "valueFrom": {"fieldRef": {
                                                          "fieldPath": "spec.nodeName"}}}]}]}}}})
        return docs

    # -- GPU plugins --
    def device_plugins(self) -> list[dict[str, Any]]:
        plugins = []
        for release in self.layer.releases:
            for obj in release.objects:
                if obj.get("kind") != "DaemonSet":
                    continue
                images = [c.get("image", "") for c in obj["spec"]["template"]["spec"].get("containers", [])]
                namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
                # The EFA plugin first: its image (`.../aws-efa-k8s-device-plugin`) contains NVIDIA's
                # repository name (`nvcr.io/nvidia/k8s-device-plugin`) as a substring.
                if any("aws-efa-k8s-device-plugin" in i for i in images):
                    plugins.append({"kind": "efa", "namespace": namespace, "daemonset": name})
                elif any("k8s-device-plugin" in i for i in images) and "mps" not in name:
                    plugins.append({"kind": "nvidia", "namespace": namespace, "daemonset": name,
                                    "config_label": "nvidia.com/device-plugin.config",
                                    "default_config": ((release.values.get("config") or {}).get("default") or ""),
                                    "configs": self._configs(release, "config")})
        operator = self._gpu_operator()
        if operator is not None:
            values = operator.values
            config = (values.get("devicePlugin") or {}).get("config") or {}
            mig = self._mig_layouts(operator)
            plugins.append({"kind": "nvidia", "namespace": GPU_OPERATOR_NAMESPACE,
                            "daemonset": "nvidia-device-plugin-daemonset",
                            "config_label": "nvidia.com/device-plugin.config", "default_config": config.get("default", ""),
                            "configs": {k: yaml.safe_load(v) for k, v in (config.get("data") or {}).items()},
                            "mig_label": "nvidia.com/mig.config", "mig_state_label": "nvidia.com/mig.config.state",
                            "mig_layouts": mig})
        return plugins

    @staticmethod
    def _configs(release, key: str) -> dict[str, Any]:
        mapping = (release.values.get(key) or {}).get("map") or {}
        return {name: yaml.safe_load(text) for name, text in mapping.items()}

    def _gpu_operator(self):
        return next((r for r in self.layer.releases if r.chart == "gpu-operator"), None)

    @staticmethod
    def _mig_layouts(operator) -> dict[str, dict[str, int]]:
        """mig-parted layouts (``migManager.config``): name -> {profile: slices per GPU}."""
        data = ((operator.values.get("migManager") or {}).get("config") or {}).get("data") or {}
        layouts: dict[str, dict[str, int]] = {}
        for text in data.values():
            for name, devices in (yaml.safe_load(text).get("mig-configs") or {}).items():
                slices: dict[str, int] = {}
                for device in devices:
                    if device.get("mig-enabled"):
                        for profile, count in (device.get("mig-devices") or {}).items():
                            slices[profile] = slices.get(profile, 0) + int(count)
                layouts[name] = slices
        return layouts

    # -- the GPU Operator (prod) --
    def gpu_operator_operands(self) -> list[dict[str, Any]]:
        """The operand DaemonSets the operator creates from its ClusterPolicy: the device plugin
        and the MIG manager, each selecting its ``nvidia.com/gpu.deploy.<operand>`` label, with
        ``daemonsets.tolerations`` and ``priorityClassName`` (the operator applies them to every
        operand: ClusterPolicy ``spec.daemonsets``)."""
        operator = self._gpu_operator()
        if operator is None:
            return []
        policy = next(o for o in operator.objects if o.get("kind") == "ClusterPolicy")
        common = policy["spec"].get("daemonsets") or {}
        docs = []
        for name, label, image in (("nvidia-device-plugin-daemonset", "nvidia.com/gpu.deploy.device-plugin",
                                    "nvcr.io/nvidia/k8s-device-plugin"),
                                   ("nvidia-mig-manager", "nvidia.com/gpu.deploy.mig-manager",
                                    "nvcr.io/nvidia/cloud-native/k8s-mig-manager")):
            labels = {"app": name}
            docs.append({"apiVersion": "apps/v1", "kind": "DaemonSet",
                         "metadata": {"name": name, "namespace": GPU_OPERATOR_NAMESPACE, "labels": labels},
                         "spec": {"selector": {"matchLabels": labels}, "template": {
                             "metadata": {"labels": labels},
                             "spec": {"nodeSelector": {label: "true"}, "tolerations": common.get("tolerations", []),
                                      "priorityClassName": common.get("priorityClassName", "system-node-critical"),
                                      "containers": [{"name": name, "image": image}]}}}})
        return docs

    def operator_node_labels(self) -> list[dict[str, Any]]:
        """The operator labels a GPU node once node-feature-discovery (its worker DaemonSet)
        reports the NVIDIA PCI device there."""
        operator = self._gpu_operator()
        if operator is None:
            return []
        worker = next((o for o in operator.objects if o.get("kind") == "DaemonSet" and "worker" in o["metadata"]["name"]),
                      None)
        if worker is None:
            return []
        return [{"namespace": worker["metadata"]["namespace"], "daemonset": worker["metadata"]["name"],
                 "gpu_nodes_only": True, "labels": {NFD_NVIDIA_LABEL: "true", **OPERATOR_LABELS}}]

    def mig_managers(self) -> list[dict[str, Any]]:
        """The MIG manager applies the node's ``nvidia.com/mig.config`` layout and reports
        ``nvidia.com/mig.config.state=success`` (mig-parted deployments/container/reconfigure-mig.sh)."""
        if self._gpu_operator() is None:
            return []
        return [{"namespace": GPU_OPERATOR_NAMESPACE, "daemonset": "nvidia-mig-manager",
                 "config_label": "nvidia.com/mig.config", "state_label": "nvidia.com/mig.config.state"}]

    # -- EC2 capacity --
    def exhaust(self, instance_type: str = "*", zone: str = "*", capacity_type: str = "*") -> None:
        """EC2 answers InsufficientInstanceCapacity for these offerings until ``restore`` (the
        AWS provider then marks them unavailable; the wrapper reads the list on every
        GetInstanceTypes)."""
        path = self.spool / CAPACITY_FILE
        current = json.loads(path.read_text()) if path.exists() else []
        current.append({"instanceType": instance_type, "zone": zone, "capacityType": capacity_type})
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(current))
        tmp.rename(path)

    def exhaust_all_but(self, instance_type: str, zone: str, capacity_type: str) -> None:
        """Every offering of ``capacity_type`` answers InsufficientInstanceCapacity except the one
        given (a spot market where only the offering a node already runs on had capacity)."""
        for other in catalog_instance_types():
            for offering in other["offerings"]:
                labels = {r["key"]: r["values"][0] for r in offering["Requirements"]}
                if labels["karpenter.sh/capacity-type"] != capacity_type:
                    continue
                if (other["name"], labels["topology.kubernetes.io/zone"]) != (instance_type, zone):
                    self.exhaust(other["name"], labels["topology.kubernetes.io/zone"], capacity_type)

    def restore(self) -> None:
        (self.spool / CAPACITY_FILE).unlink(missing_ok=True)

    # -- interruptions --
    def spot_interruption(self, instance_id: str) -> Path:
        """Put an EC2 Spot Instance Interruption Warning for ``instance_id`` (the kwok node's
        name) on the stack's interruption queue, as EventBridge delivers it (EC2 User Guide,
        "Spot Instance interruption notices": source aws.ec2, detail-type "EC2 Spot Instance
        Interruption Warning", detail {instance-id, instance-action: terminate})."""
        queue = self.interruption_queue
        if not queue:
            raise RuntimeError(f"{self.layer.stack}: the Karpenter release sets no settings.interruptionQueue")
        message = {"version": "0", "id": str(uuid.uuid4()), "detail-type": "EC2 Spot Instance Interruption Warning",
                   "source": "aws.ec2", "account": "111122223333",
                   "time": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "region": "us-west-2",
                   "resources": [f"arn:aws:ec2:us-west-2:111122223333:instance/{instance_id}"],
                   "detail": {"instance-id": instance_id, "instance-action": "terminate"}}
        directory = self.spool / queue
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{message['id']}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(message))
        tmp.rename(path)
        return path
