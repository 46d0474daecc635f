"""tests.support.validation: CRD schemas converted to strict JSON Schema, core kinds via kubernetes-validate."""
from __future__ import annotations

import copy

import pytest

from tests.support.validation import (
    structural_to_json_schema,
    validate_core,
    validate_custom_resource,
    validate_pod_template,
)

NODE_POOL = {
    "apiVersion": "karpenter.sh/v1",
    "kind": "NodePool",
    "metadata": {"name": "gpu-a100", "labels": {"team": "ml"}},
    "spec": {
        "template": {
            "metadata": {"labels": {"mlplatform.io/pool": "a100"}},
            "spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu-a100"},
                "requirements": [
                    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot", "on-demand"]},
                ],
                "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
                "expireAfter": "720h",
            },
        },
        "limits": {"nvidia.com/gpu": "16"},
        "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "10m"},
    },
}


def _pool() -> dict:
    return copy.deepcopy(NODE_POOL)


def test_valid_node_pool(schemas):
    assert validate_custom_resource(_pool(), schemas) == []


def test_unknown_field_is_an_error(schemas):
    pool = _pool()
    pool["spec"]["template"]["spec"]["taint"] = []  # typo of `taints`
    errors = validate_custom_resource(pool, schemas)
    assert len(errors) == 1
    assert errors[0].startswith("spec.template.spec:") and "'taint' was unexpected" in errors[0]


def test_wrong_type_is_an_error(schemas):
    pool = _pool()
    pool["spec"]["template"]["spec"]["requirements"][0]["values"] = "spot"
    errors = validate_custom_resource(pool, schemas)
    assert any(e.startswith("spec.template.spec.requirements.0.values:") and "not of type 'array'" in e for e in errors)


def test_missing_required_field_is_an_error(schemas):
    pool = _pool()
    del pool["spec"]["template"]["spec"]["nodeClassRef"]["kind"]
    errors = validate_custom_resource(pool, schemas)
    assert errors == ["spec.template.spec.nodeClassRef: 'kind' is a required property"]


def test_all_errors_are_reported_at_once(schemas):
    pool = _pool()
    pool["spec"]["bogus"] = True
    pool["spec"]["disruption"]["consolidationPolicy"] = "Never"
    del pool["spec"]["template"]["spec"]["nodeClassRef"]["name"]
    errors = validate_custom_resource(pool, schemas)
    assert len(errors) == 3, errors
    assert {e.split(":")[0] for e in errors} == {"spec", "spec.disruption.consolidationPolicy", "spec.template.spec.nodeClassRef"}


@pytest.mark.parametrize("value", ["16", 16])
def test_int_or_string_accepts_both(schemas, value):
    # NodePool limits are a map of int-or-string quantities.
    pool = _pool()
    pool["spec"]["limits"]["nvidia.com/gpu"] = value
    assert validate_custom_resource(pool, schemas) == []


def test_int_or_string_still_rejects_other_types(schemas):
    pool = _pool()
    pool["spec"]["limits"]["nvidia.com/gpu"] = [16]
    assert validate_custom_resource(pool, schemas) != []


def test_budget_nodes_percent_and_kueue_quota(schemas):
    pool = _pool()
    pool["spec"]["disruption"]["budgets"] = [{"nodes": "0", "reasons": ["Drifted"]}, {"nodes": "10%"}]
    assert validate_custom_resource(pool, schemas) == []
    flavor = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "a100"},
        "spec": {"nodeLabels": {"mlplatform.io/pool": "a100"}},
    }
    assert validate_custom_resource(flavor, schemas) == []
    flavor["spec"]["nodeLabelz"] = {}
    assert validate_custom_resource(flavor, schemas) != []


def test_unknown_crd_is_reported_not_skipped(schemas):
    errors = validate_custom_resource({"apiVersion": "example.com/v1", "kind": "Nope", "metadata": {}}, schemas)
    assert errors and "no CRD for Nope example.com/v1" in errors[0]


def test_preserve_unknown_fields_and_nullable():
    schema = structural_to_json_schema(
        {
            "type": "object",
            "properties": {
                "open": {"type": "object", "properties": {"a": {"type": "string"}}, "x-kubernetes-preserve-unknown-fields": True},
                "closed": {"type": "object", "properties": {"a": {"type": "string"}}},
                "maybe": {"type": "string", "nullable": True},
                "port": {"x-kubernetes-int-or-string": True},
            },
        }
    )
    assert "additionalProperties" not in schema["properties"]["open"]
    assert schema["properties"]["closed"]["additionalProperties"] is False
    assert schema["properties"]["maybe"]["type"] == ["string", "null"]
    assert schema["properties"]["port"]["anyOf"] == [{"type": "integer"}, {"type": "string"}]
    assert schema["additionalProperties"] is False


def test_pod_template_valid_and_invalid():
    template = {
        "metadata": {"labels": {"app": "x"}},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
    }
    assert validate_pod_template(template) == []
    template["spec"]["containers"][0]["imagePullPolicie"] = "Always"
    errors = validate_pod_template(template)
    assert len(errors) == 1 and "imagePullPolicie" in errors[0]


def test_core_wrong_type_and_missing_required():
    assert validate_core({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}) == []
    assert validate_core({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": 3}}) != []
    pod_template_missing_image_name = {"metadata": {}, "spec": {"containers": [{"image": "x"}]}}
    assert validate_pod_template(pod_template_missing_image_name) != []


def test_every_pinned_crd_converts_to_a_valid_json_schema(schemas):
    # Guards the converter (and RE2-only regex syntax such as a mid-pattern `(?i)`) on all pinned CRDs.
    import jsonschema

    from tests.support.validation import _crd_file_texts, _parse_crds

    num_schemas = 0
    for path, _ in _crd_file_texts(str(schemas.resolve())):
        if "karpenter" not in path and "kueue" not in path:
            continue
        for schema in _parse_crds(path).values():
            jsonschema.Draft202012Validator.check_schema(structural_to_json_schema(schema))
            num_schemas += 1
    assert num_schemas >= 10
