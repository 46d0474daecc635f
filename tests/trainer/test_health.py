"""The trainer's Prometheus endpoint, scraped over HTTP as Prometheus would."""
from __future__ import annotations

import shutil
import subprocess
import urllib.request

import pytest

from trainer.health import METRIC_NAMES, PORT_ENV, NoHealth, health_exporter


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return response.read().decode()


@pytest.fixture
def exporter():
    health = health_exporter(True, "gpt2", 100, environ={PORT_ENV: "0", "TORCHELASTIC_RESTART_COUNT": "2"})
    yield health
    health.close()


def test_disabled_and_other_ranks_are_no_ops():
    assert isinstance(health_exporter(True, "j", environ={}), NoHealth)
    assert isinstance(health_exporter(False, "j", environ={PORT_ENV: "0"}), NoHealth)
    assert isinstance(health_exporter(True, "j", environ={PORT_ENV: "not-a-port"}), NoHealth)


def test_scrape_reports_what_the_loop_reported(exporter):
    exporter.update(step=40, loss=float("nan"), tokens_per_second=1234.5, step_seconds=0.5, mfu=None,
                    goodput=0.9, checkpoint_step=40)
    body = scrape(exporter.port)
    values = {line.split("{")[0]: line.rsplit(" ", 1)[1] for line in body.splitlines() if not line.startswith("#")}
    assert values["mlp_trainer_step"] == "40.0"
    assert values["mlp_trainer_loss"] == "NaN"  # the TrainingLossNotFinite alert's input
    assert values["mlp_trainer_restarts"] == "2.0"
    assert values["mlp_trainer_checkpoint_interval_steps"] == "100.0"
    assert "mlp_trainer_mfu_ratio" not in values  # unknown peak: absent, not zero
    assert set(values) <= METRIC_NAMES
    assert 'job_name="gpt2"' in body


def test_checkpoint_time_moves_only_with_a_new_checkpoint(exporter):
    exporter.update(step=1, loss=1.0, tokens_per_second=1, step_seconds=1, mfu=0.4, goodput=1, checkpoint_step=0)
    first = exporter._values["mlp_trainer_last_checkpoint_timestamp_seconds"]
    exporter.update(step=2, loss=1.0, tokens_per_second=1, step_seconds=1, mfu=0.4, goodput=1, checkpoint_step=0)
    assert exporter._values["mlp_trainer_last_checkpoint_timestamp_seconds"] == first


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool not installed: `apt-get install prometheus` (Debian) provides it")
def test_exposition_passes_promtool(exporter):
    exporter.update(step=3, loss=2.5, tokens_per_second=10.0, step_seconds=0.1, mfu=0.3, goodput=0.5, checkpoint_step=2)
    result = subprocess.run(["promtool", "check", "metrics"], input=scrape(exporter.port), capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
