"""Imported by every Python process started with this directory on PYTHONPATH (the image's
``/app``): the MLflow server and each of its uvicorn workers, which are separate
interpreters. Installs the database-password hook of ``mlflow_db_credentials`` when the
server's environment names a secret; does nothing elsewhere (the bootstrap container,
tools run in the image)."""
import os

if os.environ.get("MLFLOW_DB_SECRET_ID"):
    import mlflow_db_credentials

    mlflow_db_credentials.install()
