"""The MLflow task exactly as ECS runs it, against real servers on loopback.

PostgreSQL (Debian's package, with TLS like Aurora, and a non-superuser master user with
CREATEROLE that owns the ``mlflow`` database, like Aurora's), moto's S3 and Secrets
Manager, the one-off ``db-bootstrap`` container from ``mlflow_bootstrap_command`` and
``mlflow server`` from ``mlflow_server_command`` - the functions that write the task
definition. Only endpoints and credentials differ: ports, the database address,
``MLFLOW_S3_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_SECRETS_MANAGER``, and the values ECS
would inject from Secrets Manager.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from base64 import b64encode
from pathlib import Path

import pytest

from components.mlflow_server import (
    APP_DATABASE_USER,
    BOOTSTRAP_SECRET_ENV_NAMES,
    HEALTH_CHECK_PATH,
    SECRET_ENV_ADMIN_PASSWORD,
    SECRET_ENV_APP_PASSWORD,
    SECRET_ENV_FLASK_SECRET_KEY,
    SECRET_ENV_MASTER_PASSWORD,
    SECRET_ENV_MASTER_USERNAME,
    SECRET_ENV_NAMES,
    MlflowServerSettings,
    mlflow_bootstrap_command,
    mlflow_server_command,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
IMAGE_APP_DIR = ROOT / "docker" / "mlflow"  # what the Dockerfile copies to /app (its PYTHONPATH)
BUCKET = "mlp-test-artifacts"
SUPERUSER = "postgres"  # stands in for AWS's rdsadmin: the test's own control of the server
SUPERUSER_PASSWORD = "superuser-Test-1"
MASTER_USER = "mlflow_owner"  # the Aurora master user (RDS-managed secret)
MASTER_PASSWORD = "master-Test-7"
# Characters a generated secret may contain and a URI must escape.
APP_PASSWORD = "p@ss:w/rd%#?1"
ADMIN_PASSWORD = "admin-Integration-Test-42"
TEAMS = {"team-research": "research-Password-1", "team-vision": "vision-Password-2"}
REGION = "us-east-1"
STARTUP_TIMEOUT_SECONDS = 90


def _postgres_bin() -> Path | None:
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.path.exists(os.path.join(candidate, "initdb")):
            return Path(candidate)
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _self_signed_certificate(cert_path: Path, key_path: Path) -> None:
    """TLS for the test server, like Aurora's (the task connects with sslmode=require)."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1)).sign(key, hashes.SHA256()))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)  # PostgreSQL refuses a key others can read
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


class Postgres:
    """A throwaway cluster: password auth over TCP, TLS on, owned by the postgres user."""

    def __init__(self, bin_dir: Path, base: Path):
        self.bin_dir = bin_dir
        self.base = base
        self.data = base / "data"
        self.port = _free_port()
        self.as_root = os.geteuid() == 0

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        # initdb refuses to run as root: run the server tools as the postgres user.
        prefix = ["runuser", "-u", "postgres", "--"] if self.as_root else []
        return subprocess.run([*prefix, *argv], check=check, capture_output=True, text=True, timeout=60)

    def init(self) -> None:
        password_file = self.base / "pw"
        password_file.write_text(SUPERUSER_PASSWORD + "\n")
        _self_signed_certificate(self.base / "server.crt", self.base / "server.key")
        if self.as_root:
            shutil.chown(self.base, "postgres", "postgres")
            for path in self.base.iterdir():
                shutil.chown(path, "postgres", "postgres")
        self.run(str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", SUPERUSER, "--pwfile", str(password_file),
                 "--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8", "--no-sync")
        self.start()
        # Like Aurora's master user: not a superuser, may create roles and databases, and owns
        # the database named in the cluster's database_name.
        self.sql(f"CREATE ROLE {MASTER_USER} LOGIN CREATEROLE CREATEDB PASSWORD '{MASTER_PASSWORD}'")
        self.sql(f"CREATE DATABASE mlflow OWNER {MASTER_USER}")
        # What an earlier server that connected as the master user left behind: the bootstrap
        # hands it to the server's own user.
        self.sql(f"SET ROLE {MASTER_USER}; CREATE TABLE public.created_by_master (id serial PRIMARY KEY)",
                 database="mlflow")

    def sql(self, statement: str, database: str = "postgres") -> str:
        """Run one statement as the superuser over the local socket; returns unaligned output."""
        return self.run(str(self.bin_dir / "psql"), "-h", str(self.base), "-p", str(self.port), "-U", SUPERUSER,
                        "-d", database, "-v", "ON_ERROR_STOP=1", "-At", "-c", statement).stdout.strip()

    def start(self) -> None:
        options = (f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.base} "
                   f"-c ssl=on -c ssl_cert_file={self.base / 'server.crt'} -c ssl_key_file={self.base / 'server.key'} "
                   "-c fsync=off")
        self.run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-l", str(self.base / "postgres.log"),
                 "-o", options, "-w", "start")

    def stop(self) -> None:
        self.run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop", check=False)


