"""One-off database bootstrap: the MLflow server's own least-privilege PostgreSQL user.

Runs as the ECS task's non-essential ``db-bootstrap`` container before the server
container starts (``dependsOn: SUCCESS``), on every task start, and is idempotent. It is
the only place that sees the Aurora master login (ECS injects the RDS-managed secret into
this container only). It:

1. creates the login role ``MLFLOW_DB_USERNAME`` if it is missing (NOSUPERUSER,
   NOCREATEDB, NOCREATEROLE, no role memberships: not ``rds_superuser``), with the
   password from its own Secrets Manager secret; if the role exists but cannot log in
   with that password, it sets the password again (a lost rotation), unless the secret's
   AWSPENDING password logs in (a rotation between setSecret and finishSecret: left alone);
2. makes it the owner of the ``MLFLOW_DB_NAME`` database - and with PostgreSQL 15+'s
   ``pg_database_owner`` of its ``public`` schema - and of the tables an earlier
   version created there as the master user, so migrations keep working;
3. takes CONNECT on that database away from PUBLIC.

The master user must be able to hand objects to the new role: PostgreSQL requires
membership in (PostgreSQL 16: SET on) the new owner role, so it grants that role to itself
(a CREATEROLE user may; on 16 it holds ADMIN OPTION on the roles it created).
Standard library plus psycopg (already in the image for SQLAlchemy).
"""
from __future__ import annotations

import os
import sys

BOOTSTRAP_LOCK_ID = 0x6D6C666C6F77  # "mlflow": any constant shared by all bootstraps of this database
REQUIRED = ("MLFLOW_DB_HOST", "MLFLOW_DB_NAME", "MLFLOW_DB_USERNAME", "MLFLOW_BOOTSTRAP_MASTER_USERNAME",
            "MLFLOW_BOOTSTRAP_MASTER_PASSWORD", "MLFLOW_BOOTSTRAP_APP_PASSWORD")



def scram_sha256_verifier(password: str, *, salt: bytes | None = None, iterations: int = 4096) -> str:
    """The SCRAM-SHA-256 secret PostgreSQL stores for `password` (RFC 5802/7677; PostgreSQL
    src/common/scram-common.c, scram_build_secret: "SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>").
    CREATE/ALTER ROLE ... PASSWORD stores a string already in this form as-is (PostgreSQL docs,
    CREATE ROLE: "If the presented password string is already in MD5-encrypted or
    SCRAM-encrypted format, then it is stored as-is"), so the statement, and any log line that
    quotes it (log_min_error_statement), never holds the password itself."""
    import base64
    import hashlib
    import hmac

    if not password.isascii():
        # PostgreSQL SASLprep-normalises non-ASCII passwords; the generated ones are ASCII.
        raise SystemExit("mlflow_bootstrap: the database password must be ASCII")
    salt = salt or os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    b64 = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"

def _connect(env: dict[str, str], user: str, password: str):
    import psycopg

    return psycopg.connect(host=env["MLFLOW_DB_HOST"], port=int(env.get("MLFLOW_DB_PORT", "5432")),
                           dbname=env["MLFLOW_DB_NAME"], user=user, password=password,
                           sslmode=env.get("MLFLOW_DB_SSLMODE", "require"), connect_timeout=30,
                           application_name="mlflow-db-bootstrap")


def _can_log_in(env: dict[str, str], user: str, password: str) -> bool:
    import psycopg

    try:
        _connect(env, user, password).close()
        return True
    except psycopg.OperationalError as error:
        if "password authentication failed" in str(error) or getattr(error, "sqlstate", None) == "28P01":
            return False
        raise


def _rotation_in_progress(env: dict[str, str], user: str, current_password: str) -> bool:
    """True when the secret's AWSPENDING password (AWS's single-user rotation: createSecret,
    setSecret = ALTER ROLE, testSecret, finishSecret) is the one the role accepts."""
    secret_id = env.get("MLFLOW_DB_SECRET_ID")
    if not secret_id:
        return False
    from mlflow_db_credentials import _fetch_from_secrets_manager

    pending = _fetch_from_secrets_manager(secret_id, "AWSPENDING")
    return pending is not None and pending != current_password and _can_log_in(env, user, pending)


