"""What the stand-in providers "created": one JSON file per live resource, per project and stack,
under ``$MLP_STANDIN_STATE_DIR`` (the engine starts one plugin process per provider resource, so
several processes share it; a refresh in a later run reads what an earlier one wrote).

Layout (``<root>/<project>/<stack>/``):

* ``resources/<sha256(type, id)>.json``: ``{type, id, urn, inputs, outputs, account, region, name}``;
* ``generations.json``: URN -> how many times a resource of that URN was created (a replacement
  gets fresh ids and names, as AWS would give it);
* ``names.json``: the physical names in use (an S3 bucket name, an IAM role name...) -> the
  resource holding it, so a second resource with the same name fails as AWS refuses it;
* ``.lock``: ``flock`` around every change.

The root is ``$MLP_STANDIN_STATE_DIR``, else ``$PULUMI_HOME/standin-state``.

Deleting a file by hand is how a test makes a resource disappear behind Pulumi's back (a refresh
then drops it from the stack).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any, Iterator, Optional

STATE_DIR_ENV = "MLP_STANDIN_STATE_DIR"


class StateError(RuntimeError):
    pass


def default_root() -> Path:
    """``$MLP_STANDIN_STATE_DIR``, else ``$PULUMI_HOME/standin-state`` (the engine passes its
    environment to plugins, so one PULUMI_HOME per test keeps tests apart)."""
    value = os.environ.get(STATE_DIR_ENV)
    if value:
        return Path(value)
    home = os.environ.get("PULUMI_HOME")
    if home:
        return Path(home) / "standin-state"
    raise StateError(f"{STATE_DIR_ENV} is not set (nor PULUMI_HOME): the stand-in providers keep the resources "
                     "they create there; set it to a directory that lives as long as the stack's backend")


def _urn_parts(urn: str) -> tuple[str, str]:
    # urn:pulumi:<stack>::<project>::<type>::<name>
    head = urn.split("::")
    if len(head) < 4 or not head[0].startswith("urn:pulumi:"):
        raise StateError(f"not a Pulumi URN: {urn!r}")
    return head[1], head[0][len("urn:pulumi:"):]


class StateStore:
    _thread_lock = threading.Lock()

    def __init__(self, root: Optional[Path] = None):
        if root is None:
            root = default_root()
        self.root = Path(root)

    def stack_dir(self, urn: str) -> Path:
        project, stack = _urn_parts(urn)
        return self.root / project / stack

    @contextlib.contextmanager
    def locked(self, urn: str) -> Iterator[Path]:
        directory = self.stack_dir(urn)
        (directory / "resources").mkdir(parents=True, exist_ok=True)
        with self._thread_lock, open(directory / ".lock", "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield directory
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    @staticmethod
    def _read(path: Path, default: Any) -> Any:
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return default

    @staticmethod
    def _write(path: Path, value: Any) -> None:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(value, indent=1, sort_keys=True))
        os.replace(tmp, path)

    @staticmethod
    def _key(type_: str, resource_id: str) -> str:
        return hashlib.sha256(f"{type_}\0{resource_id}".encode()).hexdigest()[:32]

    def generation(self, urn: str) -> int:
        """How many resources of this URN were created so far."""
        return int(self._read(self.stack_dir(urn) / "generations.json", {}).get(urn, 0))

    def create(self, urn: str, record_for: "Any") -> dict:
        """Under the lock: take the URN's next generation, build the record with
        ``record_for(generation, names_in_use)`` (it raises to refuse), store it."""
        with self.locked(urn) as directory:
            generations = self._read(directory / "generations.json", {})
            generation = int(generations.get(urn, 0))
            names = self._read(directory / "names.json", {})
            record = record_for(generation, names)
            generations[urn] = generation + 1
            self._write(directory / "generations.json", generations)
            if record.get("name_key"):
                names[record["name_key"]] = {"urn": urn, "type": record["type"], "id": record["id"]}
                self._write(directory / "names.json", names)
            self._write(directory / "resources" / f"{self._key(record['type'], record['id'])}.json", record)
            return record

    def get(self, urn: str, type_: str, resource_id: str) -> Optional[dict]:
        return self._read(self.stack_dir(urn) / "resources" / f"{self._key(type_, resource_id)}.json", None)

    def put(self, urn: str, record: dict) -> None:
        with self.locked(urn) as directory:
            self._write(directory / "resources" / f"{self._key(record['type'], record['id'])}.json", record)

    def delete(self, urn: str, type_: str, resource_id: str) -> Optional[dict]:
        with self.locked(urn) as directory:
            path = directory / "resources" / f"{self._key(type_, resource_id)}.json"
            record = self._read(path, None)
            if record is None:
                return None
            path.unlink()
            names = self._read(directory / "names.json", {})
            key = record.get("name_key")
            if key and names.get(key, {}).get("id") == resource_id:
                del names[key]
                self._write(directory / "names.json", names)
            return record

    def records(self, urn: str) -> list[dict]:
        directory = self.stack_dir(urn) / "resources"
        return [json.loads(path.read_text()) for path in sorted(directory.glob("*.json"))] if directory.is_dir() else []
