"""Issue 10 item 22, the short version: tools/fault_injection.py with a fixed seed.

The long version is the same tool with more faults and steps:
`python tools/fault_injection.py --seed N --num-faults 10 --steps 80`."""
import pytest

from tools.fault_injection import run

pytestmark = pytest.mark.slow


def test_seeded_faults_end_bitwise_equal_with_every_metric_once(tmp_path, data_dir):
    """3 ranks (with 3+ a reduction's order depends on more than the values: a resumed run must
    keep it), and every computed metric compared, exactly, in metrics.jsonl and in MLflow: the
    losses, the learning rate, the gradient norm, tokens seen, skipped updates and the
    validation loss, not only the final weights."""
    report = run(seed=1, num_faults=4, steps=30, nproc=3, workdir=str(tmp_path), data_dir=data_dir)
    assert not report["problems"], report
    assert len(report["attempts"]) >= 4 and report["attempts"][-1]["exit"] == 0
    assert {a["exit"] for a in report["attempts"][:-1]} <= {137, 143}
    assert report["num_tensors_compared"] > 0
    assert {"loss", "learning_rate", "grad_norm", "tokens_seen", "skipped_updates", "val_loss"} <= set(
        report["metrics_compared"]), report["metrics_compared"]