def bootstrap(env: dict[str, str]) -> list[str]:
    """Bring the server's role to the state above; returns what it changed."""
    from psycopg import sql

    app_user, database = env["MLFLOW_DB_USERNAME"], env["MLFLOW_DB_NAME"]
    master_user, master_password = env["MLFLOW_BOOTSTRAP_MASTER_USERNAME"], env["MLFLOW_BOOTSTRAP_MASTER_PASSWORD"]
    app_password = env["MLFLOW_BOOTSTRAP_APP_PASSWORD"]
    if app_user == master_user:
        raise SystemExit(f"mlflow_bootstrap: MLFLOW_DB_USERNAME {app_user!r} is the master user; "
                         "the server needs its own user (the master password rotates every 7 days)")
    changes: list[str] = []
    role = sql.Identifier(app_user)
    with _connect(env, master_user, master_password) as conn:
        conn.autocommit = True
        # Tasks start together (desired count 2, rolling deployments): one bootstrap at a time.
        # Session-level lock, released when this connection closes.
        conn.execute("SELECT pg_advisory_lock(%s)", (BOOTSTRAP_LOCK_ID,))
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (app_user,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION "
                                 "PASSWORD {}").format(role, sql.Literal(scram_sha256_verifier(app_password))))
            changes.append(f"created role {app_user}")
        elif not _can_log_in(env, app_user, app_password):
            if _rotation_in_progress(env, app_user, app_password):
                # Between the rotation's setSecret and finishSecret the role already has the
                # AWSPENDING password: resetting it to AWSCURRENT would undo the rotation.
                changes.append(f"left the password of {app_user} alone: a rotation is in progress (AWSPENDING logs in)")
            else:
                conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(role, sql.Literal(scram_sha256_verifier(app_password))))
                changes.append(f"reset the password of {app_user} to its secret's current value")
        # Handing objects to a role needs SET on it. PostgreSQL 16 (Aurora 16.x) gives a role's
        # creator ADMIN OPTION only (createrole_self_grant is empty), so SET is granted explicitly;
        # on 15 plain membership is enough.
        if int(conn.execute("SHOW server_version_num").fetchone()[0]) >= 160000:
            if not conn.execute("SELECT pg_has_role(current_user, %s, 'SET')", (app_user,)).fetchone()[0]:
                conn.execute(sql.SQL("GRANT {} TO CURRENT_USER WITH SET TRUE").format(role))
        elif not conn.execute("SELECT pg_has_role(current_user, %s, 'MEMBER')", (app_user,)).fetchone()[0]:
            conn.execute(sql.SQL("GRANT {} TO CURRENT_USER").format(role))
        owner = conn.execute("SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = %s",
                             (database,)).fetchone()[0]
        if owner != app_user:
            conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(database), role))
            changes.append(f"database {database} now owned by {app_user} (was {owner})")
        # Objects created by an earlier server that connected as the master user.
        kinds = {"r": "TABLE", "p": "TABLE", "S": "SEQUENCE", "v": "VIEW", "m": "MATERIALIZED VIEW"}
        rows = conn.execute(
            "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relowner = (SELECT oid FROM pg_roles WHERE rolname = current_user) "
            "AND c.relkind IN ('r', 'p', 'S', 'v', 'm') "
            # Sequences owned by a table column follow their table.
            "AND NOT (c.relkind = 'S' AND EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = c.oid AND d.deptype IN ('a', 'i')))"
        ).fetchall()
        for relname, relkind in rows:
            conn.execute(sql.SQL("ALTER {} public.{} OWNER TO {}").format(
                sql.SQL(kinds[relkind]), sql.Identifier(relname), role))
        if rows:
            changes.append(f"{len(rows)} object(s) in public handed from {master_user} to {app_user}")
        conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(database)))
    return changes


def main() -> None:
    env = dict(os.environ)
    missing = [name for name in REQUIRED if not env.get(name)]
    if missing:
        sys.exit(f"mlflow_bootstrap: missing environment variables {missing} (ECS secrets or task environment)")
    changes = bootstrap(env)
    print("mlflow_bootstrap: " + ("; ".join(changes) if changes else "nothing to change"), flush=True)


if __name__ == "__main__":
    main()
