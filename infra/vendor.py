"""Upstream manifests the deploy builds locally, fetched by commit and verified by content.

    python -m infra.vendor            # fetch (if missing) and verify; what `pulumi up` also does

The Training Operator 1.9.x has no Helm chart: its install is a kustomize overlay. Building it
from a remote `repo//path?ref=tag` URL needs the `git` binary and a tag that could move
(pulumi/pulumi-kubernetes#3036, "Remote Targets"). Instead the program's entry point
(``infra/__main__.py``) fetches the commit's source archive over HTTPS (no git), keeps only the
manifests folder, and refuses it unless its git tree id is the pinned one: the same id
``git rev-parse <commit>:manifests`` prints in any clone, so the pin is checkable by anyone and
independent of how GitHub compresses its archives. It then writes the platform's local overlay
(``components.training.operator_kustomization``) next to it; the kustomize Directory builds
that overlay. Nothing is fetched when the verified tree is already there (an air-gapped runner
can be seeded with ``python -m infra.vendor`` from a machine that has egress).
"""
from __future__ import annotations

import argparse
import hashlib
import io
import os
import sys
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable, Optional

import yaml

from catalog.versions import (
    TRAINING_OPERATOR_ARCHIVE_URL, TRAINING_OPERATOR_COMMIT, TRAINING_OPERATOR_MANIFESTS_TREE,
    TRAINING_OPERATOR_OVERLAY_DIR, TRAINING_OPERATOR_VENDOR_DIR,
)

ROOT = Path(__file__).resolve().parent.parent
EXIT_FAILED = 1


class VendorError(RuntimeError):
    """A vendored tree that could not be fetched or does not match its pin."""


@dataclass(frozen=True)
class VendoredTree:
    """One folder of an upstream repository at a commit.

    archive_url: the commit's source archive (.tar.gz, one top-level folder).
    subdir: the folder kept, relative to the repository root.
    tree_id: ``git rev-parse <commit>:<subdir>`` (git's SHA-1 tree id of that folder).
    dest: where it is kept, relative to the project root.
    """

    archive_url: str
    subdir: str
    tree_id: str
    dest: str


TRAINING_OPERATOR = VendoredTree(
    archive_url=TRAINING_OPERATOR_ARCHIVE_URL, subdir="manifests",
    tree_id=TRAINING_OPERATOR_MANIFESTS_TREE, dest=TRAINING_OPERATOR_VENDOR_DIR,
)


# -- git's content address of a folder ------------------------------------------------------------
def _blob_id(data: bytes) -> bytes:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).digest()


def tree_id(path: Path) -> str:
    """The id git gives this folder as a tree (Git book, "Git Objects": a tree entry is
    ``<mode> <name>\\0<20-byte id>``, entries sorted by name with folders compared as
    ``name/``). Empty folders do not exist for git and are skipped."""
    return _tree_digest(path).hex()


def _tree_digest(path: Path) -> bytes:
    entries: list[tuple[bytes, bytes]] = []
    for child in path.iterdir():
        name = child.name.encode()
        if child.is_symlink():
            entries.append((name, b"120000 " + name + b"\0" + _blob_id(os.readlink(child).encode())))
        elif child.is_dir():
            if not any(child.rglob("*")):
                continue
            entries.append((name + b"/", b"40000 " + name + b"\0" + _tree_digest(child)))
        else:
            mode = b"100755" if os.access(child, os.X_OK) else b"100644"
            entries.append((name, mode + b" " + name + b"\0" + _blob_id(child.read_bytes())))
    body = b"".join(entry for _, entry in sorted(entries))
    return hashlib.sha1(b"tree %d\0" % len(body) + body).digest()


