"""Every Service, ServiceMonitor and PodMonitor selector the platform declares selects what it is
meant to select, decided by the real control plane of each stack.

- Services: the real Deployment/ReplicaSet controllers create the workload's pods, the real
  scheduler places them on a node as EKS registers it for the system node group (labels and
  taints from the plan's ``aws:eks/nodeGroup:NodeGroup``), kwok (a simulated kubelet, its own
  ``fast`` stages) makes them Running and Ready, and the real EndpointSlice controller decides
  which pods back each Service and what each named port resolves to.
- ServiceMonitors: the Services the charts and operators create are built at their pinned versions
  (tests/cluster/chart_services.py, sources quoted there), applied, and each monitor's selector is
  evaluated by the API server (a list with ``labelSelector``), in the namespaces its
  ``namespaceSelector`` names; the selected Service must carry the endpoint's port name.
- PodMonitors: the pods are the ones the job controllers create (see the test's docstring) and
  the API server evaluates the selector; the selected pod must declare the endpoint's port name.

Prometheus' own discovery is the same selection: prometheus-operator v0.93.1 generates a
``kubernetes_sd_configs`` role ``endpoints``/``pod`` with the monitor's ``namespaces.names`` and
keeps targets whose labels match the selector and whose port name equals ``endpoints[].port``
(pkg/prometheus/promcfg.go ``generateServiceMonitorConfig``/``generatePodMonitorConfig``: ``keep``
relabelings on ``__meta_kubernetes_service_label_*`` / ``__meta_kubernetes_pod_label_*`` and on
``__meta_kubernetes_endpoint_port_name`` / ``__meta_kubernetes_pod_container_port_name``).
"""
from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from tests.cluster.chart_services import chart_services
from tools.cluster.controlplane import missing_tools
from tools.cluster.standins import KWOK_ANNOTATION, start_kwok, wait_for

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


def _apply(cluster, documents: list[dict[str, Any]]) -> None:
    namespaces = sorted({d["metadata"]["namespace"] for d in documents})
    existing = {n["metadata"]["name"] for n in _items(cluster, "namespaces")}
    for namespace in namespaces:
        if namespace not in existing:
            cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl("apply", "--server-side", "--field-manager=helm", "-f", "-",
                    input=yaml.safe_dump_all(documents, sort_keys=False))


# -- fixtures -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plan(stack_cluster):
    from tests.conftest import _plan

    return _plan(stack_cluster.stack)


@pytest.fixture(scope="module")
def with_chart_services(stack_cluster, plan):
    services, unknown = chart_services(plan)
    _apply(stack_cluster, services)
    return stack_cluster, services, unknown


@pytest.fixture(scope="module")
def system_node(stack_cluster, plan):
    """kwok (started unless another module of this session already runs it on this plane) and a
    node as EKS registers it for each managed node group of the plan: the group's ``labels`` and
    ``taints`` (EKS API ``NO_SCHEDULE`` -> ``NoSchedule``)."""
    from infra.plan import resource_graph

    if missing_tools(("kwok",)):
        pytest.skip("kwok not built (make cluster-tools)")
    plane = stack_cluster.plane
    if not any(p.name == "kwok" and p.alive() for p in plane.processes):
        start_kwok(plane)
    effects = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
    groups = [r for r in resource_graph(plan.recording, plan.config) if r["type"] == "aws:eks/nodeGroup:NodeGroup"]
    assert groups, f"{stack_cluster.stack}: the plan has no managed node group"
    names = []
    for index, group in enumerate(groups):
        name = f"selectors-system-{index}"
        capacity = {"cpu": "16", "memory": "64Gi", "pods": "110"}
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "annotations": dict(KWOK_ANNOTATION),
                             "labels": {**(group["inputs"].get("labels") or {}), "kubernetes.io/hostname": name,
                                        "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "type": "kwok"}},
                "spec": {"taints": [{"key": t["key"], "value": t.get("value", ""), "effect": effects[t["effect"]]}
                                    for t in group["inputs"].get("taints") or []]},
                "status": {"capacity": capacity, "allocatable": capacity}}
        stack_cluster.kubectl("apply", "-f", "-", input=json.dumps(node))
        names.append(name)
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


