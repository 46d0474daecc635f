"""``pulumi-resource-aws`` stand-in: a resource provider plugin for package ``aws`` that the real
Pulumi engine loads from PATH (an "ambient" plugin, pulumi/pulumi sdk/go/common/workspace/plugins.go
``getPluginInfoAndPath``), speaking the provider protocol through the Python SDK's generated stubs.

What it does, per call:

* ``Handshake``/``Configure``: takes neither secrets nor resource references (the engine unwraps
  secrets and turns references into ids first, as for pulumi-aws's bridge), supports preview. The
  account and region come from the provider's inputs (the first assumed role's account, else the
  only allowed account; ``region``), as ``infra.plan.mock_outputs.account_and_region`` reads them.
* ``CheckConfig``/``Check``: refuses unknown and missing required inputs against the pinned SDK's
  input types (``infra.plan.input_rules``, shared with the offline plan), and names a resource that
  gives no ``name`` (``bucket`` for a bucket) the way the bridge autonames it: ``<name>-<7 hex>``,
  kept across updates through ``__defaults``.
* ``Diff``: changed inputs; a replacement where ``replacements.REPLACE_ON_CHANGE`` says AWS cannot
  change the value in place; delete-before-replace when the resource's name was given explicitly
  (the bridge's ``nameRequiresDeleteBeforeReplace``); write-only inputs (``secretStringWo``) never diff.
* ``Create``/``Read``/``Update``/``Delete``: keep each resource in ``state.StateStore``, with ids,
  ARNs and names from ``infra.plan.mock_outputs.fabricate`` (the same as the offline plan's for a
  first creation); a second live resource with the same physical name fails as AWS refuses it;
  deletion protection (RDS, EKS, load balancers) refuses a delete as the service does. An
  ``aws:eks/cluster:Cluster`` reports the test control plane (``MLP_STANDIN_KUBECONFIG``) as its
  endpoint and CA, so the kubeconfig built from it reaches a real API server.
* ``Invoke``: the lookups the program makes (``infra.plan.mock_outputs.invoke``); any other token
  fails with its name.

    python -m tools.engine.standins.aws <engine address>    # what pulumi-resource-aws runs
"""
from __future__ import annotations

import argparse
import concurrent.futures
import importlib.metadata
import json
import secrets
import sys
import threading
from typing import Any, Mapping, Optional

import grpc
from google.protobuf import empty_pb2

from infra.plan import input_rules, mock_outputs
from pulumi.runtime.proto import plugin_pb2, provider_pb2, provider_pb2_grpc
from tools.engine.standins import replacements
from tools.engine.standins.control_plane import control_plane
from tools.engine.standins.state import StateError, StateStore
from tools.engine.standins.wire import UNKNOWN, contains_unknown, decode, encode

PACKAGE = "aws"
VERSION = importlib.metadata.version("pulumi-aws")  # the pin the SDK asks the engine for

# The bridge autonames a resource's `name` (pulumi-aws resources.go: SetAutonaming(255, "-")) and,
# for a bucket, `bucket` (lower case).
AUTONAMED = {"aws:s3/bucket:Bucket": "bucket"}
# Types whose names are unique per account rather than per region, or across AWS for S3.
GLOBAL_NAMES = ("aws:iam/",)
PARTITION_WIDE_NAMES = ("aws:s3/bucket:Bucket",)
# What each service refuses to delete while its deletion protection is on (RDS DeleteDBCluster,
# EKS DeleteCluster, ELBv2 DeleteLoadBalancer: "deletion protection" in each API reference); the
# message is the stand-in's, not the service's wording.
DELETION_PROTECTION = {
    "aws:rds/cluster:Cluster": "deletionProtection",
    "aws:eks/cluster:Cluster": "deletionProtection",
    "aws:lb/loadBalancer:LoadBalancer": "enableDeletionProtection",
}
DEFAULTS_KEY = "__defaults"


