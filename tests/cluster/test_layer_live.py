"""Each stack's in-cluster layer, as the program declares it, is accepted by the real API server."""
from __future__ import annotations

import json
import re
import time

from tools.cluster.layer import calls_a_service

# A warning all of whose errors name only these fields (see the test's docstring).
CHECKER_LIMITATION = re.compile(r"^(?!.*ERROR: <input>:\d+:\d+: (?!undefined field '(requests|limits)')).*$", re.S)


def test_every_object_of_the_layer_is_stored(stack_cluster):
    """Server-side apply already refuses an invalid object; here every object is read back."""
    missing = []
    for obj in stack_cluster.layer.namespaces + stack_cluster.layer.objects:
        meta = obj["metadata"]
        args = ["get", f"{obj['kind'].lower()}.{obj['apiVersion'].split('/')[0]}" if "/" in obj["apiVersion"]
                else obj["kind"].lower(), meta["name"], "-o", "name"]
        if meta.get("namespace"):
            args += ["-n", meta["namespace"]]
        if stack_cluster.kubectl(*args, check=False).returncode != 0:
            missing.append(f"{obj['kind']} {meta.get('namespace', '')}/{meta['name']}")
    assert not missing, missing


def test_the_admission_policies_type_check_against_the_real_schemas(stack_cluster):
    """kube-apiserver type-checks each policy's CEL against the OpenAPI schema of what it matches
    and reports problems in ``status.typeChecking.expressionWarnings`` (k8s.io/apiserver
    pkg/admission/plugin/policy/validating/typechecking.go); a field name that does not exist on
    the matched kind would be a policy that never refuses anything.

    One class of warning is the checker's, not the policy's: it reports ``undefined field
    'requests'`` / ``'limits'`` on a container's ``resources`` (ResourceRequirements' maps of
    Quantity, whose schema the checker does not turn into a CEL type), while at run time those
    fields are read and the GPU rules refuse what they must (test_tenant_attacks_live.py,
    test_admission_cases_live.py). Those are set aside by their exact text; anything else fails.
    (The first run of this test found a real one: ``containers + initContainers`` has no ``_+_``
    overload for two differently typed lists; workloads/tenancy.py now checks each list.)"""
    names = [p["metadata"]["name"] for p in stack_cluster.layer.of_kind("ValidatingAdmissionPolicy")]
    assert names
    deadline, pending = time.monotonic() + 60, set(names)
    warnings = {}
    while pending and time.monotonic() < deadline:
        for name in sorted(pending):
            policy = json.loads(stack_cluster.kubectl("get", "validatingadmissionpolicy", name, "-o", "json").stdout)
            status = policy.get("status", {})
            if status.get("observedGeneration") == policy["metadata"]["generation"] and "typeChecking" in status:
                pending.discard(name)
                found = [w for w in status["typeChecking"].get("expressionWarnings", [])
                         if not CHECKER_LIMITATION.search(w["warning"])]
                if found:
                    warnings[name] = found
        time.sleep(1)
    assert not pending, f"policies never type-checked: {sorted(pending)}"
    assert not warnings, json.dumps(warnings, indent=1)


def test_nothing_applied_makes_the_api_server_dial_a_service(stack_cluster):
    """With no cluster network, a Service name would be resolved by the host: traffic off loopback."""
    assert not [o for o in stack_cluster.layer.crds + stack_cluster.layer.objects if calls_a_service(o)]