def _container_port(pod: dict[str, Any], target) -> int | None:
    if isinstance(target, int):
        return target
    for container in pod["spec"]["containers"]:
        for port in container.get("ports", []):
            if port.get("name") == target:
                return port["containerPort"]
    return None


def test_every_service_is_backed_by_its_workloads_pods(system_node):
    """For each Service of the layer, its workload is the Deployment/DaemonSet/StatefulSet of the
    same name and namespace in the layer. The real controllers create that workload's pods, the
    scheduler places them on the system node, kwok reports them Ready; the real EndpointSlice
    controller must then list exactly those pods, Ready, with every Service port resolved
    (a named ``targetPort`` that no container declares leaves the port out of the slice:
    kubernetes v1.32 pkg/controller/endpointslice ``getEndpointPorts``, ``podutil.FindPort``)."""
    cluster, _ = system_node
    services = cluster.layer.of_kind("Service")
    assert services, f"{cluster.stack}: the layer declares no Service"
    problems = []
    for service in services:
        meta = service["metadata"]
        namespace, name = meta.get("namespace", "default"), meta["name"]
        workload = next((w for w in cluster.layer.objects if w.get("kind") in WORKLOAD_KINDS
                         and w["metadata"]["name"] == name and w["metadata"].get("namespace") == namespace), None)
        if workload is None:
            problems.append(f"Service {namespace}/{name}: no Deployment/DaemonSet/StatefulSet of that name in the layer")
            continue

        def ready_pods():
            pods = [p for p in _items(cluster, "pods", "-n", namespace)
                    if _owned_by(p, workload, _items(cluster, "replicasets", "-n", namespace))]
            ready = [p for p in pods if any(c["type"] == "Ready" and c["status"] == "True"
                                            for c in p.get("status", {}).get("conditions", []))]
            return ready if pods and len(ready) == len(pods) else None

        try:
            pods = wait_for(ready_pods, f"{workload['kind']} {namespace}/{name} pods Ready", timeout_s=120)
        except TimeoutError as error:
            states = [(p["metadata"]["name"], p.get("status", {}).get("conditions"))
                      for p in _items(cluster, "pods", "-n", namespace)]
            problems.append(f"Service {namespace}/{name}: {error}; pods: {states}")
            continue
        expected_ips = {p["status"]["podIP"] for p in pods}

        def slice_endpoints():
            slices = _items(cluster, "endpointslices", "-n", namespace, "-l", f"kubernetes.io/service-name={name}")
            endpoints = [e for s in slices for e in s.get("endpoints") or []]
            ips = {a for e in endpoints if (e.get("conditions") or {}).get("ready") for a in e["addresses"]}
            return (slices, endpoints) if ips == expected_ips else None

        try:
            slices, endpoints = wait_for(slice_endpoints, f"EndpointSlices of {namespace}/{name}", timeout_s=60)
        except TimeoutError:
            slices = _items(cluster, "endpointslices", "-n", namespace, "-l", f"kubernetes.io/service-name={name}")
            problems.append(f"Service {namespace}/{name} selector {service['spec'].get('selector')}: EndpointSlices "
                            f"{[s.get('endpoints') for s in slices]}, expected the Ready pods {sorted(expected_ips)} "
                            f"of {workload['kind']} {name} (labels {pods[0]['metadata'].get('labels')})")
            continue
        refs = {e.get("targetRef", {}).get("name") for e in endpoints}
        if refs != {p["metadata"]["name"] for p in pods}:
            problems.append(f"Service {namespace}/{name}: endpoints {sorted(refs)} are not the workload's pods")
        slice_ports = {(p.get("name") or "", p.get("port")) for s in slices for p in s.get("ports") or []}
        for port in service["spec"].get("ports", []):
            want = (port.get("name") or "", _container_port(pods[0], port.get("targetPort", port["port"])))
            if want not in slice_ports:
                problems.append(f"Service {namespace}/{name} port {port}: not resolved in its EndpointSlices "
                                f"(they list {sorted(slice_ports)}; the pod's container ports: "
                                f"{[c.get('ports') for c in pods[0]['spec']['containers']]})")
    assert not problems, "\n".join(problems)


