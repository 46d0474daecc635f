"""The URNs of every stack's resources, pinned: child names are a contract with deployed stacks.

A resource whose URN changes is, to Pulumi, a new resource: `pulumi up` deletes the old one and
creates another (data included, for a bucket or a database). A rename must carry an `aliases`
entry naming the old URN, and a CHANGELOG entry. `tests/infra/test_urns.py` compares each
stack's URNs with the pinned list in `tests/infra/golden/urns-<stack>.txt`:

    python -m infra.urns --write     # after an intended change: additions, or renames with aliases
    python -m infra.urns --write --accept-removals   # resources deliberately removed
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from infra.recording import Recording

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "tests" / "infra" / "golden"


def golden_file(stack: str) -> Path:
    return GOLDEN_DIR / f"urns-{stack}.txt"


def stack_urns(recording: Recording) -> list[str]:
    return sorted(r.urn for r in recording.resources)


@dataclass(frozen=True)
class UrnDiff:
    added: list[str]
    renamed: dict[str, str]  # old URN -> new URN that aliases it
    lost: list[str]  # pinned URNs nothing carries: pulumi up would delete these resources

    @property
    def clean(self) -> bool:
        return not (self.added or self.renamed or self.lost)


def diff(pinned: list[str], recording: Recording) -> UrnDiff:
    current = set(stack_urns(recording))
    aliased = {alias: r.urn for r in recording.resources for alias in r.alias_urns}
    gone = [urn for urn in pinned if urn not in current]
    return UrnDiff(
        added=sorted(current - set(pinned)),
        renamed={urn: aliased[urn] for urn in gone if urn in aliased},
        lost=[urn for urn in gone if urn not in aliased],
    )


def main(argv: Optional[list[str]] = None) -> int:
    from infra.plan import available_stacks, build_plan, default_project_dir

    parser = argparse.ArgumentParser(prog="python -m infra.urns", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="pin the current URNs of every stack")
    parser.add_argument("--accept-removals", action="store_true",
                        help="with --write: the LOST resources are meant to be deleted (say so in the CHANGELOG)")
    args = parser.parse_args(argv)
    status = 0
    for stack in available_stacks(default_project_dir()):
        recording = build_plan(stack, default_project_dir()).recording
        path = golden_file(stack)
        pinned = path.read_text().split() if path.exists() else []
        change = diff(pinned, recording)
        for urn in change.lost:
            print(f"{stack}: LOST {urn}: pulumi up would delete it; add `aliases` to the renamed resource", file=sys.stderr)
            status = 1
        for old, new in change.renamed.items():
            print(f"{stack}: renamed {old} -> {new} (aliased)")
        print(f"{stack}: {len(change.added)} added, {len(change.renamed)} renamed, {len(change.lost)} lost")
        if args.write and (args.accept_removals or not change.lost):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join(stack_urns(recording)) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
