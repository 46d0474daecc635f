"""``pulumi-resource-eks`` stand-in: the component provider of package ``eks`` (pulumi-eks 4.4.0),
loaded by the real engine from PATH. Its ``Construct`` registers, through the engine's resource
monitor, the children pulumi-eks's ``Cluster`` registers for the platform's options
(``infra.plan.pulumi_eks``, the same model the offline plan records: nodejs/eks/cluster/cluster.ts),
with the pinned SDKs' resource types, parented and named as pulumi-eks does them; it returns the
component's outputs (kubeconfig, kubeconfigJson, a reference to the ``aws:eks/cluster:Cluster``
child, OIDC issuer, core data...). The kubeconfig carries the test control plane's credentials
(``MLP_STANDIN_KUBECONFIG``) instead of ``aws eks get-token``, so the real Kubernetes provider and
Helm apply every in-cluster object there. ``Call`` answers ``Cluster.getKubeconfig``.

The Python SDK's provider framework (``pulumi.provider``) serves the gRPC side: it runs
``construct`` with the engine's monitor, so children register like any program's.

    python -m tools.engine.standins.eks <engine address>    # what pulumi-resource-eks runs
"""
from __future__ import annotations

import importlib.metadata
import json
import ssl
import sys
import time
import urllib.request
from typing import Any, Callable, Mapping, Optional

import pulumi
import pulumi.provider as provider
import pulumi_aws  # noqa: F401 - registers the aws resource modules (resource references come back typed)
import pulumi_eks as _eks_sdk  # noqa: F401 - and eks's: Call receives the Cluster it is called on as a reference
import pulumi_kubernetes  # noqa: F401 - registers the kubernetes provider resource package
from pulumi.errors import InputPropertiesError
from pulumi.provider.provider import CallResult, ConstructResult

from infra.plan import input_rules, pulumi_eks
from tools.engine.standins.control_plane import control_plane

VERSION = importlib.metadata.version("pulumi-eks")  # the pin the SDK asks the engine for
AWS_VERSION = importlib.metadata.version("pulumi-aws")
KUBERNETES_VERSION = importlib.metadata.version("pulumi-kubernetes")
# Outputs of the children that the component reads (the rest of a child's state is not needed).
_READ_OUTPUTS = ("arn", "name", "endpoint", "certificateAuthority", "identities", "vpcConfig")
# cluster.ts: 60 tries, 1 s request timeout, 5 s apart.
HEALTHZ_TRIES, HEALTHZ_TIMEOUT_S, HEALTHZ_PAUSE_S = 60, 1.0, 5.0


def _is_output(value: Any) -> bool:
    return isinstance(value, pulumi.Output)


def _walk(value: Any, parts: list[str]) -> Any:
    for part in parts:
        if value is None:
            return None
        value = value[int(part)] if isinstance(value, list) else value.get(part)
    return value


