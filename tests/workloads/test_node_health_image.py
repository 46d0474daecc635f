"""The GPU readiness agent's image (docker/node-health/Dockerfile) can run the agent (aws-readiness-4 R2).

There is no Docker engine here; CI builds the image and imports the agent with the image's own
python3 (job ``node-health-image`` in .github/workflows/platform.yml). What can be decided without
the image is decided here:

- the Python the image ships: its base is ``nvcr.io/nvidia/cloud-native/dcgm:<v>-ubuntu22.04``
  (NVIDIA/DCGM ``docker/Dockerfile.ubuntu22.04``: a CUDA base image, no Python), and the
  Dockerfile installs Ubuntu's ``python3``, which on 22.04 (jammy) is CPython 3.10
  (packages.ubuntu.com/jammy/python3: 3.10.6-1~22.04). The agent is run under that minor here.
- the packages: Debian and Ubuntu split the standard library. ``libpython3.X-minimal`` (what
  ``python3-minimal`` pulls in) lacks ``json`` and ``http`` (they are in ``libpython3.X-stdlib``);
  the agent imports ``json`` and ``urllib.request`` (which imports ``http.client``), so a
  ``python3-minimal`` image dies with ModuleNotFoundError before its tool-error handling runs.
"""
from __future__ import annotations

import ast
import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "node-health" / "Dockerfile"
AGENT = ROOT / "workloads" / "node_health_agent.py"
SHARED = ROOT / "trainer" / "gpu_faults.py"  # the GPU-fault format, mounted beside the agent

# The python3 each base distro ships (its distro package, not a guess): packages.ubuntu.com.
DISTRO_PYTHON = {"ubuntu22.04": (3, 10), "ubuntu24.04": (3, 12)}


def _base_image() -> str:
    (line,) = [l for l in DOCKERFILE.read_text().splitlines() if l.startswith("FROM ")]
    return line.split()[1]


def image_python() -> tuple[int, int]:
    """The CPython minor of the image, from its base tag's distro suffix."""
    base = _base_image()
    distro = re.search(r"-(ubuntu\d+\.\d+)$", base)
    assert distro and distro.group(1) in DISTRO_PYTHON, (
        f"docker/node-health base {base!r}: no known python3 for its distro; add it to DISTRO_PYTHON "
        "from the distro's python3 package")
    return DISTRO_PYTHON[distro.group(1)]


def _apt_packages() -> set[str]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    found: set[str] = set()
    for match in re.finditer(r"apt-get install ([^&\n]+)", text):
        found |= {w for w in match.group(1).split() if not w.startswith("-")}
    return found


def _agent_imports() -> set[str]:
    """What the agent and the module its ConfigMap mounts beside it import from the image."""
    names: set[str] = set()
    for path in (AGENT, SHARED):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
                names.add(node.module)
    return names - {"trainer.gpu_faults"}


def _minimal_modules(minor: str) -> set[str]:
    """Top-level modules of Debian's libpython3.X-minimal, from this host's package list."""
    dpkg = shutil.which("dpkg")
    if not dpkg:
        pytest.skip("no dpkg here to list libpython3.X-minimal")
    done = subprocess.run([dpkg, "-L", f"libpython{minor}-minimal"], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"libpython{minor}-minimal is not installed here")
    prefix = f"/usr/lib/python{minor}/"
    modules = set(sys.builtin_module_names)
    for path in done.stdout.splitlines():
        if path.startswith(prefix):
            rest = path[len(prefix):]
            if rest.startswith("lib-dynload/"):
                modules.add(rest.split("/", 1)[1].split(".", 1)[0])
            else:
                modules.add(rest.split("/", 1)[0].removesuffix(".py"))
    return modules


