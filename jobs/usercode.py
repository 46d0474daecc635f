"""`submit --code DIR`: your code as a reproducible archive in the team's S3 prefix, pinned by digest.

The archive is deterministic (sorted members, zeroed owners and times, fixed gzip header), so the
same tree always has the same SHA-256 and a re-submit of unchanged code uploads nothing new. Its
key is content-addressed under the job's code prefix of the team's space
(``s3://<checkpoints bucket>/team-<team>/code/<job>/<sha256>.tar.gz``, workloads/owncode.py),
and the rendered job carries the digest: the launcher in the pod refuses any other bytes
(trainer/code_archive.py).

What goes in: every regular file under DIR except version-control and cache directories and
anything ``.mlpignore`` names (one glob per line, matched against the path relative to DIR).
Links are refused (an archive member pointing outside DIR would be unpacked as nothing useful,
or refused by the pod's "data" filter); so is an archive above ``MAX_ARCHIVE_BYTES``.
"""
from __future__ import annotations

import ast
import difflib
import fnmatch
import gzip
import hashlib
import io
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from workloads.jobspec import CodeSpec, JobSpec
from workloads.owncode import CODE_SIZE_LIMIT, code_key
from workloads.problems import InvalidInputError, Problem

SKIPPED_DIRS = {".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".pytest_cache", ".venv", "venv", ".ipynb_checkpoints"}
IGNORE_FILE = ".mlpignore"
# The pod unpacks into an emptyDir of CODE_SIZE_LIMIT (2 GiB); archives are code, not data.
MAX_ARCHIVE_BYTES = 256 * 1024 * 1024


class CodeError(InvalidInputError):
    """Why DIR cannot be shipped, every problem at once."""


@dataclass(frozen=True)
class CodeArchive:
    data: bytes
    sha256: str
    files: tuple[str, ...]

    @property
    def size_bytes(self) -> int:
        return len(self.data)


def _ignored(relative: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(relative, p) or fnmatch.fnmatch(relative.split("/")[-1], p) for p in patterns)


def collect(directory: Path) -> tuple[list[str], list[Problem]]:
    """The files to ship (relative POSIX paths, sorted) and the problems that stop it."""
    problems: list[Problem] = []
    if not directory.is_dir():
        return [], [Problem("--code", str(directory), "is not a directory", "give the directory holding your script")]
    patterns = []
    ignore = directory / IGNORE_FILE
    if ignore.is_file():
        patterns = [line.strip() for line in ignore.read_text().splitlines() if line.strip() and not line.startswith("#")]
    files = []
    for root, dirs, names in os.walk(directory):
        for linked in sorted(d for d in dirs if (Path(root) / d).is_symlink()):
            relative = (Path(root) / linked).relative_to(directory).as_posix()
            if not _ignored(relative, patterns):
                problems.append(Problem("--code", relative, "is a link or not a regular file",
                                        f"copy the files in, or list it in {IGNORE_FILE}"))
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not (Path(root) / d).is_symlink())
        for name in sorted(names):
            path = Path(root) / name
            relative = path.relative_to(directory).as_posix()
            if _ignored(relative, patterns) or name.endswith(".pyc"):
                continue
            if path.is_symlink() or not path.is_file():
                problems.append(Problem("--code", relative, "is a link or not a regular file",
                                        f"copy the file in, or list it in {IGNORE_FILE}"))
                continue
            files.append(relative)
    if not files and not problems:
        problems.append(Problem("--code", str(directory), "has no files to ship", "give the directory holding your script"))
    return sorted(files), problems


