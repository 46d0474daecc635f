"""A recording mock engine: runs a real Pulumi program with no CLI, cloud or credentials.

The offline plan and the tests both use it. It replaces the Pulumi engine through
``pulumi.runtime.set_mocks`` and records every ``RegisterResourceRequest`` whole: inputs,
parent, provider, protect, retain_on_delete, dependencies, remote. Two gaps of the stock
``MockMonitor`` are closed here:

* Resource objects passed as inputs (``cluster=cluster``) make the stock monitor
  deserialize them on its own thread, which fails with "attached to a different loop" or
  hangs (pulumi/pulumi#6465). This monitor decodes requests itself and turns every
  resource reference into its URN.
* pulumi-eks components are remote: the engine would construct their children in the
  plugin. The mock returns the outputs a program reads (kubeconfig, OIDC, security group
  and a real resource reference for ``eksCluster``).

Outputs are derived from names, so two runs of the same program record the same graph. The graph
type it fills (`Recording`) lives in `infra/recording.py`, which the program itself may read.

It is at least as strict as the real engine (pulumi/pulumi, quoted in tests/infra/test_engine_rules.py):
a run that `pulumi preview` would refuse raises ``EngineRefusal`` naming every offending resource
or invoke and its fix:

* a resource, remote component, read or invoke with no explicit provider whose package's
  default provider ``pulumi:disable-default-providers`` disables (the SDK has already applied
  the provider a resource or invoke inherits from its ``parent``: what arrives here is final);
* two resources with one URN;
* (given ``working_dir``, as the offline plan always does) a local path a provider reads
  (kustomize directory, YAML file, local chart, file asset) that does not exist where the
  provider resolves it: in the program's working directory, the folder Pulumi.yaml's ``main``
  names.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from google.protobuf import struct_pb2

import pulumi
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime.proto import resource_pb2
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from infra.plan import input_rules, mock_outputs, pulumi_eks
from infra.recording import SECRET_PLACEHOLDER, RecordedResource, Recording, ResourceReference

_SIG = "4dabf18193072939515e22adb298388d"
_SIG_SECRET = "1b47061264138c4ac30d75fd1eb44270"
_SIG_RESOURCE = "5cf8f73096256a8f31e491e813e4eb8e"
_SIG_OUTPUT = "d0e6a833031e9bbcd3f4e8bde6ca49a4"
_SIG_ASSET = "c44067f5952c0a294b673a41bacd8c17"
_SIG_ARCHIVE = "0def7320c3a5731c473e5ecbe6d01bc7"
_UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"

DEFAULT_ACCOUNT_ID = mock_outputs.DEFAULT_ACCOUNT_ID
DEFAULT_REGION = mock_outputs.DEFAULT_REGION


class RecordingMocks(pulumi_mocks.Mocks):
    """Returns plausible outputs for every resource and the invokes the platform uses."""

    def __init__(self, epoch: Optional[int] = None) -> None:
        self.by_urn: dict[str, RecordedResource] = {}
        # None: invokes that return a fresh random value each run (GetRandomPassword) return
        # nothing, so plans are stable. An int: a value of that run, as two real `up`s differ.
        self.epoch = epoch

    # The monitor sets this before calling new_resource, so outputs can use the URN, account
    # and region of the resource being registered. The SDK registers resources from a thread
    # pool: one "current" per thread, or concurrent registrations would swap their records
    # (and ids, derived from the URN, would change from run to run).
    _local = threading.local()

    @property
    def current(self) -> Optional[RecordedResource]:
        return getattr(self._local, "record", None)

    @current.setter
    def current(self, record: Optional[RecordedResource]) -> None:
        self._local.record = record

    def account_and_region(self, resource: Optional[RecordedResource]) -> tuple[str, str]:
        provider = self.by_urn.get(resource.provider_for("aws") or "") if resource else None
        return mock_outputs.account_and_region(provider.inputs if provider is not None else None)

    def new_resource(self, args: pulumi_mocks.MockResourceArgs) -> tuple[Optional[str], dict]:
        resource = self.current
        account, region = self.account_and_region(resource)
        seed = resource.urn if resource else f"{args.typ}/{args.name}"
        if args.typ == pulumi_eks.CLUSTER_TYPE:
            # A remote component: the monitor records its children and fills its outputs.
            return f"{args.name}-{mock_outputs.digest_of(seed)[:8]}", {}
        resource_id, outputs = mock_outputs.fabricate(args.typ, args.name, seed, args.inputs, account, region)
        if args.typ.startswith("pulumi:providers:"):
            return resource_id, dict(args.inputs)
        return resource_id, outputs

    def call(self, args: pulumi_mocks.MockCallArgs) -> tuple[dict, Optional[list]]:
        resource = self.by_urn.get((args.provider or "").split("::")[0] or "") if args.provider else None
        provider = self.by_urn.get(args.provider.rsplit("::", 1)[0]) if args.provider else None
        account, region = self.account_and_region(
            RecordedResource("", "", "", True, False, None, provider.urn if provider else None, {}, False, False, [], {})
            if provider
            else resource
        )
        seed = None if self.epoch is None else json.dumps([self.epoch, args.provider])
        answer = mock_outputs.invoke(args.token, args.args, account, region, random_seed=seed)
        return (answer if answer is not None else {}), None


# -- what the real engine refuses ---------------------------------------------------------
class EngineRefusal(Exception):
    """What `pulumi preview` / `pulumi up` would refuse in the program, every instance at once."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__(f"the Pulumi engine would refuse this program ({len(self.problems)} problem"
                         f"{'s' if len(self.problems) != 1 else ''}):\n" + "\n".join(f"  - {p}" for p in self.problems))