def _type_and_name(urn: str) -> tuple[str, str]:
    parts = urn.split("::")
    return parts[2].split("$")[-1], parts[3]


def autonamed_property(type_: str) -> Optional[str]:
    """The input the bridge fills with an autoname when the program leaves it out."""
    if type_ in AUTONAMED:
        return AUTONAMED[type_]
    names = input_rules.input_names(type_) or frozenset()
    if "name" in names and "name" not in input_rules.required_inputs(type_) and not type_.startswith("pulumi:providers:"):
        return "name"
    return None


def _strip(inputs: Mapping[str, Any], drop: frozenset[str] = frozenset()) -> dict:
    return {key: value for key, value in inputs.items() if key != DEFAULTS_KEY and key not in drop}


class AwsStandIn(provider_pb2_grpc.ResourceProviderServicer):
    def __init__(self, store: Optional[StateStore] = None):
        self._store = store
        self.config: dict[str, Any] = {}
        self.account, self.region = mock_outputs.DEFAULT_ACCOUNT_ID, mock_outputs.DEFAULT_REGION
        self.default_tags: dict[str, str] = {}
        self._lock = threading.Lock()

    @property
    def store(self) -> StateStore:
        if self._store is None:
            self._store = StateStore()
        return self._store

    # -- plugin ----------------------------------------------------------------------------
    def Handshake(self, request, context):  # noqa: N802 - gRPC method names
        return provider_pb2.ProviderHandshakeResponse(accept_secrets=False, accept_resources=False,
                                                      accept_outputs=False, supports_autonaming_configuration=False)

    def GetPluginInfo(self, request, context):  # noqa: N802
        return plugin_pb2.PluginInfo(version=VERSION)

    def GetSchema(self, request, context):  # noqa: N802
        # No schema: the stand-in serves the pinned SDK's types, which carry their own.
        return provider_pb2.GetSchemaResponse(schema=json.dumps({"name": PACKAGE, "version": VERSION}))

    def Cancel(self, request, context):  # noqa: N802
        return empty_pb2.Empty()

    def GetMapping(self, request, context):  # noqa: N802
        return provider_pb2.GetMappingResponse(provider="", data=b"")

    def GetMappings(self, request, context):  # noqa: N802
        return provider_pb2.GetMappingsResponse(providers=[])

    # -- provider configuration ------------------------------------------------------------
    def CheckConfig(self, request, context):  # noqa: N802
        news = decode(request.news)
        failures = [provider_pb2.CheckFailure(property=p.path, reason=p.reason)
                    for p in input_rules.check_inputs(f"pulumi:providers:{PACKAGE}", news, unknown=UNKNOWN)]
        return provider_pb2.CheckResponse(inputs=request.news, failures=failures)

    def DiffConfig(self, request, context):  # noqa: N802
        olds = _strip(decode(request.old_inputs if request.HasField("old_inputs") else request.olds), frozenset({"version"}))
        news = _strip(decode(request.news), frozenset({"version"}))
        changed = sorted(key for key in set(olds) | set(news) if olds.get(key) != news.get(key))
        return provider_pb2.DiffResponse(
            changes=provider_pb2.DiffResponse.DIFF_SOME if changed else provider_pb2.DiffResponse.DIFF_NONE,
            diffs=changed, hasDetailedDiff=True,
            detailedDiff={key: provider_pb2.PropertyDiff(kind=_kind(olds, news, key, False), inputDiff=True)
                          for key in changed})

    def Configure(self, request, context):  # noqa: N802
        args = decode(request.args) if request.HasField("args") else {
            key.split(":", 1)[-1]: value for key, value in request.variables.items()}
        with self._lock:
            self.config = {key: mock_outputs.json_or_value(value) for key, value in args.items()}
            self.account, self.region = mock_outputs.account_and_region(self.config)
            tags = (self.config.get("defaultTags") or {})
            self.default_tags = dict(tags.get("tags") or {}) if isinstance(tags, dict) else {}
        return provider_pb2.ConfigureResponse(acceptSecrets=False, supportsPreview=True, acceptResources=False,
                                              acceptOutputs=False)

    # -- resources ------------------------------------------------------------------------------
    def Check(self, request, context):  # noqa: N802
        type_, name = _type_and_name(request.urn)
        if input_rules.args_class(type_) is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"unrecognized resource type (Check): {type_}: not a type of pulumi-aws {VERSION}")
        olds, news = decode(request.olds), decode(request.news)
        failures = [provider_pb2.CheckFailure(property=p.path, reason=p.reason)
                    for p in input_rules.check_inputs(type_, news, unknown=UNKNOWN)]
        checked = dict(news)
        defaults: list[str] = []
        key = autonamed_property(type_)
        if key and checked.get(key) is None and not checked.get(f"{key}Prefix"):
            if olds.get(key) and key in (olds.get(DEFAULTS_KEY) or []):
                checked[key] = olds[key]  # an autoname is kept for the resource's lifetime
            else:
                generation = self._generation(request.urn) if not olds else 0
                seed = request.urn if generation == 0 else f"{request.urn}#{generation}"
                checked[key] = mock_outputs.autoname(name, seed)
                if type_ in AUTONAMED:
                    checked[key] = checked[key].lower()
            defaults.append(key)
        checked[DEFAULTS_KEY] = defaults
        return provider_pb2.CheckResponse(inputs=encode(checked), failures=failures)

    def Diff(self, request, context):  # noqa: N802
        type_, _ = _type_and_name(request.urn)
        olds = decode(request.old_inputs) if request.HasField("old_inputs") else decode(request.olds)
        news = apply_ignore_changes(olds, decode(request.news), list(request.ignoreChanges))
        skip = input_rules.write_only_inputs(type_) | {DEFAULTS_KEY}
        changed = sorted(key for key in (set(olds) | set(news)) - skip if olds.get(key) != news.get(key))
        forcing = replacements.replacing_paths(type_, olds, news)
        replaces = sorted({path.split(".")[0] for path in forcing})
        detailed = {key: provider_pb2.PropertyDiff(kind=_kind(olds, news, key, key in replaces), inputDiff=True)
                    for key in changed if key not in replaces}
        for path in forcing:
            detailed[path] = provider_pb2.PropertyDiff(kind=_kind_path(olds, news, path), inputDiff=True)
        key = autonamed_property(type_)
        explicit_name = bool(key and news.get(key) is not None and key not in (news.get(DEFAULTS_KEY) or []))
        return provider_pb2.DiffResponse(
            changes=provider_pb2.DiffResponse.DIFF_SOME if changed or replaces else provider_pb2.DiffResponse.DIFF_NONE,
            replaces=replaces, diffs=sorted(set(changed) | set(replaces)),
            deleteBeforeReplace=bool(replaces) and explicit_name,
            detailedDiff=detailed, hasDetailedDiff=True)

    def Create(self, request, context):  # noqa: N802
        type_, name = _type_and_name(request.urn)
        inputs = decode(request.properties)
        if request.preview:
            _, fabricated = self._fabricate(type_, name, request.urn, inputs)
            outputs = {key: (value if key in inputs else UNKNOWN) for key, value in fabricated.items()}
            return provider_pb2.CreateResponse(id="", properties=encode(outputs))
        try:
            record = self.store.create(request.urn, lambda generation, names: self._new_record(
                type_, name, request.urn, inputs, generation, names))
        except (ValueError, StateError) as error:
            context.abort(grpc.StatusCode.UNKNOWN, str(error))
        return provider_pb2.CreateResponse(id=record["id"], properties=encode(record["outputs"]))

    def Read(self, request, context):  # noqa: N802
        type_, _ = _type_and_name(request.urn)
        record = self.store.get(request.urn, type_, request.id)
        if record is None:
            return provider_pb2.ReadResponse(id="")  # gone: the engine drops it from the stack
        return provider_pb2.ReadResponse(id=record["id"], properties=encode(record["outputs"]),
                                          inputs=encode(record["inputs"]))

    def Update(self, request, context):  # noqa: N802
        type_, name = _type_and_name(request.urn)
        olds, news = decode(request.olds), decode(request.news)
        record = self.store.get(request.urn, type_, request.id)
        if record is None and not request.preview:
            context.abort(grpc.StatusCode.NOT_FOUND, f"updating {type_} ({request.id}): not found (deleted outside "
                                                     "Pulumi? run `pulumi refresh`)")
        base = dict(record["outputs"]) if record else dict(olds)
        old_inputs = record["inputs"] if record else {}
        outputs = {key: value for key, value in base.items() if not (key in old_inputs and key not in news)}
        outputs.update(_strip(news, input_rules.write_only_inputs(type_)))
        if "tags" in (input_rules.input_names(type_) or ()):
            outputs["tagsAll"] = {**self.default_tags, **(news.get("tags") or {})}
        if request.preview:
            return provider_pb2.UpdateResponse(properties=encode(outputs))
        record.update(inputs=news, outputs=outputs)
        self.store.put(request.urn, record)
        return provider_pb2.UpdateResponse(properties=encode(outputs))

    def Delete(self, request, context):  # noqa: N802
        type_, _ = _type_and_name(request.urn)
        record = self.store.get(request.urn, type_, request.id)
        state = record["outputs"] if record else decode(request.properties)
        protection = DELETION_PROTECTION.get(type_)
        if protection and state.get(protection) is True:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"deleting {type_} ({request.id}): the service refuses, deletion protection is on "
                          f"(`{protection}: true`); set it false and update before deleting")
        self.store.delete(request.urn, type_, request.id)
        return empty_pb2.Empty()

    # -- invokes --------------------------------------------------------------------------------
    def Invoke(self, request, context):  # noqa: N802
        args = decode(request.args)
        region = args.get("region") or self.region
        answer = mock_outputs.invoke(request.tok, args, self.account, region, random_seed=secrets.token_hex(16))
        if answer is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED,
                          f"the aws stand-in does not answer invoke {request.tok} (answers: "
                          f"{', '.join(mock_outputs.INVOKE_TOKENS)}); add it to infra/plan/mock_outputs.invoke")
        return provider_pb2.InvokeResponse(**{"return": encode(answer)})

    # -- helpers --------------------------------------------------------------------------------
    def _generation(self, urn: str) -> int:
        try:
            return self.store.generation(urn)
        except StateError:
            return 0  # a preview with no state directory: nothing was created yet

    def _fabricate(self, type_: str, name: str, seed: str, inputs: Mapping[str, Any]) -> tuple[str, dict]:
        stored_inputs = _strip(inputs, input_rules.write_only_inputs(type_))
        region = inputs.get("region") if isinstance(inputs.get("region"), str) else self.region
        resource_id, outputs = mock_outputs.fabricate(type_, name, seed, stored_inputs, self.account, region)
        if "tags" in (input_rules.input_names(type_) or ()):
            outputs["tagsAll"] = {**self.default_tags, **(inputs.get("tags") or {})}
        if type_ == "aws:eks/cluster:Cluster":
            plane = control_plane()
            if plane is not None:
                outputs["endpoint"] = plane["server"]
                outputs["certificateAuthority"] = {"data": plane["ca"]}
        return resource_id, outputs

    def _new_record(self, type_: str, name: str, urn: str, inputs: dict, generation: int, names: dict) -> dict:
        if contains_unknown(inputs):
            raise ValueError(f"creating {type_} ({name}): inputs still unknown at create")
        seed = urn if generation == 0 else f"{urn}#{generation}"
        resource_id, outputs = self._fabricate(type_, name, seed, inputs)
        name_key = None
        key = autonamed_property(type_)
        physical = inputs.get(key) if key else None
        if isinstance(physical, str):
            scope = ("aws" if type_.startswith(PARTITION_WIDE_NAMES) else
                     self.account if type_.startswith(GLOBAL_NAMES) else f"{self.account}/{self.region}")
            name_key = f"{type_}|{scope}|{physical}"
            holder = names.get(name_key)
            if holder is not None:
                raise ValueError(f"creating {type_} ({physical}): AlreadyExists: a {type_.split(':')[-1]} named "
                                 f"'{physical}' already exists in {scope} (held by {holder['urn']}, id "
                                 f"{holder['id']}); AWS names are unique: delete the other one first "
                                 "(deleteBeforeReplace) or give this one another name")
        return {"type": type_, "id": resource_id, "urn": urn, "inputs": inputs, "outputs": outputs,
                "account": self.account, "region": self.region, "name_key": name_key, "generation": generation}


