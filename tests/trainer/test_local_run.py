import json
import os
import subprocess
import sys

import pytest

from trainer_helpers import REPO

pytestmark = pytest.mark.slow


def test_local_run_interrupts_resumes_and_reports(tmp_path):
    out = tmp_path / "local"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    result = subprocess.run([sys.executable, "-m", "trainer.local_run", "--output-dir", str(out)], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["steps"] == 300 and report["restarts"] == 1
    assert 0 < report["interrupted_and_resumed_at_step"] < 300
    assert report["mlflow_runs_for_job"] == 1 and report["mlflow_loss_points"] == 300
    assert (out / "loss.png").stat().st_size > 10_000
    assert (out / "checkpoints" / "step-000300" / "complete.json").exists()
    assert "mlflow ui --backend-store-uri" in result.stdout
