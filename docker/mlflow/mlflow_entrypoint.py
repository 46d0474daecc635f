"""Start ``mlflow server`` against PostgreSQL, then create the teams' MLflow users.

1. The backend URI names the server's own database user but no password: every
   connection gets it from Secrets Manager through the hook in ``mlflow_db_credentials``
   (installed by ``sitecustomize`` in this process and in each uvicorn worker), so a
   rotated password is picked up without a restart.
2. The basic-auth app reads its user database from an INI file only: that file is written
   into the scratch directory (the root file system is read-only), pointing at the same
   database.
3. ``mlflow server`` runs as a child; SIGTERM/SIGINT are passed on to it and its exit
   status is this process's.
4. Once ``/health`` answers, each team's MLflow user is created (or its password updated)
   from the team's Secrets Manager secret through the auth REST API, as the admin, and
   gets ``MLFLOW_TEAM_EXPERIMENT_PERMISSION`` on an experiment named after the team. It
   sees nothing else unless granted (``default_permission = NO_PERMISSIONS``) and may create
   experiments and models only under its own prefix (``mlflow_team_auth``). Training pods get only
   their team's login, never the admin's. A failure stops the server (exit 1) so ECS
   replaces the task instead of running with teams locked out.

Everything after the module name is passed to ``mlflow server`` unchanged.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from base64 import b64encode
from pathlib import Path
from typing import Callable, Optional
from urllib.parse import quote

REQUIRED = ("MLFLOW_DB_HOST", "MLFLOW_DB_NAME", "MLFLOW_DB_USERNAME", "MLFLOW_DB_SECRET_ID",
            "MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY")
HEALTH_TIMEOUT_SECONDS = 300  # first start runs the schema migrations; Aurora may be resuming from 0 ACU


def database_uri(env: dict[str, str]) -> str:
    """No password: the connection hook supplies the current one from Secrets Manager."""
    user = quote(env["MLFLOW_DB_USERNAME"], safe="")
    host, port, name = env["MLFLOW_DB_HOST"], env.get("MLFLOW_DB_PORT", "5432"), env["MLFLOW_DB_NAME"]
    sslmode = env.get("MLFLOW_DB_SSLMODE", "require")
    return f"postgresql://{user}@{host}:{port}/{quote(name, safe='')}?sslmode={sslmode}"


def auth_config(env: dict[str, str], uri: str) -> str:
    # configparser treats % as interpolation: escape it in the URI.
    return "\n".join([
        "[mlflow]",
        f"default_permission = {env.get('MLFLOW_AUTH_DEFAULT_PERMISSION', 'NO_PERMISSIONS')}",
        f"database_uri = {uri.replace('%', '%%')}",
        f"admin_username = {env.get('MLFLOW_AUTH_ADMIN_USERNAME', 'admin')}",
        # Basic auth plus each team's own prefix of experiment and model names (mlflow_team_auth).
        "authorization_function = mlflow_team_auth:authenticate_request",
        "",
    ])


def _option(argv: list[str], name: str, default: str) -> str:
    for index, arg in enumerate(argv):
        if arg == name and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return default


# -- team users ---------------------------------------------------------------------------------
class AuthApi:
    """The few auth-app REST calls the platform needs (mlflow/server/auth/routes.py)."""

    def __init__(self, base_url: str, host_header: str, username: str, password: str):
        self.base_url = base_url
        self.host_header = host_header
        self.authorization = "Basic " + b64encode(f"{username}:{password}".encode()).decode()

    def call(self, method: str, path: str, body: Optional[dict] = None, query: Optional[dict] = None):
        url = self.base_url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Authorization", self.authorization)
        request.add_header("Host", self.host_header)  # MLflow rejects hosts not in --allowed-hosts
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                payload = response.read()
                return response.status, json.loads(payload) if payload else {}
        except urllib.error.HTTPError as error:
            return error.code, {"error": error.read().decode(errors="replace")[:500]}

    def ensure_user(self, username: str, password: str) -> str:
        status, _ = self.call("GET", "/api/2.0/mlflow/users/get", query={"username": username})
        if status == 200:
            self._ok(self.call("PATCH", "/api/2.0/mlflow/users/update-password",
                               {"username": username, "password": password}), f"update password of {username}")
            return "updated"
        self._ok(self.call("POST", "/api/2.0/mlflow/users/create", {"username": username, "password": password}),
                 f"create user {username}")
        return "created"

    def ensure_experiment(self, name: str) -> str:
        status, body = self.call("GET", "/api/2.0/mlflow/experiments/get-by-name", query={"experiment_name": name})
        if status == 200:
            return body["experiment"]["experiment_id"]
        body = self._ok(self.call("POST", "/api/2.0/mlflow/experiments/create", {"name": name}),
                        f"create experiment {name}")
        return body["experiment_id"]

    def grant(self, username: str, experiment_id: str, permission: str) -> None:
        self._ok(self.call("POST", "/api/3.0/mlflow/users/permissions/grant",
                           {"username": username, "resource_type": "experiment", "resource_id": experiment_id,
                            "permission": permission}), f"grant {permission} on experiment {experiment_id} to {username}")

    @staticmethod
    def _ok(result, what: str) -> dict:
        status, body = result
        if status != 200:
            raise RuntimeError(f"{what}: HTTP {status} {body}")
        return body


def read_team_secrets(secret_ids: dict[str, str], fetch: Optional[Callable[[str], str]] = None) -> dict[str, str]:
    """Team user -> password; each team's secret holds the password alone."""
    fetch = fetch or _secret_string
    users = {}
    for team_user, secret_id in secret_ids.items():
        password = fetch(secret_id)
        if not password:
            raise RuntimeError(f"secret {secret_id} of MLflow user {team_user} is empty")
        users[team_user] = password
    return users


