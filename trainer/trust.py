"""Checkpoint trust: nothing in a checkpoint directory is unpickled before it is proven ours.

Why: resuming runs pickle. torch DCP's `FileSystemReader.read_metadata` is `pickle.load` of
`.metadata`, and `DefaultLoadPlanner.load_bytes` is `torch.load(..., weights_only=False)` of
every non-tensor item of the shards (torch 2.13 `distributed/checkpoint/filesystem.py`,
`default_planner.py`). Whoever can write a `step-N/` directory that the trainer resumes from
runs code as the trainer: its Pod Identity role and its MLflow login.

What proves a checkpoint ours, checked in this order, all before any unpickling:
1. ownership: the checkpoint directory, the step directory and every file in it belong to
   this process's uid, and none is world-writable (each team runs under its own uid);
2. `manifest.json`: the SHA-256 and size of every file of the step, the step directory's
   name and the marker's content, HMAC-SHA256-signed with the team's checkpoint key (the
   team namespace's `checkpoint-signing` Secret, mounted read-only at the path in
   `TRAINER_CHECKPOINT_KEY_FILE`). Another team has neither the key nor the right to read it,
   so it can neither forge a manifest nor move one onto other files;
3. every file's digest matches its manifest entry, and no file is there that the manifest
   does not list.

The RNG files hold tensors only and are read with `weights_only=True`.

Without a key (a laptop, the tests) manifests are written unsigned and checked for digests and
ownership only; inside a Kubernetes pod (`KUBERNETES_SERVICE_HOST` set, as the kubelet does
for every container) a missing key is refused rather than silently trusted.

Without a key, only a checkpoint the caller wrote itself is read (audit security-4 N1: the
operator's drill unpickled what a team wrote into its own prefix, with the platform's rights):
- a signed manifest was written in a team's pod; with no key here it cannot be verified, so it
  is refused (it is read in that team's namespace, with its key: the in-cluster drill);
- a downloaded source (`require_key`: `verify-checkpoint s3://...`) was written by someone else
  whatever its manifest says, so it needs the key;
- what is left, an unsigned local directory owned by the caller's uid, is read, and even then
  nothing in it can run code (trainer/safe_load.py).

A manifest written by rank 0 covers the files of every rank, so rank 0 reads the whole step
once per save (SHA-256 in threads; hashlib releases the GIL on large buffers). On load the
ranks share the digest work and agree on the verdict.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable

from trainer.contract.environment import ENV_CHECKPOINT_KEY_FILE
from trainer.contract.layout import MANIFEST, MARKER, RNG_FILE_PREFIX
from trainer.durable import fsync_file, sha256_file, write_json_atomic
from trainer.guards import TrainingStopped

KEY_FILE_ENV = ENV_CHECKPOINT_KEY_FILE
IN_KUBERNETES_ENV = "KUBERNETES_SERVICE_HOST"
MIN_KEY_BYTES = 32
FORMAT = 1
# The files DCP and the trainer unpickle: never opened unless their digest matches.
PICKLED = (".metadata",)
PICKLED_PREFIX = RNG_FILE_PREFIX


class UntrustedCheckpoint(TrainingStopped):
    """A checkpoint that must not be loaded; the message lists every reason. A permanent stop:
    a retry would meet the same files."""

    def __init__(self, path: str, problems: list[str]):
        self.path, self.problems = path, problems
        super().__init__(f"checkpoint {path} refused before loading anything from it:\n  - "
                         + "\n  - ".join(problems)
                         + "\nIt was not written by this team's trainer (or was changed since). Move it out of "
                           "the checkpoint directory, or resume from an explicit trusted step with "
                           "checkpoint.resume=<path>.")


class CheckpointKeyError(ValueError):
    """The signing key is configured wrongly (exit 2: bad input)."""


def _canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def key_id(key: bytes) -> str:
    """Names a key in messages without revealing it."""
    return hashlib.sha256(b"mlplatform-checkpoint-key-id:" + key).hexdigest()[:16]


def _is_pickled(name: str) -> bool:
    return name in PICKLED or name.startswith(PICKLED_PREFIX)


def _step_files(path: str) -> list[str]:
    return sorted(f for f in os.listdir(path) if f not in (MANIFEST, MARKER) and ".tmp-" not in f)


def ownership_problems(paths: Iterable[str], uid: int) -> list[str]:
    problems = []
    for p in paths:
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            problems.append(f"{p}: a symbolic link (a checkpoint holds only regular files and directories)")
        elif st.st_uid != uid:
            problems.append(f"{p}: owned by uid {st.st_uid}, not by this trainer's uid {uid}")
        elif st.st_mode & stat.S_IWOTH and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
            problems.append(f"{p}: writable by every user (mode {stat.filemode(st.st_mode)})")
    return problems


# Keys the trainer adds to its own marker after the save (`Checkpointer.annotate_newest`): one
# that was unknown (None or absent) when the manifest was sealed may have gained a value since
# (a kill between re-signing the manifest and rewriting the marker leaves either side ahead).
ANNOTATION_KEYS = ("mlflow_run_id",)


def _same_marker(marker: dict, sealed: object) -> bool:
    """Equal, except that an annotation key may have gone from unknown (None or absent) to a value."""
    if not isinstance(sealed, dict):
        return False
    return all(marker.get(k) == sealed.get(k)
               or (k in ANNOTATION_KEYS and None in (marker.get(k), sealed.get(k)))
               for k in set(marker) | set(sealed))


class CheckpointTrust:
    """Seals a step directory after a save and checks it before a load. `key=None`: unsigned
    (local runs only, see the module docstring)."""

    def __init__(self, key: bytes | None, uid: int | None = None, threads: int = 4, require_key: str | None = None):
        self.key = key
        # Where a source that needs the key came from (a download), or None.
        self.require_key = require_key
        self.uid = os.geteuid() if uid is None else uid
        self.threads = threads

    @property
    def signed(self) -> bool:
        return self.key is not None

    def _sign(self, body: dict) -> str | None:
        return hmac.new(self.key, _canonical(body), hashlib.sha256).hexdigest() if self.key else None

    def _digests(self, path: str, names: list[str]) -> dict[str, str]:
        with ThreadPoolExecutor(max_workers=self.threads) as pool:
            return dict(zip(names, pool.map(lambda n: sha256_file(os.path.join(path, n)), names)))

    def file_digests(self, path: str) -> dict[str, str]:
        """SHA-256 of every file of the step now, for `seal(digests=...)`: the writer's thread
        computes them right after the save, so hashing (about a second per 1.5 GB) never runs
        on the training loop's thread."""
        return self._digests(path, _step_files(path))

    def seal(self, path: str, marker: dict, digests: dict[str, str] | None = None) -> None:
        """Writes `manifest.json` for the files now in `path` and the marker about to be written.
        `digests`: the files' SHA-256 computed earlier (after the last write); any file not in it
        is hashed here."""
        names = _step_files(path)
        known = digests or {}
        digests = {**{n: known[n] for n in names if n in known},
                   **self._digests(path, [n for n in names if n not in known])}
        body = {"format": FORMAT, "step_dir": os.path.basename(os.path.normpath(path)), "marker": marker,
                "files": {n: {"sha256": digests[n], "bytes": os.path.getsize(os.path.join(path, n))} for n in names}}
        write_json_atomic(os.path.join(path, MANIFEST), {
            "body": body, "hmac_sha256": self._sign(body), "key_id": key_id(self.key) if self.key else None})
        fsync_file(os.path.join(path, MANIFEST))

    def reseal_marker(self, path: str, marker: dict) -> bool:
        """Replaces the marker a sealed manifest carries, when the trainer annotates its own
        marker after the save (the MLflow run id, once known). The file digests are kept, not
        recomputed: only a manifest whose signature still verifies is re-signed, so a tampered
        step stays refused. Returns whether the manifest was updated."""
        try:
            with open(os.path.join(path, MANIFEST)) as f:
                manifest = json.load(f)
            body = manifest["body"]
        except (OSError, ValueError, KeyError, TypeError):
            return False
        signature = manifest.get("hmac_sha256")
        if self.key is not None and not (signature and hmac.compare_digest(str(signature), self._sign(body))):
            return False
        body = {**body, "marker": marker}
        write_json_atomic(os.path.join(path, MANIFEST), {
            "body": body, "hmac_sha256": self._sign(body), "key_id": key_id(self.key) if self.key else None})
        fsync_file(os.path.join(path, MANIFEST))
        return True

    # -- checks ---------------------------------------------------------------------------------

    def manifest_problems(self, path: str) -> tuple[list[str], list[str], dict | None]:
        """The checks that read no file but the two JSON files: (blocking, other, manifest body).
        Blocking problems forbid opening any pickled file; the others (a changed marker, files
        added or missing) are reported with them but leave nothing to unpickle unverified."""
        path = os.path.normpath(path)
        entries = [os.path.join(path, f) for f in os.listdir(path)] if os.path.isdir(path) else []
        blocking = ownership_problems([os.path.dirname(path), path, *entries], self.uid)
        other: list[str] = []
        try:
            with open(os.path.join(path, MANIFEST)) as f:
                manifest = json.load(f)
            body = manifest["body"]
            files = body["files"]
            if not isinstance(files, dict):
                raise ValueError("'files' is not an object")
        except FileNotFoundError:
            return blocking + [f"{MANIFEST}: missing (every save of this trainer writes one before its marker)"], other, None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return blocking + [f"{MANIFEST}: unreadable ({type(exc).__name__}: {exc})"], other, None
        signature = manifest.get("hmac_sha256")
        if self.key is None and self.require_key:
            blocking.append(f"no checkpoint key ({KEY_FILE_ENV} is not set): {self.require_key} was written by someone "
                            "else, and is never unpickled unverified. Run the drill in the team's namespace, with its "
                            "key: python -m workloads checkpoints JOB --team TEAM --stack STACK --verify")
        elif self.key is None and signature:
            blocking.append(f"{MANIFEST}: signed with a team's key (key id {manifest.get('key_id')!r}), and there is no "
                            f"key here to verify it ({KEY_FILE_ENV} is not set): it was written in a team's pod and is "
                            "read only there, with that team's key. Run the drill in the team's namespace: python -m "
                            "workloads checkpoints JOB --team TEAM --stack STACK --verify")
        if self.key is not None:
            if not signature:
                blocking.append(f"{MANIFEST}: not signed, and this trainer has a checkpoint key "
                                f"(key id {key_id(self.key)}): unsigned checkpoints are refused")
            elif not hmac.compare_digest(str(signature), self._sign(body)):
                blocking.append(f"{MANIFEST}: the signature does not verify with this team's checkpoint key (key id "
                                f"{key_id(self.key)}; the manifest names key id {manifest.get('key_id')!r}): forged, "
                                "changed, or signed by another team")
        if body.get("format") != FORMAT:
            blocking.append(f"{MANIFEST}: format {body.get('format')!r}, expected {FORMAT}")
        if body.get("step_dir") != os.path.basename(path):
            blocking.append(f"{MANIFEST}: written for {body.get('step_dir')!r}, found in {os.path.basename(path)!r}: "
                            "a checkpoint moved to another step")
        try:
            with open(os.path.join(path, MARKER)) as f:
                marker = json.load(f)
            if not _same_marker(marker, body.get("marker")):
                other.append(f"{MARKER}: differs from the marker the manifest was sealed with")
        except (OSError, ValueError) as exc:
            other.append(f"{MARKER}: unreadable ({type(exc).__name__})")
        present = set(_step_files(path))
        extra = sorted(present - set(files))
        if extra:
            (blocking if any(_is_pickled(n) for n in extra) else other).append(
                f"{extra}: not in {MANIFEST}: files added after the save")
        missing = sorted(set(files) - present)
        if missing:
            other.append(f"{missing}: listed in {MANIFEST}, missing")
        return blocking, other, body

    def digest_problems(self, path: str, body: dict, names: Iterable[str]) -> list[str]:
        files = body["files"]
        names = [n for n in names if n in files and os.path.isfile(os.path.join(path, n))]
        problems = []
        for name, digest in self._digests(path, names).items():
            if not hmac.compare_digest(digest, str(files[name].get("sha256"))):
                problems.append(f"{name}: SHA-256 {digest[:16]}... differs from the manifest's "
                                f"{str(files[name].get('sha256'))[:16]}...: changed after the save")
        return problems

    def problems(self, path: str, share: tuple[int, int] = (0, 1)) -> list[str]:
        """Every reason not to load `path`. `share=(rank, world)`: this rank hashes the pickled
        files and its share of the others (the caller combines the ranks' verdicts)."""
        blocking, other, body = self.manifest_problems(path)
        if body is None:
            return blocking + other
        rank, world = share
        names = sorted(body["files"])
        rest = [n for n in names if not _is_pickled(n)]
        mine = [n for n in names if _is_pickled(n)] + rest[rank::world]
        return blocking + other + self.digest_problems(path, body, mine)

    def pickled_problems(self, path: str) -> tuple[list[str], list[str]]:
        """For a diagnosis that reads further (verify-checkpoint): (problems that forbid reading
        any pickled file, problems that still allow reading tensors with weights_only=True)."""
        blocking, other, body = self.manifest_problems(path)
        if body is None or blocking:
            return blocking, other
        names = sorted(body["files"])
        blocking += self.digest_problems(path, body, [n for n in names if _is_pickled(n)])
        other += self.digest_problems(path, body, [n for n in names if not _is_pickled(n)])
        return blocking, other

    def check(self, path: str) -> None:
        problems = self.problems(path)
        if problems:
            raise UntrustedCheckpoint(path, problems)


