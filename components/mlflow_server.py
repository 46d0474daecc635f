"""How the MLflow tracking server is started: one pure function for ECS and the tests.

``mlflow_server_command`` returns the container command and plain environment of the
MLflow task. The ECS task definition (``components.tracking``) uses it verbatim, and
``tests/integration/test_mlflow_server.py`` runs the very same argv and environment
against a real PostgreSQL and an S3-compatible server; only endpoints and credentials
(which ECS injects from Secrets Manager) differ. No Pulumi imports: the values here are
plain strings so the test can execute them.

The image (``docker/mlflow``) puts ``mlflow_entrypoint.py`` on ``PYTHONPATH``. It builds
the PostgreSQL URI from the ``MLFLOW_DB_*`` variables (the password URL-encoded, so any
character Secrets Manager generates is safe), writes the auth app's config into the
writable scratch directory (the root file system is read-only) and execs ``mlflow server``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

MLFLOW_PORT = 5000
HEALTH_CHECK_PATH = "/health"  # answered by the web server alone: never opens a database connection
ENTRYPOINT_MODULE = "mlflow_entrypoint"
SCRATCH_DIR = "/tmp/mlflow"  # the task's only writable path (a task-local volume)

# Variables ECS injects from Secrets Manager (``secrets`` of the container definition).
SECRET_ENV_DB_USERNAME = "MLFLOW_DB_USERNAME"
SECRET_ENV_DB_PASSWORD = "MLFLOW_DB_PASSWORD"
SECRET_ENV_ADMIN_PASSWORD = "MLFLOW_AUTH_ADMIN_PASSWORD"
SECRET_ENV_FLASK_SECRET_KEY = "MLFLOW_FLASK_SERVER_SECRET_KEY"
SECRET_ENV_NAMES = (SECRET_ENV_DB_USERNAME, SECRET_ENV_DB_PASSWORD, SECRET_ENV_ADMIN_PASSWORD,
                    SECRET_ENV_FLASK_SECRET_KEY)


@dataclass(frozen=True)
class MlflowServerSettings:
    """What decides the server's command line and plain environment.

    Attributes:
        artifacts_destination: ``s3://bucket/prefix`` the server proxies artifacts to.
        allowed_hosts: ``Host`` header values the server accepts (MLflow >= 3.5 rejects
            others with 403): the tracking domain and the load balancers' names.
        database_host / database_port / database_name: the PostgreSQL endpoint.
        database_sslmode: libpq ``sslmode``; ``require`` so credentials never cross the wire in clear.
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
    admin_username: str = "admin"
    num_workers: int = 2
    default_permission: str = "READ"
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


def mlflow_server_command(settings: MlflowServerSettings) -> tuple[list[str], dict[str, str]]:
    """The container command and its plain (non-secret) environment.

    The secrets (``SECRET_ENV_NAMES``) are not here: ECS injects them from Secrets Manager
    and the integration test sets test values.
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
        "MLFLOW_DB_HOST": settings.database_host,
        "MLFLOW_DB_PORT": str(settings.database_port),
        "MLFLOW_DB_NAME": settings.database_name,
        "MLFLOW_DB_SSLMODE": settings.database_sslmode,
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
