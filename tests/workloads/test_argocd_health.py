"""Argo CD health checks run on recorded statuses, the way Argo CD runs them.

argo-cd v3.5.1 util/lua/lua.go ``runLua``::

    l := lua.NewState(lua.Options{SkipOpenLibs: !vm.UseOpenLibs})
    ...
    {lua.LoadLibName, lua.OpenPackage},
    {lua.BaseLibName, lua.OpenBase},
    {lua.TabLibName, lua.OpenTable},
    // load our 'safe' version of the os library
    {lua.OsLibName, OpenSafeOs},
    ...
    objectValue := decodeValue(l, obj.Object)
    l.SetGlobal("obj", objectValue)
    err := l.DoString(script)

and ``ExecuteHealthLua``: ``returnValue := l.Get(-1)`` must be a table, JSON-decoded into
``HealthStatus{status, message}``, whose status must be a valid health code. gopher-lua is Lua
5.1: the runtime below is lupa's Lua 5.1 with the same libraries (no ``string``, ``math``,
``io``, ``debug``) and ``obj`` converted the way ``decodeValue`` does (maps and arrays to tables,
arrays from index 1).

gitops-engine pkg/health/health.go: without a check ``GetResourceHealth`` returns nil and the
resource does not count towards the Application's health (the finding these checks fix).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

lupa = pytest.importorskip("lupa.lua51", reason="lupa (dev extra) runs the Lua checks")

from workloads import argocd_health  # noqa: E402

VALID_CODES = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}
STATUSES = yaml.safe_load((Path(__file__).parent / "data" / "pytorchjob-statuses.yaml").read_text())["sequences"]


def _to_lua(runtime, value):
    if isinstance(value, dict):
        return runtime.table_from({k: _to_lua(runtime, v) for k, v in value.items()})
    if isinstance(value, list):
        return runtime.table_from([_to_lua(runtime, v) for v in value])
    return value


def health(group: str, kind: str, obj: dict) -> dict:
    runtime = lupa.LuaRuntime(unpack_returned_tuples=False, register_eval=False, register_builtins=False)
    # Only package, base, table and os, as Argo CD opens them (string methods go too).
    runtime.execute("getmetatable('').__index = nil; string = nil; math = nil; io = nil; debug = nil; coroutine = nil")
    runtime.globals().obj = _to_lua(runtime, obj)
    result = runtime.execute(argocd_health.HEALTH_CHECKS[(group, kind)])
    assert lupa.lua_type(result) == "table", "Argo CD needs a table back"
    out = {k: v for k, v in dict(result).items()}
    assert set(out) <= {"status", "message"}
    assert out["status"] in VALID_CODES
    return out


def _operator_health(status: dict) -> str:
    true = {c["type"] for c in status.get("conditions", []) if c["status"] == "True"}
    if "Failed" in true:
        return "Degraded"
    if "Succeeded" in true:
        return "Healthy"
    if "Suspended" in true:
        return "Suspended"
    return "Progressing"


@pytest.mark.parametrize("sequence", sorted(STATUSES))
def test_pytorchjob_health_through_recorded_sequences(sequence):
    for entry in STATUSES[sequence]:
        result = health("kubeflow.org", "PyTorchJob", {"kind": "PyTorchJob", "status": entry["status"]})
        assert result["status"] == _operator_health(entry["status"]), entry["what"]
        if result["status"] == "Degraded":
            failed = next(c for c in entry["status"]["conditions"] if c["type"] == "Failed")
            assert result["message"] == failed["message"]


def test_a_preempted_pytorchjob_is_progressing_not_degraded():
    entry = next(e for e in STATUSES["preempted-twice-then-succeeds"] if "deletionTimestamp" in e["what"])
    assert entry["status"]["replicaStatuses"]["Master"]["failed"] == 1
    assert health("kubeflow.org", "PyTorchJob", {"status": entry["status"]})["status"] == "Progressing"


def test_a_new_pytorchjob_without_status_is_progressing():
    assert health("kubeflow.org", "PyTorchJob", {"spec": {}})["status"] == "Progressing"
    assert health("kubeflow.org", "PyTorchJob", {"status": {}})["status"] == "Progressing"


# Trainer v2.3 TrainJob conditions (trainjob_types.go: Suspended, Complete, Failed, Created).
TRAINJOB_STATUSES = [
    ({"conditions": [{"type": "Suspended", "status": "True", "reason": "Suspended", "message": "TrainJob is suspended"}]},
     "Suspended"),
    ({"conditions": [{"type": "Suspended", "status": "False", "reason": "Resumed"},
                     {"type": "Created", "status": "True", "reason": "JobsCreationSucceeded",
                      "message": "Succeeded to create Jobs"}]}, "Progressing"),
    ({"conditions": [{"type": "Suspended", "status": "False", "reason": "Resumed"},
                     {"type": "Created", "status": "True", "reason": "JobsCreationSucceeded"},
                     {"type": "Failed", "status": "True", "reason": "FailedJobs",
                      "message": "jobset failed: PermanentExit rule matched"}]}, "Degraded"),
    ({"conditions": [{"type": "Created", "status": "True", "reason": "JobsCreationSucceeded"},
                     {"type": "Complete", "status": "True", "reason": "JobsCompleted", "message": "jobset completed"}]},
     "Healthy"),
    ({}, "Progressing"),
]


@pytest.mark.parametrize("status,expected", TRAINJOB_STATUSES)
def test_trainjob_health(status, expected):
    assert health("trainer.kubeflow.org", "TrainJob", {"status": status})["status"] == expected


@pytest.mark.parametrize("phase,expected", [("", "Progressing"), ("Pending", "Progressing"), ("Running", "Progressing"),
                                            ("Succeeded", "Healthy"), ("Failed", "Degraded"), ("Error", "Degraded"),
                                            ("Weird", "Unknown")])
def test_workflow_health(phase, expected):
    obj = {"status": {"phase": phase, "message": "child 'train' failed"}} if phase else {}
    assert health("argoproj.io", "Workflow", obj)["status"] == expected


def test_the_scripts_need_no_library_argo_cd_does_not_open():
    """A script that used string.find would fail in this runtime, as it would in Argo CD."""
    runtime = lupa.LuaRuntime(register_eval=False, register_builtins=False)
    runtime.execute("getmetatable('').__index = nil; string = nil")
    with pytest.raises(lupa.LuaError):
        runtime.execute("local s = 'abc'; return s:find('b')")


def test_installed_through_the_argo_cd_chart_values():
    from components.argocd import helm_values

    cm = helm_values(domain="argocd.example.com", ha=False, sso=None)["configs"]["cm"]
    for group, kind in (("kubeflow.org", "PyTorchJob"), ("trainer.kubeflow.org", "TrainJob"), ("argoproj.io", "Workflow")):
        assert cm[f"resource.customizations.health.{group}_{kind}"] == argocd_health.HEALTH_CHECKS[(group, kind)]
