"""How the MLflow tracking server is started: pure functions for ECS and the tests.

The ECS task has two containers built from the same image (``docker/mlflow``):

- ``db-bootstrap`` (``mlflow_bootstrap_command``): runs once per task start, before the
  server, and exits. It logs in as the Aurora master user (the RDS-managed secret, which
  ECS injects into this container only) and idempotently creates the server's own
  database user: a plain login role that owns the ``mlflow`` database (and, through
  PostgreSQL 15+'s ``pg_database_owner``, its ``public`` schema), without SUPERUSER,
  CREATEROLE, CREATEDB or membership in ``rds_superuser``. The master password therefore
  never reaches the long-running server, and RDS may rotate it every 7 days: the next
  task start reads the new one.
- ``mlflow`` (``mlflow_server_command``): the server. It connects as that user and reads
  the user's password from Secrets Manager when it opens a connection (NullPool: one per
  request), not from its environment: on an authentication failure it re-reads the secret
  (``AWSCURRENT``, then ``AWSPENDING`` while a rotation is half-way), so a rotated password
  is picked up without a restart (``docker/mlflow/mlflow_db_credentials.py``). After
  ``/health`` answers, the entrypoint creates or updates one MLflow user per team from the
  team's Secrets Manager secret, with EDIT on the team's experiment; it sees nothing else
  unless granted (``default_permission = NO_PERMISSIONS``) and creates experiments and models
  only under its own prefix (``docker/mlflow/mlflow_team_auth.py``).

The task definition (``components.tracking``) uses these functions verbatim, and
``tests/integration/test_mlflow_server.py`` runs the very same argv and environment
against a real PostgreSQL and loopback S3/Secrets Manager; only endpoints and the values
ECS would inject differ. No Pulumi imports: plain strings, so the test can execute them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Mapping, Sequence

MLFLOW_PORT = 5000
HEALTH_CHECK_PATH = "/health"  # answered by the web server alone: never opens a database connection
ENTRYPOINT_MODULE = "mlflow_entrypoint"
BOOTSTRAP_MODULE = "mlflow_bootstrap"
SCRATCH_DIR = "/tmp/mlflow"  # the task's only writable path (a task-local volume)

# Variables ECS injects from Secrets Manager into the server container (``secrets``).
SECRET_ENV_ADMIN_PASSWORD = "MLFLOW_AUTH_ADMIN_PASSWORD"
SECRET_ENV_FLASK_SECRET_KEY = "MLFLOW_FLASK_SERVER_SECRET_KEY"
SECRET_ENV_NAMES = (SECRET_ENV_ADMIN_PASSWORD, SECRET_ENV_FLASK_SECRET_KEY)
# ... and into the one-off bootstrap container only: the master login and the password the
# server's user is created with.
SECRET_ENV_MASTER_USERNAME = "MLFLOW_BOOTSTRAP_MASTER_USERNAME"
SECRET_ENV_MASTER_PASSWORD = "MLFLOW_BOOTSTRAP_MASTER_PASSWORD"
SECRET_ENV_APP_PASSWORD = "MLFLOW_BOOTSTRAP_APP_PASSWORD"
BOOTSTRAP_SECRET_ENV_NAMES = (SECRET_ENV_MASTER_USERNAME, SECRET_ENV_MASTER_PASSWORD, SECRET_ENV_APP_PASSWORD)
# The server's database user. Not the master user (``mlflow_owner``), whose password RDS rotates.
APP_DATABASE_USER = "mlflow_app"
# Experiments the platform creates for each team (the team user gets EDIT on it).
TEAM_EXPERIMENT_PERMISSION = "EDIT"


@dataclass(frozen=True)
class MlflowServerSettings:
    """What decides the server's command line and plain environment.

    Attributes:
        artifacts_destination: ``s3://bucket/prefix`` the server proxies artifacts to.
        allowed_hosts: ``Host`` header values the server accepts (MLflow >= 3.5 rejects
            others with 403): the tracking domain and the load balancers' names.
        database_host / database_port / database_name: the PostgreSQL endpoint.
        database_sslmode: libpq ``sslmode``; ``require`` so credentials never cross the wire in clear.
        database_username: the server's own (non-master) database user.
        database_secret_id: Secrets Manager secret (ARN) holding that user's password, as JSON
            in the format of AWS's rotation functions (engine, host, port, dbname, username,
            password); read by the server at connection time.
        team_secret_ids: team user name -> Secrets Manager secret (ARN) holding its password;
            the entrypoint creates/updates these MLflow users.
        admin_username: the basic-auth admin created on first start.
        num_workers: web server worker processes.
        default_permission: permission of users on experiments they did not create.
        port: container port the target group sends traffic to.
    """

    artifacts_destination: str
    allowed_hosts: Sequence[str]
    database_host: str
    database_port: int = 5432
    database_name: str = "mlflow"
    database_sslmode: str = "require"
    database_username: str = APP_DATABASE_USER
    database_secret_id: str = ""
    team_secret_ids: Mapping[str, str] = field(default_factory=dict)
    admin_username: str = "admin"
    num_workers: int = 2
    # Nobody reads what they were not granted: teams' runs, artifacts and models are their own
    # (sharing is an explicit grant; docker/mlflow/mlflow_team_auth.py).
    default_permission: str = "NO_PERMISSIONS"
    port: int = MLFLOW_PORT
    scratch_dir: str = SCRATCH_DIR
    extra_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.artifacts_destination.startswith("s3://"):
            raise ValueError(f"MlflowServerSettings.artifacts_destination: {self.artifacts_destination!r} must be s3://bucket/prefix")
        if not self.allowed_hosts:
            raise ValueError("MlflowServerSettings.allowed_hosts: list the host names clients use (MLflow rejects others)")
        if self.num_workers < 1:
            raise ValueError(f"MlflowServerSettings.num_workers: {self.num_workers} must be >= 1")
        if self.default_permission not in ("READ", "EDIT", "MANAGE", "NO_PERMISSIONS"):
            raise ValueError(f"MlflowServerSettings.default_permission: {self.default_permission!r} is not an MLflow permission")
        if not self.database_secret_id:
            raise ValueError("MlflowServerSettings.database_secret_id: the server reads its database password from this secret")


def _database_environment(settings: MlflowServerSettings) -> dict[str, str]:
    """Where the database is and who connects: the server and the bootstrap container alike."""
    return {
        "MLFLOW_DB_HOST": settings.database_host,
        "MLFLOW_DB_PORT": str(settings.database_port),
        "MLFLOW_DB_NAME": settings.database_name,
        "MLFLOW_DB_SSLMODE": settings.database_sslmode,
        "MLFLOW_DB_USERNAME": settings.database_username,
    }


def mlflow_server_command(settings: MlflowServerSettings) -> tuple[list[str], dict[str, str]]:
    """The container command and its plain (non-secret) environment.

    The secrets (``SECRET_ENV_NAMES``) are not here: ECS injects them from Secrets Manager
    and the integration test sets test values. The database password is in neither: the
    server fetches it from ``MLFLOW_DB_SECRET_ID`` with its task role.
    """
    command = [
        "python", "-m", ENTRYPOINT_MODULE,
        "--host", "0.0.0.0",
        "--port", str(settings.port),
        "--workers", str(settings.num_workers),
        # Artifacts go through the server, so clients (training pods) need no S3 rights.
        "--serve-artifacts",
        "--artifacts-destination", settings.artifacts_destination,
        "--allowed-hosts", ",".join(settings.allowed_hosts),
        "--app-name", "basic-auth",
    ]
    environment = {
        **_database_environment(settings),
        "MLFLOW_DB_SECRET_ID": settings.database_secret_id,
        "MLFLOW_TEAM_SECRET_IDS": json.dumps(dict(sorted(settings.team_secret_ids.items()))),
        "MLFLOW_TEAM_EXPERIMENT_PERMISSION": TEAM_EXPERIMENT_PERMISSION,
        "MLFLOW_AUTH_ADMIN_USERNAME": settings.admin_username,
        "MLFLOW_AUTH_DEFAULT_PERMISSION": settings.default_permission,
        "MLFLOW_SCRATCH_DIR": settings.scratch_dir,
        # No idle connections are kept, so Aurora Serverless v2 can pause at 0 ACU.
        "MLFLOW_SQLALCHEMYSTORE_POOLCLASS": "NullPool",
        # The job runner (GenAI scorers) polls the database forever, which would keep Aurora
        # awake, and starts seven worker processes the tracking server does not need.
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        # Python writes nothing next to the (read-only) code; temp files go to scratch.
        "PYTHONDONTWRITEBYTECODE": "1",
        "TMPDIR": settings.scratch_dir,
        "HOME": settings.scratch_dir,
        **settings.extra_env,
    }
    return command, environment


def mlflow_bootstrap_command(settings: MlflowServerSettings) -> tuple[list[str], dict[str, str]]:
    """The one-off bootstrap container's command and plain environment.

    ECS injects ``BOOTSTRAP_SECRET_ENV_NAMES`` (the master login from the RDS-managed
    secret, the server user's password from its own secret) into this container only.
    """
    command = ["python", "-m", BOOTSTRAP_MODULE]
    environment = {
        **_database_environment(settings),
        # Read with the task role only to tell a rotation in progress (AWSPENDING) from a lost one.
        "MLFLOW_DB_SECRET_ID": settings.database_secret_id,
        "PYTHONDONTWRITEBYTECODE": "1",
        "HOME": settings.scratch_dir,
    }
    return command, environment
