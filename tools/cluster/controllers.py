"""The platform's controllers, run from their pinned binaries against a stack's control plane and
configured as the stack configures them (tools/cluster/RUNNING.md says how each runs on loopback).

- kwok (tools/cluster/standins.py): simulated kubelets for every node Karpenter writes.
- Kueue: the stack's own manager Configuration (the Helm release's
  ``managerConfig.controllerManagerConfigYaml``: frameworks, waitForPodsReady, fair sharing,
  manageJobsWithoutQueueName), with only what a laptop needs changed: loopback ports, no leader
  election, the webhook's cert directory, and ``VisibilityOnDemand`` off (it would serve an
  aggregated API on all interfaces; the stack does not rely on it).
- The Training Operator: the overlay's Deployment arguments and init-container template
  (the ConfigMap it mounts), plus loopback ports; its webhook is the overlay's
  ValidatingWebhookConfiguration with a loopback URL.
- Karpenter with its kwok cloud provider: the stack's NodePools, each pointed at a KWOKNodeClass
  of its EC2NodeClass's name (the kwok provider manages no other kind), and the instance types of
  ``catalog/`` (GPUs, vCPUs, memory, EFA devices, spot and on-demand offerings).
- The owners of startup taints (standins.TaintLifter).

Webhooks are registered by URL to 127.0.0.1 only: the API server never dials a Service name. Every
process is started in a process group of its own and ``stop()`` ends exactly those.
"""
from __future__ import annotations

import base64
import copy
import datetime as dt
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from tools.cluster.controlplane import ControlPlane, Process, free_port, tool_path
from tools.cluster.layer import Layer, go_module_dir
from tools.cluster.standins import TaintLifter, start_kwok, wait_for

KUEUE_MODULE = ("sigs.k8s.io/kueue", "v0.19.2")
KARPENTER_MODULE = ("sigs.k8s.io/karpenter", "v1.14.1")
KUEUE_NAMESPACE = "kueue-system"
TRAINING_OPERATOR_NAMESPACE = "kubeflow"
# Kueue's kustomization patches these CRDs with a v1beta1<->v1beta2 conversion webhook
# (config/components/crd/patches/webhook_in_*.yaml); its cert rotator refuses to report ready
# unless it can inject its CA into each (RUNNING.md, Kueue).
KUEUE_CONVERTED = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")
# The cert-controller rotator replaces a Secret whose certificates expire within 90 days
# (defaultLookaheadInterval), so the pre-seeded ones outlive that.
WEBHOOK_CERT_DAYS = 365
# The rotator of the Training Operator only stat()s this hard-coded path (pkg/cert certDir).
TRAINING_OPERATOR_CERT_STAT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
KWOK_NODE_CLASS = {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass"}
# Zones of the stand-in offerings: labels only, nothing in the stacks selects a zone.
STAND_IN_ZONES = ("zone-a", "zone-b")


class ControllersError(RuntimeError):
    pass


# --- webhook PKI ---------------------------------------------------------------------------

@dataclass(frozen=True)
class WebhookPki:
    """One CA and one serving cert for every controller's webhook (RUNNING.md, "the common
    recipe"): RSA with a PKCS#1 CA key (the rotator refuses other encodings), the CA valid for
    each rotator's CAName, the serving cert for each ``<service>.<ns>.svc`` and for 127.0.0.1."""

    directory: Path
    ca_names: tuple[str, ...] = ("kueue-ca", "training-operator-ca")
    service_names: tuple[str, ...] = ("kueue-webhook-service.kueue-system.svc", "training-operator.kubeflow.svc")

    def create(self) -> None:
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        self.directory.mkdir(parents=True, exist_ok=True)
        now = dt.datetime.now(dt.timezone.utc)
        until = now + dt.timedelta(days=WEBHOOK_CERT_DAYS)
        ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mlplatform-webhook-ca")])
        ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
              .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
              .not_valid_after(until)
              .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
              .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in self.ca_names]), critical=False)
              .sign(ca_key, hashes.SHA256()))
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        sans = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), *(x509.DNSName(n) for n in self.service_names)]
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mlplatform-webhooks")]))
                .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(until)
                .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        pem = serialization.Encoding.PEM
        pkcs1 = serialization.PrivateFormat.TraditionalOpenSSL
        self.ca_cert.write_bytes(ca.public_bytes(pem))
        self.ca_key.write_bytes(ca_key.private_bytes(pem, pkcs1, serialization.NoEncryption()))
        self.tls_cert.write_bytes(cert.public_bytes(pem))
        self.tls_key.write_bytes(key.private_bytes(pem, pkcs1, serialization.NoEncryption()))

    ca_cert = property(lambda self: self.directory / "ca.crt")
    ca_key = property(lambda self: self.directory / "ca.key")
    tls_cert = property(lambda self: self.directory / "tls.crt")
    tls_key = property(lambda self: self.directory / "tls.key")

    @property
    def ca_bundle(self) -> str:
        return base64.b64encode(self.ca_cert.read_bytes()).decode()

    def cert_dir(self, path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.tls_cert, path / "tls.crt")
        shutil.copy(self.tls_key, path / "tls.key")
        return path

    def secret(self, namespace: str, name: str) -> dict[str, Any]:
        data = {"ca.crt": self.ca_cert, "ca.key": self.ca_key, "tls.crt": self.tls_cert, "tls.key": self.tls_key}
        # No ``type``: the layer may already hold the Secret (Opaque), and a type is immutable.
        return {"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": name, "namespace": namespace},
                "data": {k: base64.b64encode(p.read_bytes()).decode() for k, p in data.items()}}