def read_key(environ=os.environ) -> bytes | None:
    """The team's checkpoint key from the file named by TRAINER_CHECKPOINT_KEY_FILE (a Secret
    mount), None when unset outside Kubernetes. Raises CheckpointKeyError for a key that is configured
    but unusable, or missing inside a pod."""
    key_file = environ.get(KEY_FILE_ENV)
    if not key_file:
        if environ.get(IN_KUBERNETES_ENV):
            raise CheckpointKeyError(f"{KEY_FILE_ENV} is not set in a Kubernetes pod: checkpoints would be neither signed nor "
                            "verified. The platform's job renderer mounts the team's `checkpoint-signing` Secret and "
                            "sets it; run the job through `python -m workloads render/submit`.")
        return None
    try:
        with open(key_file, "rb") as f:
            key = f.read().strip()
    except OSError as exc:
        raise CheckpointKeyError(f"{KEY_FILE_ENV}={key_file!r}: cannot read the checkpoint key ({exc.strerror}); "
                        "mount the team's `checkpoint-signing` Secret there") from None
    if len(key) < MIN_KEY_BYTES:
        raise CheckpointKeyError(f"{KEY_FILE_ENV}={key_file!r}: the key has {len(key)} bytes, at least {MIN_KEY_BYTES} "
                        "are needed")
    return key


def trust_from_env(environ=os.environ, require_key: str | None = None) -> CheckpointTrust:
    """`require_key`: the source, when the checkpoint was not written by the caller (a download)."""
    return CheckpointTrust(read_key(environ), require_key=require_key)