# -- ServiceMonitors ------------------------------------------------------------------------------
def test_every_service_monitor_selects_a_service_with_its_port(with_chart_services):
    """Each ServiceMonitor of the layer, evaluated by the API server against the Services the
    layer applies and the ones the stack's charts and operators create (chart_services.py).
    aws-readiness-4 R3: in prod (gpu-operator mode) the DCGM monitor selected
    ``app.kubernetes.io/name: dcgm-exporter``, which only the standalone chart sets."""
    cluster, _, unknown = with_chart_services
    monitors = cluster.layer.of_kind("ServiceMonitor")
    assert monitors, f"{cluster.stack}: the layer declares no ServiceMonitor"
    problems = []
    for monitor in monitors:
        meta = monitor["metadata"]
        where = f"ServiceMonitor {meta['namespace']}/{meta['name']}"
        selector = label_selector(monitor["spec"]["selector"])
        namespaces = monitor_namespaces(cluster, monitor)
        selected = [s for n in namespaces for s in _items(cluster, "services", "-n", n, "-l", selector)]
        if not selected:
            problems.append(f"{where}: selector {selector!r} in {namespaces} selects no Service; labels present: "
                            f"{_labels_present(cluster, 'services', namespaces)} (charts with no Service builder: "
                            f"{unknown or 'none'})")
            continue
        ports = [e["port"] for e in monitor["spec"].get("endpoints", []) if e.get("port")]
        if ports and not any(set(ports) <= {p.get("name") for p in s["spec"].get("ports", [])} for s in selected):
            problems.append(f"{where}: the Services it selects ("
                            + ", ".join(f"{s['metadata']['name']} ports {[p.get('name') for p in s['spec']['ports']]}"
                                        for s in selected) + f") have no port named {ports}")
    assert not problems, "\n".join(problems)


# -- PodMonitors ----------------------------------------------------------------------------------
EXAMPLE = {"dev": "examples/jobs/l4-dev-smoke.yaml", "prod": "examples/jobs/gpt2-pretrain.yaml"}
TRAINING_OPERATOR_SA = "system:serviceaccount:kubeflow:training-operator"


def _submit(cluster, namespace: str, runtime: str, suffix: str) -> dict[str, Any]:
    """A team member of ``namespace`` submits the stack's example job with ``JobClient`` (as in
    test_job_client_live.py), two nodes so that rank 0 and another rank exist; the stored object."""
    import os
    from pathlib import Path

    from jobs.client import JobClient
    from jobs.kube import KubectlApi
    from tools.cluster.controlplane import tool_path
    from workloads.tenancy import team_group

    root = Path(__file__).resolve().parents[2]
    raw = yaml.safe_load((root / EXAMPLE[cluster.stack]).read_text())
    team = namespace.removeprefix("team-")
    raw["trainer"]["overrides"] = [o.replace(f"team-{raw['team']}.", f"{namespace}.") for o in raw["trainer"].get("overrides", [])]
    if team != raw["team"]:
        raw.pop("priority", None)  # a priority class is a per-team entitlement; the team's default
    raw.update({"team": team, "name": f"sel-{suffix}", "nodes": 2, "runtime": runtime})
    kubeconfig = cluster.plane.kubeconfig(f"selectors@{namespace}", [team_group(namespace)])
    client = JobClient(cluster.stack, kube=KubectlApi(
        kubectl=str(tool_path("kubectl")),
        environ={"KUBECONFIG": str(kubeconfig), "PATH": os.environ.get("PATH", ""), "HOME": str(cluster.plane.workdir)}))
    submitted = client.submit(client.load(raw))
    kind = "pytorchjobs.kubeflow.org" if runtime == "pytorchjob" else "trainjobs.trainer.kubeflow.org"
    stored = json.loads(cluster.kubectl("get", kind, submitted.job.name, "-n", namespace, "-o", "json").stdout)
    if runtime == "pytorchjob":
        # The pods are then made from the stored object as the operator makes them. Where the real
        # Kueue and Training Operator run in this session (test_job_lifecycle_live.py), the job
        # waits suspended and the operator deletes every pod of a suspended job it owns or can
        # adopt: the job goes first, so nothing reconciles the pods made from it.
        cluster.kubectl("delete", kind, submitted.job.name, "-n", namespace, "--wait=true")
    return stored


