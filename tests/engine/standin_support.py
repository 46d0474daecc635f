"""Drive a stand-in provider servicer the way the engine does, without the CLI."""
from __future__ import annotations

from typing import Any, Optional

from pulumi.runtime.proto import provider_pb2

from tools.engine.standins.wire import decode, encode

PROJECT, STACK = "p", "s"


class Refused(Exception):
    """What ``context.abort`` raises: the gRPC status the engine would show."""

    def __init__(self, code, details: str):
        super().__init__(f"{code}: {details}")
        self.code, self.details = code, details


class Context:
    def abort(self, code, details):
        raise Refused(code, details)


def urn(type_: str, name: str, parent_type: Optional[str] = None) -> str:
    qualified = f"{parent_type}${type_}" if parent_type else type_
    return f"urn:pulumi:{STACK}::{PROJECT}::{qualified}::{name}"


def configure(servicer, **config: Any) -> None:
    servicer.Configure(provider_pb2.ConfigureRequest(args=encode(config), acceptSecrets=True,
                                                     acceptResources=True), Context())


def check(servicer, resource_urn: str, news: dict, olds: Optional[dict] = None, seed: bytes = b"seed") -> tuple[dict, list]:
    response = servicer.Check(provider_pb2.CheckRequest(urn=resource_urn, olds=encode(olds or {}), news=encode(news),
                                                        randomSeed=seed), Context())
    return decode(response.inputs), [(f.property, f.reason) for f in response.failures]


def create(servicer, resource_urn: str, inputs: dict, preview: bool = False) -> tuple[str, dict]:
    response = servicer.Create(provider_pb2.CreateRequest(urn=resource_urn, properties=encode(inputs), preview=preview),
                               Context())
    return response.id, decode(response.properties)


def diff(servicer, resource_urn: str, resource_id: str, old_inputs: dict, old_outputs: dict, news: dict,
         ignore_changes: tuple[str, ...] = ()):
    return servicer.Diff(provider_pb2.DiffRequest(
        id=resource_id, urn=resource_urn, olds=encode(old_outputs), news=encode(news),
        old_inputs=encode(old_inputs), ignoreChanges=list(ignore_changes)), Context())


def update(servicer, resource_urn: str, resource_id: str, old_outputs: dict, news: dict, old_inputs: dict) -> dict:
    response = servicer.Update(provider_pb2.UpdateRequest(
        id=resource_id, urn=resource_urn, olds=encode(old_outputs), news=encode(news), old_inputs=encode(old_inputs)),
        Context())
    return decode(response.properties)


def read(servicer, resource_urn: str, resource_id: str, outputs: dict, inputs: dict) -> tuple[str, dict, dict]:
    response = servicer.Read(provider_pb2.ReadRequest(id=resource_id, urn=resource_urn, properties=encode(outputs),
                                                      inputs=encode(inputs)), Context())
    return response.id, decode(response.properties), decode(response.inputs)


def delete(servicer, resource_urn: str, resource_id: str, outputs: dict, inputs: dict) -> None:
    servicer.Delete(provider_pb2.DeleteRequest(id=resource_id, urn=resource_urn, properties=encode(outputs),
                                               old_inputs=encode(inputs)), Context())