DISABLE_DEFAULT_PROVIDERS = "pulumi:disable-default-providers"


def denied_default_providers(config: Mapping[str, str]) -> frozenset[str]:
    """The packages whose default provider the config disables, parsed as the engine does
    (pkg/resource/deploy/default_providers.go ``shouldDenyRequest``): a JSON list of strings,
    each trimmed, ``*`` for all; an empty string for none."""
    value = config.get(DISABLE_DEFAULT_PROVIDERS)
    if value is None or value == "":
        return frozenset()
    try:
        items = json.loads(value)
    except ValueError as error:
        raise EngineRefusal([f"Failed to parse {value}: {error} (config `{DISABLE_DEFAULT_PROVIDERS}`); "
                             "FIX: write it as a YAML list of package names"]) from None
    if not isinstance(items, list):
        raise EngineRefusal([f"Failed to parse {value}: not a list (config `{DISABLE_DEFAULT_PROVIDERS}`); "
                             "FIX: write it as a YAML list of package names"])
    names = set()
    for index, item in enumerate(items):
        if not isinstance(item, str):
            raise EngineRefusal([f"{DISABLE_DEFAULT_PROVIDERS}[{index}] must be a string, not {item!r}"])
        names.add(item.strip())
    return frozenset(names)


def default_provider_denied(package: str, denied: frozenset[str]) -> bool:
    # default_providers.go: `if req.Package().Name().String() == "pulumi"` -> always allowed.
    return package != "pulumi" and ("*" in denied or package in denied)


# Inputs a provider reads as local paths, per type (pulumi-kubernetes builds these in the
# provider process, whose working directory is the program's: the folder `main` names).
PROVIDER_READ_PATHS: dict[str, tuple[str, ...]] = {
    "kubernetes:kustomize/v2:Directory": ("directory",),
    "kubernetes:yaml/v2:ConfigFile": ("file",),
    "kubernetes:yaml/v2:ConfigGroup": ("files",),
    "kubernetes:helm.sh/v4:Chart": ("chart",),
    "kubernetes:helm.sh/v3:Release": ("chart",),
}
_HELM_TYPES = ("kubernetes:helm.sh/v4:Chart", "kubernetes:helm.sh/v3:Release")