def _secret_string(secret_id: str) -> str:
    import boto3

    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not region and secret_id.startswith("arn:"):
        region = secret_id.split(":")[3]
    return boto3.client("secretsmanager", region_name=region).get_secret_value(SecretId=secret_id)["SecretString"]


def sync_team_users(api: AuthApi, users: dict[str, str], permission: str) -> list[str]:
    done = []
    for team_user, password in sorted(users.items()):
        action = api.ensure_user(team_user, password)
        experiment_id = api.ensure_experiment(team_user)
        api.grant(team_user, experiment_id, permission)
        done.append(f"{team_user} ({action}, {permission} on experiment {experiment_id})")
    return done


# -- process ------------------------------------------------------------------------------------
def _wait_healthy(url: str, host_header: str, child: subprocess.Popen) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {child.returncode} before it was healthy")
        request = urllib.request.Request(url + "/health")
        request.add_header("Host", host_header)
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"mlflow server not healthy after {HEALTH_TIMEOUT_SECONDS} s")


def main(argv: list[str]) -> None:
    env = dict(os.environ)
    missing = [name for name in REQUIRED if not env.get(name)]
    if missing:
        sys.exit(f"mlflow_entrypoint: missing environment variables {missing} (ECS secrets or task environment)")
    uri = database_uri(env)
    scratch = Path(env.get("MLFLOW_SCRATCH_DIR", "/tmp/mlflow"))
    scratch.mkdir(parents=True, exist_ok=True)
    config_path = scratch / "basic_auth.ini"
    fd = os.open(config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(auth_config(env, uri))
    os.environ["MLFLOW_AUTH_CONFIG_PATH"] = str(config_path)

    team_secret_ids = json.loads(env.get("MLFLOW_TEAM_SECRET_IDS") or "{}")
    if not team_secret_ids:
        os.execvp("mlflow", ["mlflow", "server", "--backend-store-uri", uri, *argv])

    child = subprocess.Popen(["mlflow", "server", "--backend-store-uri", uri, *argv])

    def forward(signum, _frame):
        if child.poll() is None:
            child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)

    port = _option(argv, "--port", "5000")
    host_header = _option(argv, "--allowed-hosts", f"127.0.0.1:{port}").split(",")[0]
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, host_header, child)
        api = AuthApi(url, host_header, env.get("MLFLOW_AUTH_ADMIN_USERNAME", "admin"), env["MLFLOW_AUTH_ADMIN_PASSWORD"])
        done = sync_team_users(api, read_team_secrets(team_secret_ids),
                               env.get("MLFLOW_TEAM_EXPERIMENT_PERMISSION", "EDIT"))
        print("mlflow_entrypoint: team users " + ", ".join(done), flush=True)
    except Exception as error:  # noqa: BLE001 - any failure means teams cannot log in: stop the task
        print(f"mlflow_entrypoint: team user setup failed: {error}", file=sys.stderr, flush=True)
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
        sys.exit(1)
    sys.exit(child.wait())


if __name__ == "__main__":
    main(sys.argv[1:])
