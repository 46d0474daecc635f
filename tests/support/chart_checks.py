"""Checks of what a Helm release puts in the cluster, as pure functions over Kubernetes objects.

They take a list of objects (dicts as the API returns them), so the same checks run on a
`helm template` render (tests/infra/test_chart_render.py) and, after a real ``up`` on the test
control plane, on the live objects (the engine harness: list the release's objects, then call
``unconsumed``, ``cloudwatch_output_problems`` and ``policy_port_problems`` with them; each
returns the problems, empty when all is well).

- ``unconsumed``: a ConfigMap or Secret that a chart value fills but no pod template mounts or
  reads (the class of bug where a chart writes the platform's metric list into a ConfigMap its
  DaemonSet never mounts), nor a custom resource names for its operator to mount, nor a sidecar
  selects by label.
- ``cloudwatch_output_problems``: Fluent Bit's ``cloudwatch_logs`` outputs that its
  ``cb_cloudwatch_init`` would refuse (fluent/fluent-bit plugins/out_cloudwatch_logs/
  cloudwatch_logs.c: ``if (!ctx->log_stream_name && !ctx->log_stream_prefix) { flb_plg_error(...
  "Either 'log_stream_name' or 'log_stream_prefix' is required"); goto error; }``, and the same
  error when both are set); init failing stops the engine (src/flb_engine.c: "output
  initialization failed"), so the pod never becomes ready.
- ``policy_port_problems``: the platform's NetworkPolicy ingress ports against the ports the
  release's pods and Services serve.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence

Object = Mapping[str, Any]
WORKLOAD_KINDS = ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job", "CronJob", "Pod")
RBAC_KINDS = ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")


def key(obj: Object) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return obj.get("kind", ""), meta.get("namespace") or "", meta.get("name", "")


def pod_spec(obj: Object) -> Optional[Mapping[str, Any]]:
    """The pod spec of a workload object (CronJob: its job template's), else None."""
    kind = obj.get("kind")
    spec = obj.get("spec") or {}
    if kind == "Pod":
        return spec
    if kind == "CronJob":
        spec = ((spec.get("jobTemplate") or {}).get("spec")) or {}
    elif kind not in WORKLOAD_KINDS:
        return None
    return ((spec.get("template") or {}).get("spec")) or None


def _containers(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or []), *(spec.get("ephemeralContainers") or [])]


def pod_references(spec: Mapping[str, Any]) -> set[tuple[str, str]]:
    """(kind, name) of every ConfigMap and Secret a pod spec mounts or reads into its environment."""
    found: set[tuple[str, str]] = set()
    for volume in spec.get("volumes") or []:
        if "configMap" in volume:
            found.add(("ConfigMap", volume["configMap"].get("name", "")))
        if "secret" in volume:
            found.add(("Secret", volume["secret"].get("secretName", "")))
        for source in (volume.get("projected") or {}).get("sources") or []:
            if "configMap" in source:
                found.add(("ConfigMap", source["configMap"].get("name", "")))
            if "secret" in source:
                found.add(("Secret", source["secret"].get("name", "")))
    for container in _containers(spec):
        for env in container.get("env") or []:
            ref = env.get("valueFrom") or {}
            if "configMapKeyRef" in ref:
                found.add(("ConfigMap", ref["configMapKeyRef"].get("name", "")))
            if "secretKeyRef" in ref:
                found.add(("Secret", ref["secretKeyRef"].get("name", "")))
        for source in container.get("envFrom") or []:
            if "configMapRef" in source:
                found.add(("ConfigMap", source["configMapRef"].get("name", "")))
            if "secretRef" in source:
                found.add(("Secret", source["secretRef"].get("name", "")))
    for secret in spec.get("imagePullSecrets") or []:
        found.add(("Secret", secret.get("name", "")))
    return found


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def _names(name: str, text: str) -> bool:
    """``text`` is ``name`` or names it as ``<namespace>:<name>`` / ``<namespace>/<name>`` (e.g. an
    exporter's ``-m gpu-system:exporter-metrics-config-map`` flag)."""
    return text == name or re.search(rf"(^|[:/\s]){re.escape(name)}$", text) is not None


