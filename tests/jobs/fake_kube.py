"""An in-memory Kubernetes API for the job client's tests (there is no cluster here).

What it does as the API server does:
- every object created or patched is validated against the pinned upstream schema of its kind
  (CRDs under $ML_PLATFORM_SCHEMAS or `make schemas`' cache, via tests.support.validation; built-in kinds against the
  Kubernetes OpenAPI schema), and refused with the errors (HTTP 422 "Invalid") otherwise;
- label selectors follow the Kubernetes grammar (k8s.io/apimachinery pkg/labels/selector.go:
  ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``, ``a``, ``!a``; requirements ANDed);
- a JSON merge patch (RFC 7386) is applied, then the result validated;
- deletion: ``Foreground`` keeps the owner (deletionTimestamp, finalizer ``foregroundDeletion``)
  until its dependents (ownerReferences) are gone; ``Background`` removes the owner at once.
  Dependents are deleted gracefully: a pod gets a deletionTimestamp and keeps running for its
  ``terminationGracePeriodSeconds`` (recorded in ``graceful_deletions``) until the test, in the
  kubelet's seat, ends it with ``terminate(pod, exit_code)``.

It also backs the fake ``kubectl`` executable (``fake_kubectl.py``): ``save``/``load`` keep the
state in a JSON file between invocations.
"""
from __future__ import annotations

import copy
import itertools
import json
import re
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from jobs.kube import KubeError
from tools import schemas
from tests.support.validation import validate_core, validate_custom_resource

PROJECT_DIR = Path(__file__).resolve().parents[2]

# kubectl resource name -> (apiVersion, kind, namespaced, validated)
RESOURCES = {
    "pytorchjobs.kubeflow.org": ("kubeflow.org/v1", "PyTorchJob", True, True),
    "trainjobs.trainer.kubeflow.org": ("trainer.kubeflow.org/v1alpha1", "TrainJob", True, True),
    # Kueue's Workload CRD is not among the pinned schemas: the client only reads Workloads.
    "workloads.kueue.x-k8s.io": ("kueue.x-k8s.io/v1beta2", "Workload", True, False),
    "pods": ("v1", "Pod", True, True),
    "jobs.batch": ("batch/v1", "Job", True, True),  # the in-cluster restore drill
    "nodes": ("v1", "Node", False, True),
    "localqueues.kueue.x-k8s.io": ("kueue.x-k8s.io/v1beta2", "LocalQueue", True, True),
    "configmaps": ("v1", "ConfigMap", True, True),  # the client's job history records
    "secrets": ("v1", "Secret", True, True),  # a dev pod's notebook token
    "namespaces": ("v1", "Namespace", False, True),
    # The platform's run records: the recorder writes them (workloads/run_recorder.py, its CRD's schema
    # is checked in tests/workloads/test_run_recorder.py and by the real API server in tests/cluster).
    "runrecords.mlplatform.io": ("mlplatform.io/v1alpha1", "RunRecord", True, False),
}
CORE_APIS = ("batch/v1",)  # built-in groups: validated against the Kubernetes OpenAPI schema
KIND_TO_RESOURCE = {(api, kind): name for name, (api, kind, _, _) in RESOURCES.items()}
_uids = itertools.count(1)


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- label selectors (k8s.io/apimachinery/pkg/labels) --------------------------------------
_REQ = re.compile(r"^\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9./_-]+)\s*(?:(?P<op>==|=|!=|\s+in\s+|\s+notin\s+)\s*(?P<val>.*?))?\s*$")