def _is_local_path(type_: str, value: Any) -> bool:
    if not isinstance(value, str) or not value or "://" in value or value.startswith(("oci:", "git@", "github.com/")):
        return False
    # A chart name ("karpenter", "repo/chart") is not a path; helm reads a local chart only from a path.
    return value.startswith((".", "/")) if type_ in _HELM_TYPES else True


def _provider_read_paths(type_: str, inputs: Mapping[str, Any]) -> list[tuple[str, str]]:
    found = []
    for key in PROVIDER_READ_PATHS.get(type_, ()):
        values = inputs.get(key)
        for value in values if isinstance(values, list) else [values]:
            if _is_local_path(type_, value) and not any(c in value for c in "*?["):
                found.append((key, value))
    return found


def _asset_paths(struct: struct_pb2.Struct, prefix: str = "") -> list[tuple[str, str]]:
    """File assets and archives anywhere in the inputs: the engine reads them relative to the
    program's working directory (source_eval.go: ``WorkingDirectory: rm.workingDirectory``)."""
    found = []

    def walk(value: struct_pb2.Value, path: str) -> None:
        kind = value.WhichOneof("kind")
        if kind == "struct_value":
            fields = value.struct_value.fields
            if _SIG in fields and fields[_SIG].string_value in (_SIG_ASSET, _SIG_ARCHIVE) and "path" in fields:
                found.append((path, fields["path"].string_value))
                return
            for key, item in fields.items():
                walk(item, f"{path}.{key}" if path else key)
        elif kind == "list_value":
            for index, item in enumerate(value.list_value.values):
                walk(item, f"{path}[{index}]")

    for key, value in struct.fields.items():
        walk(value, key)
    return found


