"""A real Kubernetes 1.32 control plane on loopback, for the cluster tests.

    python -m tools.cluster.controlplane up     # start one, print its admin kubeconfig, wait for ^C

etcd, kube-apiserver, kube-controller-manager and kube-scheduler run as real processes built
from pinned modules (``make cluster-tools``; versions in docs/testing.md). Everything lives in one
directory of its own: generated certificates, free loopback ports, etcd's data, one log per
process. ``stop()`` ends exactly the processes it started (their process groups) and removes the
directory, whatever happened before.

Identities are client certificates signed by the cluster's CA: the certificate's CN is the user,
its O entries the groups, which is how kube-apiserver's x509 authenticator reads them
(k8s.io/apiserver/pkg/authentication/request/x509/x509.go, ``CommonNameUserConversion``:
``User: chain[0].Subject.CommonName, Groups: chain[0].Subject.Organization``). A team member's
kubeconfig therefore carries exactly the groups an EKS access entry would map that IAM role to.
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

ROOT = Path(__file__).resolve().parents[2]
BIN_DIR = ROOT / ".cache" / "cluster-tools" / "bin"

# The service range EKS gives a cluster when none is set (EKS User Guide, "Create an Amazon EKS
# cluster": kubernetesNetworkConfig.serviceIpv4Cidr defaults to 10.100.0.0/16 or 172.20.0.0/16).
# It is only data here: nothing routes to it.
SERVICE_CIDR = "10.100.0.0/16"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc"

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

CONTROL_PLANE_COMMANDS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")


def tool_path(name: str) -> Optional[Path]:
    """A built tool (``.cache/cluster-tools/bin``) first, then PATH (Debian's etcd and kubectl)."""
    built = BIN_DIR / name
    if built.is_file() and os.access(built, os.X_OK):
        return built
    found = shutil.which(name)
    return Path(found) if found else None


def missing_tools(names: Sequence[str] = CONTROL_PLANE_COMMANDS) -> list[str]:
    return [name for name in names if tool_path(name) is None]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ControlPlaneError(RuntimeError):
    pass


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

    def create(self) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self.directory.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mlplatform-test-ca")])
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
        self._write_key(self.ca_key, key)
        self.ca_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        sa = ec.generate_private_key(ec.SECP256R1())
        self._write_key(self.sa_key, sa)
        self.sa_pub.write_bytes(sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))

    @staticmethod
    def _write_key(path: Path, key) -> None:
        from cryptography.hazmat.primitives import serialization

        path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.TraditionalOpenSSL,
                                           serialization.NoEncryption()))
        path.chmod(0o600)

    def issue(self, stem: str, common_name: str, organizations: Sequence[str] = (),
              server_names: Sequence[str] = ()) -> tuple[Path, Path]:
        """A leaf certificate signed by the CA: a client identity, or a serving cert with SANs."""
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        ca_key = serialization.load_pem_private_key(self.ca_key.read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate(self.ca_cert.read_bytes())
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name),
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


# --- processes ----------------------------------------------------------------------------

