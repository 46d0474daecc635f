"""The Kubernetes API as the job client needs it: a small interface, and the production
implementation that shells out to ``kubectl ... -o json``.

kubectl, not a Python client: the platform's kubeconfig authenticates with EKS through an
``exec`` credential plugin (``aws eks get-token``), which kubectl runs and refreshes itself.
Every failure becomes one of two exceptions whose message is one line a person can act on
(``NoClusterAccess``: no kubectl, no kubeconfig, unreachable, unauthorised; ``KubeError``:
anything else the API refused); kubectl's own stderr is never shown raw.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Protocol, Sequence

# Resource names kubectl resolves without ambiguity (a bare `workloads` could be anything).
PYTORCHJOBS = "pytorchjobs.kubeflow.org"
TRAINJOBS = "trainjobs.trainer.kubeflow.org"
WORKLOADS = "workloads.kueue.x-k8s.io"
LOCALQUEUES = "localqueues.kueue.x-k8s.io"
PODS = "pods"
NODES = "nodes"
EVENTS = "events"
CONFIGMAPS = "configmaps"  # the job history records (jobs/client.py)
NAMESPACES = "namespaces"
JOBS = "jobs.batch"  # dev pods and the restore drill
SECRETS = "secrets"
RUNRECORDS = "runrecords.mlplatform.io"  # the platform's record of every run (workloads/run_records.py)


class NoClusterAccess(RuntimeError):
    """kubectl cannot reach or authenticate to the cluster (exit EXIT_NO_CLUSTER)."""


class KubeError(RuntimeError):
    """The API server refused a request for another reason."""


class AlreadyExists(KubeError):
    """A create found an object of that name (HTTP 409, reason AlreadyExists)."""


class Forbidden(NoClusterAccess):
    """The API server authenticated the caller and RBAC refused the request (HTTP 403)."""


class KubeApi(Protocol):
    """What the job client asks of a cluster. ``resource`` is a kubectl resource name above."""

    def get(self, resource: str, name: str, namespace: Optional[str] = None) -> Optional[dict[str, Any]]: ...

    def list(self, resource: str, namespace: Optional[str] = None, selector: Optional[str] = None) -> list[dict[str, Any]]:
        """``namespace=None``: every namespace the caller may read."""

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]: ...

    def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create, never update: ``AlreadyExists`` when the name is taken (the API server's
        409), so a second submit of a name can neither no-op nor patch a running job."""

    def patch(self, resource: str, name: str, namespace: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386)."""

    def delete(self, resource: str, name: str, namespace: str, *, propagation: str = "Foreground") -> None: ...

    def logs(self, pod: str, namespace: str, container: str, *, follow: bool = False) -> Iterator[str]:
        """The container's log lines; with ``follow`` until the container ends."""

    def whoami(self) -> dict[str, Any]:
        """The caller as the API server sees them: a SelfSubjectReview (authentication.k8s.io/v1)."""


def no_access_reason(environ: Optional[Mapping[str, str]] = None, kubeconfig: Optional[str] = None) -> Optional[str]:
    """Why kubectl cannot be used here, or None."""
    environ = os.environ if environ is None else environ
    if shutil.which("kubectl", path=environ.get("PATH")) is None:
        return "kubectl is not installed (https://kubernetes.io/docs/tasks/tools/)"
    if kubeconfig is not None:
        return None if Path(kubeconfig).is_file() else f"no kubeconfig at {kubeconfig}"
    paths = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p] or [str(Path.home() / ".kube" / "config")]
    if not any(Path(p).is_file() for p in paths):
        return "no kubeconfig (KUBECONFIG is unset or names no file)"
    return None


# What kubectl prints when the cluster cannot be reached or the login is refused; matched on
# its stderr so the user sees one sentence instead of kubectl's retries.
_UNREACHABLE = ("connection refused", "unable to connect to the server", "no such host", "i/o timeout",
                "the server has asked for the client to provide credentials", "unauthorized",
                "getting credentials: exec", "no configuration has been provided", "context deadline exceeded")


def classify(stderr: str) -> RuntimeError:
    text = stderr.strip()
    lower = text.lower()
    last = text.splitlines()[-1] if text else "kubectl failed without a message"
    if any(marker in lower for marker in _UNREACHABLE):
        return NoClusterAccess(f"the cluster is not reachable with this kubeconfig ({last[:200]})")
    if "(alreadyexists)" in lower or " already exists" in lower:
        return AlreadyExists(last[:300])
    if "forbidden" in lower:
        return Forbidden(f"your identity may not do this ({last[:200]})")
    return KubeError(last[:300])


