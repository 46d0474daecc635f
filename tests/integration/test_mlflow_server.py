"""The MLflow server exactly as the ECS task runs it, against real servers on loopback.

PostgreSQL (Debian's package, with TLS like Aurora), moto's S3 server, and ``mlflow
server`` started from ``mlflow_server_command`` - the same function that writes the
task definition. Only endpoints and credentials differ: the port, the database address,
``MLFLOW_S3_ENDPOINT_URL``, and the values ECS would inject from Secrets Manager.
"""
from __future__ import annotations

import glob
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
    HEALTH_CHECK_PATH,
    SECRET_ENV_ADMIN_PASSWORD,
    SECRET_ENV_DB_PASSWORD,
    SECRET_ENV_DB_USERNAME,
    SECRET_ENV_FLASK_SECRET_KEY,
    SECRET_ENV_NAMES,
    MlflowServerSettings,
    mlflow_server_command,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
IMAGE_APP_DIR = ROOT / "docker" / "mlflow"  # what the Dockerfile copies to /app (its PYTHONPATH)
BUCKET = "mlp-test-artifacts"
DB_USER = "mlflow_owner"
# Characters a generated secret may contain and a URI must escape.
DB_PASSWORD = "p@ss:w/rd%#?1"
ADMIN_PASSWORD = "admin-Integration-Test-42"
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
        password_file.write_text(DB_PASSWORD + "\n")
        _self_signed_certificate(self.base / "server.crt", self.base / "server.key")
        if self.as_root:
            shutil.chown(self.base, "postgres", "postgres")
            for path in self.base.iterdir():
                shutil.chown(path, "postgres", "postgres")
        self.run(str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", DB_USER, "--pwfile", str(password_file),
                 "--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8", "--no-sync")
        self.start()
        self.run(str(self.bin_dir / "createdb"), "-h", str(self.base), "-p", str(self.port), "-U", DB_USER, "mlflow")

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
    try:
        _s3(endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        server.stop()


def _s3(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


@pytest.fixture(scope="module")
def mlflow_server(postgres, s3_endpoint, tmp_path_factory):
    port = _free_port()
    scratch = tmp_path_factory.mktemp("mlflow-scratch")
    settings = MlflowServerSettings(
        artifacts_destination=f"s3://{BUCKET}/artifacts",
        allowed_hosts=[f"127.0.0.1:{port}"],
        database_host="127.0.0.1",
        database_port=postgres.port,
        port=port,
        scratch_dir=str(scratch),
    )
    command, environment = mlflow_server_command(settings)
    secrets = {  # what ECS injects from Secrets Manager
        SECRET_ENV_DB_USERNAME: DB_USER,
        SECRET_ENV_DB_PASSWORD: DB_PASSWORD,
        SECRET_ENV_ADMIN_PASSWORD: ADMIN_PASSWORD,
        SECRET_ENV_FLASK_SECRET_KEY: "integration-test-flask-secret",
    }
    assert set(secrets) == set(SECRET_ENV_NAMES)
    env = {
        # The host's basics (PATH with this interpreter's bin first, as the image's python/mlflow).
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(IMAGE_APP_DIR),
        **environment,
        **secrets,
        # Task role credentials and the S3 endpoint, pointed at moto.
        "MLFLOW_S3_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    log_path = scratch / "server.log"
    log = open(log_path, "w")
    # Own process group, so teardown stops the workers too.
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process, log_path)
        yield url, process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=15)
        log.close()


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


def _status(url: str, auth: tuple[str, str] | None) -> int:
    request = urllib.request.Request(url + "/api/2.0/mlflow/experiments/search?max_results=10")
    if auth:
        request.add_header("Authorization", "Basic " + b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.fixture
def client(mlflow_server, monkeypatch):
    from mlflow.tracking import MlflowClient

    url, _ = mlflow_server
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", ADMIN_PASSWORD)
    # Short backoff so a database outage of a second or two is ridden out quickly.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "6")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "MLFLOW_S3_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)  # the client must not need S3 credentials
    return MlflowClient(tracking_uri=url)


def test_logs_and_reads_back_with_basic_auth_and_s3_artifacts(mlflow_server, client, s3_endpoint, tmp_path):
    url, process = mlflow_server
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
    url, process = mlflow_server
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
