"""Every Service, ServiceMonitor and PodMonitor selector the platform declares selects what it is
meant to select, decided by the real control plane of each stack.

- Services: the real Deployment/ReplicaSet controllers create the workload's pods, the real
  scheduler places them on the nodes of the system node group (labels and taints from the plan's
  ``aws:eks/nodeGroup:NodeGroup``), the harness's kubelet makes them Running and Ready, and the real
  EndpointSlice controller decides which pods back each Service and what each named port resolves to.
- ServiceMonitors: the Services the charts create are the charts' own, rendered by Helm from the
  pinned archives with the stack's values and installed (tools/cluster/charts.py), and each
  monitor's selector is evaluated by the API server (a list with ``labelSelector``), in the
  namespaces its ``namespaceSelector`` names; the selected Service must carry the endpoint's port name.
- PodMonitors: the pods are the ones the real Training Operator creates for a team's job, and the
  API server evaluates the selector; the selected pod must declare the endpoint's port name.

Prometheus' own discovery is the same selection: prometheus-operator v0.93.1 generates a
``kubernetes_sd_configs`` role ``endpoints``/``pod`` with the monitor's ``namespaces.names`` and
keeps targets whose labels match the selector and whose port name equals ``endpoints[].port``
(pkg/prometheus/promcfg.go ``generateServiceMonitorConfig``/``generatePodMonitorConfig``: ``keep``
relabelings on ``__meta_kubernetes_service_label_*`` / ``__meta_kubernetes_pod_label_*`` and on
``__meta_kubernetes_endpoint_port_name`` / ``__meta_kubernetes_pod_container_port_name``).
"""
from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.cluster import lifecycle as lc
from tests.cluster.lifecycle import EXAMPLE, ROOT
from tests.infra.test_chart_render import operand_services
from tools.cluster.api import eventually
from tools.cluster.standins import wait_for

WORKLOAD_KINDS = ("Deployment", "DaemonSet", "StatefulSet")


# -- helpers --------------------------------------------------------------------------------------
def label_selector(selector: dict[str, Any]) -> str:
    """A LabelSelector written in kubectl's ``-l`` syntax; the API server evaluates it."""
    terms = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        terms.append({"In": f"{key} in ({','.join(values)})", "NotIn": f"{key} notin ({','.join(values)})",
                      "Exists": key, "DoesNotExist": f"!{key}"}[operator])
    return ",".join(terms)


def monitor_namespaces(cluster, monitor: dict[str, Any]) -> list[str]:
    """``namespaceSelector``: ``any: true`` is every namespace, ``matchNames`` those, else the
    monitor's own (prometheus-operator v0.93.1 NamespaceSelector)."""
    chosen = monitor["spec"].get("namespaceSelector") or {}
    if chosen.get("any"):
        return [n["metadata"]["name"] for n in _items(cluster, "namespaces")]
    return list(chosen.get("matchNames") or [monitor["metadata"]["namespace"]])


def _items(cluster, *args: str) -> list[dict[str, Any]]:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)["items"]


def _labels_present(cluster, kind: str, namespaces: list[str]) -> str:
    found = []
    for namespace in namespaces:
        for obj in _items(cluster, kind, "-n", namespace):
            found.append(f"{namespace}/{obj['metadata']['name']} {obj['metadata'].get('labels') or {}}")
    return "; ".join(found) or "none"


# -- fixtures -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def system_node(stack_cluster):
    """The nodes EKS registers for the stack's managed node groups (registered with the cluster)."""
    names = [n["metadata"]["name"] for n in stack_cluster.api.get("/api/v1/nodes")["items"]
             if "eks.amazonaws.com/nodegroup" in n["metadata"]["labels"]]
    assert names, f"{stack_cluster.stack}: no node of a managed node group"
    return stack_cluster, names