def _sidecar_selects(spec: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A kiwigrid k8s-sidecar container (Grafana's dashboard/datasource loader) watching objects
    by label: env LABEL (and LABEL_VALUE when set) (kiwigrid/k8s-sidecar README, "Configuration
    Environment Variables")."""
    for container in _containers(spec):
        env = {e.get("name"): e.get("value") for e in container.get("env") or [] if "value" in e}
        label = env.get("LABEL")
        if label and label in labels and (env.get("LABEL_VALUE") in (None, "") or labels[label] == env.get("LABEL_VALUE")):
            return True
    return False


def consumers(objects: Sequence[Object], target: Object) -> list[str]:
    """Who uses the ConfigMap or Secret ``target``: pod templates that mount or read it, sidecars
    that load it by label, and custom resources (or container arguments) that name it for a
    controller. RBAC grants naming it are not use."""
    kind, namespace, name = key(target)
    labels = (target.get("metadata") or {}).get("labels") or {}
    found = []
    for obj in objects:
        if obj is target or obj.get("kind") in RBAC_KINDS or obj.get("kind") in ("ConfigMap", "Secret"):
            continue
        obj_namespace = (obj.get("metadata") or {}).get("namespace") or ""
        spec = pod_spec(obj)
        if spec is not None and obj_namespace == namespace:
            if (kind, name) in pod_references(spec):
                found.append(f"{'/'.join(key(obj)[::2])} mounts or reads it")
                continue
            if _sidecar_selects(spec, labels):
                found.append(f"{'/'.join(key(obj)[::2])} loads it by label")
                continue
        if obj.get("kind") == "Alertmanager" and kind == "Secret" and obj_namespace == namespace and \
                not (obj.get("spec") or {}).get("configSecret") and name == f"alertmanager-{key(obj)[2]}":
            # prometheus-operator: Alertmanager.spec.configSecret "defaults to alertmanager-<alertmanager-name>"
            # (Documentation/api.md, AlertmanagerSpec.configSecret).
            found.append(f"Alertmanager/{key(obj)[2]} takes it as its configuration (default configSecret)")
            continue
        if any(_names(name, text) for text in _strings(obj.get("spec") or {})):
            found.append(f"{'/'.join(key(obj)[::2])} names it")
    return found


def unconsumed(objects: Sequence[Object], filled: Iterable[tuple[str, str, str]]) -> list[str]:
    """Each ConfigMap/Secret (kind, namespace, name) in ``filled`` that nothing in ``objects`` uses."""
    by_key = {key(o): o for o in objects}
    problems = []
    for item in sorted(set(filled)):
        target = by_key.get(item)
        if target is not None and not consumers(objects, target):
            problems.append(f"{item[0]} {item[1]}/{item[2]} is filled from chart values but no pod template mounts "
                            "or reads it, no sidecar selects it and no custom resource names it")
    return problems


# -- Fluent Bit --------------------------------------------------------------------------------------
def fluent_bit_sections(text: str) -> list[tuple[str, dict[str, str]]]:
    """The ``[SECTION]`` blocks of a classic-mode Fluent Bit configuration, keys lower-cased
    (Fluent Bit's property names are case-insensitive)."""
    sections: list[tuple[str, dict[str, str]]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        header = re.fullmatch(r"\[([A-Za-z_]+)\]", line)
        if header:
            sections.append((header.group(1).upper(), {}))
        elif sections and not line.startswith("@"):
            name, _, value = line.partition(" ")
            sections[-1][1][name.lower()] = value.strip()
    return sections


def cloudwatch_outputs(objects: Sequence[Object]) -> list[tuple[str, dict[str, str]]]:
    """(ConfigMap name, properties) of every ``[OUTPUT] Name cloudwatch_logs`` in the objects' ConfigMaps."""
    found = []
    for obj in objects:
        if obj.get("kind") != "ConfigMap":
            continue
        for data_key, text in (obj.get("data") or {}).items():
            if not data_key.endswith(".conf"):
                continue
            for section, props in fluent_bit_sections(text):
                if section == "OUTPUT" and props.get("name") == "cloudwatch_logs":
                    found.append((f"{key(obj)[2]}/{data_key}", props))
    return found


def cloudwatch_output_problems(objects: Sequence[Object]) -> list[str]:
    problems = []
    for where, props in cloudwatch_outputs(objects):
        has = [k for k in ("log_stream_name", "log_stream_prefix") if props.get(k)]
        if len(has) != 1:
            problems.append(f"{where}: cloudwatch_logs output has {has or 'neither of'} log_stream_name/log_stream_prefix; "
                            "Fluent Bit's init refuses it (\"Either 'log_stream_name' or 'log_stream_prefix' is required\")")
        if not props.get("log_group_name"):
            problems.append(f"{where}: cloudwatch_logs output has no log_group_name")
    return problems


# -- NetworkPolicy ports -----------------------------------------------------------------------------
def served_ports(objects: Sequence[Object], namespace: str) -> dict[str, set]:
    """Ports the release's pods in ``namespace`` listen on: container ports (number and name; host
    network pods aside, policies do not apply to them) and numeric Service target ports (pods an
    operator creates from a custom resource appear only through their Service)."""
    ports: set = set()
    host_network: set = set()
    for obj in objects:
        if (obj.get("metadata") or {}).get("namespace", namespace) != namespace:
            continue
        spec = pod_spec(obj)
        if spec is not None:
            target = host_network if spec.get("hostNetwork") else ports
            for container in _containers(spec):
                for port in container.get("ports") or []:
                    target.add(port.get("containerPort"))
                    if port.get("name"):
                        target.add(port["name"])
                # A probed port is served even where the chart declares no containerPort for it.
                for probe in (container.get(p) for p in ("livenessProbe", "readinessProbe", "startupProbe")):
                    for handler in ("httpGet", "tcpSocket", "grpc"):
                        if probe and handler in probe and probe[handler].get("port") is not None:
                            target.add(probe[handler]["port"])
        if obj.get("kind") == "Service":
            for port in (obj.get("spec") or {}).get("ports") or []:
                target_port = port.get("targetPort", port.get("port"))
                if isinstance(target_port, int):
                    ports.add(target_port)
    return {"pods": ports, "host_network": host_network}


def service_target_ports(objects: Sequence[Object], namespace: str) -> list[tuple[str, Any]]:
    """(Service/port name, target port) of every Service in ``namespace`` whose pods are not on the host network."""
    host_network_labels = []
    for obj in objects:
        spec = pod_spec(obj)
        if spec is not None and spec.get("hostNetwork"):
            template = (obj.get("spec") or {}).get("template") or {}
            host_network_labels.append((template.get("metadata") or {}).get("labels") or {})
    found = []
    for obj in objects:
        if obj.get("kind") != "Service" or (obj.get("metadata") or {}).get("namespace", namespace) != namespace:
            continue
        selector = (obj.get("spec") or {}).get("selector") or {}
        if selector and any(all(labels.get(k) == v for k, v in selector.items()) for labels in host_network_labels):
            continue
        for port in (obj.get("spec") or {}).get("ports") or []:
            found.append((f"{key(obj)[2]}:{port.get('name') or port.get('port')}", port.get("targetPort", port.get("port"))))
    return found


def _named_ports(objects: Sequence[Object], namespace: str) -> dict[str, int]:
    """Container port name -> number in ``namespace`` (a Service or policy may name a port)."""
    found: dict[str, int] = {}
    for obj in objects:
        spec = pod_spec(obj)
        if spec is None or (obj.get("metadata") or {}).get("namespace", namespace) != namespace:
            continue
        for container in _containers(spec):
            for port in container.get("ports") or []:
                if port.get("name"):
                    found[port["name"]] = port.get("containerPort")
    return found


def policy_ingress_ports(policies: Sequence[Object], namespace: str) -> tuple[set, bool]:
    """The ports the namespace's NetworkPolicies admit traffic to, and whether some rule admits
    every port (a rule without ``ports``)."""
    ports: set = set()
    any_port = False
    for policy in policies:
        if (policy.get("metadata") or {}).get("namespace") != namespace:
            continue
        for rule in (policy.get("spec") or {}).get("ingress") or []:
            if not rule.get("ports"):
                any_port = True
            for port in rule.get("ports") or []:
                ports.add(port.get("port"))
    return ports, any_port


def policy_port_problems(objects: Sequence[Object], policies: Sequence[Object], namespace: str,
                         *, unreachable_ok: Mapping[str, str] = {}) -> list[str]:
    """Both directions, for ``namespace``: an ingress port the platform's policies open that no pod
    of the namespace serves (a stale or mistyped port: the real one stays closed), and a Service
    target port no policy admits (its clients time out), except ``unreachable_ok`` (Service:port ->
    why nothing needs to reach it)."""
    served = served_ports(objects, namespace)
    allowed, any_port = policy_ingress_ports(policies, namespace)
    numbers = _named_ports(objects, namespace)
    allowed |= {name for name, number in numbers.items() if number in allowed}
    allowed |= {numbers[name] for name in list(allowed) if isinstance(name, str) and name in numbers}
    problems = [f"{namespace}: a NetworkPolicy admits port {port}, which no pod or Service of the namespace serves "
                f"(served: {sorted(map(str, served['pods']))})"
                for port in sorted(allowed, key=str) if port not in served["pods"] and port not in served["host_network"]]
    if not any_port:
        for where, target in service_target_ports(objects, namespace):
            if target not in allowed and where not in unreachable_ok:
                problems.append(f"{namespace}: Service {where} targets port {target}, which no NetworkPolicy admits")
    return problems


def live_release_problems(objects: Sequence[Object], policies: Sequence[Object], namespace: str,
                          filled: Iterable[tuple[str, str, str]] = (),
                          unreachable_ok: Mapping[str, str] = {}) -> list[str]:
    """Every check above on one namespace's objects as the API server returns them after a real
    ``up`` (the engine harness's hook): ``objects`` every object in ``namespace`` (operator-created
    pods and Services included), ``policies`` the namespace's NetworkPolicies, ``filled`` the
    ConfigMaps/Secrets the release's values fill (``tests.support.charts.value_effects`` on the
    render: ``{k for e in effects for k in e.changed if k[0] in ("ConfigMap", "Secret")}``)."""
    return [*unconsumed(objects, filled), *cloudwatch_output_problems(objects),
            *policy_port_problems(objects, policies, namespace, unreachable_ok=unreachable_ok)]
