"""Start ``mlflow server`` with its PostgreSQL URIs assembled from the environment.

ECS injects the database user and password from the RDS-managed secret as separate
variables; a URI needs them URL-encoded, which a shell one-liner gets wrong for passwords
with ``@``, ``:`` or ``%``. The basic-auth app reads its user database from an INI file
only, so that file is written into the scratch directory (the root file system is
read-only) pointing at the same database. Everything after the module name is passed to
``mlflow server`` unchanged. Standard library only: it runs before anything else.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import quote

REQUIRED = ("MLFLOW_DB_HOST", "MLFLOW_DB_NAME", "MLFLOW_DB_USERNAME", "MLFLOW_DB_PASSWORD",
            "MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY")


def database_uri(env: dict[str, str]) -> str:
    user = quote(env["MLFLOW_DB_USERNAME"], safe="")
    password = quote(env["MLFLOW_DB_PASSWORD"], safe="")
    host, port, name = env["MLFLOW_DB_HOST"], env.get("MLFLOW_DB_PORT", "5432"), env["MLFLOW_DB_NAME"]
    sslmode = env.get("MLFLOW_DB_SSLMODE", "require")
    return f"postgresql://{user}:{password}@{host}:{port}/{quote(name, safe='')}?sslmode={sslmode}"


def auth_config(env: dict[str, str], uri: str) -> str:
    # configparser treats % as interpolation: escape it in the URI.
    return "\n".join([
        "[mlflow]",
        f"default_permission = {env.get('MLFLOW_AUTH_DEFAULT_PERMISSION', 'READ')}",
        f"database_uri = {uri.replace('%', '%%')}",
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth",
        "",
    ])


def main(argv: list[str]) -> None:
    env = dict(os.environ)
    missing = [name for name in REQUIRED if not env.get(name)]
    if missing:
        sys.exit(f"mlflow_entrypoint: missing environment variables {missing} (ECS secrets or task environment)")
    uri = database_uri(env)
    scratch = Path(env.get("MLFLOW_SCRATCH_DIR", "/tmp/mlflow"))
    scratch.mkdir(parents=True, exist_ok=True)
    config_path = scratch / "basic_auth.ini"
    # Created owner-only: the file holds the database password.
    fd = os.open(config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(auth_config(env, uri))
    os.environ["MLFLOW_AUTH_CONFIG_PATH"] = str(config_path)
    # The server re-reads the URI from argv; it never appears in a shell history or log line.
    os.execvp("mlflow", ["mlflow", "server", "--backend-store-uri", uri, *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