def test_the_image_installs_the_standard_library_the_agent_imports():
    """The attack on the old image: ``apt-get install python3-minimal`` gives a python3 without
    json or http, and the agent's first line of imports fails on every GPU node."""
    packages = _apt_packages()
    assert packages, "docker/node-health installs no python3"
    full = {"python3", f"python3.{image_python()[1]}", f"libpython3.{image_python()[1]}-stdlib"}
    if packages & full:
        return
    # Only the minimal interpreter: every module the agent imports must be in it (Debian's list
    # of the same split, libpython3.11-minimal here, stands for Ubuntu's 3.10 one).
    host_minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    provided = _minimal_modules(host_minor)
    missing = sorted(name for name in _agent_imports() if name.split(".")[0] not in provided)
    assert not missing, (f"docker/node-health installs {sorted(packages)}: python3-minimal has no {missing} "
                         "(libpython3.X-stdlib); install python3")


def test_the_agent_parses_as_the_images_python():
    """Syntax newer than the image's minor fails here even without that interpreter."""
    for path in (AGENT, SHARED):
        ast.parse(path.read_text(), feature_version=image_python())


def _python_of(version: tuple[int, int]) -> str | None:
    name = f"python{version[0]}.{version[1]}"
    pyenv = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    candidates = sorted(glob.glob(f"{pyenv}/versions/{version[0]}.{version[1]}.*/bin/{name}"))
    if candidates:
        return candidates[-1]
    found = shutil.which(name)
    # A pyenv shim answers to every name, then fails when that version is not installed.
    return found if found and "/shims/" not in found else None


SMOKE = """
import sys
sys.path.insert(0, sys.argv[1])
import node_health_agent as agent
assert sys.version_info[:2] == tuple(int(p) for p in sys.argv[2].split(".")), sys.version
tree = agent.parse_tree(["Attached GPUs : 1", "GPU 00000000:00:1E.0", "    Product Name : NVIDIA L4"])
assert tree["Attached GPUs"] == "1", tree
print("ok", sys.version.split()[0])
"""


def test_the_agent_imports_and_starts_under_the_images_python_minor(tmp_path):
    """The agent as the DaemonSet runs it: its ConfigMap's files at their mount paths
    (``workloads.node_health.config_map_items``), outside the repository, no site-packages and no
    environment (``-S -E``; not ``-I``, which would also drop the script's directory, and the
    DaemonSet's ``python3 <file>`` keeps it), under CPython of the image's minor: imports, its
    parser, the shared GPU-fault module and its Xid table, and its CLI up to argument parsing."""
    from workloads import node_health

    version = image_python()
    python = _python_of(version)
    if python is None:
        # The version gate still holds with ours: the agent needs nothing newer than the image's.
        assert sys.version_info[:2] >= version
        pytest.skip(f"no python{version[0]}.{version[1]} here to run the agent under the image's minor")
    data = node_health.config_map()["data"]
    for item in node_health.config_map_items():
        (tmp_path / item["path"]).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / item["path"]).write_text(data[item["key"]])
    smoke = subprocess.run([python, "-S", "-E", "-c", SMOKE + "assert 79 in agent.xid_actions()\n", str(tmp_path),
                            f"{version[0]}.{version[1]}"], capture_output=True, text=True, timeout=60, cwd="/")
    assert smoke.returncode == 0 and smoke.stdout.startswith("ok 3."), smoke.stdout + smoke.stderr
    cli = subprocess.run([python, "-S", "-E", str(tmp_path / node_health.AGENT_FILE), "--help"], capture_output=True,
                         text=True, timeout=60, cwd="/")
    assert cli.returncode == 0 and "--instances" in cli.stdout, cli.stdout + cli.stderr


def test_ci_builds_the_image_and_imports_the_agent_with_its_python():
    import yaml

    from tests.infra.ci_claims import workflow_jobs

    jobs = workflow_jobs(yaml.safe_load((ROOT / ".github" / "workflows" / "platform.yml").read_text()))
    job = jobs["node-health-image"]
    script = "\n".join(step.get("run", "") for step in job["steps"])
    assert "docker build" in script and "docker/node-health" in script
    assert "workloads/node_health_agent.py:/opt/mlplatform/node_health_agent.py" in script
    assert "import node_health_agent" in script
    assert "node-health-image" in jobs["deploy"]["needs"]