def apply_ignore_changes(olds: Mapping[str, Any], news: Mapping[str, Any], paths: list[str]) -> dict:
    """``news`` with the old value at each ignored path (dotted wire names), as the engine applies
    ``ignoreChanges`` (pulumi/pulumi pkg/resource/deploy/step_generator.go ``processIgnoreChanges``)."""
    import copy

    result = copy.deepcopy(dict(news))
    for path in paths:
        parts = path.replace("[", ".").replace("]", "").split(".")
        old: Any = olds
        for part in parts:
            old = old.get(part) if isinstance(old, Mapping) else None
        target: Any = result
        for part in parts[:-1]:
            if not isinstance(target, dict):
                break
            target = target.setdefault(part, {})
        if isinstance(target, dict):
            if old is None:
                target.pop(parts[-1], None)
            else:
                target[parts[-1]] = copy.deepcopy(old)
    return result


def _kind(olds: Mapping[str, Any], news: Mapping[str, Any], key: str, replace: bool) -> int:
    kinds = provider_pb2.PropertyDiff
    if key not in olds or olds.get(key) is None:
        return kinds.ADD_REPLACE if replace else kinds.ADD
    if key not in news or news.get(key) is None:
        return kinds.DELETE_REPLACE if replace else kinds.DELETE
    return kinds.UPDATE_REPLACE if replace else kinds.UPDATE


