"""The trainer<->platform contracts (trainer/contract/{layout,environment,memory}.py) are imported by
the job CLI, the renderer and the components, none of which may pull in torch: each is imported
here in a fresh interpreter and torch must not be among its modules. And the trainer's own modules
keep their one-way arrows (the restore drill builds its optimizer without the training loop)."""
from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONTRACTS = ("trainer.contract.layout", "trainer.contract.environment", "trainer.contract.memory", "trainer.gpu_faults")


@pytest.mark.parametrize("module", [*CONTRACTS, "trainer.contract", "trainer.retries", "jobs.store", "workloads.owncode",
                                    "jobs.preflight"])
def test_a_contract_and_its_readers_import_without_torch(module):
    probe = f"import sys, {module}; print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": REPO})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", f"importing {module} loads torch: {result.stdout.strip()[:300]}"


def test_the_layout_reads_complete_steps_only(tmp_path):
    from trainer.contract.layout import MARKER, complete_steps, step_dir_name, step_of

    for step, marked in ((5, True), (12, False), (120, True)):
        (tmp_path / step_dir_name(step)).mkdir()
        if marked:
            (tmp_path / step_dir_name(step) / MARKER).write_text("{}")
    (tmp_path / "step-x").mkdir()
    (tmp_path / "attempts").mkdir()
    assert step_dir_name(120) == "step-000120" and step_of("step-000120") == 120 and step_of("steps-1") is None
    assert complete_steps(str(tmp_path)) == [5, 120]
    assert complete_steps(str(tmp_path / "missing")) == []


def _imports(path: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_the_restore_drill_does_not_import_the_training_loop():
    """trainer/verify.py builds the optimizer from trainer/optim.py, so it stands beside train.py, not above it."""
    imported = _imports(os.path.join(REPO, "trainer", "verify.py"))
    assert "trainer.optim" in imported
    assert "trainer.train" not in imported