def _split_requirements(selector: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in selector:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [p for p in parts + [current] if p.strip()]


def selector_matches(selector: Optional[str], labels: dict[str, str]) -> bool:
    if not selector:
        return True
    for requirement in _split_requirements(selector):
        m = _REQ.match(requirement)
        if not m:
            raise KubeError(f"unable to parse requirement: {requirement!r}")
        key, op, value = m.group("key"), (m.group("op") or "").strip(), (m.group("val") or "").strip()
        if m.group("neg"):
            if op or key in labels:
                return False if not op else _bad(requirement)
            continue
        if not op:
            if key not in labels:
                return False
        elif op in ("=", "=="):
            if labels.get(key) != value:
                return False
        elif op == "!=":
            if labels.get(key) == value:  # a missing key matches != (selector.go NotEquals)
                return False
        else:
            if not (value.startswith("(") and value.endswith(")")):
                _bad(requirement)
            values = {v.strip() for v in value[1:-1].split(",") if v.strip()}
            if op == "in" and labels.get(key) not in values:
                return False
            if op == "notin" and key in labels and labels[key] in values:
                return False
    return True


def _bad(requirement: str) -> bool:
    raise KubeError(f"unable to parse requirement: {requirement!r}")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class FakeKubeApi:
    """``jobs.kube.KubeApi`` in memory."""

    def __init__(self, schemas_dir: Optional[str] = None):
        # The fake kubectl runs as a subprocess: it finds the schemas the way the tests do, so a CI
        # run that fetched them with `make schemas` (no ML_PLATFORM_SCHEMAS) works too.
        self.schemas_dir = schemas_dir or str(schemas.schemas_dir(PROJECT_DIR))
        self.objects: dict[tuple[str, str, str], dict] = {}  # (resource, namespace, name)
        self.pod_logs: dict[str, list[str]] = {}  # pod uid -> lines
        self.requests: list[tuple] = []  # every call, for assertions
        self.graceful_deletions: list[tuple[str, int]] = []  # (pod, grace seconds)
        self.on_stream_end: list[Callable[[dict], None]] = []
        # Who the caller is (kubectl auth whoami): an admin unless a test says otherwise.
        self.user, self.groups = "kubernetes-admin", ("system:masters", "system:authenticated")

    # -- state ---------------------------------------------------------------------------
    @staticmethod
    def resource_of(obj: dict) -> str:
        try:
            return KIND_TO_RESOURCE[(obj["apiVersion"], obj["kind"])]
        except KeyError:
            raise KubeError(f'no matches for kind "{obj.get("kind")}" in version "{obj.get("apiVersion")}"') from None

    def validate(self, resource: str, obj: dict) -> None:
        _, _, _, validated = RESOURCES[resource]
        if not validated:
            return
        if "/" in obj["apiVersion"] and obj["apiVersion"] not in CORE_APIS:
            body = {k: v for k, v in obj.items()}
            errors = validate_custom_resource(body, self.schemas_dir)
        else:
            body = copy.deepcopy(obj)
            body["metadata"] = {k: v for k, v in body["metadata"].items()
                                if k not in ("deletionTimestamp", "deletionGracePeriodSeconds")}
            errors = validate_core(body)
        if errors:
            raise KubeError(f'The {obj["kind"]} "{obj["metadata"].get("name")}" is invalid: {"; ".join(errors)}')

    def add(self, obj: dict, *, validate: bool = True, logs: Optional[list[str]] = None) -> dict:
        """Put an object in the cluster as a controller would (validated like a create)."""
        resource = self.resource_of(obj)
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        # Unique across the fake kubectl's processes too (each starts a fresh counter), as the API
        # server's UUIDs are.
        meta.setdefault("uid", f"uid-{next(_uids)}-{uuid.uuid4().hex[:8]}")
        meta.setdefault("creationTimestamp", now())
        if validate:
            self.validate(resource, obj)
        self.objects[(resource, meta.get("namespace", ""), meta["name"])] = obj
        if logs is not None:
            self.pod_logs[meta["uid"]] = list(logs)
        return obj

    def find(self, resource: str, name: str, namespace: Optional[str] = None) -> Optional[dict]:
        return self.objects.get((resource, namespace or "", name))

    def save(self, path: Path) -> None:
        partial = Path(f"{path}.partial")
        partial.write_text(json.dumps({"objects": [[list(k), v] for k, v in self.objects.items()],
                                          "logs": self.pod_logs, "graceful": self.graceful_deletions,
                                          "requests": self.requests}))
        partial.replace(path)

    @classmethod
    def load(cls, path: Path) -> "FakeKubeApi":
        api = cls()
        data = json.loads(Path(path).read_text())
        api.objects = {tuple(k): v for k, v in data["objects"]}
        api.pod_logs = data["logs"]
        api.graceful_deletions = [tuple(x) for x in data["graceful"]]
        api.requests = [tuple(x) for x in data["requests"]]
        return api

    # -- KubeApi -------------------------------------------------------------------------
    def whoami(self):
        self.requests.append(("whoami",))
        return {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview",
                "status": {"userInfo": {"username": self.user, "groups": list(self.groups)}}}

    def get(self, resource, name, namespace=None):
        self.requests.append(("get", resource, namespace, name))
        obj = self.find(resource, name, namespace)
        return copy.deepcopy(obj) if obj else None

    def list(self, resource, namespace=None, selector=None):
        self.requests.append(("list", resource, namespace, selector))
        if resource not in RESOURCES:
            raise KubeError(f'the server doesn\'t have a resource type "{resource}"')
        return [copy.deepcopy(o) for (r, ns, _), o in sorted(self.objects.items())
                if r == resource and (namespace is None or ns == namespace)
                and selector_matches(selector, (o["metadata"].get("labels") or {}))]

    def apply(self, obj):
        self.requests.append(("apply", obj.get("kind"), obj.get("metadata", {}).get("name")))
        resource = self.resource_of(obj)
        key = (resource, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        existing = self.objects.get(key)
        merged = copy.deepcopy(obj)
        if existing:
            merged["metadata"] = {**existing["metadata"], **obj["metadata"]}
            if "status" in existing:
                merged["status"] = existing["status"]
        self.validate(resource, merged)
        return self.add(merged, validate=False)

    def create(self, obj):
        """POST: 409 AlreadyExists for a taken name (also while it is being deleted)."""
        from jobs.kube import AlreadyExists

        self.requests.append(("create", obj.get("kind"), obj.get("metadata", {}).get("name")))
        resource = self.resource_of(obj)
        meta = obj.get("metadata", {})
        if self.find(resource, meta["name"], meta.get("namespace")):
            raise AlreadyExists(f'{resource} "{meta["name"]}" already exists')
        self.validate(resource, obj)
        return self.add(obj, validate=False)

    def patch(self, resource, name, namespace, patch):
        self.requests.append(("patch", resource, namespace, name, json.dumps(patch, sort_keys=True)))
        obj = self.find(resource, name, namespace)
        if obj is None:
            raise KubeError(f'{resource} "{name}" not found')
        patched = merge_patch(obj, patch)
        self.validate(resource, patched)
        self.objects[(resource, namespace, name)] = patched
        return copy.deepcopy(patched)

    def delete(self, resource, name, namespace, *, propagation="Foreground"):
        self.requests.append(("delete", resource, namespace, name, propagation))
        obj = self.find(resource, name, namespace)
        if obj is None:
            raise KubeError(f'{resource} "{name}" not found')
        self._delete(resource, obj, propagation)

    def _dependents(self, owner: dict) -> list[tuple[str, dict]]:
        uid = owner["metadata"]["uid"]
        return [(r, o) for (r, _, _), o in list(self.objects.items())
                if any(ref.get("uid") == uid for ref in o["metadata"].get("ownerReferences") or [])]

    def _delete(self, resource: str, obj: dict, propagation: str) -> None:
        meta = obj["metadata"]
        if meta.get("deletionTimestamp"):
            return
        if resource == "pods":
            grace = obj["spec"].get("terminationGracePeriodSeconds", 30)
            meta["deletionTimestamp"], meta["deletionGracePeriodSeconds"] = now(), grace
            self.graceful_deletions.append((meta["name"], grace))
            return  # the kubelet (the test) ends it
        dependents = self._dependents(obj)
        if propagation == "Foreground" and dependents:
            meta["deletionTimestamp"] = now()
            meta["finalizers"] = [*(meta.get("finalizers") or []), "foregroundDeletion"]
        else:
            self._remove(resource, obj)
        for dep_resource, dep in dependents:
            self._delete(dep_resource, dep, "Background")

    def _remove(self, resource: str, obj: dict) -> None:
        self.objects.pop((resource, obj["metadata"].get("namespace", ""), obj["metadata"]["name"]), None)
        self._collect()

    def _collect(self) -> None:
        """The garbage collector: an owner waiting on foregroundDeletion goes once its
        dependents are gone."""
        for (resource, _, _), obj in list(self.objects.items()):
            meta = obj["metadata"]
            if "foregroundDeletion" in (meta.get("finalizers") or []) and not self._dependents(obj):
                self._remove(resource, obj)

    def terminate(self, pod_name: str, namespace: str, exit_code: int, *, container: str = "pytorch") -> None:
        """The kubelet's seat: the container exited; a pod being deleted goes away."""
        pod = self.objects[("pods", namespace, pod_name)]
        pod["status"] = {**pod.get("status", {}), "phase": "Succeeded" if exit_code == 0 else "Failed",
                         "containerStatuses": [{"name": container, "ready": False, "restartCount": 0,
                                                "image": "x", "imageID": "", "state": {"terminated": {
                                                    "exitCode": exit_code, "startedAt": now(), "finishedAt": now()}}}]}
        if pod["metadata"].get("deletionTimestamp"):
            self._remove("pods", pod)

    def logs(self, pod, namespace, container, *, follow=False):
        self.requests.append(("logs", pod, namespace, container, follow))
        obj = self.find("pods", pod, namespace)
        if obj is None:
            raise KubeError(f'pods "{pod}" not found')
        names = [c["name"] for c in obj["spec"]["containers"]]
        if container not in names:
            raise KubeError(f"container {container} is not valid for pod {pod}")
        return self._stream(obj)

    def _stream(self, obj: dict) -> Iterator[str]:
        yield from self.pod_logs.get(obj["metadata"]["uid"], [])
        for hook in self.on_stream_end:
            hook(obj)
