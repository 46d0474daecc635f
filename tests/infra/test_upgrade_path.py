"""`python -m infra.plan.upgrade --path`: per stack, the whole way from its EKS minor to the newest one the
platform knows, one hop at a time (EKS: "you can only update to the next minor version"), each hop
planned on the config the previous one leaves, with its blockers, and what staying costs.

The extended-support figure is AWS's rule, not ours: EKS pricing is $0.10 per cluster-hour in
standard support and $0.60 in extended support, so staying costs $0.50 x 730 h = $365 a month per
cluster more (aws.amazon.com/eks/pricing).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infra.plan import upgrade

ROOT = Path(__file__).resolve().parents[2]
TODAY = "2026-11-29"


@pytest.fixture(scope="module")
def both_stacks():
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = upgrade.main(["--path", "--today", TODAY])
    return code, out.getvalue()


def test_each_stack_gets_its_whole_path_and_the_price_of_staying(both_stacks):
    code, text = both_stacks
    # prod runs the GPU Operator, whose pinned release states Kubernetes 1.29-1.32: every hop of
    # prod's path names it, and the command says the path is blocked (dev's has no blocker).
    assert code == upgrade.EXIT_BLOCKED, text
    dev, prod = text.split("stack dev (")[1].split("\n\nstack ")[0], text.split("stack prod (")[1]
    assert "! " not in dev, dev
    for target in ("1.33", "1.34", "1.35"):
        assert (f"! NVIDIA GPU Operator v25.3.0 supports Kubernetes 1.29-1.32 (docs.nvidia.com/datacenter/cloud-native/"
                f"gpu-operator/25.3.0, Platform Support: Kubernetes 1.29-1.32), not {target}: upgrade the chart first") in prod
    assert "staying where they are costs $730.00/month in extended support (dev, prod)" in text
    for stack in ("dev", "prod"):
        section = text.split(f"stack {stack} (")[1].split("\n\nstack ")[0]
        assert "runs EKS 1.32, extended support since 2026-03-23 (until 2027-03-23): +$365.00/month" in section
        assert "path: 1.32 -> 1.33 -> 1.34 -> 1.35 (3 hop(s), one `up` each" in section
        # 1.33's standard support ended on 2026-07-29, 1.34's ends three days later: only 1.35 leaves.
        assert "hop 1: 1.32 -> 1.33: then extended support since 2026-07-29" in section
        assert "hop 2: 1.33 -> 1.34: then standard support until 2026-12-02 (3 days: extended again within 90 days)" in section
        assert "leaves extended support for good at 1.35 (standard until 2027-03-27)" in section
        assert "about $1,367 until its extended support ends on 2027-03-23" in section  # 114 days x $365 / 30.44
    # Dev first: prod's hops follow dev's, and dev is listed first.
    assert text.index("stack dev (") < text.index("stack prod (")
    assert "hop 1: 1.32 -> 1.33" in text.split("stack prod (")[1] and "after Pulumi.dev.yaml (dev) runs 1.33" in text


def test_the_stacks_stay_pinned(both_stacks):
    for stack in ("dev", "prod"):
        config = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]
        assert str(config["ml-training-platform:cluster"]["version"]) == "1.32"


def test_a_hops_blocker_is_printed_under_it_and_fails_the_command(monkeypatch, capsys):
    """A chart whose stated range stops at 1.33 blocks the 1.33 -> 1.34 hop, planned on the config
    the first hop leaves."""
    narrowed = tuple(upgrade.ChartSupport(c.name, c.version, c.minimum, "1.33", c.source) if c.name == "Kueue" else c
                     for c in upgrade.CHARTS)
    monkeypatch.setattr(upgrade, "CHARTS", narrowed)
    assert upgrade.main(["--path", "--stack", "dev", "--today", TODAY]) == upgrade.EXIT_BLOCKED
    text = capsys.readouterr().out
    hop2 = text.split("hop 2:")[1].split("hop 3:")[0]
    assert "1 blocker(s)" in hop2 and "! Kueue" in hop2 and "not 1.34" in hop2, text
    assert "! Kueue" not in text.split("hop 2:")[0]


@pytest.mark.parametrize("argv, message", [
    (["--path", "--to", "1.33"], "error: --path plans every hop to the newest minor; drop --to"),
    (["--path", "--today", "2026-13-01"], "error: --today 2026-13-01: not a date. Fix: YYYY-MM-DD"),
    (["--to", "1.33"], "error: give --stack STACK and --to VERSION (one hop), or --path"),
])
def test_bad_input_is_one_line(argv, message, capsys):
    assert upgrade.main(argv) == upgrade.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1