# -- fetching ----------------------------------------------------------------------------------
def _download(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 - pinned https URL
        return response.read()


def _extract_subdir(archive: bytes, subdir: str, target: Path) -> None:
    """Extract ``<top>/<subdir>/...`` of a source archive into ``target`` (regular files and
    folders only; a link or a path escaping the folder is refused)."""
    keep = PurePosixPath(subdir).parts
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        for member in tar.getmembers():
            parts = PurePosixPath(member.name).parts[1:]  # drop the archive's top-level folder
            if parts[:len(keep)] != keep or len(parts) == len(keep):
                continue
            relative = parts[len(keep):]
            if ".." in relative:
                raise VendorError(f"archive member {member.name!r} escapes {subdir}/")
            out = target.joinpath(*relative)
            if member.isdir():
                out.mkdir(parents=True, exist_ok=True)
            elif member.isfile():
                source = tar.extractfile(member)
                if source is None:
                    raise VendorError(f"archive member {member.name!r} has no data")
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(source.read())
                out.chmod(0o755 if member.mode & 0o111 else 0o644)
            else:
                raise VendorError(f"archive member {member.name!r} is not a file or folder; the pinned tree has none")


def ensure(tree: VendoredTree, root: Path = ROOT, download: Callable[[str], bytes] = _download) -> Path:
    """The verified folder, fetched first if missing. Raises VendorError naming the pin and the fix."""
    dest = root / tree.dest
    if dest.is_dir():
        found = tree_id(dest)
        if found == tree.tree_id:
            return dest
        raise VendorError(
            f"{tree.dest} has tree id {found}, pinned {tree.tree_id} (catalog/versions.py). "
            f"FIX: delete {tree.dest} and run `python -m infra.vendor` again")
    try:
        archive = download(tree.archive_url)
    except OSError as error:
        raise VendorError(
            f"cannot download {tree.archive_url}: {error}. FIX: run `python -m infra.vendor` on a machine "
            f"with HTTPS egress to github.com and copy {tree.dest} to this checkout") from None
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as scratch:
        staged = Path(scratch) / "tree"
        staged.mkdir()
        try:
            _extract_subdir(archive, tree.subdir, staged)
        except tarfile.TarError as error:
            raise VendorError(f"{tree.archive_url} is not a .tar.gz archive: {error}") from None
        found = tree_id(staged)
        if found != tree.tree_id:
            raise VendorError(
                f"{tree.archive_url}: {tree.subdir}/ has tree id {found}, pinned {tree.tree_id}; refusing it. "
                f"FIX: check the pin with `git rev-parse <commit>:{tree.subdir}` in a clone")
        staged.rename(dest)  # same file system: atomic, never a half-written tree
    return dest


def write_overlay(root: Path = ROOT) -> Path:
    """The platform's Training Operator overlay (placement, init-container image) as a file."""
    from components.training import (
        INIT_CONTAINER_TEMPLATE, INIT_CONTAINER_TEMPLATE_FILE, NETWORK_POLICY_FILE, network_policy_yaml, operator_kustomization,
    )

    overlay = root / TRAINING_OPERATOR_OVERLAY_DIR
    overlay.mkdir(parents=True, exist_ok=True)
    upstream = os.path.relpath(root / TRAINING_OPERATOR_VENDOR_DIR / "overlays" / "standalone", overlay)
    text = yaml.safe_dump(operator_kustomization(upstream), sort_keys=False)
    for path, content in ((overlay / "kustomization.yaml", text), (overlay / INIT_CONTAINER_TEMPLATE_FILE, INIT_CONTAINER_TEMPLATE),
                          (overlay / NETWORK_POLICY_FILE, network_policy_yaml())):
        if not path.is_file() or path.read_text() != content:
            path.write_text(content)
    return overlay


def prepare(root: Path = ROOT) -> Path:
    """What ``pulumi up`` needs on disk before the program runs: verified upstream, local overlay."""
    ensure(TRAINING_OPERATOR, root)
    return write_overlay(root)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.vendor", description=__doc__.split("\n\n")[0])
    parser.parse_args(argv)
    try:
        overlay = prepare()
    except VendorError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_FAILED
    print(f"Training Operator {TRAINING_OPERATOR_COMMIT[:12]} verified in {TRAINING_OPERATOR.dest}; overlay {overlay}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