def _kind_path(olds: Mapping[str, Any], news: Mapping[str, Any], path: str) -> int:
    from tools.engine.standins.wire import get_path

    kinds = provider_pb2.PropertyDiff
    old, new = get_path(olds, path), get_path(news, path)
    if old is None:
        return kinds.ADD_REPLACE
    if new is None:
        return kinds.DELETE_REPLACE
    return kinds.UPDATE_REPLACE


def serve(servicer: provider_pb2_grpc.ResourceProviderServicer, argv: Optional[list[str]] = None) -> None:
    """Listen on a free loopback port, print it as the first line on stdout (what the engine reads,
    pulumi/pulumi sdk/go/common/resource/plugin/plugin.go ``parsePort``), serve until killed."""
    parser = argparse.ArgumentParser(description="Pulumi resource provider plugin (stand-in)")
    parser.add_argument("engine", nargs="?", help="the engine's address (unused: nothing is logged back)")
    parser.parse_known_args(argv)
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=32),
                         options=[("grpc.max_receive_message_length", 400 * 1024 * 1024),
                                  ("grpc.max_send_message_length", 400 * 1024 * 1024)])
    provider_pb2_grpc.add_ResourceProviderServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    sys.stdout.write(f"{port}\n")
    sys.stdout.flush()
    server.wait_for_termination()


def main(argv: Optional[list[str]] = None) -> None:
    serve(AwsStandIn(), argv)


if __name__ == "__main__":
    main()
