"""Compare two offline plans resource by resource, keyed by URN: the check of a refactoring that
must not change what `pulumi up` would do.

    python -m infra.plan --stack dev --json /tmp/before-dev.json      # on the base commit
    python tools/plan_diff.py /tmp/before-dev.json --stack dev         # on the change

Exits 0 when every URN is in both plans with equal fields (inputs, parent, provider,
dependencies, protect, ...), 1 with the differences listed otherwise. ``--stack`` renders the
"after" plan of the working tree; a second path compares two saved plans.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any


def by_urn(resources: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["urn"]: r for r in resources}


def differences(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[str]:
    old, new = by_urn(before), by_urn(after)
    out = [f"- {urn}" for urn in sorted(set(old) - set(new))]
    out += [f"+ {urn}" for urn in sorted(set(new) - set(old))]
    for urn in sorted(set(old) & set(new)):
        for key in sorted(set(old[urn]) | set(new[urn])):
            if old[urn].get(key) != new[urn].get(key):
                a, b = json.dumps(old[urn].get(key), sort_keys=True), json.dumps(new[urn].get(key), sort_keys=True)
                out.append(f"~ {urn} {key}: {a[:300]} -> {b[:300]}")
    return out


def render(stack: str) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{stack}.json")
        subprocess.run([sys.executable, "-m", "infra.plan", "--stack", stack, "--json", path], check=True,
                       stdout=subprocess.DEVNULL)
        with open(path) as f:
            return json.load(f)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after", nargs="?")
    parser.add_argument("--stack")
    args = parser.parse_args(argv)
    if (args.after is None) == (args.stack is None):
        parser.error("give either a second plan file or --stack")
    with open(args.before) as f:
        before = json.load(f)
    if args.after:
        with open(args.after) as f:
            after = json.load(f)
    else:
        after = render(args.stack)
    found = differences(before, after)
    print("\n".join(found) if found else f"identical: {len(before)} resources by URN")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
