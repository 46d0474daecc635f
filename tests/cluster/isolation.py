"""Per-test isolation on a shared stack cluster: a name prefix per test and a finalizer.

Starting a control plane and a stack's controllers takes minutes, so a stack's tests share one
cluster (as envtest suites share one API server). What keeps them independent is what envtest
suites get from a namespace per test and ``DeferCleanup``: every job, pod or object a test creates
carries the test's prefix (``scope.name("life")`` -> ``t3f9a1-life``), and when the test ends,
passed or failed, everything with that prefix is deleted and waited for, so the next test starts
from the stack as installed, whichever order the tests run in.
"""
from __future__ import annotations

import hashlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from tools.cluster.api import ApiError, eventually

# What a test may leave behind in a namespace, by API path (namespaced collections).
SCOPED_COLLECTIONS = (
    "/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs",
    "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs",
    "/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets",
    "/apis/batch/v1/namespaces/{ns}/jobs",
    "/api/v1/namespaces/{ns}/pods",
    "/api/v1/namespaces/{ns}/configmaps",
    "/api/v1/namespaces/{ns}/services",
)
CLEANUP_S = 180


@dataclass
class Scope:
    cluster: object
    prefix: str
    namespaces: set[str] = field(default_factory=set)

    @classmethod
    @contextmanager
    def for_test(cls, cluster, test_id: str) -> Iterator["Scope"]:
        scope = cls(cluster, "t" + hashlib.sha1(test_id.encode()).hexdigest()[:5])
        scope.namespaces = {n["metadata"]["name"] for n in cluster.layer.namespaces} | {"default"}
        try:
            yield scope
        finally:
            scope.cleanup()

    def name(self, base: str) -> str:
        return f"{self.prefix}-{base}"

    def owns(self, name: str) -> bool:
        return f"{self.prefix}-" in name  # the job, its pods, and what the client names after it (verify-<job>)

    def leftovers(self) -> list[str]:
        api = self.cluster.api
        found = []
        for namespace in sorted(self.namespaces):
            for template in SCOPED_COLLECTIONS:
                path = template.format(ns=namespace)
                try:
                    items = api.get(path)["items"]
                except ApiError:
                    continue  # a kind this stack does not install
                found += [f"{path}/{i['metadata']['name']}" for i in items if self.owns(i["metadata"]["name"])]
        return found

    def cleanup(self) -> None:
        api = self.cluster.api
        for path in self.leftovers():
            api.delete(path, {"propagationPolicy": "Background", "gracePeriodSeconds": 0})
        eventually(lambda: not self.leftovers(), f"the objects of test scope {self.prefix} gone", CLEANUP_S,
                   interval_s=1, diagnose=lambda: "\n".join(self.leftovers()))