class RecordingMonitor(pulumi_mocks.MockMonitor):
    """MockMonitor that records whole requests and never deserializes resource objects."""

    def __init__(self, mocks: RecordingMocks, project: str, stack: str, *, denied: frozenset[str] = frozenset(),
                 main: Optional[str] = None, prepared_paths: Iterable[Path] = (), check_paths: bool = False):
        super().__init__(mocks)
        self.recording_mocks = mocks
        self.records: list[RecordedResource] = []
        self.project = project
        self.stack = stack
        # Packages whose default provider is disabled (`pulumi:disable-default-providers`).
        self.denied = denied
        # Pulumi.yaml's `main` (for messages) and the paths the entry point writes before the
        # program registers anything (they need not exist offline).
        self.main = main
        # Paths are checked only for a run that says where the program runs (as the CLI would).
        self.check_paths = check_paths
        self.prepared_paths = {Path(p).resolve() for p in prepared_paths}
        # What the engine would refuse, reported together after the run.
        self.problems: list[str] = []
        self._lock = threading.Lock()
        self._urns: set[str] = set()
        # URNs of resources only the mock knows (a remote component's children such as the
        # eksCluster it returns) -> the recorded resource that stands for them.
        self.aliases: dict[str, str] = {}

    def make_urn(self, parent: str, type_: str, name: str) -> str:
        """The engine's URN: the parent's *whole* qualified type, then this type (pulumi/pulumi
        pkg/resource/deploy/source_eval.go: "Skip empty parents and don't use the root stack type;
        otherwise, use the full qualified type"). The stock MockMonitor keeps only the parent's
        last type, which no real stack has for a resource nested two levels deep."""
        if parent:
            parent_type = parent.split("::")[2]
            if parent_type != "pulumi:pulumi:Stack":
                type_ = parent_type + "$" + type_
        return f"urn:pulumi:{self.stack}::{self.project}::{type_}::{name}"

    def refuse(self, problem: str) -> None:
        with self._lock:
            if problem not in self.problems:
                self.problems.append(problem)

    def _check_provider(self, kind: str, type_: str, name: str, urn: Optional[str], provider: str) -> None:
        """source_eval.go: an empty provider reference resolves to the package's default provider;
        a denied one is refused (``diag.GetDefaultProviderDenied``)."""
        package = type_.split(":", 1)[0]
        if provider or not default_provider_denied(package, self.denied):
            return
        what = f"{kind} {type_} '{name}'" if name else f"{kind} {type_}"
        option = "pulumi.InvokeOutputOptions" if kind == "invoke" else "pulumi.ResourceOptions"
        self.refuse(
            f"{what}: Default provider for '{package}' disabled. '{urn or type_}' must use an explicit provider "
            f"(Pulumi.yaml `{DISABLE_DEFAULT_PROVIDERS}` lists '{package}'). FIX: pass opts={option}(provider=<a "
            f"{package} provider>), or parent=<a resource whose `providers` has '{package}'>: the SDK takes the "
            f"parent's provider for the same package")

    def _check_paths(self, type_: str, name: str, inputs: Mapping[str, Any], struct: struct_pb2.Struct) -> None:
        """A relative path is read in the provider's and engine's working directory: the folder
        Pulumi.yaml's `main` names (pkg/engine/project.go getPwdMain), which is this process's."""
        if not self.check_paths:
            return
        cwd = Path(os.getcwd())
        for key, value in _provider_read_paths(type_, inputs) + _asset_paths(struct):
            resolved = (cwd / value).resolve()
            if resolved.exists() or resolved in self.prepared_paths:
                continue
            self.refuse(
                f"{type_} '{name}' input `{key}` = {value!r}: read by the provider in its working directory "
                f"{cwd} (Pulumi.yaml main: {self.main or '.'}), that is {resolved}, which does not exist. "
                f"FIX: build the path from the module that owns the file (os.path.relpath(<absolute path>)), "
                f"not from the project root")

    def ReadResource(self, request):  # noqa: N802 - gRPC method name
        self._check_provider("read", request.type, request.name, None, request.provider)
        return super().ReadResource(request)

    def RegisterResource(self, request):  # noqa: N802 - gRPC method name
        urn = self.make_urn(request.parent, request.type, request.name)
        if request.type == "pulumi:pulumi:Stack":
            return resource_pb2.RegisterResourceResponse(urn=urn)
        with self._lock:
            duplicate = urn in self._urns
            self._urns.add(urn)
        if duplicate:
            # step_generator.go generateURN: diag.GetDuplicateResourceURNError.
            self.refuse(f"Duplicate resource URN '{urn}'; try giving it a unique name")
        if (request.custom and not request.type.startswith("pulumi:providers:")) or request.remote:
            self._check_provider("resource", request.type, request.name, urn, request.provider)

        provider = request.provider.rsplit("::", 1)[0] if request.provider else None
        record = RecordedResource(
            urn=urn,
            type=request.type,
            name=request.name,
            custom=bool(request.custom),
            remote=bool(request.remote),
            parent=request.parent or None,
            provider=provider,
            providers={pkg: ref.rsplit("::", 1)[0] for pkg, ref in request.providers.items()},
            protect=bool(request.protect) if request.HasField("protect") else False,
            retain_on_delete=bool(request.retainOnDelete) if request.HasField("retainOnDelete") else False,
            dependencies=list(request.dependencies),
            inputs=decode_struct(request.object),
            property_dependencies={key: list(deps.urns) for key, deps in request.propertyDependencies.items()},
            alias_urns=self._alias_urns(request),
            alias_specs=_alias_specs(request),
            ignore_changes=list(request.ignoreChanges),
            revealed_inputs=decode_struct(request.object, reveal=True),
        )
        self._check_paths(request.type, request.name, record.inputs, request.object)
        if record.is_provider:
            # Providers receive structured config JSON-encoded, as the engine passes it.
            record.inputs = {k: mock_outputs.json_or_value(v) for k, v in record.inputs.items()}
        self.recording_mocks.by_urn[urn] = record
        self.recording_mocks.current = record
        args = pulumi_mocks.MockResourceArgs(
            typ=request.type, name=request.name, inputs=record.inputs, provider=request.provider,
            resource_id=request.importId, custom=request.custom or False,
        )
        id_, state = self.mocks.new_resource(args)
        record.id = id_
        self._check_inputs(record)
        self.records.append(record)
        output_dependencies: dict[str, list[str]] = {}
        if request.remote and request.type == pulumi_eks.CLUSTER_TYPE:
            # The component registers before its children (Construct registers it first).
            state, output_dependencies = self._record_eks_cluster(record, list(request.transforms))
        record.outputs = state
        self.resources[urn] = pulumi_mocks.MockMonitor.ResourceRegistration(urn, id_ or "", state)
        # A remote component's outputs carry the resources they come from (the Construct response's
        # propertyDependencies), so a resource built from one depends on them, as under the engine.
        return resource_pb2.RegisterResourceResponse(
            urn=urn, id=id_ or "", object=encode_struct(state),
            propertyDependencies={key: resource_pb2.RegisterResourceResponse.PropertyDependencies(urns=urns)
                                  for key, urns in output_dependencies.items() if urns})

    def _alias_urns(self, request) -> list[str]:
        """The URNs a resource's `aliases` say it used to have (what a rename must carry)."""
        urns = list(request.aliasURNs)
        for alias in request.aliases:
            if alias.urn:
                urns.append(alias.urn)
                continue
            spec = alias.spec
            parent = "" if spec.noParent else (spec.parentUrn or request.parent)
            urn = self.make_urn(parent, spec.type or request.type, spec.name or request.name)
            if spec.stack or spec.project:
                _, _, rest = urn.partition("::")
                _, _, rest = rest.partition("::")
                urn = f"urn:pulumi:{spec.stack or self.stack}::{spec.project or self.project}::{rest}"
            urns.append(urn)
        return urns

    def _record_eks_cluster(self, component: RecordedResource, transforms: Sequence[Any]) -> tuple[dict, dict]:
        """Record the children pulumi-eks's Cluster registers (``infra.plan.pulumi_eks``, the model
        the ``eks`` stand-in plugin registers with the real engine), each first through the
        transforms given to the component, as the engine runs them for a packaged component's
        children; return the component's outputs and, per output, the URNs it comes from."""
        account, region = self.recording_mocks.account_and_region(component)
        recorder = _ChildRecorder(self, component, account, region, transforms)
        try:
            for child in pulumi_eks.cluster_children(component.name, component.inputs, recorder):
                recorder.record(child)
            outputs = pulumi_eks.cluster_outputs(component.name, component.inputs, recorder)
        except (pulumi_eks.UnsupportedOptions, ValueError) as error:
            self.refuse(f"{component.type} '{component.name}': {error}")
            return {}, {}
        dependencies = {}
        for key, (children, inputs) in pulumi_eks.OUTPUT_DEPENDENCIES.items():
            urns = [recorder.records[child].urn for child in children if child in recorder.records]
            for input_key in inputs:
                urns += [u for u in component.property_dependencies.get(input_key, []) if u not in urns]
            dependencies[key] = urns
        return outputs, dependencies

    def _check_inputs(self, record: RecordedResource) -> None:
        """The inputs a provider's Check refuses (``infra.plan.input_rules``, shared with the
        stand-in plugins): names the pinned SDK's input type lacks, required ones missing."""
        if not (record.custom or record.remote):
            return
        for problem in input_rules.check_inputs(record.type, record.inputs):
            self.refuse(f"{record.type} '{record.name}' input {problem}. FIX: use the input names of the pinned "
                        f"SDK's {record.package} types (a transform or a dictionary input is not checked by the SDK)")

    def Invoke(self, request):  # noqa: N802 - gRPC method name
        args = decode_struct(request.args)
        self._check_provider("invoke", request.tok, "", None, request.provider)
        if request.tok == "pulumi:pulumi:getResource":
            registration = self.resources.get(args["urn"])
            if registration is None:
                raise KeyError(f"unknown resource {args['urn']}")
            payload = {"urn": registration.urn, "id": registration.id, "state": registration.state}
            return resource_pb2.ResourceInvokeResponse(failures=None, **{"return": encode_struct(payload)})
        ret, _ = self.mocks.call(pulumi_mocks.MockCallArgs(token=request.tok, args=args, provider=request.provider))
        return resource_pb2.ResourceInvokeResponse(failures=None, **{"return": encode_struct(ret)})

    def Call(self, request):  # noqa: N802 - gRPC method name
        raise NotImplementedError(
            f"component method {request.tok} is not mocked; read the component's outputs instead of calling methods"
        )

    def SupportsFeature(self, request):  # noqa: N802 - gRPC method name
        return type("SupportsFeatureResponse", (object,), {"hasSupport": request.id not in ("outputValues",)})


