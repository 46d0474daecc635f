"""Argo CD resource health checks (Lua) for the kinds the platform's Applications and pipelines run.

Argo CD v3.5.1 ships none for ``kubeflow.org`` or ``trainer.kubeflow.org`` (no such directory
under ``resource_customizations/``); without a check a resource has no health, is left out of
the Application's (controller/health.go), and a failed job leaves the Application Healthy.

How Argo CD runs a check (util/lua/lua.go): a Lua 5.1 state (gopher-lua) with only the package,
base, table and a "safe" os library open (``useOpenLibs`` is off by default: no ``string``), the
resource as the global ``obj`` (JSON maps and arrays as tables, arrays 1-based), the script run
as a chunk whose returned table is read as ``{status, message}``; status must be one of Healthy,
Progressing, Degraded, Suspended, Missing, Unknown. The scripts below use nothing else.

Installed as ``configs.cm["resource.customizations.health.<group>_<kind>"]`` of the argo-cd
chart (components/argocd.py); tested with a Lua 5.1 runtime on recorded statuses
(tests/workloads/test_argocd_health.py).
"""
from __future__ import annotations

# Both job kinds report a list of conditions; a check reads the first True one in the order
# Failed, <done>, Suspended (Kueue holding the job), then what is left is Progressing.
_CONDITIONS = """\
local hs = {}
local conditions = {}
if obj.status ~= nil and obj.status.conditions ~= nil then
  conditions = obj.status.conditions
end
local function true_condition(kind)
  for _, c in ipairs(conditions) do
    if c.type == kind and c.status == "True" then
      return c
    end
  end
  return nil
end
"""


def _terminal_and_suspended(done: str) -> str:
    """Failed -> Degraded, ``done`` -> Healthy, Suspended -> Suspended; falls through otherwise."""
    return f"""\
local failed = true_condition("Failed")
if failed ~= nil then
  hs.status = "Degraded"
  hs.message = failed.message or failed.reason or "Failed"
  return hs
end
local done = true_condition("{done}")
if done ~= nil then
  hs.status = "Healthy"
  hs.message = done.message or "{done}"
  return hs
end
local suspended = true_condition("Suspended")
if suspended ~= nil then
  hs.status = "Suspended"
  hs.message = suspended.message or "Suspended: waiting for Kueue to admit it"
  return hs
end
"""


# Training Operator v1.9.4 (kubeflow.org/v1): conditions Created, Running, Restarting, Succeeded,
# Suspended, Failed (pkg/util/status.go). Failed is final; Restarting is an in-place restart
# after a retryable exit or a preemption, not a failure; Suspended is Kueue holding the job.
PYTORCHJOB = _CONDITIONS + _terminal_and_suspended("Succeeded") + """\
local restarting = true_condition("Restarting")
if restarting ~= nil then
  hs.status = "Progressing"
  hs.message = restarting.message or "Restarting"
  return hs
end
local running = true_condition("Running")
hs.status = "Progressing"
if running ~= nil then
  hs.message = running.message or "Running"
else
  hs.message = "Waiting for the operator to start the job"
end
return hs
"""

# Trainer v2.3 (trainer.kubeflow.org/v1alpha1): conditions Created, Suspended, Complete, Failed
# (pkg/apis/trainer/v1alpha1/trainjob_types.go); Kueue reads Complete/Failed the same way
# (kueue v0.19.2 pkg/controller/jobs/trainjob/trainjob_controller.go Finished).
TRAINJOB = _CONDITIONS + _terminal_and_suspended("Complete") + """\
hs.status = "Progressing"
hs.message = "Running"
local created = true_condition("Created")
if created ~= nil and created.message ~= nil then
  hs.message = created.message
end
return hs
"""

# Argo Workflows (argoproj.io/v1alpha1 Workflow): status.phase Pending, Running, Succeeded,
# Failed, Error. The same semantics as Argo CD's built-in check, kept here so one place defines
# every check the platform relies on.
WORKFLOW = """\
local hs = {}
local phase = ""
local message = ""
if obj.status ~= nil then
  phase = obj.status.phase or ""
  message = obj.status.message or ""
end
if phase == "Succeeded" then
  hs.status = "Healthy"
elseif phase == "Failed" or phase == "Error" then
  hs.status = "Degraded"
elseif phase == "" or phase == "Pending" or phase == "Running" then
  hs.status = "Progressing"
else
  hs.status = "Unknown"
end
hs.message = message
return hs
"""

HEALTH_CHECKS: dict[tuple[str, str], str] = {
    ("kubeflow.org", "PyTorchJob"): PYTORCHJOB,
    ("trainer.kubeflow.org", "TrainJob"): TRAINJOB,
    ("argoproj.io", "Workflow"): WORKFLOW,
}


def cm_key(group: str, kind: str) -> str:
    """The argocd-cm key of a health check (Argo CD "Resource Health": group_kind)."""
    return f"resource.customizations.health.{group}_{kind}"


def cm_entries() -> dict[str, str]:
    return {cm_key(group, kind): script for (group, kind), script in HEALTH_CHECKS.items()}