@pytest.fixture(scope="module")
def postgres():
    bin_dir = _postgres_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL server binaries not found (apt-get install postgresql); needed to run MLflow's backend")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("running as root without runuser: initdb refuses root")
    base = Path(tempfile.mkdtemp(prefix="mlp-pg-"))
    server = Postgres(bin_dir, base)
    try:
        server.init()
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    # moto keeps its accounts' state per process, not per server: a second module's server (the
    # same xdist worker) would start with the first one's bucket and secrets. Reset it.
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=30).close()
    try:
        _s3(endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        server.stop()


def _aws(service: str, endpoint: str):
    import boto3

    return boto3.client(service, endpoint_url=endpoint, region_name=REGION,
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def _s3(endpoint: str):
    return _aws("s3", endpoint)


@pytest.fixture(scope="module")
def secrets(s3_endpoint, postgres):  # moto serves S3 and Secrets Manager on one port
    """What the stack creates: the server user's secret (the rotation functions' JSON format)
    and one secret per team."""
    client = _aws("secretsmanager", s3_endpoint)
    app = client.create_secret(Name="mlflow-db-app", SecretString=json.dumps({
        "engine": "postgres", "host": "127.0.0.1", "port": postgres.port, "dbname": "mlflow",
        "username": APP_DATABASE_USER, "password": APP_PASSWORD}))["ARN"]
    teams = {user: client.create_secret(Name=f"mlflow-user-{user}", SecretString=password)["ARN"]
             for user, password in TEAMS.items()}
    return {"app": app, "teams": teams}


def _settings(postgres, secrets, port: int, scratch: Path) -> MlflowServerSettings:
    return MlflowServerSettings(
        artifacts_destination=f"s3://{BUCKET}/artifacts",
        allowed_hosts=[f"127.0.0.1:{port}"],
        database_host="127.0.0.1",
        database_port=postgres.port,
        database_secret_id=secrets["app"],
        team_secret_ids=secrets["teams"],
        port=port,
        scratch_dir=str(scratch),
    )


def _base_env(endpoint: str) -> dict[str, str]:
    return {
        # The host's basics (PATH with this interpreter's bin first, as the image's python/mlflow).
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(IMAGE_APP_DIR),
        # Task role credentials and the AWS endpoints, pointed at moto.
        "AWS_ENDPOINT_URL_SECRETS_MANAGER": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }


@pytest.fixture(scope="module")
def bootstrapped(postgres, secrets, s3_endpoint, tmp_path_factory):
    """The db-bootstrap container: master login in, the server's own user out."""
    scratch = tmp_path_factory.mktemp("bootstrap-scratch")
    command, environment = mlflow_bootstrap_command(_settings(postgres, secrets, 5000, scratch))
    injected = {  # what ECS injects into this container only
        SECRET_ENV_MASTER_USERNAME: MASTER_USER,
        SECRET_ENV_MASTER_PASSWORD: MASTER_PASSWORD,
        SECRET_ENV_APP_PASSWORD: APP_PASSWORD,
    }
    assert set(injected) == set(BOOTSTRAP_SECRET_ENV_NAMES)
    env = {**_base_env(s3_endpoint), **environment, **injected}
    # Two tasks starting together (desired count 2) bootstrap one at a time: while another
    # session holds the bootstrap lock, both wait; then both succeed and one does the work.
    import psycopg

    sys.path.insert(0, str(IMAGE_APP_DIR))
    from mlflow_bootstrap import BOOTSTRAP_LOCK_ID

    holder = psycopg.connect(host="127.0.0.1", port=postgres.port, dbname="mlflow", user=SUPERUSER,
                             password=SUPERUSER_PASSWORD, sslmode="require", autocommit=True)
    holder.execute("SELECT pg_advisory_lock(%s)", (BOOTSTRAP_LOCK_ID,))
    first = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    time.sleep(3)
    waiting = [p.poll() is None for p in first]
    holder.execute("SELECT pg_advisory_unlock(%s)", (BOOTSTRAP_LOCK_ID,))
    holder.close()
    assert waiting == [True, True], "bootstrap did not wait for the lock"
    results = [(*p.communicate(timeout=120),) for p in first]
    results = [(p.returncode, out, err) for p, (out, err) in zip(first, results)]
    assert [rc for rc, _, _ in results] == [0, 0], results
    outputs = sorted(out for _, out, _ in results)
    assert sum("created role" in out for out in outputs) == 1, outputs
    assert any("handed from" in out for out in outputs), outputs
    # It runs on every task start: a later run changes nothing and succeeds.
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "nothing to change" in again.stdout, (again.stdout, again.stderr)
    return outputs


@pytest.fixture(scope="module")
def mlflow_server(postgres, s3_endpoint, secrets, bootstrapped, tmp_path_factory):
    port = _free_port()
    scratch = tmp_path_factory.mktemp("mlflow-scratch")
    command, environment = mlflow_server_command(_settings(postgres, secrets, port, scratch))
    injected = {  # what ECS injects from Secrets Manager
        SECRET_ENV_ADMIN_PASSWORD: ADMIN_PASSWORD,
        SECRET_ENV_FLASK_SECRET_KEY: "integration-test-flask-secret",
    }
    assert set(injected) == set(SECRET_ENV_NAMES)
    env = {
        **_base_env(s3_endpoint),
        **environment,
        **injected,
        "MLFLOW_S3_ENDPOINT_URL": s3_endpoint,
    }
    log_path = scratch / "server.log"
    log = open(log_path, "w")
    # Own process group, so teardown stops the workers too.
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process, log_path)
        _wait_for_log(log_path, process, "team users ")
        yield url, process, log_path
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=15)
        log.close()


