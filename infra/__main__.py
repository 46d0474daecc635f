"""Entry point of `pulumi up` (Pulumi.yaml: `main: infra/`)."""
import sys
from pathlib import Path

# Pulumi runs this directory as a script; make the project root importable.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pulumi  # noqa: E402

from workloads.problems import InvalidInputError  # noqa: E402
from infra.chart_mirror import ChartMirrorError  # noqa: E402
from infra.program import main, prepare_files  # noqa: E402
from infra.vendor import VendorError  # noqa: E402

try:
    # Once the config is valid, and before any resource: the Training Operator overlay is built
    # from a verified local tree (no git at deploy time), and with a chart mirror every chart is
    # downloaded and checked against its pinned SHA-256.
    main(prepare=prepare_files)
except (VendorError, ChartMirrorError) as error:
    raise pulumi.RunError(str(error)) from None
except InvalidInputError as error:
    # RunError prints the message alone: a config mistake is not a program crash.
    raise pulumi.RunError(str(error)) from None