class _ChildRecorder:
    """``pulumi_eks.Resolver`` over recorded children: values are plain (the offline plan runs
    every apply), outputs fabricated as for any other resource."""

    def __init__(self, monitor: "RecordingMonitor", component: RecordedResource, account: str, region: str,
                 transforms: Sequence[Any]):
        self.monitor, self.component = monitor, component
        self.account, self.region = account, region
        self.transforms = list(transforms)
        self.records: dict[str, RecordedResource] = {}
        self._used: set[str] = set()

    def ref(self, key: str, path: Optional[str] = None) -> Any:
        record = self.records[key]
        self._used.add(key)
        if path is None:
            return ResourceReference(record.urn, record.id or "")
        value: Any = record.outputs
        for part in path.split("."):
            value = value[int(part)] if isinstance(value, list) else (value or {}).get(part)
        return value

    def combine(self, fn: Callable[..., Any], *values: Any) -> Any:
        return fn(*values)

    def partition(self) -> Any:
        return mock_outputs.invoke("aws:index/getPartition:getPartition", {}, self.account, self.region)["partition"]

    def endpoint(self) -> Any:
        return self.ref("eksCluster", "endpoint")

    def kubeconfig_user(self) -> None:
        return None

    def record(self, child: "pulumi_eks.Child") -> None:
        monitor, component = self.monitor, self.component
        parent = self.records[child.parent] if child.parent else component
        urn = monitor.make_urn(parent.urn, child.type, child.name)
        inputs = _ids_for_references(child.inputs)
        for callback in self.transforms:
            inputs = _run_transform(callback, child.type, child.name, parent.urn, inputs, custom=child.custom)
        dependencies = [self.records[key].urn for key in sorted(set(child.depends_on) | self._used)]
        for key in child.reads:
            dependencies += [urn for urn in component.property_dependencies.get(key, []) if urn not in dependencies]
        self._used = set()
        is_provider = child.type.startswith("pulumi:providers:")
        if is_provider:
            # As RegisterResource records a provider's inputs: structured config JSON-decoded.
            inputs = {key: mock_outputs.json_or_value(value) for key, value in inputs.items()}
        record = RecordedResource(
            urn=urn, type=child.type, name=child.name, custom=child.custom, remote=False, parent=parent.urn,
            provider=component.provider_for(child.type.split(":", 1)[0]) if child.custom and not is_provider else None,
            providers={}, protect=component.protect, retain_on_delete=False, dependencies=dependencies,
            inputs=inputs, ignore_changes=list(child.ignore_changes), revealed_inputs=dict(inputs))
        record.id, outputs = mock_outputs.fabricate(child.type, child.name, urn, inputs, self.account, self.region)
        # A component's outputs are what it registers (none here); a provider's are its inputs.
        record.outputs = outputs if child.custom and not is_provider else (dict(inputs) if is_provider else {})
        with monitor._lock:
            duplicate = urn in monitor._urns
            monitor._urns.add(urn)
        if duplicate:
            monitor.refuse(f"Duplicate resource URN '{urn}'; try giving it a unique name")
        monitor._check_inputs(record)
        monitor.records.append(record)
        monitor.resources[urn] = pulumi_mocks.MockMonitor.ResourceRegistration(urn, record.id or "", record.outputs)
        self.records[child.key] = record


