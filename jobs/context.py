"""The stack a job client works on: its facts (read lazily from the offline plan, cached), its
checkpoint store (the checkpoints bucket, as the stack's file system exports to it) and its teams.
Shared by the client's face (preflight, render) and its backends (the cluster, this machine)."""
from __future__ import annotations

import difflib
from typing import Any, Callable, Optional

from jobs.records import UnknownTeam
from jobs.store import EXPORT, MIRROR, CheckpointStore, S3Store


class StackContext:
    """``facts``/``store`` given are used as they are; otherwise read from ``stack`` when first needed."""

    def __init__(self, stack: Optional[str] = None, *, facts: Any = None, store: Optional[CheckpointStore] = None,
                 offline: bool = False):
        self.stack = stack
        self._facts = facts
        self._store = store
        self.offline = offline
        # The deployed checkpoints bucket from the cluster (the team namespace's platform
        # ConfigMap), for a team member who cannot read the stack's outputs; set by the client.
        self.bucket_lookup: Optional[Callable[[], Optional[str]]] = None

    @property
    def knows_stack(self) -> bool:
        return self._facts is not None or self.stack is not None

    @property
    def facts(self):
        if self._facts is None:
            if self.stack is None:
                raise ValueError("this needs the stack's facts: give --stack STACK (in Python: JobClient(stack=...))")
            from jobs.facts import facts_for_stack

            self._facts = facts_for_stack(self.stack, use_outputs=not self.offline)
        return self._facts

    @property
    def store(self) -> Optional[CheckpointStore]:
        if self._store is None:
            bucket = self.facts.checkpoints_bucket  # no stack: ValueError, saying so
            placeholder = bool(bucket) and not getattr(self.facts, "names_deployed", False)
            if placeholder and self.bucket_lookup is not None and (deployed := self.bucket_lookup()):
                bucket, placeholder = deployed, False
            if bucket:
                # On EFS (datasets storage s3-mountpoint) nothing exports /fsx/checkpoints: the
                # only copy in S3 is a job's s3Mirror (jobs/store.py).
                efs = self.facts.checkpoint_store == "EFS"
                self._store = S3Store(bucket, region=self.facts.region, layout=MIRROR if efs else EXPORT,
                                      file_system=self.facts.checkpoint_store or "FSx for Lustre", placeholder=placeholder)
        return self._store

    def store_note(self) -> Optional[str]:
        """What the store cannot see on this stack, or None."""
        store = self.store_or_none()
        if isinstance(store, S3Store) and store.layout == MIRROR:
            return (f"stack {self.stack} keeps checkpoints on EFS, which is not exported to S3: complete steps are "
                    "readable from here through the job's S3 mirror (on by default on EFS; not for jobs with "
                    "s3Mirror: false)")
        return None

    def store_or_none(self) -> Optional[CheckpointStore]:
        try:
            return self.store
        except ValueError:  # no stack given: describe and cancel work without its bucket
            return None

    def check_team(self, team: str) -> None:
        """``UnknownTeam`` naming the team and the stack's teams, when the stack is known."""
        if not self.knows_stack:
            return
        facts = self.facts
        if facts.team(team) is None:
            names = sorted(t.name for t in facts.teams)
            close = difflib.get_close_matches(team, names, n=1)
            raise UnknownTeam(f"--team {team!r}: stack {facts.stack} has no such team (teams: {', '.join(names)})"
                              + (f"; did you mean {close[0]!r}?" if close else ""))
