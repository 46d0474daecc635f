"""A real Kubernetes 1.32 control plane for the cluster tests, in a network namespace of its own.

    python -m tools.cluster.controlplane up     # start one, print its admin kubeconfig, wait for ^C

etcd, kube-apiserver, kube-controller-manager and kube-scheduler run as real processes built
from pinned modules (``make cluster-tools``; versions in docs/testing.md) inside the plane's
machine (tools/cluster/machine.py): a network and mount namespace of their own, with their usual
fixed ports, a pod network bridge and nothing visible outside. The test process reaches the API
server through one loopback port it bound itself and handed over (``server``). Everything lives
in one directory: generated certificates, etcd's data, one log per process, the machine's
socket. ``stop()`` ends every process (the machine stops them in reverse order, then itself) and
removes the directory, whatever happened before; a killed test process takes them all with it
(tools/cluster/procs.py).

Identities are client certificates signed by the cluster's CA: the certificate's CN is the user,
its O entries the groups, which is how kube-apiserver's x509 authenticator reads them
(k8s.io/apiserver/pkg/authentication/request/x509/x509.go, ``CommonNameUserConversion``:
``User: chain[0].Subject.CommonName, Groups: chain[0].Subject.Organization``). A team member's
kubeconfig therefore carries exactly the groups an EKS access entry would map that IAM role to.

The public face (used by the cluster tests and the Pulumi engine tests): ``ControlPlane.in_tempdir()``
as a context manager (or ``start()``/``stop()``), ``admin_kubeconfig``, ``server``,
``kubeconfig(user, groups)``, ``token_kubeconfig``, ``kubectl(...)``, ``api``, ``spawn(...)``.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from tools.cluster import machine as machine_mod
from tools.cluster import procs
from tools.cluster.api import Api, eventually
from tools.cluster.paths import ROOT, bin_dir, missing_tools, tool_path

# The service range EKS gives a cluster when none is set (EKS User Guide, "Create an Amazon EKS
# cluster": kubernetesNetworkConfig.serviceIpv4Cidr defaults to 10.100.0.0/16 or 172.20.0.0/16).
# It is only data here: nothing routes to it.
SERVICE_CIDR = "10.100.0.0/16"
KUBERNETES_SERVICE_IP = "10.100.0.1"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc"
# Inside the machine: the usual ports, never chosen at run time.
ETCD_PORT, ETCD_PEER_PORT = 2379, 2380
API_PORT = machine_mod.API_PORT
CONTROLLER_MANAGER_PORT, SCHEDULER_PORT = 10257, 10259
# Pods reach the API server on the pod network's gateway (no kube-proxy programs the Service IP).
POD_API_SERVER = f"https://{machine_mod.POD_GATEWAY}:{API_PORT}"

# The admission plugins EKS 1.32 turns on (EKS User Guide, "Amazon EKS Kubernetes versions" ->
# platform versions, "Enabled admission controllers"), so that quota, limit ranges, Pod Security,
# priority and the admission policies behave as in a customer's cluster.
EKS_ADMISSION_PLUGINS = (
    "NamespaceLifecycle", "LimitRanger", "ServiceAccount", "DefaultStorageClass", "ResourceQuota",
    "DefaultTolerationSeconds", "NodeRestriction", "MutatingAdmissionWebhook",
    "ValidatingAdmissionWebhook", "PodSecurity", "TaintNodesByCondition", "Priority",
    "StorageObjectInUseProtection", "PersistentVolumeClaimResize", "ExtendedResourceToleration",
    "CertificateApproval", "CertificateSigning", "CertificateSubjectRestriction",
    "DefaultIngressClass", "RuntimeClass", "ValidatingAdmissionPolicy",
)

CONTROL_PLANE_COMMANDS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl",
                          "unshare", "ip")
BIN_DIR = bin_dir()  # kept for callers that read it; tools.cluster.paths is the rule


class ControlPlaneError(RuntimeError):
    pass


def namespaces_available() -> Optional[str]:
    """None when this process may create the machine's namespaces, else why not (and the fix)."""
    if os.geteuid() == 0:
        return None
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--net", "--mount", "ip", "link", "add",
                            "probe0", "type", "dummy"], capture_output=True, text=True)
    if probe.returncode == 0:
        return None
    return ("the cluster tests run each control plane in a network namespace of its own, which needs root or "
            "unprivileged user namespaces with capabilities (Ubuntu 24.04: sudo sysctl -w "
            f"kernel.apparmor_restrict_unprivileged_userns=0); unshare said: {probe.stderr.strip()}")


