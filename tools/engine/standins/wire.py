"""Property values on the provider protocol: ``google.protobuf.Struct`` <-> plain Python.

The engine marks special values with a signature key (pulumi/pulumi sdk/go/common/resource/plugin/rpc.go;
the Python SDK's ``pulumi.runtime.rpc`` uses the same constants): unknowns (a preview), secrets,
resource references, assets and archives. The stand-ins tell the engine at handshake that they take
neither secrets nor resource references (as pulumi-aws's bridge does), so the engine unwraps secrets
and turns references into ids before calling them; decoding still handles them, to be safe.
"""
from __future__ import annotations

from typing import Any, Mapping

from google.protobuf import struct_pb2

SIG_KEY = "4dabf18193072939515e22adb298388d"
SIG_SECRET = "1b47061264138c4ac30d75fd1eb44270"
SIG_RESOURCE = "5cf8f73096256a8f31e491e813e4eb8e"
SIG_OUTPUT = "d0e6a833031e9bbcd3f4e8bde6ca49a4"
UNKNOWN_VALUE = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"


class _Unknown:
    """A value not known yet (preview). One instance: compare with ``is``."""

    _instance = None

    def __new__(cls) -> "_Unknown":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<unknown>"


UNKNOWN = _Unknown()


def decode(struct: struct_pb2.Struct | None) -> dict[str, Any]:
    if struct is None:
        return {}
    return {key: _decode(value) for key, value in struct.fields.items()}


def _decode(value: struct_pb2.Value) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "null_value" or kind is None:
        return None
    if kind == "bool_value":
        return value.bool_value
    if kind == "number_value":
        number = value.number_value
        return int(number) if number.is_integer() else number
    if kind == "string_value":
        return UNKNOWN if value.string_value == UNKNOWN_VALUE else value.string_value
    if kind == "list_value":
        return [_decode(item) for item in value.list_value.values]
    fields = value.struct_value.fields
    if SIG_KEY in fields:
        sig = fields[SIG_KEY].string_value
        if sig == SIG_SECRET:
            return _decode(fields["value"]) if "value" in fields else None
        if sig == SIG_RESOURCE:
            resource_id = fields["id"].string_value if "id" in fields else ""
            return resource_id or fields["urn"].string_value
        if sig == SIG_OUTPUT:
            return _decode(fields["value"]) if "value" in fields else UNKNOWN
    return {key: _decode(item) for key, item in fields.items()}


def encode(values: Mapping[str, Any]) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    for key, value in values.items():
        _encode_into(struct.fields[key], value)
    return struct


def _encode_into(target: struct_pb2.Value, value: Any) -> None:
    if value is UNKNOWN:
        target.string_value = UNKNOWN_VALUE
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
    elif isinstance(value, Mapping):
        target.struct_value.Clear()
        for key, item in value.items():
            _encode_into(target.struct_value.fields[str(key)], item)
    else:
        raise TypeError(f"cannot send {type(value).__name__} {value!r} to the engine")


def contains_unknown(value: Any) -> bool:
    if value is UNKNOWN:
        return True
    if isinstance(value, Mapping):
        return any(contains_unknown(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return any(contains_unknown(item) for item in value)
    return False


def get_path(value: Any, path: str) -> Any:
    """The value at a dotted path of wire names (``vpcConfig.subnetIds``), None where absent."""
    for part in path.split("."):
        if value is UNKNOWN:
            return UNKNOWN
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value