@dataclass
class Process:
    name: str
    popen: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, grace_s: float = 10.0) -> None:
        if not self.alive():
            return
        # Each process was started in a session of its own: its group is exactly what we started.
        try:
            os.killpg(self.popen.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.popen.wait(timeout=grace_s)


@dataclass
class ControlPlane:
    """One control plane in ``workdir``; use as a context manager or call start()/stop()."""

    workdir: Path
    keep_workdir: bool = False
    processes: list[Process] = field(default_factory=list)
    api_port: int = 0
    etcd_port: int = 0

    @classmethod
    def in_tempdir(cls) -> "ControlPlane":
        return cls(Path(tempfile.mkdtemp(prefix="mlplatform-cluster-")))

    @property
    def pki(self) -> Pki:
        return Pki(self.workdir / "pki")

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.workdir / "kubeconfigs" / "admin.yaml"

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
    def start(self, ready_timeout_s: float = 120.0) -> None:
        missing = missing_tools()
        if missing:
            raise ControlPlaneError(f"missing cluster tools: {', '.join(missing)} (run: make cluster-tools)")
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        (self.workdir / "kubeconfigs").mkdir(parents=True, exist_ok=True)
        self.pki.create()
        self.api_port, self.etcd_port, etcd_peer = free_port(), free_port(), free_port()
        serving_cert, serving_key = self.pki.issue("apiserver", "kube-apiserver",
                                                   server_names=("127.0.0.1", "localhost", "kubernetes",
                                                                 "kubernetes.default.svc"))
        self.kubeconfig("admin", ["system:masters"], path=self.admin_kubeconfig)
        cm_kubeconfig = self.kubeconfig("system:kube-controller-manager", [])
        scheduler_kubeconfig = self.kubeconfig("system:kube-scheduler", [])

        etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        self._spawn("etcd", [
            str(tool_path("etcd")), "--name", "default", "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-cluster", f"default=http://127.0.0.1:{etcd_peer}",
            "--log-level", "warn",
        ], env={"ETCD_UNSUPPORTED_ARCH": os.environ.get("ETCD_UNSUPPORTED_ARCH", "")})
        self._wait(lambda: self._tcp_open(self.etcd_port), "etcd", 30)

        self._spawn("kube-apiserver", [
            str(tool_path("kube-apiserver")),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", f"--secure-port={self.api_port}", "--advertise-address=127.0.0.1",
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
            # The default (lease) reconciler writes the `kubernetes` Service's endpoints with the
            # advertise address, and endpoint validation refuses a loopback IP.
            "--endpoint-reconciler-type=none",
            "--profiling=false",
        ])
        self._wait(self._ready, "kube-apiserver /readyz", ready_timeout_s)

        self._spawn("kube-controller-manager", [
            str(tool_path("kube-controller-manager")),
            f"--kubeconfig={cm_kubeconfig}", f"--authentication-kubeconfig={cm_kubeconfig}",
            f"--authorization-kubeconfig={cm_kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            "--leader-elect=false", "--use-service-account-credentials=true",
            f"--service-account-private-key-file={self.pki.sa_key}",
            f"--root-ca-file={self.pki.ca_cert}",
            f"--cluster-signing-cert-file={self.pki.ca_cert}", f"--cluster-signing-key-file={self.pki.ca_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--controllers=*",
        ])
        self._spawn("kube-scheduler", [
            str(tool_path("kube-scheduler")),
            f"--kubeconfig={scheduler_kubeconfig}", f"--authentication-kubeconfig={scheduler_kubeconfig}",
            f"--authorization-kubeconfig={scheduler_kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "--leader-elect=false",
        ])
        # The default service account appears once the controller-manager's token controllers run.
        self._wait(lambda: self.kubectl("get", "serviceaccount", "default", "-n", "default",
                                        check=False).returncode == 0,
                   "kube-controller-manager (default service account)", 60)

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
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

    def token_kubeconfig(self, name: str, token: str) -> Path:
        """A kubeconfig that authenticates with a bearer token (a service account's, say)."""
        path = self.workdir / "kubeconfigs" / f"token-{name}.yaml"
        path.write_text(kubeconfig_text(self.server, self.pki.ca_cert, name, {"token": token}))
        path.chmod(0o600)
        return path

    def kubectl(self, *args: str, kubeconfig: Optional[Path] = None, input: Optional[str] = None,
                check: bool = True, timeout_s: float = 60) -> subprocess.CompletedProcess:
        command = [str(tool_path("kubectl")), f"--kubeconfig={kubeconfig or self.admin_kubeconfig}", *args]
        result = subprocess.run(command, input=input, capture_output=True, text=True, timeout=timeout_s)
        if check and result.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)} failed ({result.returncode}): "
                                    f"{result.stderr.strip() or result.stdout.strip()}")
        return result

    def spawn_controller(self, name: str, argv: Sequence[str], env: Optional[dict[str, str]] = None) -> Process:
        """Run another controller (kwok, Kueue, ...) under this control plane's lifetime."""
        return self._spawn(name, argv, env=env)

    # -- internals --
    def _spawn(self, name: str, argv: Sequence[str], env: Optional[dict[str, str]] = None) -> Process:
        log = self.workdir / "logs" / f"{name}.log"
        handle = log.open("ab")
        popen = subprocess.Popen(list(argv), stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 cwd=self.workdir, start_new_session=True,
                                 env={**os.environ, **(env or {})})
        handle.close()
        process = Process(name, popen, log)
        self.processes.append(process)
        return process

    @staticmethod
    def _tcp_open(port: int) -> bool:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            return sock.connect_ex(("127.0.0.1", port)) == 0

    def _ready(self) -> bool:
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.directory / "user-admin.crt"), str(self.pki.directory / "user-admin.key"))
        try:
            with urllib.request.urlopen(f"{self.server}/readyz", context=context, timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def _wait(self, predicate, what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [p for p in self.processes if not p.alive()]
            if dead:
                raise ControlPlaneError(f"{dead[0].name} exited ({dead[0].popen.returncode}) while waiting "
                                        f"for {what}:\n{dead[0].tail()}")
            if predicate():
                return
            time.sleep(0.25)
        raise ControlPlaneError(f"timed out after {timeout_s:.0f} s waiting for {what}:\n"
                                + "\n".join(f"--- {p.name}\n{p.tail(10)}" for p in self.processes))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.cluster.controlplane")
    parser.add_argument("command", choices=["up", "check"])
    args = parser.parse_args(argv)
    missing = missing_tools()
    if missing:
        print(f"missing cluster tools: {', '.join(missing)} (run: make cluster-tools)", file=sys.stderr)
        return 2
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
