"""Which attempt may finalise, prune and roll back a checkpoint directory."""
from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid

from trainer.contract.layout import OWNER
from trainer.durable import write_json_atomic

log = logging.getLogger(__name__)


class Ownership:
    """Only one attempt acts on a checkpoint directory. Each attempt's rank 0 claims
    `owner.json` (atomic replace) when it starts; before it writes a marker, prunes or
    uploads, it checks that the claim is still its own. An older attempt still draining
    (a pod on a lost node, a launcher that outlived its workers) then stops acting
    instead of pruning the checkpoint a new attempt is loading. The check narrows the
    window to one file read before each action; it is not a distributed lock."""

    def __init__(self, root: str, attempt_id: str | None = None):
        self.path = os.path.join(root, OWNER)
        self.attempt_id = attempt_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def claim(self) -> None:
        previous = self.current()
        write_json_atomic(self.path, {"attempt_id": self.attempt_id, "host": socket.gethostname(),
                                      "pid": os.getpid(), "since": time.time()})
        if previous and previous != self.attempt_id:
            log.info("checkpoint directory taken over from attempt %s by %s", previous, self.attempt_id)

    def current(self) -> str | None:
        try:
            with open(self.path) as f:
                return json.load(f).get("attempt_id")
        except (OSError, ValueError, AttributeError):
            return None

    def holds(self) -> bool:
        return self.current() == self.attempt_id


class NoOwnership:
    """Ranks other than 0 never act on the directory."""

    def claim(self) -> None:
        pass

    def holds(self) -> bool:
        return True