def _contains_output(value: Any) -> bool:
    if _is_output(value):
        return True
    if isinstance(value, Mapping):
        return any(_contains_output(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_contains_output(v) for v in value)
    return False


def wait_for_healthz(endpoint: str, tries: int = HEALTHZ_TRIES) -> str:
    """cluster.ts: up to 300 s until ``<endpoint>/healthz`` answers 200 (certificate not checked,
    "EKS API server uses self-signed cert"); the endpoint is returned either way."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    for attempt in range(tries):
        try:
            with urllib.request.urlopen(f"{endpoint}/healthz", timeout=HEALTHZ_TIMEOUT_S, context=context) as response:
                if response.status == 200:
                    return endpoint
        except OSError:
            pass
        if attempt + 1 < tries:
            time.sleep(HEALTHZ_PAUSE_S)
    return endpoint


class _OutputResolver:
    """``pulumi_eks.Resolver`` over registered resources: values are outputs."""

    def __init__(self, component: pulumi.ComponentResource, args: Mapping[str, Any]):
        self.component, self.args = component, args
        self.resources: dict[str, pulumi.Resource] = {}
        self.plane = control_plane()
        self._endpoint: Any = None

    def ref(self, key: str, path: Optional[str] = None) -> Any:
        resource = self.resources[key]
        if path is None:
            return resource
        head, *rest = path.split(".")
        output = getattr(resource, head)
        return output.apply(lambda value: _walk(value, rest)) if rest else output

    def combine(self, fn: Callable[..., Any], *values: Any) -> Any:
        if any(_contains_output(v) for v in values):
            return pulumi.Output.all(*values).apply(lambda resolved: fn(*resolved))
        return fn(*values)

    def partition(self) -> Any:
        return pulumi_aws.get_partition_output(opts=pulumi.InvokeOutputOptions(parent=self.component)).partition

    def endpoint(self) -> Any:
        # One output, as cluster.ts computes `endpoint` once: every reader waits on the same check.
        if self._endpoint is None:
            self._endpoint = self._waited_endpoint()
        return self._endpoint

    def _waited_endpoint(self) -> Any:
        public = self.args.get("endpointPublicAccess")

        def wait(endpoint: str, public_: Any) -> str:
            if public_ and not pulumi.runtime.is_dry_run():
                return wait_for_healthz(endpoint)
            return endpoint

        return self.combine(wait, self.ref("eksCluster", "endpoint"), public)

    def kubeconfig_user(self) -> Optional[Mapping[str, Any]]:
        return self.plane["user"] if self.plane else None


class ClusterComponent(pulumi.ComponentResource):
    """``eks:index:Cluster`` as pulumi-eks registers it (props {}: the Node SDK sends a component's
    args to the engine only for remote or rehydrated components)."""

    def __init__(self, name: str, args: Mapping[str, Any], opts: pulumi.ResourceOptions):
        super().__init__(pulumi_eks.CLUSTER_TYPE, name, {}, opts)
        resolver = _OutputResolver(self, args)
        open_role: Optional[tuple[pulumi.ComponentResource, list[pulumi.Resource]]] = None
        for child in pulumi_eks.cluster_children(name, args, resolver):
            if open_role is not None and child.parent != "eksRole":
                _finish_service_role(*open_role)
                open_role = None
            resource = self._register(child, resolver)
            resolver.resources[child.key] = resource
            if child.type == pulumi_eks.SERVICE_ROLE_TYPE:
                open_role = (resource, [])
            elif open_role is not None:
                open_role[1].append(resource)
        if open_role is not None:
            _finish_service_role(*open_role)
        self.state = pulumi_eks.cluster_outputs(name, args, resolver)
        self.register_outputs(self.state)

    def _register(self, child: pulumi_eks.Child, resolver: _OutputResolver) -> pulumi.Resource:
        parent = resolver.resources[child.parent] if child.parent else self
        opts = pulumi.ResourceOptions(
            parent=parent, depends_on=[resolver.resources[key] for key in child.depends_on] or None,
            ignore_changes=list(child.ignore_changes) or None)
        if child.type.startswith("pulumi:providers:"):
            package = child.type.split(":", 2)[2]
            opts.version = KUBERNETES_VERSION if package == "kubernetes" else None
            return pulumi.ProviderResource(package, child.name, dict(child.inputs), opts)
        if not child.custom:
            return pulumi.ComponentResource(child.type, child.name, {}, opts)
        opts.version = AWS_VERSION
        props = {key: None for key in _READ_OUTPUTS}
        props.update(child.inputs)
        return pulumi.CustomResource(child.type, child.name, props, opts)


def _finish_service_role(role_component: pulumi.ComponentResource, children: list[pulumi.Resource]) -> None:
    """servicerole.ts: ``registerOutputs({resolvedRole, directRole})``, the role once every policy
    is attached."""
    role = children[0]
    attachments = children[1:]
    resolved = pulumi.Output.all(role.arn, *[a.id for a in attachments]).apply(lambda _: role)
    role_component.register_outputs({"resolvedRole": resolved, "directRole": role})


class EksStandIn(provider.Provider):
    def __init__(self) -> None:
        super().__init__(VERSION)

    def construct(self, name: str, resource_type: str, inputs: pulumi.Inputs,
                  options: Optional[pulumi.ResourceOptions] = None) -> ConstructResult:
        if resource_type != pulumi_eks.CLUSTER_TYPE:
            raise Exception(f"unknown resource type {resource_type}: the eks stand-in constructs only "
                            f"{pulumi_eks.CLUSTER_TYPE}")
        # As the offline plan's rule for the component's inputs (pulumi-eks itself would ignore an
        # unknown key; the pinned SDK's keyword arguments cannot produce one, a transform can).
        problems = input_rules.check_inputs(resource_type, inputs)
        if problems:
            raise InputPropertiesError(f"{resource_type} '{name}': inputs pulumi-eks {VERSION} does not declare",
                                       [{"property_path": p.path, "reason": p.reason} for p in problems])
        component = ClusterComponent(name, inputs, options or pulumi.ResourceOptions())
        return ConstructResult(urn=component.urn, state=component.state)

    def call(self, token: str, args: pulumi.Inputs) -> CallResult:
        if token != pulumi_eks.GET_KUBECONFIG:
            raise Exception(f"unknown method {token}")
        cluster = args["__self__"]
        plane = control_plane()
        eks_cluster = cluster.eks_cluster

        def kubeconfig(resource: Any) -> Any:
            def render(name: str, endpoint: str, ca: Any, arn: str) -> str:
                data = ca.get("data") if isinstance(ca, Mapping) else getattr(ca, "data", None)
                config = pulumi_eks.generate_kubeconfig(
                    name, endpoint, pulumi_eks.region_from_arn(arn), True, data,
                    {"profileName": args.get("profileName"), "roleArn": args.get("roleArn")},
                    plane["user"] if plane else None)
                return json.dumps(config, separators=(",", ":"))

            return pulumi.Output.all(resource.name, resource.endpoint, resource.certificate_authority,
                                     resource.arn).apply(lambda v: render(*v))

        return CallResult(outputs={"result": eks_cluster.apply(kubeconfig)})


def main(argv: Optional[list[str]] = None) -> None:
    provider.main(EksStandIn(), argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
