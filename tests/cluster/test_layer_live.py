"""Each stack's in-cluster layer, as the program declares it, is accepted by the real API server, and
every webhook and aggregated API it declares is answered by its real controller through its own
Service, or named as not served here with the reason."""
from __future__ import annotations

import json
import re
from collections import defaultdict

from tools.cluster.api import eventually
from tools.cluster.layer import image_repository, serving_container, service_calls
from tools.cluster.nodes import runnable_images

# A warning all of whose errors name only these fields (see the test's docstring).
CHECKER_LIMITATION = re.compile(r"^(?!.*ERROR: <input>:\d+:\d+: (?!undefined field '(requests|limits)')).*$", re.S)


def test_every_object_of_the_layer_is_stored(stack_cluster):
    """Server-side apply already refused an invalid object; here every object is read back, one
    list per kind and namespace."""
    wanted = defaultdict(set)
    for obj in stack_cluster.layer.namespaces + stack_cluster.layer.objects:
        group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
        resource = f"{obj['kind'].lower()}.{group}" if group else obj["kind"].lower()
        wanted[(resource, obj["metadata"].get("namespace"))].add(obj["metadata"]["name"])
    missing = []
    for (resource, namespace), names in sorted(wanted.items(), key=str):
        args = ["get", resource, "-o", "jsonpath={.items[*].metadata.name}"]
        args += ["-n", namespace] if namespace else []
        stored = set(stack_cluster.kubectl(*args).stdout.split())
        missing += [f"{resource} {namespace or ''}/{n}" for n in sorted(names - stored)]
    assert not missing, missing


def test_the_admission_policies_type_check_against_the_real_schemas(stack_cluster):
    """kube-apiserver type-checks each policy's CEL against the OpenAPI schema of what it matches
    and reports problems in ``status.typeChecking.expressionWarnings`` (k8s.io/apiserver
    pkg/admission/plugin/policy/validating/typechecking.go); a field name that does not exist on
    the matched kind would be a policy that never refuses anything.

    One class of warning is the checker's, not the policy's: it reports ``undefined field
    'requests'`` / ``'limits'`` on a container's ``resources`` (ResourceRequirements' maps of
    Quantity, whose schema the checker does not turn into a CEL type), while at run time those
    fields are read and the GPU rules refuse what they must (test_tenant_attacks_live.py,
    test_admission_cases_live.py). Those are set aside by their exact text; anything else fails.
    (The first run of this test found a real one: ``containers + initContainers`` has no ``_+_``
    overload for two differently typed lists; workloads/tenancy.py now checks each list.)"""
    api = stack_cluster.api
    names = [p["metadata"]["name"] for p in stack_cluster.layer.of_kind("ValidatingAdmissionPolicy")]
    assert names

    def checked():
        policies = {p["metadata"]["name"]: p for p in
                    api.get("/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies")["items"]}
        done = {n: policies[n] for n in names if n in policies
                and policies[n].get("status", {}).get("observedGeneration") == policies[n]["metadata"]["generation"]
                and "typeChecking" in policies[n].get("status", {})}
        return done if len(done) == len(names) else None

    policies = eventually(checked, "every policy type-checked", 60, interval_s=1)
    warnings = {name: found for name, policy in policies.items()
                if (found := [w for w in policy["status"]["typeChecking"].get("expressionWarnings", [])
                              if not CHECKER_LIMITATION.search(w["warning"])])}
    assert not warnings, json.dumps(warnings, indent=1)


def test_every_service_the_api_server_calls_is_served_by_its_controller_or_set_aside(stack_cluster):
    """kube-apiserver (``--enable-aggregator-routing``) calls each admission webhook, aggregated
    API and conversion webhook at the endpoints of the Service it names. For each one the stack
    declares: if a controller built here backs that Service on the called port, the object is
    applied as declared and its Service has a ready endpoint that is that controller's pod (a
    process the kubelet runs); otherwise it is set aside and the reason names the image behind the
    Service, which must be one nothing here runs."""
    cluster = stack_cluster
    runnable = runnable_images()
    everything = cluster.layer.objects
    problems, served = [], []
    for obj in cluster.layer.crds + cluster.layer.objects:
        for what, ref in service_calls(obj):
            image, why = serving_container(ref, everything, runnable)
            if image is None:
                problems.append(f"{what} is applied, but {why}")
                continue
            endpoints = cluster.api.get_or_none(f"/api/v1/namespaces/{ref['namespace']}/endpoints/{ref['name']}") or {}
            ready = [a for s in endpoints.get("subsets") or [] for a in s.get("addresses") or []]
            pods = [a.get("targetRef", {}).get("name") for a in ready]
            running = [p for p in pods if p and _runs_a_process(cluster, ref["namespace"], p)]
            if not running:
                problems.append(f"{what}: Service {ref['namespace']}/{ref['name']} has no ready endpoint run by "
                                f"{image_repository(image)} (endpoints: {pods})")
            served.append(what)
    for obj, why in cluster.layer.set_aside:
        backing = re.findall(r"backed by (\S+?),? whose", why)
        if not backing and "URL" not in why and "not in the layer" not in why:
            problems.append(f"{obj['kind']} {obj['metadata']['name']} set aside without naming what backs it: {why}")
        for image in ", ".join(backing).split(", ") if backing else []:
            if image and image_repository(image) in runnable:
                problems.append(f"{obj['kind']} {obj['metadata']['name']} set aside, but {image} runs here: {why}")
    assert served, f"{cluster.stack}: no webhook or aggregated API is served here"
    assert not problems, "\n".join(problems)