def url_webhooks(config: dict[str, Any], port: int, ca_bundle: str) -> dict[str, Any]:
    """A webhook configuration with each ``clientConfig.service`` replaced by a loopback URL."""
    out = copy.deepcopy(config)
    for hook in out.get("webhooks", []):
        path = hook["clientConfig"].get("service", {}).get("path", "/")
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle}
    return out


def service_account_groups(namespace: str) -> list[str]:
    """The groups kube-apiserver gives a service account's token (k8s.io/apiserver
    pkg/authentication/serviceaccount ``MakeGroupNames``), for an x509 identity of the same name:
    RBAC bindings to the ServiceAccount subject match the user name."""
    return ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"]


# --- Karpenter's kwok provider: instance types from the catalog ----------------------------

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
    card), a spot and an on-demand offering per zone at the catalog's prices. The offerings carry
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
        on_demand = price(name)
        offerings = []
        for capacity_type, usd in (("on-demand", on_demand.on_demand_usd_per_hour),
                                   ("spot", on_demand.spot_usd_per_hour)):
            for zone in STAND_IN_ZONES:
                requirements = [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": [capacity_type]},
                                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [zone]}]
                requirements += [{"key": k, "operator": "In", "values": [v]} for k, v in sorted(labels.items())]
                offerings.append({"Price": usd, "Available": True, "Requirements": requirements})
        types.append({"name": name, "architecture": "amd64", "operatingSystems": ["linux"],
                      "resources": resources, "offerings": offerings})
    return types


def kwok_node_pools(layer: Layer) -> list[dict[str, Any]]:
    """The stack's NodePools pointed at a KWOKNodeClass of their EC2NodeClass's name."""
    pools = []
    for pool in layer.of_kind("NodePool"):
        pool = copy.deepcopy(pool)
        ref = pool["spec"]["template"]["spec"]["nodeClassRef"]
        pool["spec"]["template"]["spec"]["nodeClassRef"] = {**KWOK_NODE_CLASS, "name": ref["name"]}
        pools.append(pool)
    return pools


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


# --- the controllers -----------------------------------------------------------------------