# --- certificates -------------------------------------------------------------------------

@dataclass(frozen=True)
class Pki:
    """The cluster's CA and the files kube-apiserver and the controllers read."""

    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def sa_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.directory / "sa.pub"

    @property
    def front_proxy_ca(self) -> Path:
        return self.directory / "front-proxy-ca.crt"

    def create(self) -> None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        self.directory.mkdir(parents=True, exist_ok=True)
        self._create_ca("ca", "mlplatform-test-ca")
        # The aggregation layer's own CA: kube-apiserver proxies to extension API servers (Kueue's
        # visibility API) with a client certificate from it, which they trust through the
        # ``extension-apiserver-authentication`` ConfigMap (requestheader authentication).
        self._create_ca("front-proxy-ca", "mlplatform-front-proxy-ca")
        sa = ec.generate_private_key(ec.SECP256R1())
        self._write_key(self.sa_key, sa)
        self.sa_pub.write_bytes(sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))

    def _create_ca(self, stem: str, common_name: str) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = dt.datetime.now(dt.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False,
                                             encipher_only=False, decipher_only=False), critical=True)
                .sign(key, hashes.SHA256()))
        self._write_key(self.directory / f"{stem}.key", key)
        (self.directory / f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    @staticmethod
    def _write_key(path: Path, key) -> None:
        from cryptography.hazmat.primitives import serialization

        path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.TraditionalOpenSSL,
                                           serialization.NoEncryption()))
        path.chmod(0o600)

    def issue(self, stem: str, common_name: str, organizations: Sequence[str] = (),
              server_names: Sequence[str] = (), ca: str = "ca") -> tuple[Path, Path]:
        """A leaf certificate signed by the CA (``ca``: its file stem): a client identity, or a
        serving cert with SANs."""
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        ca_key = serialization.load_pem_private_key((self.directory / f"{ca}.key").read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate((self.directory / f"{ca}.crt").read_bytes())
        key = ec.generate_private_key(ec.SECP256R1())
        # An EKS user name (an assumed role's session ARN) can pass RFC 5280's 64-character bound on
        # a common name; the API server's x509 authenticator (Go's crypto/x509) reads it whole.
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name, _validate=len(common_name) <= 64),
                             *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations)])
        now = dt.datetime.now(dt.timezone.utc)
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
        if server_names:
            sans = [x509.IPAddress(ipaddress.ip_address(n)) if n[0].isdigit() else x509.DNSName(n)
                    for n in server_names]
            builder = (builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
                       .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False))
        else:
            builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
                                            critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        cert_path, key_path = self.directory / f"{stem}.crt", self.directory / f"{stem}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self._write_key(key_path, key)
        return cert_path, key_path


def kubeconfig_text(server: str, ca_cert: Path, user: str, credentials: dict[str, str]) -> str:
    import yaml

    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": user,
        "clusters": [{"name": "mlplatform-test", "cluster": {"server": server, "certificate-authority": str(ca_cert)}}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": user, "context": {"cluster": "mlplatform-test", "user": user}}],
    }, sort_keys=False)




WORKDIR_PREFIX = "mlplatform-cluster-"
OWNER_FILE = "owner.pid"