def _runs_a_process(cluster, namespace: str, pod: str) -> bool:
    """The kubelet runs a process for the pod (its container log exists), not a simulation."""
    logs = cluster.plane.workdir / "kubelet" / "logs"
    return any(logs.glob(f"{namespace}_{pod}_*.log"))


def test_kueues_job_webhooks_act_in_team_namespaces_only(stack_cluster):
    """The chart renders Kueue's job webhooks with the stack's ``managedJobsNamespaceSelector``
    (kueue chart 0.19.2 templates/webhook/manifests.yaml), and the real Kueue answers through
    ``kueue-webhook-service``: a Job created in a team namespace is suspended by ``mjob.kb.io``
    (Kueue's ``ApplyDefaultForSuspend``: a managed Job starts suspended until admitted); the same
    Job in a namespace outside the selector is left alone. A server-side dry run goes through
    the whole admission chain and stores nothing."""
    cluster = stack_cluster
    config = __import__("yaml").safe_load(cluster.layer.helm_values["kueue"]["managerConfig"]["controllerManagerConfigYaml"])
    selector = config["managedJobsNamespaceSelector"]
    team = next(n["metadata"]["name"] for n in cluster.layer.namespaces
                if _matches(selector, n["metadata"].get("labels") or {}))
    outside = next(n["metadata"]["name"] for n in cluster.layer.namespaces
                   if not _matches(selector, n["metadata"].get("labels") or {}) and n["metadata"]["name"] != "kube-system")

    def dry_run(namespace: str) -> dict:
        labels = cluster.layer.find("Namespace", namespace)["metadata"].get("labels") or {}
        posix = int(labels.get("mlplatform.io/posix-id", 65534))
        job = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": "webhook-probe", "namespace": namespace,
                            # The team's queue, as the platform's policies require of a team's Job.
                            "labels": {"kueue.x-k8s.io/queue-name": labels["mlplatform.io/local-queue"]}
                            if "mlplatform.io/local-queue" in labels else {}},
               "spec": {"template": {"spec": {
                   "restartPolicy": "Never",
                   "securityContext": {"runAsNonRoot": True, "runAsUser": posix, "runAsGroup": posix, "fsGroup": posix,
                                       "seccompProfile": {"type": "RuntimeDefault"}},
                   "containers": [{"name": "c", "image": "busybox", "command": ["true"],
                                   "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                                                 "limits": {"cpu": "100m", "memory": "64Mi"}},
                                   "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                                       "readOnlyRootFilesystem": True}}]}}}}
        return cluster.api.request("POST", f"/apis/batch/v1/namespaces/{namespace}/jobs", job,
                                   query={"dryRun": "All"})

    assert dry_run(team)["spec"].get("suspend") is True, f"Kueue's webhook did not suspend a Job in {team}"
    assert not dry_run(outside)["spec"].get("suspend"), f"a Job in {outside} (outside {selector}) was suspended"


def _matches(selector: dict, labels: dict) -> bool:
    for expression in selector.get("matchExpressions") or []:
        key, op, values = expression["key"], expression["operator"], expression.get("values") or []
        if op == "Exists" and key not in labels or op == "DoesNotExist" and key in labels \
                or op == "In" and labels.get(key) not in values or op == "NotIn" and labels.get(key) in values:
            return False
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def test_kueues_visibility_api_is_served_by_kueue(stack_cluster):
    """The chart's APIServices ``v1beta1``/``v1beta2.visibility.kueue.x-k8s.io`` are answered by the
    real Kueue (``VisibilityOnDemand``, on by default in 0.19) through ``kueue-visibility-server``:
    the aggregator reports them Available and a ClusterQueue's pending workloads are listed."""
    cluster = stack_cluster
    services = eventually(lambda: [s for s in cluster.api.get("/apis/apiregistration.k8s.io/v1/apiservices")["items"]
                                   if s["metadata"]["name"].endswith("visibility.kueue.x-k8s.io")
                                   and any(c["type"] == "Available" and c["status"] == "True"
                                           for c in s.get("status", {}).get("conditions", []))],
                          "Kueue's visibility APIServices Available", 120, interval_s=2,
                          diagnose=lambda: cluster.kubectl("get", "apiservices", "-o", "wide").stdout)
    assert {s["metadata"]["name"] for s in services} >= {"v1beta2.visibility.kueue.x-k8s.io"}, services
    queue = cluster.layer.of_kind("ClusterQueue")[0]["metadata"]["name"]
    answer = cluster.api.get(f"/apis/visibility.kueue.x-k8s.io/v1beta2/clusterqueues/{queue}/pendingworkloads")
    assert answer.get("kind") == "PendingWorkloadsSummary", answer