def build_archive(directory: Path, files: list[str]) -> CodeArchive:
    """A gzip'ed tar whose bytes depend only on the files' paths, contents and executable bits."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for relative in files:
            path = directory / relative
            info = tarfile.TarInfo(relative)
            info.size = path.stat().st_size
            info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with open(path, "rb") as f:
                tar.addfile(info, f)
    packed = io.BytesIO()
    # mtime=0 and no file name: the gzip header is the same on every run (RFC 1952 MTIME, FNAME).
    with gzip.GzipFile(filename="", mode="wb", fileobj=packed, mtime=0) as gz:
        gz.write(raw.getvalue())
    data = packed.getvalue()
    return CodeArchive(data, hashlib.sha256(data).hexdigest(), tuple(files))


def archive(directory: Path | str) -> CodeArchive:
    directory = Path(directory)
    files, problems = collect(directory)
    if not problems:
        result = build_archive(directory, files)
        if result.size_bytes > MAX_ARCHIVE_BYTES:
            problems.append(Problem("--code", str(directory), f"packs to {result.size_bytes / 2**20:.0f} MiB, more than "
                                    f"{MAX_ARCHIVE_BYTES // 2**20} MiB (the pod unpacks into {CODE_SIZE_LIMIT})",
                                    f"keep data and checkpoints out ({IGNORE_FILE}); datasets go to FSx"))
        else:
            return result
    raise CodeError(f"code directory {directory}", problems)


def pin(spec: JobSpec, code: CodeArchive, checkpoints_bucket: Optional[str], stack: str) -> JobSpec:
    """The spec with ``code`` set to the archive's place and digest."""
    problems = []
    if spec.trainer is not None:
        problems.append(Problem("--code", "given", "the job runs the built-in trainer, which is in the image",
                                "give script: or command: in the spec to run your own code"))
    if not checkpoints_bucket:
        problems.append(Problem("--code", "given", f"stack {stack} has no checkpoints bucket to hold code archives",
                                "ship the code in an image built FROM the trainer image instead"))
    if problems:
        raise CodeError(f"job {spec.name}", problems)
    uri = f"s3://{checkpoints_bucket}/{code_key(spec.namespace, spec.name, code.sha256)}"
    return spec.model_copy(update={"code": CodeSpec(uri=uri, sha256=code.sha256)})


def upload(spec: JobSpec, code: CodeArchive, *, s3_client=None) -> bool:
    """Put the archive at its pinned key unless the object there already has the pinned digest
    (read back and hashed here: a replaced object is overwritten). Returns whether it uploaded.
    ChecksumSHA256 makes S3 refuse the put if the bytes it received are not these."""
    import base64
    import hashlib

    from botocore.exceptions import BotoCoreError, ClientError

    from jobs.store import StoreError

    assert spec.code is not None
    bucket, key = spec.code.uri[len("s3://"):].split("/", 1)
    try:
        if s3_client is None:
            import boto3

            s3_client = boto3.client("s3")
        try:
            existing = s3_client.get_object(Bucket=bucket, Key=key)["Body"].read()
            if hashlib.sha256(existing).hexdigest() == code.sha256:
                return False
        except s3_client.exceptions.NoSuchKey:
            pass
        s3_client.put_object(Bucket=bucket, Key=key, Body=code.data, ContentType="application/gzip",
                             ChecksumSHA256=base64.b64encode(bytes.fromhex(code.sha256)).decode())
    except (BotoCoreError, ClientError) as exc:
        # No credentials, expired SSO, no write access: one line (exit 4), nothing submitted.
        raise StoreError(f"cannot upload your code to {spec.code.uri} ({exc}). Fix: use AWS credentials of team "
                         f"{spec.team} that may write the team's prefix (aws sso login, or AWS_PROFILE), then submit "
                         "again") from None
    return True


REQUIREMENTS_FILE = "requirements.txt"
WHEELS_DIR = "wheels"  # trainer/requirements_env.py installs from here, with --no-index
# Options of a requirements file the pod's offline install can honour.
ALLOWED_OPTIONS = {"--no-index", "--prefer-binary", "--only-binary", "--no-binary", "--pre", "--require-hashes",
                   "--find-links", "-f"}
# What to vendor: in the trainer image, `pip install --dry-run` names only what the image lacks (torch
# and the trainer's pins are already satisfied), for the image's Python and platform.
WHEELS_HOWTO = (f"in the trainer image, list what it lacks (pip install --dry-run -r {REQUIREMENTS_FILE}) and "
                f"pip download --no-deps -d {WHEELS_DIR} each of them")
NO_INDEX_REASON = "team pods reach no package index (their NetworkPolicies allow the VPC, DNS and S3 only)"
NO_INDEX_FIX = f"vendor the wheels in {WHEELS_DIR}/ beside your script ({WHEELS_HOWTO}) and drop the line: {NO_INDEX_REASON}"


def entry_point(spec: JobSpec) -> tuple[str, Optional[str]]:
    """(spec field, the Python file torchrun starts relative to the code root) of an own-code
    spec; the file is None for a module (`python -m pkg`) or a non-Python command."""
    if spec.script is not None:
        return "script", spec.script
    command = list(spec.command or ())
    if command and command[0] in ("python", "python3") and len(command) > 1 and command[1].endswith(".py"):
        return "command[1]", command[1]
    if command[:2] in (["python", "-m"], ["python3", "-m"]) and len(command) > 2:
        return "command[2]", command[2]
    return "command", None


