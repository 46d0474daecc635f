"""Entry point of the policy pack: `pulumi preview --policy-pack policypack`.

Building a PolicyPack starts the policy analyzer's gRPC server and never returns, so it only
happens here, never on import (the offline plan imports the rules, not this file).
"""
import sys
from pathlib import Path

# The engine runs this folder as a script: make the project root importable.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pulumi_policy import PolicyPack  # noqa: E402

from policypack.pack import policies  # noqa: E402

PolicyPack(name="ml-training-platform", policies=policies())
