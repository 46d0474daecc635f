"""`list --sweep NAME` shows each point's results: the sweep is rendered as `submit --sweep` renders
it, applied to the fake API through the fake kubectl, and each point's MLflow run is written the
way the trainer writes it in the pod (trainer.tracking.MLflowTracker, with the experiment, run
name and sweep id the rendered pod carries). Nothing links the two but what the platform renders."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from jobs.__main__ import main
from jobs.sweep import EXPERIMENT_ANNOTATION, SWEEP_ID_ENV, expand, parse_sweeps, render_sweep
from tests.jobs.conftest import SMOKE, set_conditions, use_fake_kubectl
from workloads.jobspec import parse_job_spec

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def swept(kube, dev_facts, tmp_path, monkeypatch):
    """Two points of sweep lr-probe in the fake cluster; returns their rendered manifests."""
    spec = parse_job_spec(yaml.safe_load(SMOKE.read_text()))
    points = expand(spec, parse_sweeps(["optimizer.lr=1e-4,3e-4"], spec, repo_root=str(ROOT)), name="lr-probe")
    manifests = render_sweep(points, dev_facts, sweep="lr-probe")
    for manifest in manifests:
        kube.apply(manifest)
    set_conditions(kube, kube.find("pytorchjobs.kubeflow.org", manifests[0]["metadata"]["name"], spec.namespace),
                   "Created", "Running", "Succeeded")
    kube.save(use_fake_kubectl(tmp_path, monkeypatch))
    return manifests


def _pod_env(manifest: dict) -> tuple[dict, list[str]]:
    container = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}, container["args"]


def _train_in_the_pod(manifest: dict, uri: str, val_loss: float, loss: float) -> None:
    """What the trainer of this point records: its run under the sweep's parent."""
    from trainer.tracking import MLflowTracker

    env, args = _pod_env(manifest)
    run_name = next(a.split("=", 1)[1] for a in args if a.startswith("tracking.run_name="))
    tracker = MLflowTracker(uri=uri, experiment=env["MLFLOW_EXPERIMENT_NAME"], job_id=f"{manifest['metadata']['namespace']}.{run_name}",
                            run_name=run_name, run_id=None, params={}, tags={}, config_yaml="{}",
                            sweep=(env[SWEEP_ID_ENV], "lr-probe"))
    tracker.log(10, {"loss": loss + 1.0})
    tracker.log(20, {"loss": loss, "val_loss": val_loss, "tokens_per_s": 1234.0})
    tracker.close("FINISHED")


def test_the_table_shows_each_points_mlflow_results_best_first(swept, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = f"file://{tmp_path}/mlruns"
    first, second = swept
    assert first["metadata"]["annotations"][EXPERIMENT_ANNOTATION] == _pod_env(first)[0]["MLFLOW_EXPERIMENT_NAME"]
    _train_in_the_pod(first, uri, val_loss=3.25, loss=3.0)
    _train_in_the_pod(second, uri, val_loss=2.75, loss=2.5)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)

    assert main(["list", "--team", "research", "--sweep", "lr-probe"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert rows[0] == ["sweep", "lr-probe:", "2", "job(s),", "sorted", "by", "val_loss"]
    assert rows[1] == ["job", "phase", "optimizer.lr", "val_loss", "loss"]
    names = [first["metadata"]["name"], second["metadata"]["name"]]
    # the latest value of each metric, the better point first; the sweep's parent run is no row
    assert rows[2:] == [[names[1], "Pending", "3e-4", "2.75", "2.5"], [names[0], "Succeeded", "1e-4", "3.25", "3"]]

    assert main(["list", "--team", "research", "--sweep", "lr-probe", "--metric", "tokens_per_s",
                 "--tracking-uri", uri]) == 0
    assert capsys.readouterr().out.splitlines()[1].split() == ["job", "phase", "optimizer.lr", "tokens_per_s"]


def test_without_mlflow_the_table_still_prints_with_one_line_saying_why(swept, capsys):
    assert main(["list", "--team", "research", "--sweep", "lr-probe"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["job", "phase", "optimizer.lr"] and len(out) == 5
    assert out[-1].startswith("results: set MLFLOW_TRACKING_URI")

    assert main(["list", "--team", "research", "--sweep", "lr-probe", "--tracking-uri", "http://127.0.0.1:9"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("results: MLflow at http://127.0.0.1:9 could not be read (") and "Traceback" not in last


def test_the_python_client_returns_the_same_results_typed(swept, kube, dev_facts, tmp_path, monkeypatch):
    from jobs.client import JobClient
    from jobs.store import LocalStore

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = f"file://{tmp_path}/mlruns"
    first, second = swept
    _train_in_the_pod(first, uri, val_loss=3.25, loss=3.0)
    _train_in_the_pod(second, uri, val_loss=2.75, loss=2.5)
    results = JobClient(stack="dev", kube=kube, facts=dev_facts, store=LocalStore()).sweep(
        "lr-probe", "research", tracking_uri=uri, metrics=("val_loss",))
    assert results.note == "" and sorted(j.name for j in results.jobs) == sorted(m["metadata"]["name"] for m in swept)
    assert results.metrics == {first["metadata"]["name"]: {"val_loss": 3.25}, second["metadata"]["name"]: {"val_loss": 2.75}}
    assert results.table().splitlines()[2].startswith(second["metadata"]["name"])


def test_without_the_mlflow_package_the_table_says_so(swept, monkeypatch, capsys):
    """mlflow is optional for the CLI (the infra extra does not carry it, tests/infra/test_packaging.py)."""
    import sys

    monkeypatch.setitem(sys.modules, "mlflow", None)  # what `import mlflow` finds when it is not installed
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    assert main(["list", "--team", "research", "--sweep", "lr-probe", "--tracking-uri", "http://127.0.0.1:9"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["job", "phase", "optimizer.lr"]
    assert out[-1] == "results: the mlflow package is not installed here (pip install 'ml-training-platform[trainer]')"
