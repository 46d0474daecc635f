"""The MLflow server's request authorization: basic auth, plus each team's own namespace of names.

MLflow's names are global: whoever creates an experiment or a registered model first MANAGEs
it, and the basic-auth app lets every authenticated user create any name
(mlflow/server/auth/__init__.py: ``validate_can_create_experiment`` and
``validate_can_create_registered_model`` check only the workspace, not the name). With
``default_permission = NO_PERMISSIONS`` nobody reads what they were not granted, but team A
could still create ``team-b/gpt2`` before team B's job does and lock B out of it.

So a team's login (its user name is its namespace, ``components/tracking.py``) may create or
rename to names under its own prefix only:
- experiments ``<namespace>/<name>`` (``workloads.jobspec.experiment_name``);
- registered models ``<namespace>.<name>`` (MLflow model names cannot contain '/').
Everything else is MLflow's own authorization, which runs after this function
(``_before_request``). Admins are not restricted. Sharing is an explicit grant by the owner
(``/api/2.0/mlflow/experiments/permissions/create``, ``registered-models/permissions/create``).

The AI gateway is for admins only: its secrets, model definitions and endpoints (the
``/mlflow/gateway/`` routes) let whoever defines them send requests from the server to any HTTPS
host (a secret's ``auth_config`` carries the ``api_base``; mlflow/server/gateway_api.py), which
would make the tracking server a way out of a team network that has no internet egress. MLflow's
own validators let any user create them (``validate_can_create_gateway_secret`` checks the
workspace only). Without one of those objects the invocation routes (FastAPI ``/gateway/...``)
have nothing to call.

Configured as ``authorization_function = mlflow_team_auth:authenticate_request`` in the
auth INI file that ``mlflow_entrypoint`` writes.
"""
from __future__ import annotations

from flask import Response, make_response, request
from werkzeug.datastructures import Authorization

from mlflow.server.auth import authenticate_request_basic_auth, store

# (path suffix, JSON field that names the object, kind); the same suffix serves /api and /ajax-api.
NAMING_ENDPOINTS = (
    ("/mlflow/experiments/create", "name", "experiment"),
    ("/mlflow/experiments/update", "new_name", "experiment"),
    ("/mlflow/registered-models/create", "name", "model"),
    ("/mlflow/registered-models/rename", "new_name", "model"),
)


def team_prefix(username: str, kind: str) -> str:
    return f"{username}/" if kind == "experiment" else f"{username}."


def name_allowed(username: str, kind: str, name: object) -> bool:
    prefix = team_prefix(username, kind)
    return isinstance(name, str) and name.startswith(prefix) and len(name) > len(prefix)


# Every Flask route of the AI gateway: /api/3.0/mlflow/gateway/..., /ajax-api/3.0/mlflow/gateway/...
GATEWAY_ROUTE = "/mlflow/gateway/"


def authenticate_request() -> Authorization | Response:
    authorization = authenticate_request_basic_auth()
    if not isinstance(authorization, Authorization):
        return authorization
    if GATEWAY_ROUTE in request.path and not store.get_user(authorization.username).is_admin:
        return make_response("Permission denied: the AI gateway is for platform administrators (its endpoints can call "
                             "any HTTPS host from the tracking server)", 403)
    if request.method != "POST":
        return authorization
    for suffix, field, kind in NAMING_ENDPOINTS:
        if request.path.endswith(suffix):
            if store.get_user(authorization.username).is_admin:
                return authorization
            name = (request.get_json(force=True, silent=True) or {}).get(field)
            if not name_allowed(authorization.username, kind, name):
                prefix = team_prefix(authorization.username, kind)
                response = make_response(
                    f"Permission denied: {kind} name {name!r} is outside your team's names; "
                    f"name it {prefix}<name> (names are global: another team's name is theirs)", 403)
                return response
            return authorization
    return authorization
