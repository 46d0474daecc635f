"""Your code's ``requirements.txt``, installed in the pod into a virtual environment the job reuses.

The launcher (trainer/launch.py) calls ``prepare`` after the code archive is unpacked and before
torchrun starts. Without a ``requirements.txt`` in the archive nothing happens. With one:

- The environment lives on the team's shared file system (``MLP_VENV_ROOT``, rendered by
  workloads/owncode.py: ``<team subtree>/.venvs``, FSx for Lustre or EFS), in a directory named by
  a digest of what it holds: the requirements file, the image's installed packages (the
  constraints below) and the Python version. Every pod and every restart of the job, and any job
  of the team with the same requirements on the same image, reuses it; another image gets another.
- ``python -m venv --system-site-packages``: torch, CUDA and the trainer's pinned packages come
  from the image and are not copied. A ``.pth`` file adds the launching interpreter's own
  site-packages too, so the image's packages stay visible when its Python is itself a venv.
- pip runs with ``--no-input``, ``--no-index`` (team pods reach no package index: their
  NetworkPolicies allow egress to the VPC, DNS and S3 only, workloads/scheduling.py) and
  ``--find-links <code>/wheels`` when the archive has that directory, a socket timeout and a
  wall-clock bound, and ``-c`` constraints pinning every distribution the image has installed
  (``name==version``, from importlib.metadata): a ``torch>=2`` that would pull another torch is a
  resolution conflict, not a replaced CUDA build.
- Concurrent pods of a job: the first takes an exclusive ``flock`` on ``<digest>.lock`` beside the
  environment (the FSx volumes mount with ``flock``, workloads/fsx.py MOUNT_OPTIONS; on EFS the
  NFS client emulates flock as a byte-range lock on the whole file on the server, Linux flock(2)
  "NFS details", since 2.6.12, unless mounted with local_lock, nfs(5), which the EFS volumes are
  not: workloads/s3_storage.py mounts them with tls and accesspoint only), builds, and writes
  ``.mlp-ready.json`` last; the others wait for the lock, then find the marker and use the
  environment as it is. A half-built environment (its pod died) has no marker and is rebuilt.
  Building in place rather than renaming a finished one matters: a venv is not relocatable (pip
  writes its path into the console scripts' shebangs).

A failed install is permanent (exit ``EXIT_REQUIREMENTS``, in 1-127): the same file would fail
the same way on every retry. The message names the requirement pip refused and goes to the
container's termination message as well as stderr.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import site
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from typing import Optional

from trainer.contract.environment import ENV_VENV_ROOT

REQUIREMENTS_FILE = "requirements.txt"
WHEELS_DIR = "wheels"
ENV_ROOT = ENV_VENV_ROOT
ENV_TIMEOUT = "MLP_REQUIREMENTS_TIMEOUT_SECONDS"
DEFAULT_TIMEOUT_SECONDS = 1200
PIP_SOCKET_TIMEOUT_SECONDS = 60
READY_MARKER = ".mlp-ready.json"
# Permanent for restartPolicy ExitCode (1-127), and apart from 1 (a crash) and 2 (bad input/archive).
EXIT_REQUIREMENTS = 3
# Not pinned: the venv's own installer tooling, never imported by training code.
UNPINNED = {"pip"}
TERMINATION_LOG = "/dev/termination-log"


class RequirementsError(RuntimeError):
    """The install failed; ``str()`` names the requirement and the fix."""


@dataclass(frozen=True)
class Prepared:
    venv: str
    python: str
    installed: bool  # False: an environment built earlier was reused


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_constraints() -> list[str]:
    """``name==version`` of every distribution this interpreter sees (the image's), first on
    ``sys.path`` winning as it does on import; sorted."""
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:  # pip's own copy: always there where pip is
        from pip._vendor.packaging.version import InvalidVersion, Version
    pins: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"] if dist.metadata else None
        if not name or _normalize(name) in UNPINNED or _normalize(name) in pins:
            continue
        try:
            Version(dist.version)
        except (InvalidVersion, TypeError):  # pip would refuse the whole constraints file
            continue
        pins[_normalize(name)] = f"{_normalize(name)}=={dist.version}"
    return sorted(pins.values())


def env_key(requirements: bytes, constraints: list[str], wheels_dir: Optional[str] = None) -> str:
    """What the environment is built from: the Python, the image's packages, the requirements
    and the vendored wheels' names and bytes (a rebuilt wheel of the same version is another env)."""
    h = hashlib.sha256()
    h.update(f"python {sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}\n".encode())
    h.update(b"constraints\n" + "\n".join(constraints).encode() + b"\nrequirements\n" + requirements)
    if wheels_dir and os.path.isdir(wheels_dir):
        for name in sorted(os.listdir(wheels_dir)):
            path = os.path.join(wheels_dir, name)
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    h.update(f"\nwheel {name} ".encode() + hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def image_site_dirs() -> list[str]:
    """The launching interpreter's package directories (the image's), in sys.path order."""
    candidates = [*site.getsitepackages(), *[p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]]
    out: list[str] = []
    for path in candidates:
        if os.path.isdir(path) and path not in out:
            out.append(path)
    return out


def _venv_python(venv: str) -> str:
    return os.path.join(venv, "bin", "python")


def _ready(venv: str) -> Optional[dict]:
    try:
        with open(os.path.join(venv, READY_MARKER)) as f:
            marker = json.load(f)
        return marker if isinstance(marker, dict) and os.path.exists(_venv_python(venv)) else None
    except (OSError, ValueError):
        return None


def failed_requirements(pip_output: str, requirement_lines: list[str]) -> list[str]:
    """The requirements pip's output blames, as written in requirements.txt where it can tell."""
    named: list[str] = []
    patterns = (r"No matching distribution found for (\S+)",
                r"Could not find a version that satisfies the requirement (\S+)",
                r"Cannot install (.+?) because these package versions have conflicting dependencies",
                r"Failed to build installable wheels for some pyproject\.toml based projects \((.+?)\)",
                r"Failed building wheel for (\S+)",
                r"Invalid requirement: '([^']+)'")
    for pattern in patterns:
        for match in re.finditer(pattern, pip_output):
            for part in re.split(r",\s*|\s+and\s+", match.group(1)):
                part = part.strip().strip("'\"")
                if part and part not in named:
                    named.append(part)
    written = []
    for name in named:
        key = _normalize(re.split(r"[<>=!~;\[ @]", name, maxsplit=1)[0])
        line = next((line for line in requirement_lines
                     if _normalize(re.split(r"[<>=!~;\[ @]", line, maxsplit=1)[0]) == key), None)
        written.append(line or name)
    return list(dict.fromkeys(written))


def requirement_lines(text: str) -> list[str]:
    return [line.split(" #", 1)[0].strip() for line in text.splitlines()
            if line.strip() and not line.strip().startswith(("#", "-"))]


def _error_lines(output: str) -> list[str]:
    lines = [line.strip() for line in output.splitlines() if line.strip().startswith(("ERROR:", "error:"))
             or "conflict is caused by" in line or "The user requested" in line]
    lines = [line for line in lines if "for help visit" not in line]
    return lines[-6:]


def _install(venv: str, code_dir: str, requirements: str, constraints_file: str, timeout_seconds: int) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv],
                   check=True, capture_output=True, text=True)
    # The image's own site-packages after the venv's (venv's site.py honours .pth files).
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    venv_site = os.path.join(venv, "lib", version, "site-packages")
    with open(os.path.join(venv_site, "_mlp_image_packages.pth"), "w") as f:
        f.write("\n".join(image_site_dirs()) + "\n")
    command = [_venv_python(venv), "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
               "--no-cache-dir", "--no-index", f"--timeout={PIP_SOCKET_TIMEOUT_SECONDS}",
               "-r", requirements, "-c", constraints_file]
    wheels = os.path.join(code_dir, WHEELS_DIR)
    if os.path.isdir(wheels):
        command[5:5] = ["--find-links", wheels]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}  # nothing but this command decides
    env.update({"VIRTUAL_ENV": venv, "PIP_NO_INPUT": "1"})
    print(f"[trainer.launch] installing {requirements} into {venv}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
    try:
        run = subprocess.run(command, cwd=code_dir, env=env, capture_output=True, text=True, timeout=timeout_seconds)
    except subprocess.TimeoutExpired as exc:
        raise RequirementsError(f"pip did not finish installing {requirements} within {timeout_seconds}s "
                                f"({ENV_TIMEOUT}). Fix: vendor fewer or prebuilt wheels (pip download --only-binary=:all: "
                                f"-d {WHEELS_DIR}), or build an image FROM the trainer image with them") from exc
    output = (run.stdout or "") + (run.stderr or "")
    with open(os.path.join(venv, "pip-install.log"), "w") as f:
        f.write(" ".join(command) + "\n" + output)
    if run.returncode != 0:
        with open(requirements) as f:
            lines = requirement_lines(f.read())
        blamed = failed_requirements(output, lines)
        what = f"requirement {', '.join(blamed)}" if blamed else "a requirement"
        raise RequirementsError(
            f"pip could not install {what} of {REQUIREMENTS_FILE} (exit {run.returncode}): "
            + " | ".join(_error_lines(output) or output.strip().splitlines()[-3:])
            + f". Fix: the pod installs offline from {WHEELS_DIR}/ in your code directory and keeps the image's "
              "packages (e.g. torch) at their versions: add the missing wheels (pip download -d wheels ...), or "
              "relax a pin that asks for another version of an image package; check with python -m workloads preflight --code")


def prepare(code_dir: Optional[str], environ=None, *, timeout_seconds: Optional[int] = None) -> Optional[Prepared]:
    """The environment for ``code_dir``'s requirements.txt (built, or reused), or None when the
    archive has none. Raises RequirementsError when it cannot be installed."""
    env = os.environ if environ is None else environ
    if not code_dir:
        return None
    requirements = os.path.join(code_dir, REQUIREMENTS_FILE)
    if not os.path.isfile(requirements):
        return None
    root = env.get(ENV_ROOT)
    if not root:
        raise RequirementsError(f"{REQUIREMENTS_FILE} is in your code but {ENV_ROOT} is not set: the job was rendered "
                                "by an older platform. Fix: submit it again")
    if timeout_seconds is None:
        try:
            timeout_seconds = int(env.get(ENV_TIMEOUT) or DEFAULT_TIMEOUT_SECONDS)
        except ValueError:
            timeout_seconds = DEFAULT_TIMEOUT_SECONDS
    with open(requirements, "rb") as f:
        data = f.read()
    constraints = image_constraints()
    key = env_key(data, constraints, os.path.join(code_dir, WHEELS_DIR))
    os.makedirs(root, exist_ok=True)
    venv = os.path.join(root, key)
    if _ready(venv):
        print(f"[trainer.launch] {REQUIREMENTS_FILE}: reusing {venv}", file=sys.stderr, flush=True)
        return Prepared(venv, _venv_python(venv), installed=False)
    with open(os.path.join(root, f"{key}.lock"), "a") as lock:
        started = time.monotonic()
        fcntl.flock(lock, fcntl.LOCK_EX)  # another pod of the job may be building it
        waited = time.monotonic() - started
        if _ready(venv):
            print(f"[trainer.launch] {REQUIREMENTS_FILE}: reusing {venv} (built by another pod; waited {waited:.0f}s)",
                  file=sys.stderr, flush=True)
            return Prepared(venv, _venv_python(venv), installed=False)
        shutil.rmtree(venv, ignore_errors=True)  # a pod that died mid-install left it without a marker
        constraints_file = os.path.join(root, f"{key}.constraints.txt")
        with open(constraints_file, "w") as f:
            f.write("# The image's installed packages: a requirement may not replace them.\n" + "\n".join(constraints) + "\n")
        try:
            _install(venv, code_dir, requirements, constraints_file, timeout_seconds)
        except (RequirementsError, subprocess.CalledProcessError, OSError) as exc:
            shutil.rmtree(venv, ignore_errors=True)
            if isinstance(exc, RequirementsError):
                raise
            detail = getattr(exc, "stderr", None) or exc
            raise RequirementsError(f"cannot create the environment for {REQUIREMENTS_FILE} in {venv}: {detail}") from None
        marker = {"requirements_sha256": hashlib.sha256(data).hexdigest(), "python": sys.version.split()[0],
                  "constraints": len(constraints), "built_by": f"{socket.gethostname()}:{os.getpid()}",
                  "built_at": time.time()}
        partial = os.path.join(venv, READY_MARKER + ".tmp")
        with open(partial, "w") as f:
            json.dump(marker, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, os.path.join(venv, READY_MARKER))
    print(f"[trainer.launch] {REQUIREMENTS_FILE}: installed into {venv}", file=sys.stderr, flush=True)
    return Prepared(venv, _venv_python(venv), installed=True)


def write_termination_message(message: str, path: Optional[str] = None) -> None:
    """Where ``kubectl describe`` and the job CLI read why a pod ended (terminationMessagePath)."""
    path = path or os.environ.get("TRAINER_TERMINATION_LOG", TERMINATION_LOG)
    if os.path.exists(path):
        try:
            with open(path, "w") as f:
                f.write(message[:4096])
        except OSError:
            pass
