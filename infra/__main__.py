"""Entry point of `pulumi up` (Pulumi.yaml: `main: infra/`)."""
import sys
from pathlib import Path

# Pulumi runs this directory as a script; make the project root importable.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infra.program import run  # noqa: E402

run()
