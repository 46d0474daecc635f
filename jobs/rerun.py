"""A rerun: a new run of a job spec with an identity of its own.

A job's run is identified by its name: the checkpoint directory (``/fsx/checkpoints/<namespace>/
<name>`` unless ``checkpointDir`` says otherwise) and the MLflow run (the trainer finds its run by
``<namespace>.<name>``, ``trainer.contract.environment.ENV_RUN_ID``) both follow from it. Submitting
a finished job's name again would resume its newest checkpoint and train nothing more (the trainer
loops ``while step < num_steps``), so a rerun takes a new name, ``<name>-r<N>`` (the next number
over the team's jobs and run records of that name) or ``<name>-<suffix>``, and with it:

- its own checkpoint directory (an explicit ``checkpointDir`` gets the same suffix);
- its own MLflow run, in the same experiment as the first run (``experiment`` is pinned to the
  original's), so the runs sit side by side in the MLflow UI;
- optionally (``from_previous``) the previous run's newest complete checkpoint as its initial
  weights (``initFrom: <previous>/step-N``): step, schedule, data cursor and MLflow run start fresh.

Pure: the caller lists the names in use and reads the previous run's checkpoints.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from workloads.jobspec import MAX_NAME_LENGTH, JobSpec
from workloads.problems import Problem

_SUFFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_NUMBERED = r"^{base}-r(\d+)$"


class RerunError(ValueError):
    """A rerun setting that cannot be used: one line naming the flag, the value and the fix."""

    def __init__(self, flag: str, value: object, message: str, fix: str):
        super().__init__(Problem(flag, value, message, fix).render())


@dataclass(frozen=True)
class Rerun:
    spec: JobSpec  # the new run's spec
    base: str  # the first run's name
    previous: Optional[str]  # the newest earlier run's name (None: no earlier run is known)
    init_from: Optional[str]  # <previous>/step-N when it starts from the previous run's checkpoint

    def describe(self) -> str:
        start = f"starting from {self.init_from}" if self.init_from else "starting from scratch"
        return (f"rerun of {self.base} as {self.spec.name}: checkpoints in {self.spec.checkpoint_path}, a new MLflow run "
                f"in experiment {self.spec.experiment_name}, {start}")


def base_name(name: str, taken: Iterable[str]) -> str:
    """The first run's name: a spec that already names a numbered rerun (``x-r3``) whose base
    exists counts from that base."""
    match = re.match(r"^(.*)-r\d+$", name)
    if match and match.group(1) in set(taken):
        return match.group(1)
    return name


def next_name(base: str, taken: Iterable[str]) -> tuple[str, Optional[str]]:
    """(``<base>-r<N>``, the newest earlier run) over the names in use (the base counts as run 1)."""
    taken = set(taken)
    numbers = {1} if base in taken else set()
    for name in taken:
        if match := re.match(_NUMBERED.format(base=re.escape(base)), name):
            numbers.add(int(match.group(1)))
    newest = max(numbers, default=None)
    previous = None if newest is None else base if newest == 1 else f"{base}-r{newest}"
    return f"{base}-r{(newest or 1) + 1}", previous


def plan_rerun(spec: JobSpec, taken: Iterable[str], *, suffix: Optional[str] = None, from_previous: bool = False,
               complete_steps: Optional[Callable[[str], list[int]]] = None) -> Rerun:
    """The rerun of ``spec`` given the team's job names in use (live jobs and run records).

    ``suffix``: the new name is ``<name>-<suffix>`` (default: ``<name>-r<N>``). ``from_previous``:
    start from the previous run's newest complete checkpoint; ``complete_steps(checkpoint_dir)``
    reads them (the stack's checkpoint store)."""
    taken = list(taken)
    base = base_name(spec.name, taken)
    if suffix is not None:
        if not _SUFFIX.match(suffix):
            raise RerunError("--rerun", suffix, "is not a name suffix (lowercase letters, digits and '-', starting and "
                             "ending with a letter or digit)", "e.g. --rerun lr2, or --rerun alone for the next number")
        name = f"{base}-{suffix}"
        _, previous = next_name(base, taken)
        if name in taken:
            raise RerunError("--rerun", suffix, f"job {name} already exists in the team (a job or a recorded run)",
                             "give another suffix, or --rerun alone for the next number")
    else:
        name, previous = next_name(base, taken)
    if len(name) > MAX_NAME_LENGTH:
        raise RerunError("--rerun", suffix or name, f"the rerun's name {name} is longer than {MAX_NAME_LENGTH} characters",
                         f"shorten name: in the spec to at most {MAX_NAME_LENGTH - len(name) + len(spec.name)} characters, "
                         "or give a shorter --rerun SUFFIX")
    tail = name[len(base):]  # "-r2" or "-<suffix>"
    changes: dict[str, object] = {"name": name, "experiment": spec.experiment or base}
    if spec.checkpoint_dir:
        changes["checkpoint_dir"] = f"{spec.checkpoint_dir}{tail}"
    if spec.run_name:
        changes["run_name"] = f"{spec.run_name}{tail}"
    init_from = None
    if from_previous:
        if spec.own_code:
            raise RerunError("--from-previous", True, "your own code loads what it likes (initFrom is the built-in "
                             "trainer's initial load)", "drop --from-previous and read the checkpoint in your script")
        if previous is None:
            raise RerunError("--from-previous", True, f"no earlier run of {base} is known to the cluster",
                             "drop --from-previous, or rerun a job the team has run")
        if spec.checkpoint_dir:
            raise RerunError("--from-previous", True, f"checkpointDir is set ({spec.checkpoint_dir}): initFrom reads a "
                             "job's default checkpoint directory only", "remove checkpointDir, or drop --from-previous")
        steps = complete_steps(f"{spec.checkpoint_path.rsplit('/', 1)[0]}/{previous}") if complete_steps else []
        if not steps:
            raise RerunError("--from-previous", True, f"the previous run {previous} has no complete checkpoint",
                             f"drop --from-previous (list them: python -m workloads checkpoints {previous} --team {spec.team})")
        init_from = f"{previous}/step-{steps[-1]}"
        changes["init_from"] = init_from
    from workloads.jobspec import parse_job_spec

    raw = {**spec.model_dump(by_alias=True, exclude_none=True, exclude_unset=True),
           **{_alias(k): v for k, v in changes.items()}}
    return Rerun(parse_job_spec(raw, source=f"rerun of {base}"), base, previous, init_from)


def _alias(field: str) -> str:
    head, *rest = field.split("_")
    return head + "".join(word.capitalize() for word in rest)