class KubectlApi:
    """``KubeApi`` over the kubectl binary on PATH."""

    def __init__(self, kubectl: str = "kubectl", environ: Optional[Mapping[str, str]] = None,
                 timeout_seconds: float = 60, *, kubeconfig: Optional[str] = None, context: Optional[str] = None):
        """``kubeconfig``/``context``: a kubeconfig file and one of its contexts (kubectl's
        ``--kubeconfig``/``--context``); by default $KUBECONFIG and its current context."""
        self.kubectl = kubectl
        self.environ = dict(os.environ if environ is None else environ)
        self.timeout_seconds = timeout_seconds
        self.kubeconfig = str(kubeconfig) if kubeconfig is not None else None
        self.context = context
        self._globals = [*(["--kubeconfig", self.kubeconfig] if self.kubeconfig else []),
                         *(["--context", context] if context else [])]

    def _check(self) -> None:
        reason = no_access_reason(self.environ, self.kubeconfig)
        if reason:
            raise NoClusterAccess(reason)

    def _run(self, args: Sequence[str], stdin: Optional[str] = None) -> str:
        self._check()
        try:
            done = subprocess.run([self.kubectl, *self._globals, *args], input=stdin, capture_output=True, text=True,
                                  env=self.environ, timeout=self.timeout_seconds)
        except subprocess.TimeoutExpired:
            raise NoClusterAccess(f"kubectl did not answer in {self.timeout_seconds:.0f} s") from None
        if done.returncode != 0:
            raise classify(done.stderr)
        return done.stdout

    @staticmethod
    def _scope(namespace: Optional[str]) -> list[str]:
        return ["-n", namespace] if namespace else ["--all-namespaces"]

    def get(self, resource, name, namespace=None):
        out = self._run(["get", resource, name, *(["-n", namespace] if namespace else []), "--ignore-not-found", "-o", "json"])
        return json.loads(out) if out.strip() else None

    def list(self, resource, namespace=None, selector=None):
        args = ["get", resource, *self._scope(namespace), *(["-l", selector] if selector else []), "-o", "json"]
        return json.loads(self._run(args)).get("items", [])

    def apply(self, obj):
        # Server-side apply under the submit command's field manager (the same as before).
        return json.loads(self._run(["apply", "--server-side", "--field-manager=mlplatform-submit", "-f", "-",
                                     "-o", "json"], stdin=json.dumps(obj)))

    def create(self, obj):
        # `kubectl create` POSTs: the API server refuses an existing name with 409 AlreadyExists
        # (atomic, unlike a get-then-apply). Same field manager as the apply.
        return json.loads(self._run(["create", "--field-manager=mlplatform-submit", "-f", "-", "-o", "json"],
                                    stdin=json.dumps(obj)))

    def patch(self, resource, name, namespace, patch):
        return json.loads(self._run(["patch", resource, name, "-n", namespace, "--type=merge", "-p", json.dumps(patch),
                                     "-o", "json"]))

    def delete(self, resource, name, namespace, *, propagation="Foreground"):
        self._run(["delete", resource, name, "-n", namespace, f"--cascade={propagation.lower()}", "--wait=false"])

    def whoami(self):
        return json.loads(self._run(["auth", "whoami", "-o", "json"]))

    def port_forward_argv(self, namespace: str, pod: str, local_port: int, remote_port: int) -> list[str]:
        """The kubectl command line that forwards ``local_port`` here to the pod's ``remote_port``."""
        self._check()
        return [self.kubectl, *self._globals, "-n", namespace, "port-forward", f"pod/{pod}", f"{local_port}:{remote_port}"]

    def logs(self, pod, namespace, container, *, follow=False):
        args = ["logs", pod, "-n", namespace, "-c", container, *(["-f"] if follow else [])]
        if not follow:
            yield from self._run(args).splitlines()
            return
        self._check()
        process = subprocess.Popen([self.kubectl, *self._globals, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=self.environ)
        try:
            assert process.stdout is not None
            for line in process.stdout:
                yield line.rstrip("\n")
            stderr = process.stderr.read() if process.stderr else ""
            if process.wait() != 0 and "not found" not in stderr.lower():
                raise classify(stderr)
        finally:
            if process.poll() is None:
                process.terminate()
                process.wait()
