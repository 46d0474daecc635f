"""The job commands' exit codes: one table for `python -m workloads` (jobs/__main__.py, jobs/cli.py)
and what each means (docs/jobs-client.md, "Errors and exit codes")."""
from __future__ import annotations

OK = 0
FAILED = 1  # still terminating after --wait, a checkpoint's restore drill failed, a blocked step
BAD_INPUT = 2  # the spec file, a field, a flag, a name the stack does not know, the trainer config
REFUSED = 3  # well-formed but it does not fit (memory, quota, time budget, instance size); a dev pod not admitted
NO_CLUSTER = 4  # no kubectl, no kubeconfig, unreachable, forbidden; the bucket or log group not readable
LOCAL_FAILED = 5  # the --local run failed
NOT_FOUND = 6  # no such job
EXISTS = 7  # a job of that name exists (submit refuses it: --rerun, or --replace while it runs)
INTERRUPTED = 130  # Ctrl-C

MEANINGS = {
    OK: "done", FAILED: "failed", BAD_INPUT: "bad input", REFUSED: "does not fit / not admitted",
    NO_CLUSTER: "no cluster or bucket access", LOCAL_FAILED: "the local run failed", NOT_FOUND: "no such job",
    EXISTS: "a job of that name exists", INTERRUPTED: "interrupted",
}