def pytorchjob_pods(cluster, job: dict[str, Any]) -> list[dict[str, Any]]:
    """The pods the Training Operator v1.9.4 creates for a PyTorchJob, created with its own
    service account (RBAC and admission as the operator meets them). pkg/controller.v1/common/pod.go
    ``createNewPod``::

        labels := jc.GenLabels(metaObject.GetName())
        utillabels.SetReplicaType(labels, rt)
        utillabels.SetReplicaIndex(labels, index)
        if masterRole { utillabels.SetJobRole(labels, "master") }
        podTemplate := spec.Template.DeepCopy()
        podTemplate.Name = GenGeneralName(metaObject.GetName(), rt, idxStr)
        ...
        for key, value := range labels { podTemplate.Labels[key] = value }

    ``GenLabels`` (common/job_controller.go): ``training.kubeflow.org/operator-name:
    pytorchjob-controller``, ``training.kubeflow.org/job-name``; ``rt`` is the lower-cased replica
    type; the pod keeps the template's ports. (``SetClusterSpec`` adds env and an init container,
    neither a label nor a port.)"""
    pods = []
    for rtype, replica in job["spec"]["pytorchReplicaSpecs"].items():
        rt = rtype.lower()
        for index in range(replica.get("replicas", 1)):
            template = copy.deepcopy(replica["template"])
            labels = {"training.kubeflow.org/operator-name": "pytorchjob-controller",
                      "training.kubeflow.org/job-name": job["metadata"]["name"],
                      "training.kubeflow.org/replica-type": rt, "training.kubeflow.org/replica-index": str(index)}
            if rtype == "Master":
                labels["training.kubeflow.org/job-role"] = "master"
            template["metadata"]["labels"] = {**(template["metadata"].get("labels") or {}), **labels}
            pod = {"apiVersion": "v1", "kind": "Pod",
                   # No owner: the job is gone (``_submit``), and the garbage collector would delete
                   # pods owned by it; selection depends on labels alone.
                   "metadata": {**template["metadata"], "name": f"{job['metadata']['name']}-{rt}-{index}",
                                "namespace": job["metadata"]["namespace"]},
                   "spec": {**template["spec"], "restartPolicy": "Never"}}
            cluster.kubectl("create", f"--as={TRAINING_OPERATOR_SA}", "-f", "-", input=json.dumps(pod))
            pods.append(pod)
    return pods


def trainjob_pods(cluster, trainjob: dict[str, Any]) -> list[dict[str, Any]]:
    """The pods of a TrainJob, created by the real Job controller from the Job that JobSet creates.

    Kubeflow Trainer v2.3.0 builds the JobSet from the ClusterTrainingRuntime (the one in this
    stack's layer) with the TrainJob's ``runtimePatches`` merged in
    (pkg/runtime/core/trainingruntime.go ``mergeRuntimePatches``: ``strategicpatch.StrategicMergePatch``
    of ``runtimePatch.TrainingRuntimeSpec.Template.Spec`` into the JobSet spec; replicatedJobs
    merge by name), the trainer's image/command/args/env/resources on the ``node`` container and
    ``numNodes`` as the Job's completions and parallelism (torch plugin). JobSet v0.12.0 defaults
    ``completionMode: Indexed`` (pkg/webhooks/jobset_webhook.go: "Default job completion mode to
    indexed") and names the Job ``<jobset>-<replicatedJob>-<index>``. The Job controller then
    labels each pod ``batch.kubernetes.io/job-completion-index`` (kubernetes v1.32
    pkg/controller/job/indexed_job_utils.go ``addCompletionIndexLabel``), which the PodMonitor uses."""
    runtime_ref = trainjob["spec"]["runtimeRef"]["name"]
    runtime = next(r for r in cluster.layer.of_kind("ClusterTrainingRuntime") if r["metadata"]["name"] == runtime_ref)
    replicated = copy.deepcopy(runtime["spec"]["template"]["spec"]["replicatedJobs"])
    for patch in trainjob["spec"].get("runtimePatches", []):
        for patched in ((patch.get("trainingRuntimeSpec") or {}).get("template", {}).get("spec", {}).get("replicatedJobs") or []):
            for rjob in replicated:
                if rjob["name"] != patched["name"]:
                    continue
                pod_patch = patched.get("template", {}).get("spec", {}).get("template", {})
                pod = rjob["template"]["spec"]["template"]
                pod.setdefault("metadata", {}).setdefault("labels", {}).update(pod_patch.get("metadata", {}).get("labels", {}))
                pod["metadata"].setdefault("annotations", {}).update(pod_patch.get("metadata", {}).get("annotations", {}))
                for key, value in pod_patch.get("spec", {}).items():
                    if key == "containers":
                        for container in value:
                            mine = next(c for c in pod["spec"]["containers"] if c["name"] == container["name"])
                            mine.update(container)
                    else:
                        pod["spec"][key] = value
    trainer = trainjob["spec"]["trainer"]
    pods = []
    for rjob in replicated:
        pod = rjob["template"]["spec"]["template"]
        node = next(c for c in pod["spec"]["containers"] if c["name"] == "node")
        node.update({k: trainer[k] for k in ("image", "command", "args", "env") if k in trainer})
        node["resources"] = trainer.get("resourcesPerNode", {})
        nodes = trainer.get("numNodes", 1)
        name = f"{trainjob['metadata']['name']}-{rjob['name']}-0"
        job = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": name, "namespace": trainjob["metadata"]["namespace"],
                            "labels": rjob["template"].get("metadata", {}).get("labels", {})},
               "spec": {**rjob["template"]["spec"], "completionMode": "Indexed", "completions": nodes,
                        "parallelism": nodes, "template": pod}}
        cluster.kubectl("create", "-f", "-", input=json.dumps(job))

        def created():
            found = _items(cluster, "pods", "-n", job["metadata"]["namespace"], "-l", f"batch.kubernetes.io/job-name={name}")
            return found if len(found) == nodes else None

        try:
            pods.extend(wait_for(created, f"the Job controller creates {nodes} pods for {name}", timeout_s=60))
        except TimeoutError as error:
            events = cluster.kubectl("get", "events", "-n", job["metadata"]["namespace"],
                                     "--field-selector", f"involvedObject.name={name}", check=False).stdout
            raise AssertionError(f"{error}\n{events}") from None
    return pods