def entry_point_problems(spec: JobSpec, directory: Path | str) -> tuple[list[Problem], list[str]]:
    """(problems, warnings) of the code directory against the spec, before anything is packed:
    the script torchrun starts is in it and parses (a missing file or a syntax error would
    otherwise surface on a launched GPU node, exit 1 on every rank)."""
    directory = Path(directory)
    if spec.trainer is not None or not directory.is_dir():
        return [], []
    files, _ = collect(directory)
    field, target = entry_point(spec)
    problems: list[Problem] = []
    warnings: list[str] = []
    check = check_requirements(directory)
    if check is not None:
        problems += check.problems
        warnings += check.warnings
    if field.startswith("command[2]") and target is not None:  # a module: pkg.mod -> pkg/mod.py or pkg/mod/__main__.py
        base = target.replace(".", "/")
        candidates = [f"{base}.py", f"{base}/__main__.py"]
        target = next((c for c in candidates if c in files), None)
        if target is None:
            warnings.append(f"module {spec.command[2]} is not in {directory} ({' or '.join(candidates)}): it must be "
                            "installed in the image")
            return problems, warnings
    if target is not None:
        if target not in files:
            close = difflib.get_close_matches(target, files, n=1)
            python = [f for f in files if f.endswith(".py")][:8]
            problems.append(Problem(field, target, f"is not in the code directory {directory} (its .py files: {python})",
                                    (f"did you mean {close[0]!r}? " if close else "")
                                    + "name a file of the directory, relative to it, or add the file"))
        else:
            path = directory / target
            try:
                ast.parse(path.read_bytes(), filename=target)
            except SyntaxError as exc:
                problems.append(Problem(field, target, f"does not parse: line {exc.lineno}: {exc.msg}",
                                        f"fix the syntax error (python -m py_compile {path})"))
            except ValueError as exc:  # NUL bytes
                problems.append(Problem(field, target, f"is not Python source ({exc})", "give the script's .py file"))
    return problems, warnings


def _packaging():
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    return InvalidRequirement, Requirement, canonicalize_name


def image_pins(repo_root: Path | None = None) -> dict[str, str]:
    """The trainer image's exact pins (canonical name -> version): the ``trainer`` extra of
    pyproject.toml, which trainer/Dockerfile installs (tests/trainer/test_image.py ties its torch
    to the base image's)."""
    import tomllib

    _, Requirement, canonicalize_name = _packaging()
    root = repo_root or Path(__file__).resolve().parents[1]
    extra = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["trainer"]
    pins = {}
    for text in extra:
        req = Requirement(text)
        exact = [s.version for s in req.specifier if s.operator == "=="]
        if exact:
            pins[canonicalize_name(req.name)] = exact[0]
    return pins


