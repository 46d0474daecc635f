"""Validate generated manifests against upstream schemas, offline.

Custom resources are checked against the CRD files pinned under ``<schemas_dir>/crds/*`` (the
Kubernetes structural schema is converted to JSON Schema); built-in kinds (and pod templates) against
the Kubernetes OpenAPI schemas bundled with ``kubernetes-validate``.

Unknown fields are errors on purpose: the API server prunes or refuses them, so a field the schema
does not list is a bug in what we generate, and we want to hear about it before an apply does.

Pure functions, no Pulumi imports (shared by tests and a future GitOps renderer).
"""
from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any, Mapping

import jsonschema
import yaml

_PRESERVE = "x-kubernetes-preserve-unknown-fields"
_INT_OR_STRING = "x-kubernetes-int-or-string"


def structural_to_json_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Convert a Kubernetes structural (OpenAPI v3) schema to a strict JSON Schema.

    - ``x-kubernetes-int-or-string``: integer or string (the CRD lists no ``type`` there).
    - ``x-kubernetes-preserve-unknown-fields``: anything beyond the listed properties is allowed.
    - ``nullable: true``: ``null`` is allowed too.
    - objects with ``properties`` and no ``additionalProperties`` reject unknown fields.
    """
    return _convert(schema, strict=True)


def _convert(schema: Mapping[str, Any], *, strict: bool) -> dict[str, Any]:
    """Walk a structural schema. ``strict=False`` is for value-validation overlays (inside
    allOf/anyOf/oneOf/not, often without a type): closing objects there would reject valid values."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("properties", "patternProperties"):
            out[key] = {name: _convert(sub, strict=strict) for name, sub in value.items()}
        elif key == "items" and isinstance(value, Mapping):
            out[key] = _convert(value, strict=strict)
        elif key == "additionalProperties" and isinstance(value, Mapping) and strict:
            out[key] = _convert(value, strict=True)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [_convert(sub, strict=False) for sub in value]
        elif key == "not" and isinstance(value, Mapping):
            out[key] = _convert(value, strict=False)
        elif key == "pattern" and isinstance(value, str):
            out[key] = _python_pattern(value)
        elif key.startswith("x-kubernetes-") or key in ("nullable", "format"):
            # `format` values like int-or-string / quantity are not JSON-Schema formats; CEL rules
            # (x-kubernetes-validations) cannot be evaluated here.
            continue
        else:
            out[key] = copy.deepcopy(value)
    if not strict:
        return out

    if schema.get(_INT_OR_STRING):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}] + out.get("anyOf", [])
        if len(out["anyOf"]) > 2:
            # Keep any overlay (e.g. a pattern on the string form) as an extra constraint.
            overlays = out["anyOf"][2:]
            out["anyOf"] = out["anyOf"][:2]
            out["allOf"] = out.get("allOf", []) + [{"anyOf": overlays}]
    if schema.get(_PRESERVE):
        out.pop("additionalProperties", None)
    elif out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    if schema.get("nullable"):
        if "type" in out:
            types = out["type"] if isinstance(out["type"], list) else [out["type"]]
            out["type"] = types + ["null"]
        if "enum" in out and None not in out["enum"]:
            out["enum"] = list(out["enum"]) + [None]
    return out


def _python_pattern(pattern: str) -> str:
    """CRD patterns are RE2 (Go); Python only accepts inline flags like ``(?i)`` at the very start."""
    for flag in ("(?i)", "(?s)", "(?m)"):
        if flag in pattern[1:]:
            pattern = flag + pattern.replace(flag, "")
    return pattern


_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=None)
def _crd_file_texts(schemas_dir: str) -> tuple[tuple[str, str], ...]:
    return tuple((str(p), p.read_text()) for p in sorted(Path(schemas_dir, "crds").glob("*/*.y*ml")))


@functools.lru_cache(maxsize=None)
def _parse_crds(path: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(group, kind, version) -> openAPIV3Schema for every CRD in one YAML file."""
    index: dict[tuple[str, str, str], dict[str, Any]] = {}
    with open(path) as f:
        for doc in yaml.load_all(f, Loader=_YAML_LOADER):
            if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            for version in spec.get("versions", []):
                schema = (version.get("schema") or {}).get("openAPIV3Schema")
                if schema is not None:
                    index[(spec["group"], spec["names"]["kind"], version["name"])] = schema
    return index


def _crd_schema(schemas_dir: str, group: str, kind: str, version: str) -> dict[str, Any] | None:
    # Parsing every CRD (argo-workflows alone is ~11 MB) costs seconds; a text pre-filter keeps
    # parsing to the few files that can hold this group/kind.
    for path, text in _crd_file_texts(schemas_dir):
        if f"group: {group}" in text and f"kind: {kind}" in text:
            schema = _parse_crds(path).get((group, kind, version))
            if schema is not None:
                return schema
    return None


@functools.lru_cache(maxsize=None)
def _crd_validator(schemas_dir: str, group: str, kind: str, version: str) -> jsonschema.Draft202012Validator | None:
    schema = _crd_schema(schemas_dir, group, kind, version)
    if schema is None:
        return None
    converted = structural_to_json_schema(schema)
    # The structural root leaves metadata open (the API server validates it separately).
    return jsonschema.Draft202012Validator(converted)


def _format_error(error: jsonschema.ValidationError) -> str:
    path = ".".join(str(p) for p in error.absolute_path) or "<root>"
    return f"{path}: {error.message}"


def validate_custom_resource(obj: Mapping[str, Any], schemas_dir: str | Path) -> list[str]:
    """Every schema error of a custom resource (``[]`` = valid), each prefixed with its field path.

    The CRD is found by the object's apiVersion (group/version) and kind among the CRD YAMLs under
    ``schemas_dir/crds/*``; an object whose CRD is not there is reported as an error, not skipped.
    """
    api_version = obj.get("apiVersion")
    kind = obj.get("kind")
    if not isinstance(api_version, str) or "/" not in api_version or not isinstance(kind, str):
        return [f"<root>: apiVersion {api_version!r} / kind {kind!r} do not name a custom resource"]
    group, version = api_version.rsplit("/", 1)
    validator = _crd_validator(str(Path(schemas_dir).resolve()), group, kind, version)
    if validator is None:
        return [f"<root>: no CRD for {kind} {api_version} under {Path(schemas_dir) / 'crds'}"]
    errors = sorted(validator.iter_errors(dict(obj)), key=lambda e: [str(p) for p in e.absolute_path])
    return [_format_error(e) for e in errors]


def validate_core(obj: Mapping[str, Any], k8s_version: str = "1.32.0") -> list[str]:
    """Schema errors of a built-in Kubernetes object (strict: unknown fields are errors).

    kubernetes-validate stops at the first error, so the list has at most one entry.
    """
    import kubernetes_validate

    try:
        kubernetes_validate.validate(dict(obj), k8s_version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [_format_error(e)]
    except kubernetes_validate.SchemaNotFoundError as e:
        return [f"<root>: {e.message}"]
    return []


def validate_pod_template(template: Mapping[str, Any], k8s_version: str = "1.32.0") -> list[str]:
    """Validate a pod template (``{metadata, spec}``) by wrapping it in a core ``PodTemplate``."""
    wrapped = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": "validation"},
        "template": dict(template),
    }
    return validate_core(wrapped, k8s_version)
