"""A local MLflow registry for `python -m workloads pipeline --local` (sqlite in the run directory)."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def create_experiment(mlflow_uri: str, name: str, artifacts_dir: Path) -> str:
    """The experiment (created once, artifacts under ``artifacts_dir``); also creates the sqlite schema."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_uri)
    found = client.get_experiment_by_name(name)
    return found.experiment_id if found else client.create_experiment(name, artifact_location=artifacts_dir.as_uri())


def create_run(mlflow_uri: str, experiment_id: str, run_name: str) -> str:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=mlflow_uri).create_run(experiment_id, run_name=run_name).info.run_id


def registered_versions(mlflow_uri: str, model_name: str) -> list[dict[str, Any]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_uri, registry_uri=mlflow_uri)
    out = []
    for version in client.search_model_versions(f"name = '{model_name}'"):
        run = client.get_run(version.run_id) if version.run_id else None
        out.append({"version": str(version.version), "run_id": version.run_id, "source": version.source,
                    "tags": dict(version.tags), "run_tags": dict(run.data.tags) if run else {},
                    "final_val_loss": (run.data.metrics.get("final_val_loss") if run else None)})
    return sorted(out, key=lambda v: int(v["version"]))