def requirement_entries(text: str) -> list[tuple[int, str]]:
    """(line number, logical line) of a requirements file: comments gone, continuations joined."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = "" if raw.lstrip().startswith("#") else raw
        line = line.split(" #", 1)[0].split("\t#", 1)[0].rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = " ".join((pending + line).split())
        pending = ""
        if line:
            out.append((start, line))
    if pending.strip():
        out.append((start, pending.strip()))
    return out


@dataclass(frozen=True)
class RequirementsCheck:
    problems: list[Problem]
    warnings: list[str]
    requirements: tuple[str, ...]
    wheels: tuple[str, ...]

    def install_step(self, namespace: str) -> str:
        from workloads.owncode import venv_root

        source = (f"offline from {WHEELS_DIR}/ ({len(self.wheels)} file(s))" if self.wheels
                  else "offline (no wheels/: only what the image has)")
        return (f"requirements   {REQUIREMENTS_FILE}: {len(self.requirements)} requirement(s), installed by the launcher "
                f"before torchrun, {source}, into {venv_root(namespace)}/<digest of the requirements, wheels and image>: "
                "built once, reused by every pod and restart; the image's packages (torch ...) are pinned by constraints; "
                "a failed install exits 3 (permanent)")


def check_requirements(directory: Path | str, repo_root: Path | None = None) -> Optional[RequirementsCheck]:
    """The code directory's requirements.txt, checked statically (None without one): each line
    parses, nothing the pod cannot reach (editable installs, local paths, URLs, package indexes),
    nothing that would replace one of the image's pinned packages; each problem names its line
    and the fix."""
    directory = Path(directory)
    path = directory / REQUIREMENTS_FILE
    if not path.is_file():
        return None
    InvalidRequirement, Requirement, canonicalize_name = _packaging()
    pins = image_pins(repo_root)
    wheels_dir = directory / WHEELS_DIR
    wheels = tuple(sorted(p.name for p in wheels_dir.iterdir() if p.is_file())) if wheels_dir.is_dir() else ()
    vendored = {canonicalize_name(w.split("-", 1)[0]) for w in wheels if w.endswith((".whl", ".tar.gz", ".zip"))}
    problems: list[Problem] = []
    warnings: list[str] = []
    names: list[str] = []
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        return RequirementsCheck([Problem(REQUIREMENTS_FILE, str(path), f"cannot be read ({exc})",
                                          "save it as UTF-8 text")], [], (), wheels)
    for number, line in requirement_entries(text):
        where = f"{REQUIREMENTS_FILE} line {number}"
        if line.startswith("-"):
            option, _, value = line.replace("=", " ", 1).partition(" ")
            value = value.strip()
            if option in ("-e", "--editable"):
                problems.append(Problem(where, line, "is an editable install: the pod installs wheels into a shared "
                                        "environment, not a checkout", f"build a wheel of it (pip wheel PATH -w "
                                        f"{WHEELS_DIR}/ --no-deps) and name the package instead"))
            elif option in ("-i", "--index-url", "--extra-index-url"):
                problems.append(Problem(where, line, "names a package index the pod cannot reach", NO_INDEX_FIX))
            elif option in ("-r", "--requirement", "-c", "--constraint"):
                problems.append(Problem(where, line, "includes another file: the pod reads this one file, and the "
                                        "constraints are the image's", f"list the requirements in {REQUIREMENTS_FILE} itself"))
            elif option in ("-f", "--find-links"):
                target = (directory / value).resolve() if value and "://" not in value and not value.startswith("/") else None
                if target is None or not target.is_dir() or not target.is_relative_to(directory.resolve()):
                    problems.append(Problem(where, line, "points outside your code directory (the pod has only the "
                                            "archive and no network)", f"put the wheels in {WHEELS_DIR}/ of {directory} "
                                            "and drop the line (the pod always looks there)"))
            elif option not in ALLOWED_OPTIONS:
                problems.append(Problem(where, line, "is an option the pod's offline install does not take",
                                        f"drop it; allowed: {', '.join(sorted(ALLOWED_OPTIONS))}"))
            continue
        spec_text = " ".join(t for t in line.split() if not t.startswith("--hash"))
        try:
            req = Requirement(spec_text)
        except InvalidRequirement as exc:
            if "/" in spec_text or spec_text.startswith(".") or spec_text.endswith((".whl", ".tar.gz", ".zip")):
                problems.append(Problem(where, line, "is a local path: the pod has your archive, not your disk",
                                        f"build a wheel into {WHEELS_DIR}/ (pip wheel PATH -w {WHEELS_DIR}/ --no-deps) and "
                                        "write the package's name==version"))
            else:
                problems.append(Problem(where, line, f"does not parse as a requirement ({str(exc).splitlines()[0]})",
                                        "write name, name==version or name>=x,<y (PEP 508)"))
            continue
        name = canonicalize_name(req.name)
        names.append(spec_text)
        if req.url:
            problems.append(Problem(where, line, "installs from a URL or path the pod cannot reach",
                                    f"put the wheel in {WHEELS_DIR}/ and write {req.name}==<version>; " + NO_INDEX_REASON))
        elif name in pins:
            if req.specifier and not req.specifier.contains(pins[name], prereleases=True):
                problems.append(Problem(where, line, f"asks for another version than the image's {name}=={pins[name]}: the "
                                        "pod's constraints keep the image's packages (its CUDA torch and the trainer's pins)",
                                        f"drop the line (the image has {name} {pins[name]}), or build an image FROM the "
                                        "trainer image for another version"))
        elif name not in vendored:
            warnings.append(f"{where}: {line}: no wheel for {req.name} in {wheels_dir} and the pod reaches no package "
                            f"index: unless the image has {req.name}, the install fails (exit 3). Fix: {WHEELS_HOWTO}")
    return RequirementsCheck(problems, warnings, tuple(names), wheels)


def local_object_path(uri: str, s3_root: Path) -> Path:
    """Where a local run's stand-in for S3 keeps an object (jobs/local.py maps s3:// there)."""
    return s3_root / uri[len("s3://"):]