def test_every_pod_monitor_selects_rank_zero_of_a_teams_job(stack_cluster):
    """Each PodMonitor (one per team namespace and job kind) against the pods a team's job gets:
    the team submits the example job (two nodes) with ``JobClient``; its pods are created as the
    controllers create them (``pytorchjob_pods``, ``trainjob_pods``). The API server evaluates the
    monitor's selector in its namespaces; it must select exactly rank 0 (the only rank serving
    the trainer's metrics: trainer/health.py) and, where the endpoint names a port, rank 0's pod
    must declare it."""
    cluster = stack_cluster
    monitors = cluster.layer.of_kind("PodMonitor")
    assert monitors, f"{cluster.stack}: the layer declares no PodMonitor"
    problems, jobs = [], {}
    trainer_v2 = bool(cluster.layer.of_kind("ClusterTrainingRuntime"))
    for monitor in monitors:
        meta = monitor["metadata"]
        where = f"PodMonitor {meta['namespace']}/{meta['name']}"
        runtime = "trainjob" if meta["name"].endswith("-trainjob") else "pytorchjob"
        if runtime == "trainjob" and not trainer_v2:
            # No team can submit a TrainJob here (JobClient: "Trainer v2 is not installed"). Both
            # stacks once declared these without Trainer v2; they are declared only with it now.
            problems.append(f"{where} selects nothing: Trainer v2 is not installed in this stack, so no TrainJob "
                            "pod can exist (declare it only with training.trainerV2)")
            continue
        namespace = meta["namespace"]
        key = (namespace, runtime)
        if key not in jobs:
            job = _submit(cluster, namespace, runtime, f"{runtime}")
            jobs[key] = pytorchjob_pods(cluster, job) if runtime == "pytorchjob" else trainjob_pods(cluster, job)
        created = {p["metadata"]["name"] for p in jobs[key]}
        selector = label_selector(monitor["spec"]["selector"])
        namespaces = monitor_namespaces(cluster, monitor)
        selected = [p for n in namespaces for p in _items(cluster, "pods", "-n", n, "-l", selector)
                    if p["metadata"]["name"] in created]
        rank_zero = [p for p in selected if p["metadata"]["labels"].get("training.kubeflow.org/replica-type") == "master"
                     or p["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index") == "0"]
        if not selected:
            problems.append(f"{where}: selector {selector!r} in {namespaces} selects none of the {runtime} pods "
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