# -- Services -------------------------------------------------------------------------------------
def _owned_by(pod: dict[str, Any], workload: dict[str, Any], replicasets: list[dict[str, Any]]) -> bool:
    owners = {(r["kind"], r["name"]) for r in pod["metadata"].get("ownerReferences", [])}
    if workload["kind"] != "Deployment":
        return (workload["kind"], workload["metadata"]["name"]) in owners
    mine = {rs["metadata"]["name"] for rs in replicasets
            if any(r["kind"] == "Deployment" and r["name"] == workload["metadata"]["name"]
                   for r in rs["metadata"].get("ownerReferences", []))}
    return any(kind == "ReplicaSet" and name in mine for kind, name in owners)


def _target_node(pod: dict[str, Any]):
    """The node a pod is bound to, or the one a DaemonSet pod is meant for (its node affinity's
    ``metadata.name`` field, which the DaemonSet controller sets)."""
    if pod["spec"].get("nodeName"):
        return pod["spec"]["nodeName"]
    terms = ((((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
              .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])
    for term in terms:
        for field in term.get("matchFields") or []:
            if field["key"] == "metadata.name" and field.get("values"):
                return field["values"][0]
    return None


def _container_port(pod: dict[str, Any], target) -> int | None:
    if isinstance(target, int):
        return target
    for container in pod["spec"]["containers"]:
        for port in container.get("ports", []):
            if port.get("name") == target:
                return port["containerPort"]
    return None


# Pods and Services that something creates at run time, outside the layer: a Service or monitor
# selecting them is checked against these labels instead (each from its source).
RUN_TIME_PODS = (
    ({"k8s-app": "kube-dns"}, "CoreDNS, the EKS coredns add-on's Deployment (an add-on, not a plan object)"),
    ({"app.kubernetes.io/name": "prometheus"}, "the Prometheus StatefulSet prometheus-operator v0.93.1 creates from "
     "the Prometheus resource (pkg/prometheus: app.kubernetes.io/name, operator.prometheus.io/name)"),
    ({"app.kubernetes.io/name": "alertmanager"}, "the Alertmanager StatefulSet prometheus-operator creates from the "
     "Alertmanager resource"),
)
RUN_TIME_SERVICES = (
    ({"k8s-app": "kubelet", "app.kubernetes.io/name": "kubelet"}, "the kubelet Service prometheus-operator v0.93.1 "
     "maintains (pkg/kubelet/controller.go: k8s-app, app.kubernetes.io/name = kubelet)"),
)


def _run_time(selector: dict[str, str], table) -> str:
    return next((why for labels, why in table if labels.items() <= selector.items()), "")


def test_every_service_is_backed_by_its_workloads_pods(system_node):
    """For each Service of the layer (the plan's, the charts', the overlay's), its workloads are the
    Deployments, DaemonSets and StatefulSets of the layer whose pod template its selector selects.
    The real controllers create their pods, the scheduler places them on the system nodes, the
    kubelet reports them Ready; the real EndpointSlice controller must then list exactly those
    pods, Ready, with every Service port resolved (a named ``targetPort`` that no container
    declares leaves the port out of the slice: kubernetes v1.32 pkg/controller/endpointslice
    ``getEndpointPorts``, ``podutil.FindPort``). A DaemonSet with no node to run on here (GPU
    nodes only) is checked by its template: the named port must exist. A Service selecting what
    only exists at run time (``RUN_TIME_PODS``) is named, not failed."""
    cluster, _ = system_node
    services = cluster.layer.of_kind("Service")
    assert services, f"{cluster.stack}: the layer declares no Service"
    problems = []
    for service in services:
        meta = service["metadata"]
        namespace, name = meta.get("namespace", "default"), meta["name"]
        selector = service["spec"].get("selector") or {}
        if not selector:
            continue  # endpoints written by hand or by a controller: nothing to select
        workloads = [w for w in cluster.layer.objects if w.get("kind") in WORKLOAD_KINDS
                     and w["metadata"].get("namespace") == namespace
                     and selector.items() <= ((w["spec"]["template"].get("metadata") or {}).get("labels") or {}).items()]
        if not workloads:
            if not _run_time(selector, RUN_TIME_PODS):
                problems.append(f"Service {namespace}/{name}: selector {selector} selects no workload of the layer")
            continue
        desired = [w for w in workloads if not (w["kind"] == "DaemonSet" and cluster.api.get(
            f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{w['metadata']['name']}")["status"].get(
            "desiredNumberScheduled", 0) == 0)]
        if not desired:
            template = workloads[0]["spec"]["template"]
            for port in service["spec"].get("ports", []):
                if _container_port(template, port.get("targetPort", port["port"])) is None:
                    problems.append(f"Service {namespace}/{name} port {port}: no container of "
                                    f"{workloads[0]['kind']} {workloads[0]['metadata']['name']} declares it")
            continue
        workload = desired[0]
        last: dict[str, Any] = {}

        def agreement():
            """Pods and slices read in one pass, so nodes that Karpenter adds or consolidates while
            the test runs (their DaemonSet pods come and go) cannot make the two disagree."""
            # Nodes a kubelet runs (not the bare Node objects other tests make to hold a token's pod).
            kubelet_nodes = {n["metadata"]["name"] for n in _items(cluster, "nodes")
                             if (n["metadata"].get("annotations") or {}).get("kwok.x-k8s.io/node") == "fake"}
            replicasets = _items(cluster, "replicasets", "-n", namespace)
            pods = [p for p in _items(cluster, "pods", "-n", namespace)
                    if any(_owned_by(p, w, replicasets) for w in desired) and _target_node(p) in kubelet_nodes
                    and not p["metadata"].get("deletionTimestamp")]
            slices = _items(cluster, "endpointslices", "-n", namespace, "-l", f"kubernetes.io/service-name={name}")
            ready_endpoints = {(e.get("targetRef", {}).get("name"), a)
                               for s in slices for e in s.get("endpoints") or []
                               if (e.get("conditions") or {}).get("ready") for a in e["addresses"]}
            last.update(pods=pods, slices=slices, endpoints=ready_endpoints)
            if not pods or not all(any(c["type"] == "Ready" and c["status"] == "True"
                                       for c in p.get("status", {}).get("conditions", [])) for p in pods):
                return None
            return (pods, slices) if ready_endpoints == {(p["metadata"]["name"], p["status"]["podIP"])
                                                         for p in pods} else None

        try:
            pods, slices = wait_for(agreement, f"{workload['kind']} {namespace}/{name} pods Ready and "
                                    f"listed by the Service's EndpointSlices", timeout_s=180)
        except TimeoutError as error:
            states = [(p["metadata"]["name"], p["spec"].get("nodeName"), p["status"].get("podIP"),
                       [(c["type"], c["status"]) for c in p.get("status", {}).get("conditions", [])])
                      for p in last.get("pods", [])]
            problems.append(f"Service {namespace}/{name} selector {selector}: {error}; the workload's pods "
                            f"(name, node, IP, conditions): {states}; the slices' Ready endpoints (pod, address): "
                            f"{sorted(last.get('endpoints', []), key=str)}")
            continue
        slice_ports = {(p.get("name") or "", p.get("port")) for s in slices for p in s.get("ports") or []}
        for port in service["spec"].get("ports", []):
            want = (port.get("name") or "", _container_port(pods[0], port.get("targetPort", port["port"])))
            if want not in slice_ports:
                problems.append(f"Service {namespace}/{name} port {port}: not resolved in its EndpointSlices "
                                f"(they list {sorted(slice_ports)}; the pod's container ports: "
                                f"{[c.get('ports') for c in pods[0]['spec']['containers']]})")
    assert not problems, "\n".join(problems)


# -- ServiceMonitors ------------------------------------------------------------------------------
def test_every_service_monitor_selects_a_service_with_its_port(stack_cluster):
    """Each ServiceMonitor of the layer (the plan's and the charts'), evaluated by the API server
    against the Services the layer installs, the charts' own included. In prod (gpu-operator mode)
    the DCGM monitor once selected ``app.kubernetes.io/name: dcgm-exporter``, which only the
    standalone chart sets. Services an operator would create at run time (the GPU Operator's
    operands) are not here: their monitors are reported with the charts that would own them."""
    cluster = stack_cluster
    unknown = sorted(r.name for r in cluster.layer.releases if r.chart == "gpu-operator")
    monitors = cluster.layer.of_kind("ServiceMonitor")
    assert monitors, f"{cluster.stack}: the layer declares no ServiceMonitor"
    problems = []
    for monitor in monitors:
        meta = monitor["metadata"]
        where = f"ServiceMonitor {meta['namespace']}/{meta['name']}"
        selector = label_selector(monitor["spec"]["selector"])
        namespaces = monitor_namespaces(cluster, monitor)
        selected = [s for n in namespaces for s in _items(cluster, "services", "-n", n, "-l", selector)]
        if not selected and not monitor["spec"]["selector"].get("matchExpressions"):
            # The Services an operator creates from the layer's custom resources once it runs on
            # a GPU node (the GPU Operator's operands), as its own assets declare them.
            wanted = monitor["spec"]["selector"].get("matchLabels") or {}
            selected = [s for r in cluster.layer.releases if r.namespace in namespaces
                        for s in operand_services(r.objects, r.namespace)
                        if wanted.items() <= (s["metadata"].get("labels") or {}).items()]
        if not selected and _run_time(monitor["spec"]["selector"].get("matchLabels") or {}, RUN_TIME_SERVICES):
            continue  # a Service the operator maintains at run time (RUN_TIME_SERVICES)
        if not selected:
            problems.append(f"{where}: selector {selector!r} in {namespaces} selects no Service; labels present: "
                            f"{_labels_present(cluster, 'services', namespaces)} (releases whose operator creates "
                            f"Services at run time: {unknown or 'none'})")
            continue
        ports = [e["port"] for e in monitor["spec"].get("endpoints", []) if e.get("port")]
        if ports and not any(set(ports) <= {p.get("name") for p in s["spec"].get("ports", [])} for s in selected):
            problems.append(f"{where}: the Services it selects ("
                            + ", ".join(f"{s['metadata']['name']} ports {[p.get('name') for p in s['spec']['ports']]}"
                                        for s in selected) + f") have no port named {ports}")
    assert not problems, "\n".join(problems)


# -- PodMonitors ----------------------------------------------------------------------------------


def _submit(cluster, scope, namespace: str) -> dict[str, Any]:
    """A team of ``namespace`` submits the stack's example job with ``JobClient`` (as the plan's
    access entries let it), two nodes so that rank 0 and another rank exist; the stored job."""
    from tests.cluster.identities import job_client

    raw = yaml.safe_load((ROOT / EXAMPLE[cluster.stack]).read_text())
    team = namespace.removeprefix("team-")
    raw["trainer"]["overrides"] = [o.replace(f"team-{raw['team']}.", f"{namespace}.") for o in raw["trainer"].get("overrides", [])]
    if team != raw["team"]:
        raw.pop("priority", None)  # a priority class is a per-team entitlement; the team's default
    raw.update({"team": team, "name": scope.name("monitored"), "nodes": 2})
    client = job_client(cluster, team)
    submitted = client.submit(client.load(raw))
    return json.loads(cluster.kubectl("get", "pytorchjobs.kubeflow.org", submitted.job.name, "-n", namespace,
                                      "-o", "json").stdout)


def operator_pods(cluster, job: dict[str, Any]) -> list[dict[str, Any]]:
    """The pods the real Training Operator creates for the job once Kueue admits it."""
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    replicas = sum(r.get("replicas", 1) for r in job["spec"]["pytorchReplicaSpecs"].values())

    def created():
        pods = _items(cluster, "pods", "-n", namespace, "-l", f"training.kubeflow.org/job-name={name}")
        return pods if len(pods) == replicas else None

    def diagnose() -> str:
        workload = lc.workload_of(cluster, job["metadata"]["uid"], namespace) or {}
        conditions = [(c["type"], c["status"], c.get("reason"), c.get("message", "")[:200])
                      for c in workload.get("status", {}).get("conditions", [])]
        return f"{namespace}/{name}: Workload conditions {conditions or 'none (no Workload)'}"
    return eventually(created, f"the Training Operator creates {replicas} pods for {namespace}/{name}", 300,
                      diagnose=diagnose)


def test_every_pod_monitor_selects_rank_zero_of_a_teams_job(stack_cluster, scope):
    """Each PodMonitor (one per team namespace and job kind) against the pods a team's job gets:
    the team submits the example job (two nodes) with ``JobClient``, Kueue admits it and the real
    Training Operator creates its pods. The API server evaluates the monitor's selector in its
    namespaces; it must select exactly rank 0 (the only rank serving the trainer's metrics:
    trainer/health.py) and, where the endpoint names a port, rank 0's pod must declare it. A
    TrainJob monitor needs Trainer v2, which no stack's charts install here: it fails the test."""
    cluster = stack_cluster
    monitors = cluster.layer.of_kind("PodMonitor")
    assert monitors, f"{cluster.stack}: the layer declares no PodMonitor"
    problems, jobs = [], {}
    # One job per team namespace, each on two nodes of the example's pool, all running at once. Kueue
    # admits none while an admitted job's pods wait for a node (waitForPodsReady.blockAdmission), so
    # earlier tests' empty nodes, which hold places under the pool's limit until its consolidateAfter
    # (prod's h100: 15m), must not leave the jobs without room.
    lc.release_empty_nodes(cluster, lc.pool_of(cluster, yaml.safe_load((ROOT / EXAMPLE[cluster.stack]).read_text())))
    for monitor in monitors:
        meta = monitor["metadata"]
        where = f"PodMonitor {meta['namespace']}/{meta['name']}"
        if meta["name"].endswith("-trainjob"):
            problems.append(f"{where}: no TrainJob can run here (Kubeflow Trainer v2 is not among the stack's "
                            "rendered releases), so nothing it selects can be checked")
            continue
        namespace = meta["namespace"]
        if namespace not in jobs:
            jobs[namespace] = operator_pods(cluster, _submit(cluster, scope, namespace))
        created = {p["metadata"]["name"] for p in jobs[namespace]}
        selector = label_selector(monitor["spec"]["selector"])
        namespaces = monitor_namespaces(cluster, monitor)
        selected = [p for n in namespaces for p in _items(cluster, "pods", "-n", n, "-l", selector)
                    if p["metadata"]["name"] in created]
        rank_zero = [p for p in selected if p["metadata"]["labels"].get("training.kubeflow.org/replica-type") == "master"]
        if not selected:
            problems.append(f"{where}: selector {selector!r} in {namespaces} selects none of the operator's pods "
                            f"{sorted(created)}; labels present: {_labels_present(cluster, 'pods', [namespace])}")
            continue
        if len(selected) != 1 or len(rank_zero) != 1:
            problems.append(f"{where}: selector {selector!r} selects {[p['metadata']['name'] for p in selected]}, "
                            f"expected rank 0 alone")
            continue
        endpoints = monitor["spec"].get("podMetricsEndpoints", [])
        kept = {r["regex"] for e in endpoints for r in e.get("relabelings", [])
                if r.get("action") == "keep" and r.get("sourceLabels") == ["__meta_kubernetes_pod_container_name"]}
        containers = {c["name"] for c in selected[0]["spec"]["containers"]}
        if kept - containers:
            problems.append(f"{where}: keeps containers named {sorted(kept)}; rank 0's pod has {sorted(containers)}")
        ports = [e["port"] for e in endpoints if e.get("port")]
        declared = {p.get("name") for c in selected[0]["spec"]["containers"] for p in c.get("ports", [])}
        if not set(ports) <= declared:
            problems.append(f"{where}: rank 0's pod {selected[0]['metadata']['name']} declares ports {sorted(declared)}, "
                            f"the monitor scrapes {ports}")
    assert not problems, "\n".join(problems)