def sweep_abandoned(parent: Path) -> list[Path]:
    """Remove plane directories whose owner died without removing them (a SIGKILLed test run:
    its processes died with it, see tools/cluster/procs.py, but nothing was left to delete the
    directory). A directory is abandoned when the process named in its owner file is gone."""
    removed = []
    for workdir in parent.glob(f"{WORKDIR_PREFIX}*"):
        try:
            owner = int((workdir / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            shutil.rmtree(workdir, ignore_errors=True)
            removed.append(workdir)
        except PermissionError:  # another user's live process
            continue
    return removed


@dataclass
class RemoteProcess:
    """A process the machine runs: its name there, its log here."""

    name: str
    log: Path
    machine: machine_mod.MachineClient

    def status(self) -> dict:
        try:
            return self.machine.call("status", name=self.name, timeout_s=10)
        except (OSError, EOFError, TimeoutError, RuntimeError):
            return {"known": False, "alive": False, "returncode": None}

    def alive(self) -> bool:
        return bool(self.status()["alive"])

    @property
    def returncode(self) -> Optional[int]:
        return self.status()["returncode"]

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, grace_s: float = 10.0) -> None:
        try:
            self.machine.call("stop", name=self.name, grace_s=grace_s, timeout_s=grace_s * 2 + 10)
        except (OSError, EOFError, TimeoutError, RuntimeError):
            pass

    def signal(self, sig: int) -> None:
        self.machine.call("signal", name=self.name, sig=int(sig), timeout_s=10)


@dataclass
class ControlPlane:
    """One control plane in ``workdir``; use as a context manager or call start()/stop()."""

    workdir: Path
    keep_workdir: bool = False
    processes: list[RemoteProcess] = field(default_factory=list)
    api_port: int = 0
    machine_process: Optional[procs.Process] = None

    @classmethod
    def in_tempdir(cls) -> "ControlPlane":
        sweep_abandoned(Path(tempfile.gettempdir()))
        workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
        (workdir / OWNER_FILE).write_text(str(os.getpid()))
        return cls(workdir)

    @property
    def pki(self) -> Pki:
        return Pki(self.workdir / "pki")

    @property
    def server(self) -> str:
        """The API server as this process reaches it."""
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.workdir / "kubeconfigs" / "admin.yaml"

    @property
    def machine(self) -> machine_mod.MachineClient:
        return machine_mod.MachineClient(self.workdir)

    @property
    def api(self) -> Api:
        return Api.from_kubeconfig(self.admin_kubeconfig)

    def __enter__(self) -> "ControlPlane":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- lifecycle --
    def start(self, ready_timeout_s: float = 180.0) -> None:
        missing = missing_tools(CONTROL_PLANE_COMMANDS)
        if missing:
            raise ControlPlaneError(f"missing cluster tools: {', '.join(missing)} (run: make cluster-tools)")
        refused = namespaces_available()
        if refused:
            raise ControlPlaneError(refused)
        for sub in ("logs", "kubeconfigs", "inner"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        self.pki.create()
        serving_cert, serving_key = self.pki.issue(
            "apiserver", "kube-apiserver",
            server_names=("127.0.0.1", machine_mod.POD_GATEWAY, KUBERNETES_SERVICE_IP, "localhost", "kubernetes",
                          "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"))
        proxy_cert, proxy_key = self.pki.issue("front-proxy-client", "front-proxy-client", ca="front-proxy-ca")
        self._start_machine()
        self.kubeconfig("admin", ["system:masters"], path=self.admin_kubeconfig)
        cm_kubeconfig = self.inner_kubeconfig("system:kube-controller-manager", [])
        scheduler_kubeconfig = self.inner_kubeconfig("system:kube-scheduler", [])

        etcd_url = f"http://127.0.0.1:{ETCD_PORT}"
        self.spawn("etcd", [
            str(tool_path("etcd")), "--name", "default", "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{ETCD_PEER_PORT}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{ETCD_PEER_PORT}",
            "--initial-cluster", f"default=http://127.0.0.1:{ETCD_PEER_PORT}",
            "--log-level", "warn",
        ], env={"ETCD_UNSUPPORTED_ARCH": os.environ.get("ETCD_UNSUPPORTED_ARCH", "")})
        self._wait(lambda: self._inner_ok([sys.executable, "-c", "import socket; socket.create_connection("
                                                              f"('127.0.0.1', {ETCD_PORT}), 1)"]), "etcd", 60)

        self.spawn("kube-apiserver", [
            str(tool_path("kube-apiserver")),
            f"--etcd-servers={etcd_url}",
            # All addresses of the machine: 127.0.0.1 for the forwarder and the control plane,
            # the pod network's gateway for pods.
            "--bind-address=0.0.0.0", f"--secure-port={API_PORT}",
            f"--advertise-address={machine_mod.POD_GATEWAY}",
            f"--tls-cert-file={serving_cert}", f"--tls-private-key-file={serving_key}",
            f"--client-ca-file={self.pki.ca_cert}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={self.pki.sa_pub}",
            f"--service-account-signing-key-file={self.pki.sa_key}",
            f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
            "--authorization-mode=Node,RBAC",
            f"--enable-admission-plugins={','.join(EKS_ADMISSION_PLUGINS)}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            # Webhooks and aggregated APIs are dialled at a Service's endpoint (pod IP:port), as on
            # EKS; without it the API server would dial the Service's ClusterIP, which no
            # kube-proxy programs here (cmd/kube-apiserver/app/server.go buildServiceResolver).
            "--enable-aggregator-routing=true",
            f"--requestheader-client-ca-file={self.pki.front_proxy_ca}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={proxy_cert}", f"--proxy-client-key-file={proxy_key}",
            "--profiling=false",
        ])
        self._wait(self._ready, "kube-apiserver /readyz", ready_timeout_s)

        self.spawn("kube-controller-manager", [
            str(tool_path("kube-controller-manager")),
            f"--kubeconfig={cm_kubeconfig}", f"--authentication-kubeconfig={cm_kubeconfig}",
            f"--authorization-kubeconfig={cm_kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={CONTROLLER_MANAGER_PORT}",
            "--leader-elect=false", "--use-service-account-credentials=true",
            f"--service-account-private-key-file={self.pki.sa_key}",
            f"--root-ca-file={self.pki.ca_cert}",
            f"--cluster-signing-cert-file={self.pki.ca_cert}", f"--cluster-signing-key-file={self.pki.ca_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--controllers=*",
        ])
        self.spawn("kube-scheduler", [
            str(tool_path("kube-scheduler")),
            f"--kubeconfig={scheduler_kubeconfig}", f"--authentication-kubeconfig={scheduler_kubeconfig}",
            f"--authorization-kubeconfig={scheduler_kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={SCHEDULER_PORT}", "--leader-elect=false",
        ])
        # The default service account appears once the controller-manager's token controllers run.
        self._wait(lambda: self.kubectl("get", "serviceaccount", "default", "-n", "default",
                                        check=False).returncode == 0,
                   "kube-controller-manager (default service account)", 90)

    def _start_machine(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        self.api_port = listener.getsockname()[1]
        unshare = ["unshare", "--net", "--mount", "--propagation", "private"]
        if os.geteuid() != 0:
            unshare += ["--user", "--map-root-user"]
        env = {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        try:
            self.machine_process = procs.spawn("machine", [
                *unshare, sys.executable, "-m", "tools.cluster.machine", str(self.workdir),
                "--api-fd", str(listener.fileno())], self.workdir / "logs" / "machine.log", env=env, cwd=ROOT,
                pass_fds=(listener.fileno(),))
        finally:
            listener.close()  # the machine holds it now
        ready = self.workdir / "machine.ready"
        deadline = time.monotonic() + 60
        while not ready.exists():
            if not self.machine_process.alive():
                raise ControlPlaneError(f"the machine exited ({self.machine_process.popen.returncode}):\n"
                                        f"{self.machine_process.tail()}")
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"the machine did not start in 60 s:\n{self.machine_process.tail()}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.machine_process is not None:
            if self.machine_process.alive():
                try:
                    self.machine.call("stop_all", timeout_s=120)
                except (OSError, EOFError, TimeoutError, RuntimeError):
                    pass
            self.machine_process.stop(grace_s=20)
            self.machine_process = None
        self.processes.clear()
        if not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- identities and access --
    def kubeconfig(self, user: str, groups: Sequence[str], path: Optional[Path] = None) -> Path:
        """A kubeconfig for ``user`` in ``groups`` (an x509 client identity, see module docstring)."""
        stem = "user-" + "".join(c if c.isalnum() else "-" for c in user)
        cert, key = self.pki.issue(stem, user, organizations=groups)
        path = path or self.workdir / "kubeconfigs" / f"{stem}.yaml"
        path.write_text(kubeconfig_text(self.server, self.pki.ca_cert, user,
                                        {"client-certificate": str(cert), "client-key": str(key)}))
        return path

    def inner_kubeconfig(self, user: str, groups: Sequence[str], server: str = f"https://127.0.0.1:{API_PORT}") -> Path:
        """The same identity for a process inside the machine (the API server on its own port)."""
        stem = "user-" + "".join(c if c.isalnum() else "-" for c in user)
        cert, key = self.pki.issue(stem, user, organizations=groups)
        path = self.workdir / "inner" / f"{stem}.yaml"
        path.write_text(kubeconfig_text(server, self.pki.ca_cert, user,
                                        {"client-certificate": str(cert), "client-key": str(key)}))
        return path

    def token_kubeconfig(self, name: str, token: str) -> Path:
        """A kubeconfig that authenticates with a bearer token (a service account's, say)."""
        path = self.workdir / "kubeconfigs" / f"token-{name}.yaml"
        path.write_text(kubeconfig_text(self.server, self.pki.ca_cert, name, {"token": token}))
        path.chmod(0o600)
        return path

    def kubectl(self, *args: str, kubeconfig: Optional[Path] = None, input: Optional[str] = None,
                check: bool = True, timeout_s: float = 60) -> subprocess.CompletedProcess:
        command = [str(tool_path("kubectl")), f"--kubeconfig={kubeconfig or self.admin_kubeconfig}", *args]
        # HOME: kubectl keeps its discovery cache under $HOME/.kube; the plane's own, never the user's.
        env = {**os.environ, "HOME": str(self.workdir)}
        result = subprocess.run(command, input=input, capture_output=True, text=True, timeout=timeout_s, env=env)
        if check and result.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)} failed ({result.returncode}): "
                                    f"{result.stderr.strip() or result.stdout.strip()}")
        return result

    def spawn(self, name: str, argv: Sequence[str], env: Optional[dict[str, str]] = None) -> RemoteProcess:
        """Run a process inside the machine, under this control plane's lifetime."""
        log = self.workdir / "logs" / f"{name}.log"
        self.machine.call("spawn", name=name, argv=list(argv), log=str(log), env=env or {}, cwd=str(self.workdir))
        process = RemoteProcess(name, log, self.machine)
        self.processes = [p for p in self.processes if p.name != name] + [process]
        return process

    spawn_controller = spawn  # the name earlier callers used

    def run_inside(self, argv: Sequence[str], input: Optional[str] = None, timeout_s: float = 60) -> dict:
        """A short command in the machine's namespaces: {returncode, stdout, stderr}."""
        return self.machine.call("run", argv=list(argv), input=input, timeout_s=timeout_s)

    # -- internals --
    def _inner_ok(self, argv: Sequence[str]) -> bool:
        return self.run_inside(argv, timeout_s=10)["returncode"] == 0

    def _ready(self) -> bool:
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.directory / "user-admin.crt"), str(self.pki.directory / "user-admin.key"))
        try:
            with urllib.request.urlopen(f"{self.server}/readyz", context=context, timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def _wait(self, predicate, what: str, timeout_s: float) -> None:
        def check():
            dead = [p for p in self.processes if not p.alive()]
            if dead:
                raise ControlPlaneError(f"{dead[0].name} exited ({dead[0].returncode}) while waiting "
                                        f"for {what}:\n{dead[0].tail()}")
            return predicate()
        try:
            eventually(check, what, timeout_s, interval_s=0.25)
        except TimeoutError as exc:
            raise ControlPlaneError(f"{exc}\n" + "\n".join(f"--- {p.name}\n{p.tail(10)}" for p in self.processes)) from None


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.cluster.controlplane")
    parser.add_argument("command", choices=["up", "check"])
    args = parser.parse_args(argv)
    missing = missing_tools(CONTROL_PLANE_COMMANDS)
    if missing:
        print(f"missing cluster tools: {', '.join(missing)} (run: make cluster-tools)", file=sys.stderr)
        return 2
    # SIGTERM (a background job ignores SIGINT) stops the cluster as ^C does: everything, then its directory.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    plane = ControlPlane.in_tempdir()
    with plane:
        print(f"control plane ready: export KUBECONFIG={plane.admin_kubeconfig}", flush=True)
        if args.command == "check":
            print(plane.kubectl("get", "--raw", "/version").stdout)
            return 0
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