@dataclass
class Controllers:
    plane: ControlPlane
    layer: Layer
    processes: list[Process] = field(default_factory=list)
    lifter: Optional[TaintLifter] = None
    made_stat_dir: bool = False

    @property
    def workdir(self) -> Path:
        return self.plane.workdir / "controllers"

    def start(self) -> "Controllers":
        self.workdir.mkdir(parents=True, exist_ok=True)
        pki = WebhookPki(self.workdir / "webhook-pki")
        pki.create()
        env = {"KUBE_FEATURE_WatchListClient": "false"}  # RUNNING.md, "Log noise": etcd 3.4.23
        before = set(id(p) for p in self.plane.processes)
        start_kwok(self.plane)
        self._start_training_operator(pki, env)
        self._start_kueue(pki, env)
        self._start_karpenter(env)
        self.processes = [p for p in self.plane.processes if id(p) not in before]
        daemonsets = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in self.layer.of_kind("DaemonSet")}
        self.lifter = TaintLifter(self.plane, self.layer.addons, daemonsets, interval_s=1.0).__enter__()
        self._wait_ready()
        return self

    def stop(self) -> None:
        if self.lifter is not None:
            self.lifter.__exit__(None, None, None)
            self.lifter = None
        for process in reversed(self.processes):
            process.stop()
        if self.made_stat_dir:
            shutil.rmtree(TRAINING_OPERATOR_CERT_STAT_DIR.parent, ignore_errors=True)

    def __enter__(self) -> "Controllers":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    def dead(self) -> list[Process]:
        return [p for p in self.processes if not p.alive()]

    def logs(self, lines: int = 15) -> str:
        return "\n".join(f"--- {p.name} ({'running' if p.alive() else 'exited'})\n{p.tail(lines)}" for p in self.processes)

    def _apply(self, docs: list[dict[str, Any]]) -> None:
        self.plane.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=cluster-test", "-f", "-",
                           input=yaml.safe_dump_all(docs, sort_keys=False), timeout_s=300)

    # -- the Training Operator --
    def _start_training_operator(self, pki: WebhookPki, env: dict[str, str]) -> None:
        deployment = self.layer.find("Deployment", "training-operator", TRAINING_OPERATOR_NAMESPACE)
        pod = deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
        args = list(container.get("args", []))
        # The init-container template is the ConfigMap the Deployment mounts at /etc/config.
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
        template_cm = volumes[mounts["/etc/config"]]["configMap"]["name"]
        template_data = self.layer.find("ConfigMap", template_cm, TRAINING_OPERATOR_NAMESPACE)["data"]["initContainer.yaml"]
        template_file = self.workdir / "training-operator-init-container.yaml"
        template_file.write_text(template_data)
        port = free_port()
        self._apply([pki.secret(TRAINING_OPERATOR_NAMESPACE, "training-operator-webhook-cert")])
        webhooks = [url_webhooks(o, port, pki.ca_bundle) for o in self.layer.service_callers
                    if o["kind"] == "ValidatingWebhookConfiguration" and "training-operator" in o["metadata"]["name"]]
        if not webhooks:
            raise ControllersError("the overlay declares no Training Operator webhook configuration")
        self._apply(webhooks)
        tmp = self.workdir / "training-operator-tmp"
        pki.cert_dir(tmp / "k8s-webhook-server" / "serving-certs")
        if not (TRAINING_OPERATOR_CERT_STAT_DIR / "tls.crt").exists():
            pki.cert_dir(TRAINING_OPERATOR_CERT_STAT_DIR)
            self.made_stat_dir = True
        # The Deployment's service account, with the overlay's RBAC: the platform's admission
        # policies tell a job controller from a team member by that identity (workloads/tenancy.py
        # ``_CONTROLLER``), so the operator must not run as an administrator here.
        account = f"system:serviceaccount:{TRAINING_OPERATOR_NAMESPACE}:{pod.get('serviceAccountName', 'default')}"
        kubeconfig = self.plane.kubeconfig(account, service_account_groups(TRAINING_OPERATOR_NAMESPACE))
        self.plane.spawn_controller("training-operator", [
            str(tool_path("training-operator")), f"--kubeconfig={kubeconfig}", *args,
            f"--pytorch-init-container-template-file={template_file}", "--leader-elect=false",
            f"--webhook-server-port={port}", f"--metrics-bind-address=127.0.0.1:{free_port()}",
            f"--health-probe-bind-address=127.0.0.1:{free_port()}",
        ], env={**env, "TMPDIR": str(tmp), "MY_POD_NAMESPACE": TRAINING_OPERATOR_NAMESPACE})

    # -- Kueue --
    def kueue_configuration(self, webhook_port: int, cert_dir: Path) -> dict[str, Any]:
        values = self.layer.helm_values.get("kueue")
        if values is None:
            raise ControllersError(f"the {self.layer.stack} stack declares no kueue Helm release")
        config = yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"])
        config.update({
            "namespace": KUEUE_NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{free_port()}"},
            "metrics": {"bindAddress": f"127.0.0.1:{free_port()}"},
            "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": True, "webhookServiceName": "kueue-webhook-service",
                                       "webhookSecretName": "kueue-webhook-server-cert"},
        })
        return config

    def _start_kueue(self, pki: WebhookPki, env: dict[str, str]) -> None:
        module = go_module_dir(*KUEUE_MODULE)
        port = free_port()
        for plural in KUEUE_CONVERTED:
            conversion = {"spec": {"conversion": {"strategy": "Webhook", "webhook": {
                "clientConfig": {"url": f"https://127.0.0.1:{port}/convert", "caBundle": pki.ca_bundle},
                "conversionReviewVersions": ["v1"]}}}}
            self.plane.kubectl("patch", "crd", f"{plural}.kueue.x-k8s.io", "--type=merge", "-p", json.dumps(conversion))
        config = self.kueue_configuration(port, pki.cert_dir(self.workdir / "kueue-certs"))
        frameworks = {f.split("/")[-1] for f in config.get("integrations", {}).get("frameworks", [])}
        # The job webhooks of enabled integrations only (Kueue registers no handler for the
        # others), named as the rotator expects, scoped as upstream's webhook/kustomization.yaml.
        keep = {f"{f}.kb.io" for f in frameworks} | {"clusterqueue.kb.io", "resourceflavor.kb.io", "workload.kb.io",
                                                  "cohort.kb.io", "localqueue.kb.io"}
        selector = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                          "values": ["kube-system", KUEUE_NAMESPACE]}]}
        docs = []
        for doc in yaml.safe_load_all((module / "config/components/webhook/manifests.yaml").read_text()):
            if not doc:
                continue
            doc["metadata"]["name"] = "kueue-" + doc["metadata"]["name"]
            doc["webhooks"] = [w for w in doc["webhooks"] if w["name"][1:] in keep]
            for hook in doc["webhooks"]:
                if hook["name"][1:] in {f"{f}.kb.io" for f in frameworks}:
                    hook["namespaceSelector"] = selector
            docs.append(url_webhooks(doc, port, pki.ca_bundle))
        self._apply([pki.secret(KUEUE_NAMESPACE, "kueue-webhook-server-cert")])
        self._apply(docs)
        path = self.workdir / "kueue-config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        # The chart's service account name; its RBAC comes from the chart, which is not applied
        # here, so the identity also carries system:masters (authorization only: admission
        # policies still see the service account's name).
        kubeconfig = self.plane.kubeconfig(f"system:serviceaccount:{KUEUE_NAMESPACE}:kueue-controller-manager",
                                           ["system:masters", *service_account_groups(KUEUE_NAMESPACE)])
        self.plane.spawn_controller("kueue", [
            str(tool_path("kueue")), f"--kubeconfig={kubeconfig}", f"--config={path}",
            "--feature-gates=VisibilityOnDemand=false", "--zap-log-level=info",
        ], env=env)

    # -- Karpenter --
    def _start_karpenter(self, env: dict[str, str]) -> None:
        module = go_module_dir(*KARPENTER_MODULE)
        crd = module / "kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml"
        self.plane.kubectl("apply", "--server-side", "-f", str(crd))
        self.plane.kubectl("wait", "--for=condition=Established", "crd/kwoknodeclasses.karpenter.kwok.sh",
                           "--timeout=60s", timeout_s=90)
        instance_types = catalog_instance_types()
        pools = kwok_node_pools(self.layer)
        gpu_pools = [p for p in pools if any(r["key"].startswith("karpenter.k8s.aws/instance-gpu")
                                             for r in p["spec"]["template"]["spec"].get("requirements", []))]
        problems = unlaunchable_pools(gpu_pools, instance_types)
        if problems:
            raise ControllersError(f"{self.layer.stack}: GPU pools Karpenter could never launch:\n" + "\n".join(problems))
        path = self.workdir / "instance-types.json"
        path.write_text(json.dumps(instance_types, indent=1))
        classes = sorted({p["spec"]["template"]["spec"]["nodeClassRef"]["name"] for p in pools})
        self._apply([{"apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass", "metadata": {"name": n}}
                     for n in classes])
        # Nothing in the kwok provider sets a KWOKNodeClass's status; core Karpenter keeps a
        # NodePool NotReady until its NodeClass reports Ready=True (RUNNING.md, Karpenter).
        now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        ready = {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "",
                                            "lastTransitionTime": now, "observedGeneration": 1}]}}
        for name in classes:
            self.plane.kubectl("patch", "kwoknodeclass", name, "--subresource=status", "--type=merge",
                               "-p", json.dumps(ready))
        # nodeClassRef's group is immutable (the NodePool CRD's CEL rule), so each pool is
        # replaced by its rewritten copy.
        for pool in pools:
            self.plane.kubectl("delete", "nodepool", pool["metadata"]["name"], "--ignore-not-found", "--wait=true")
        self._apply(pools)
        self.plane.spawn_controller("karpenter", [str(tool_path("karpenter-kwok"))], env={
            **env, "KUBECONFIG": str(self.plane.admin_kubeconfig), "DISABLE_LEADER_ELECTION": "true",
            "METRICS_PORT": str(free_port()), "HEALTH_PROBE_PORT": str(free_port()), "LOG_LEVEL": "info",
            "INSTANCE_TYPES_FILE_PATH": str(path), "BATCH_IDLE_DURATION": "1s", "BATCH_MAX_DURATION": "3s",
        })

    def _wait_ready(self) -> None:
        def ready() -> bool:
            dead = self.dead()
            if dead:
                raise ControllersError(f"{dead[0].name} exited:\n{dead[0].tail(40)}")
            queues = json.loads(self.plane.kubectl("get", "clusterqueues", "-o", "json").stdout)["items"]
            active = queues and all(any(c["type"] == "Active" and c["status"] == "True"
                                        for c in q.get("status", {}).get("conditions", [])) for q in queues)
            pools = json.loads(self.plane.kubectl("get", "nodepools", "-o", "json").stdout)["items"]
            pools_ready = pools and all(any(c["type"] == "Ready" and c["status"] == "True"
                                            for c in p.get("status", {}).get("conditions", [])) for p in pools)
            return bool(active and pools_ready)
        try:
            wait_for(ready, "every ClusterQueue Active and every NodePool Ready", timeout_s=240, interval_s=2)
        except TimeoutError as exc:
            raise ControllersError(f"{exc}\n{self.logs()}") from None


def start_controllers(plane: ControlPlane, layer: Layer) -> Controllers:
    return Controllers(plane, layer).__enter__()