def _wait_for_log(log_path: Path, process: subprocess.Popen, text: str) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if text in log_path.read_text():
            return
        if process.poll() is not None:
            pytest.fail(f"entrypoint exited with {process.returncode}:\n{log_path.read_text()[-4000:]}")
        time.sleep(0.25)
    pytest.fail(f"no {text!r} in the log after {STARTUP_TIMEOUT_SECONDS} s:\n{log_path.read_text()[-4000:]}")


def _wait_healthy(url: str, process: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        # A server that died at start looks like "connection refused": check the process too.
        if process.poll() is not None:
            pytest.fail(f"mlflow server exited with {process.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url + HEALTH_CHECK_PATH, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.25)
    pytest.fail(f"mlflow server not healthy after {STARTUP_TIMEOUT_SECONDS} s:\n{log_path.read_text()[-4000:]}")


def _send(request: urllib.request.Request, auth: tuple[str, str] | None) -> int:
    """The HTTP status of ``request``, sent with basic auth when given."""
    if auth:
        request.add_header("Authorization", "Basic " + b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def _status(url: str, auth: tuple[str, str] | None) -> int:
    return _send(urllib.request.Request(url + "/api/2.0/mlflow/experiments/search?max_results=10"), auth)


@pytest.fixture
def client(mlflow_server, monkeypatch):
    from mlflow.tracking import MlflowClient

    url = mlflow_server[0]
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", ADMIN_PASSWORD)
    # Short backoff so a database outage of a second or two is ridden out quickly.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "6")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "MLFLOW_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_SECRETS_MANAGER"):
        monkeypatch.delenv(name, raising=False)  # the client must not need S3 credentials
    return MlflowClient(tracking_uri=url)


def test_logs_and_reads_back_with_basic_auth_and_s3_artifacts(mlflow_server, client, s3_endpoint, tmp_path):
    url, process, _ = mlflow_server
    assert _status(url, None) == 401
    assert _status(url, ("admin", "wrong-password")) == 401
    assert _status(url, ("admin", ADMIN_PASSWORD)) == 200

    experiment_id = client.create_experiment("integration")
    run = client.create_run(experiment_id)
    run_id = run.info.run_id
    client.log_param(run_id, "learning_rate", "0.0003")
    for step, loss in enumerate([2.5, 1.75, 1.25]):
        client.log_metric(run_id, "loss", loss, step=step)
    artifact = tmp_path / "model-card.txt"
    artifact.write_text("gpt2-124m, resumed from step 3\n")
    client.log_artifact(run_id, str(artifact), artifact_path="cards")
    client.set_terminated(run_id)

    stored = client.get_run(run_id)
    assert stored.data.params == {"learning_rate": "0.0003"}
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [(0, 2.5), (1, 1.75), (2, 1.25)]
    assert stored.info.artifact_uri.startswith("mlflow-artifacts:")  # proxied through the server
    assert [f.path for f in client.list_artifacts(run_id, "cards")] == ["cards/model-card.txt"]
    downloaded = client.download_artifacts(run_id, "cards/model-card.txt", str(tmp_path / "down"))
    assert Path(downloaded).read_text() == artifact.read_text()

    keys = [o["Key"] for o in _s3(s3_endpoint).list_objects_v2(Bucket=BUCKET, Prefix="artifacts/").get("Contents", [])]
    assert any(key.endswith(f"{run_id}/artifacts/cards/model-card.txt") for key in keys), keys
    assert process.poll() is None


def test_survives_a_database_restart(mlflow_server, client, postgres):
    process = mlflow_server[1]
    experiment_id = client.create_experiment("database-restart")
    run_id = client.create_run(experiment_id).info.run_id
    client.log_metric(run_id, "loss", 3.0, step=0)

    postgres.stop()
    # The database is down when this call starts: it only succeeds through the client's retries.
    result: dict[str, object] = {}

    def log_during_outage() -> None:
        try:
            client.log_metric(run_id, "loss", 2.0, step=1)
            result["ok"] = True
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            result["error"] = exc

    worker = threading.Thread(target=log_during_outage)
    worker.start()
    time.sleep(1.5)
    assert worker.is_alive(), f"the call returned while the database was down: {result}"
    postgres.start()
    worker.join(timeout=60)
    assert result == {"ok": True}

    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [(0, 3.0), (1, 2.0)]
    assert process.poll() is None


# -- the server's database user -------------------------------------------------------------------
def test_server_user_is_its_own_least_privilege_owner_not_the_master(mlflow_server, postgres):
    role = postgres.sql(f"SELECT rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls FROM pg_roles "
                        f"WHERE rolname = '{APP_DATABASE_USER}'")
    assert role == "f|f|f|f|f"
    assert APP_DATABASE_USER != MASTER_USER
    # Member of no role (on Aurora: not rds_superuser), and owner of its database and schema.
    assert postgres.sql(f"SELECT count(*) FROM pg_auth_members WHERE member = "
                        f"(SELECT oid FROM pg_roles WHERE rolname = '{APP_DATABASE_USER}')") == "0"
    assert postgres.sql("SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'mlflow'") == APP_DATABASE_USER
    owners = postgres.sql("SELECT DISTINCT pg_get_userbyid(relowner) FROM pg_class c JOIN pg_namespace n "
                          "ON n.oid = c.relnamespace WHERE n.nspname = 'public'", database="mlflow")
    assert owners.split() == [APP_DATABASE_USER]  # MLflow's tables, created by the server's migrations
    # What it cannot do.
    app = _as_app_user(postgres)
    for statement in ("CREATE ROLE intruder", "CREATE DATABASE other", "SELECT pg_read_file('PG_VERSION')"):
        result = app(statement)
        assert result.returncode != 0 and "permission denied" in result.stderr, (statement, result.stderr)


def test_the_bootstrap_never_sends_the_database_password(mlflow_server, postgres):
    """Attack (review security-3 M4): read the server's database password from the PostgreSQL
    log, where log_min_error_statement = error copies a failing CREATE/ALTER ROLE ... PASSWORD
    statement. Control: the bootstrap sends a SCRAM-SHA-256 verifier, stored as-is, so no
    statement it sends holds the password; the server still logs in with it."""
    stored = postgres.sql(f"SELECT rolpassword FROM pg_authid WHERE rolname = '{APP_DATABASE_USER}'")
    assert stored.startswith("SCRAM-SHA-256$4096:") and APP_PASSWORD not in stored
    assert APP_PASSWORD not in (postgres.base / "postgres.log").read_text()
    assert _as_app_user(postgres)("SELECT 1").returncode == 0  # the password still works


def _as_app_user(postgres):
    def run(statement: str, password: str = APP_PASSWORD) -> subprocess.CompletedProcess:
        return subprocess.run([str(postgres.bin_dir / "psql"), f"host=127.0.0.1 port={postgres.port} dbname=mlflow "
                               f"user={APP_DATABASE_USER} sslmode=require", "-At", "-v", "ON_ERROR_STOP=1",
                               "-c", statement], env={**os.environ, "PGPASSWORD": password},
                              capture_output=True, text=True, timeout=30)
    return run


def test_server_processes_never_hold_the_master_or_database_password(mlflow_server):
    process = mlflow_server[1]
    pids = [process.pid]
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
    # The entrypoint, mlflow server and its uvicorn workers.
    for _ in range(3):
        found = []
        for pid in pids:
            path = Path(f"/proc/{pid}/task/{pid}/children")
            if path.exists():
                found += [int(c) for c in path.read_text().split()]
        pids = sorted(set(pids + found))
    assert children.exists() and len(pids) >= 3, pids
    for pid in pids:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            continue
        assert MASTER_PASSWORD.encode() not in environ and MASTER_USER.encode() not in environ
        assert APP_PASSWORD.encode() not in environ
        assert b"MLFLOW_BOOTSTRAP_" not in environ


def test_recovers_when_the_database_password_is_rotated(mlflow_server, client, postgres, secrets, s3_endpoint):
    """AWS's single-user rotation: createSecret (AWSPENDING), setSecret (ALTER ROLE),
    testSecret, finishSecret (AWSPENDING becomes AWSCURRENT). The server never restarts."""
    process = mlflow_server[1]
    experiment_id = client.create_experiment("password-rotation")
    run_id = client.create_run(experiment_id).info.run_id
    client.log_metric(run_id, "loss", 4.0, step=0)

    secretsmanager = _aws("secretsmanager", s3_endpoint)
    current = secretsmanager.get_secret_value(SecretId=secrets["app"])
    rotated = dict(json.loads(current["SecretString"]), password="rotated-P4ssword-after-7-days")
    pending = secretsmanager.put_secret_value(SecretId=secrets["app"], SecretString=json.dumps(rotated),
                                              VersionStages=["AWSPENDING"])
    postgres.sql(f"ALTER ROLE {APP_DATABASE_USER} PASSWORD '{rotated['password']}'")
    # Half-way through the rotation the old password no longer works...
    assert _as_app_user(postgres)("SELECT 1").returncode != 0
    # ... and the server, still holding it, recovers through AWSPENDING.
    client.log_metric(run_id, "loss", 3.0, step=1)

    # finishSecret: the new value becomes AWSCURRENT. (As a new version: moto 5.2's
    # update_secret_version_stage leaves the old version answering AWSCURRENT.)
    secretsmanager.put_secret_value(SecretId=secrets["app"], SecretString=json.dumps(rotated))
    secretsmanager.update_secret_version_stage(SecretId=secrets["app"], VersionStage="AWSPENDING",
                                               RemoveFromVersionId=pending["VersionId"])
    client.log_metric(run_id, "loss", 2.0, step=2)

    # A second rotation straight to AWSCURRENT (a manual put-secret-value after ALTER ROLE).
    again = dict(rotated, password="second-Rotation-0")
    postgres.sql(f"ALTER ROLE {APP_DATABASE_USER} PASSWORD '{again['password']}'")
    secretsmanager.put_secret_value(SecretId=secrets["app"], SecretString=json.dumps(again))
    time.sleep(2.5)  # past the per-process refresh throttle of the pending-stage step above
    client.log_metric(run_id, "loss", 1.0, step=3)

    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [
        (0, 4.0), (1, 3.0), (2, 2.0), (3, 1.0)]
    assert process.poll() is None


# -- team users -----------------------------------------------------------------------------------
def _team_client(url: str, user: str, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", user)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", TEAMS[user])
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    return MlflowClient(tracking_uri=url)


def test_team_users_write_their_own_experiment_and_see_nothing_else(mlflow_server, monkeypatch):
    from mlflow.exceptions import MlflowException

    url = mlflow_server[0]
    research = _team_client(url, "team-research", monkeypatch)
    own = research.get_experiment_by_name("team-research")
    run_id = research.create_run(own.experiment_id).info.run_id
    research.log_metric(run_id, "loss", 0.5, step=0)
    assert research.get_metric_history(run_id, "loss")[0].value == 0.5

    vision = _team_client(url, "team-vision", monkeypatch)
    with pytest.raises(MlflowException) as denied:  # default_permission = NO_PERMISSIONS
        vision.get_run(run_id)
    assert "PERMISSION_DENIED" in str(denied.value) or "403" in str(denied.value)
    with pytest.raises(MlflowException):
        vision.log_metric(run_id, "loss", 9.9, step=1)
    with pytest.raises(MlflowException):
        vision.create_run(own.experiment_id)
    # A team login is not an admin: it cannot create users.
    assert _post_json(url, "/api/2.0/mlflow/users/create", {"username": "x", "password": "y"},
                      ("team-vision", TEAMS["team-vision"])) == 403
    assert _status(url, ("team-research", "wrong")) == 401


# -- tenant isolation, from the attacker's seat (issue 18 item 7; review security-3 H5, rows 8, 10) --
def _denied(call) -> str:
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException) as error:
        call()
    text = str(error.value)
    assert "PERMISSION_DENIED" in text or "403" in text or "Permission denied" in text, text
    return text


@pytest.fixture
def victims_work(mlflow_server, monkeypatch, tmp_path):
    """Team research's experiment, run (metric, artifact through the proxy) and registered model."""
    url = mlflow_server[0]
    research = _team_client(url, "team-research", monkeypatch)
    suffix = os.urandom(3).hex()
    experiment_id = research.create_experiment(f"team-research/gpt2-{suffix}")
    run_id = research.create_run(experiment_id).info.run_id
    research.log_metric(run_id, "loss", 1.25)
    research.log_text(run_id, "weights of team research", "model/notes.txt")
    model = research.create_registered_model(f"team-research.gpt2-{suffix}").name
    research.create_model_version(model, f"runs:/{run_id}/model", run_id=run_id)
    return {"url": url, "experiment_id": experiment_id, "run_id": run_id, "model": model, "suffix": suffix}


def test_a_team_cannot_read_another_teams_run_artifact_or_model(victims_work, monkeypatch, tmp_path):
    attacker = _team_client(victims_work["url"], "team-vision", monkeypatch)
    _denied(lambda: attacker.get_experiment(victims_work["experiment_id"]))
    _denied(lambda: attacker.get_run(victims_work["run_id"]))
    _denied(lambda: attacker.get_metric_history(victims_work["run_id"], "loss"))
    _denied(lambda: attacker.download_artifacts(victims_work["run_id"], "model/notes.txt", str(tmp_path)))
    _denied(lambda: attacker.get_registered_model(victims_work["model"]))
    _denied(lambda: attacker.get_model_version(victims_work["model"], "1"))
    # Searches list nothing of theirs.
    assert victims_work["experiment_id"] not in {e.experiment_id for e in attacker.search_experiments()}
    assert victims_work["model"] not in {m.name for m in attacker.search_registered_models()}
    # The victim reads its own work (the control).
    owner = _team_client(victims_work["url"], "team-research", monkeypatch)
    assert owner.get_run(victims_work["run_id"]).data.metrics["loss"] == 1.25


@pytest.mark.parametrize("attack", [
    "create the victim's next experiment", "create a global experiment name", "rename own experiment into theirs",
    "register a model under the victim's prefix", "register a global model name", "rename own model into theirs",
])
def test_a_team_cannot_squat_another_teams_names(victims_work, monkeypatch, attack):
    url, suffix = victims_work["url"], victims_work["suffix"]
    attacker = _team_client(url, "team-vision", monkeypatch)
    squat = {
        "create the victim's next experiment": lambda: attacker.create_experiment(f"team-research/next-{suffix}"),
        "create a global experiment name": lambda: attacker.create_experiment(f"gpt2-124m-{suffix}"),
        "rename own experiment into theirs": lambda: attacker.rename_experiment(
            attacker.create_experiment(f"team-vision/mine-{suffix}"), f"team-research/taken-{suffix}"),
        "register a model under the victim's prefix": lambda: attacker.create_registered_model(f"team-research.m-{suffix}"),
        "register a global model name": lambda: attacker.create_registered_model(f"gpt2-{suffix}"),
        "rename own model into theirs": lambda: attacker.rename_registered_model(
            attacker.create_registered_model(f"team-vision.m-{suffix}").name, f"team-research.taken-{suffix}"),
    }[attack]
    assert "outside your team's names" in _denied(squat)
    # The victim's own names stay free for it.
    owner = _team_client(url, "team-research", monkeypatch)
    assert owner.create_experiment(f"team-research/next-{suffix}-{attack[:6].strip()}")


def test_sharing_is_an_explicit_grant_by_the_owner(victims_work, monkeypatch):
    url = victims_work["url"]
    reader = _team_client(url, "team-vision", monkeypatch)
    _denied(lambda: reader.get_run(victims_work["run_id"]))
    # The owner (MANAGE, as creator) grants READ: MLflow's grant endpoint needs can_manage on the
    # resource (mlflow/server/auth/__init__.py: GRANT_USER_PERMISSION -> validate_can_manage_resource).
    grant = "/api/3.0/mlflow/users/permissions/grant"
    share = {"username": "team-vision", "resource_type": "experiment", "resource_id": victims_work["experiment_id"]}
    assert _post_json(url, grant, {**share, "permission": "READ"}, ("team-research", TEAMS["team-research"])) == 200
    assert reader.get_run(victims_work["run_id"]).data.metrics["loss"] == 1.25
    _denied(lambda: reader.log_metric(victims_work["run_id"], "loss", 0.0))  # READ, not EDIT
    # Nobody grants themselves more on another team's experiment.
    assert _post_json(url, grant, {**share, "permission": "MANAGE"}, ("team-vision", TEAMS["team-vision"])) == 403


def _post_json(url: str, path: str, body: dict, auth: tuple[str, str]) -> int:
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    return _send(request, auth)


@pytest.mark.parametrize("path, body", [
    ("/api/3.0/mlflow/gateway/secrets/create",
     {"secret_name": "relay", "secret_value": {"api_key": "x"}, "provider": "openai",
      "auth_config": {"api_base": "https://attacker.example"}}),
    ("/ajax-api/3.0/mlflow/gateway/model-definitions/create",
     {"name": "relay", "provider": "openai", "model_name": "gpt-4o"}),
    ("/api/3.0/mlflow/gateway/endpoints/create", {"name": "relay", "model_configs": []}),
])
def test_a_team_login_cannot_define_an_ai_gateway_relay(mlflow_server, path, body):
    """MLflow's AI gateway sends requests from the tracking server to the api_base a secret names
    (mlflow/server/gateway_api.py), and its validators let any user create secrets, model
    definitions and endpoints: from a team network with no internet egress, the tracking server
    would relay anywhere on 443. A team login is refused every gateway route; an admin is not."""
    url = mlflow_server[0]
    assert _post_json(url, path, body, ("team-research", TEAMS["team-research"])) == 403
    listing = urllib.request.Request(url + "/ajax-api/3.0/mlflow/gateway/secrets/list")
    assert _send(listing, ("team-vision", TEAMS["team-vision"])) == 403
    assert _send(urllib.request.Request(url + "/ajax-api/3.0/mlflow/gateway/secrets/list"), ("admin", ADMIN_PASSWORD)) != 403


# -- first deploy and rotation order (audit N8) -------------------------------------------------------
def test_a_starting_task_does_not_undo_a_rotation_in_progress(mlflow_server, client, postgres, secrets, s3_endpoint):
    """AWS's single-user rotation sets the role's password to AWSPENDING (setSecret) before it
    moves AWSCURRENT (finishSecret). A task starting in between gets the old AWSCURRENT injected
    by ECS; its db-bootstrap must not reset the role to it (the running server recovers through
    AWSPENDING, and finishSecret then makes that password current)."""
    secretsmanager = _aws("secretsmanager", s3_endpoint)
    current = json.loads(secretsmanager.get_secret_value(SecretId=secrets["app"])["SecretString"])
    rotated = dict(current, password="mid-Rotation-Password-3")
    pending = secretsmanager.put_secret_value(SecretId=secrets["app"], SecretString=json.dumps(rotated),
                                              VersionStages=["AWSPENDING"])
    postgres.sql(f"ALTER ROLE {APP_DATABASE_USER} PASSWORD '{rotated['password']}'")  # setSecret

    command, environment = mlflow_bootstrap_command(_settings(postgres, secrets, 5000, Path(tempfile.mkdtemp())))
    env = {**_base_env(s3_endpoint), **environment, SECRET_ENV_MASTER_USERNAME: MASTER_USER,
           SECRET_ENV_MASTER_PASSWORD: MASTER_PASSWORD, SECRET_ENV_APP_PASSWORD: current["password"]}
    started = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, (started.stdout, started.stderr)
    assert "rotation is in progress" in started.stdout and "reset the password" not in started.stdout
    assert _as_app_user(postgres)("SELECT 1", rotated["password"]).returncode == 0  # the rotation stands

    # finishSecret; then a task that finds a password nobody holds (a lost rotation) does reset it.
    secretsmanager.put_secret_value(SecretId=secrets["app"], SecretString=json.dumps(rotated))
    secretsmanager.update_secret_version_stage(SecretId=secrets["app"], VersionStage="AWSPENDING",
                                               RemoveFromVersionId=pending["VersionId"])
    postgres.sql(f"ALTER ROLE {APP_DATABASE_USER} PASSWORD 'lost-Rotation-9'")
    env[SECRET_ENV_APP_PASSWORD] = rotated["password"]
    lost = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert lost.returncode == 0 and "reset the password" in lost.stdout, (lost.stdout, lost.stderr)
    client.log_metric(client.create_run(client.create_experiment("after-rotation-order")).info.run_id, "x", 1.0)