def _ids_for_references(value: Any) -> Any:
    """A resource passed as an input reaches a provider that does not accept resources as its id
    (the engine downgrades the reference): what the state records."""
    if isinstance(value, ResourceReference):
        return value.id
    if isinstance(value, dict):
        return {key: _ids_for_references(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_ids_for_references(item) for item in value]
    return value


def _alias_specs(request) -> list[dict[str, Any]]:
    """The request's aliases as the engine parses them (source_eval.go RegisterResource:
    ``resource.Alias{Name, Type, Stack, Project}`` plus ``Parent`` or ``NoParent``)."""
    specs: list[dict[str, Any]] = [{"urn": urn} for urn in request.aliasURNs]
    for alias in request.aliases:
        if alias.urn:
            specs.append({"urn": alias.urn})
            continue
        spec = alias.spec
        which = spec.WhichOneof("parent")
        specs.append({"name": spec.name, "type": spec.type, "stack": spec.stack, "project": spec.project,
                      "parent": spec.parentUrn if which == "parentUrn" else "",
                      "noParent": bool(spec.noParent) if which == "noParent" else False})
    return specs


def _run_transform(callback: Any, type_: str, name: str, parent_urn: str, inputs: dict[str, Any],
                   custom: bool = True) -> dict[str, Any]:
    """Call a program's transform through its callback server, as the engine does."""
    import grpc
    from pulumi.runtime.proto import callback_pb2, callback_pb2_grpc

    request = resource_pb2.TransformRequest(type=type_, name=name, custom=custom, parent=parent_urn,
                                            properties=encode_struct(inputs))
    with grpc.insecure_channel(callback.target) as channel:
        response = callback_pb2_grpc.CallbacksStub(channel).Invoke(
            callback_pb2.CallbackInvokeRequest(token=callback.token, request=request.SerializeToString()), timeout=30)
    result = resource_pb2.TransformResponse.FromString(response.response)
    return decode_struct(result.properties)


# -- protobuf Struct <-> plain values -----------------------------------------------------
def decode_struct(struct: struct_pb2.Struct, *, reveal: bool = False) -> dict[str, Any]:
    """Plain values; secrets as "[secret]" unless ``reveal`` (the second-`up` comparison)."""
    return {key: _decode(value, reveal) for key, value in struct.fields.items()}


def _decode(value: struct_pb2.Value, reveal: bool = False) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "null_value":
        return None
    if kind == "bool_value":
        return value.bool_value
    if kind == "number_value":
        number = value.number_value
        return int(number) if number.is_integer() else number
    if kind == "string_value":
        return None if value.string_value == _UNKNOWN else value.string_value
    if kind == "list_value":
        return [_decode(v, reveal) for v in value.list_value.values]
    if kind == "struct_value":
        fields = value.struct_value.fields
        if _SIG in fields:
            sig = fields[_SIG].string_value
            if sig == _SIG_SECRET:
                return _decode(fields["value"], reveal) if reveal and "value" in fields else SECRET_PLACEHOLDER
            if sig == _SIG_RESOURCE:
                return fields["urn"].string_value
            if sig == _SIG_OUTPUT:
                if "secret" in fields and fields["secret"].bool_value and not reveal:
                    return SECRET_PLACEHOLDER
                return _decode(fields["value"], reveal) if "value" in fields else None
            if sig == _SIG_ASSET:
                return {key: _decode(v) for key, v in fields.items() if key != _SIG}
            if sig == _SIG_ARCHIVE:
                return {key: _decode(v) for key, v in fields.items() if key != _SIG}
        return {key: _decode(v, reveal) for key, v in fields.items()}
    return None


def encode_struct(values: dict[str, Any]) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    for key, value in values.items():
        _encode_into(struct.fields[key], value)
    return struct


def _encode_into(target: struct_pb2.Value, value: Any) -> None:
    if isinstance(value, ResourceReference):
        ref = {_SIG: _SIG_RESOURCE, "urn": value.urn, "id": value.id, "packageVersion": ""}
        target.struct_value.update({})
        for key, item in ref.items():
            _encode_into(target.struct_value.fields[key], item)
    elif value is None:
        target.null_value = struct_pb2.NULL_VALUE
    elif isinstance(value, bool):
        target.bool_value = value
    elif isinstance(value, (int, float)):
        target.number_value = float(value)
    elif isinstance(value, str):
        target.string_value = value
    elif isinstance(value, (list, tuple)):
        target.list_value.Clear()
        for item in value:
            _encode_into(target.list_value.values.add(), item)
    elif isinstance(value, dict):
        target.struct_value.Clear()
        for key, item in value.items():
            _encode_into(target.struct_value.fields[str(key)], item)
    else:
        target.string_value = str(value)


def run_recorded(
    program: Callable[[], Any],
    *,
    project: str,
    stack: str,
    config: Optional[dict[str, str]] = None,
    secret_keys: Sequence[str] = (),
    working_dir: Optional[Path] = None,
    main: Optional[str] = None,
    prepared_paths: Iterable[Path] = (),
    epoch: Optional[int] = None,
) -> Recording:
    """Run ``program`` under the recording engine (preview off, so every apply runs).

    ``config`` maps full keys (``project:key``) to the strings the CLI would pass, project-level
    config (Pulumi.yaml ``config:``) included: ``pulumi:disable-default-providers`` there makes
    provider-less resources and invokes of those packages an ``EngineRefusal``.
    ``working_dir``: run the program there, as the language host does (the folder ``main``
    names, ``main`` its text for messages), and check the local paths providers read from
    there (without it, the caller's directory and no path check); ``prepared_paths``: paths the entry point writes before
    the program (they need not exist offline). ``epoch``: see ``RecordingMocks``.
    """
    config = dict(config or {})
    mocks = RecordingMocks(epoch)
    monitor = RecordingMonitor(mocks, project, stack, denied=denied_default_providers(config), main=main,
                               prepared_paths=prepared_paths, check_paths=working_dir is not None)
    logger = logging.getLogger("mlplatform.mock_engine")
    # ``set_mocks`` builds a root Stack only when none is set: cleared, each recording gets its own
    # ``project-stack`` root instead of one left by an earlier recording in this process.
    pulumi.runtime.settings.ROOT.set(None)
    pulumi.runtime.set_mocks(mocks, project=project, stack=stack, preview=False, monitor=monitor, logger=logger)
    pulumi.runtime.set_all_config(config, list(secret_keys))
    settings = pulumi.runtime.settings.SETTINGS
    settings.rpc_manager.clear()
    settings.outputs.clear()
    exported: dict[str, Any] = {}
    original_export = pulumi.export

    def export(name: str, value: Any) -> None:
        exported[name] = value
        original_export(name, value)

    pulumi.export = export  # type: ignore[assignment]
    previous_dir = os.getcwd()
    try:
        if working_dir is not None:
            os.chdir(working_dir)
        try:
            _sync_await(run_pulumi_func(program))
            resolved = {key: _sync_await(_resolve(value)) for key, value in exported.items()}
        except Exception as error:
            # The engine stops at the first refusal; whatever the program did next is moot.
            if monitor.problems:
                raise EngineRefusal(monitor.problems) from error
            raise
    finally:
        os.chdir(previous_dir)
        pulumi.export = original_export  # type: ignore[assignment]
    if monitor.problems:
        raise EngineRefusal(monitor.problems)
    return Recording(resources=list(monitor.records), stack_outputs=resolved, aliases=dict(monitor.aliases))


async def _resolve(value: Any) -> Any:
    output = pulumi.Output.from_input(value)
    if await output.is_secret():
        return SECRET_PLACEHOLDER
    return await output.future()
