"""Registering the exported model is idempotent, keyed by run and step: a retried attempt of a
finished job (a spot notice during its export), or `python -m trainer export` rerun after a cut
off one, finds the logged model and the registered version and creates neither again. Before,
each call registered a new version. The same, end to end on the real MLflow server and a 2-node
job, is tests/integration/test_end_of_job_registration.py."""
from trainer.export import EXPORT_KEY_TAG, log_to_mlflow


def test_logging_and_registering_the_same_export_twice_makes_one_model_and_one_version(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    experiment = client.create_experiment("export-test", artifact_location=(tmp_path / "artifacts").as_uri())
    run_id = client.create_run(experiment).info.run_id
    export_dir = tmp_path / "export"
    export_dir.mkdir()
    (export_dir / "config.json").write_text("{}")
    lineage = {"step": 6, "checkpoint": str(tmp_path / "ckpt" / "step-000006"), "format": "huggingface-transformers",
               "architecture": "GPT2LMHeadModel", "config_hash": "c", "dataset_hash": "d"}
    results = [log_to_mlflow(str(export_dir), lineage, tracking_uri=uri, run_id=run_id, experiment="export-test",
                             registered_model_name="tiny", client=client) for _ in range(2)]
    assert results[0] == results[1], results
    versions = client.search_model_versions("name = 'tiny'")
    assert [str(v.version) for v in versions] == ["1"], [(v.version, v.tags) for v in versions]
    assert versions[0].tags[EXPORT_KEY_TAG] == f"run={run_id}/step=6"
    assert len(client.search_logged_models(experiment_ids=[experiment])) == 1
    outputs = client.get_run(run_id).outputs.model_outputs
    assert [o.model_id for o in outputs] == [results[0]["model_id"]]

    # Another step of the same run is another model and version.
    log_to_mlflow(str(export_dir), {**lineage, "step": 9}, tracking_uri=uri, run_id=run_id, experiment="export-test",
                  registered_model_name="tiny", client=client)
    assert sorted(str(v.version) for v in client.search_model_versions("name = 'tiny'")) == ["1", "2"]
