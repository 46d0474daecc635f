"""`pulumi up` on a fresh machine installs what the program imports, and finds the stack files."""
from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import yaml

from infra.plan import ROOT, default_project_dir

RUNTIME_PACKAGES = ("jobs", "infra", "components", "workloads")  # jobs: the CLI ships with the infra extra


def _third_party_imports() -> set[str]:
    local = {p.name for p in ROOT.iterdir() if p.is_dir()}
    found = set()
    for package in RUNTIME_PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                found |= {n.split(".")[0] for n in names}
    return {n for n in found if n not in local and n not in sys.stdlib_module_names}


def _requirement_name(spec: str) -> str:
    return re.split(r"[=<>\[ ;]", spec, maxsplit=1)[0].lower().replace("_", "-")


def test_the_infra_extra_carries_every_runtime_import():
    extra = {_requirement_name(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())
             ["project"]["optional-dependencies"]["infra"]}
    distributions = packages_distributions()
    missing = {}
    for module in _third_party_imports():
        names = {d.lower().replace("_", "-") for d in distributions.get(module, [module])}
        # Pinned by what we pin: protobuf/grpc by pulumi, pydantic-core by pydantic, botocore by boto3.
        # tqdm is optional (jobs/data.py falls back to a percentage line without it), and so is
        # mlflow (the trainer extra's: `list --sweep` shows results where it is installed and says
        # so in one line where it is not, jobs/sweep.read_sweep_metrics).
        if not names & extra and module not in {"google", "grpc", "pydantic_core", "botocore", "tqdm", "mlflow"}:
            missing[module] = sorted(names)
    assert missing == {}, f"imported by jobs/infra/components/workloads but not in the infra extra: {missing}"


def test_pulumi_installs_this_project_from_the_program_directory():
    """Pulumi's pip toolchain installs ``requirements.txt`` of the program directory, with pip
    running in that directory (pulumi sdk/python/toolchain/pip.go ``InstallDependencies``:
    ``requirementsPath := filepath.Join(cwd, "requirements.txt")``, returns early when absent;
    ``pipCmd.Dir = cwd``), and the program directory is ``main`` when it names a directory
    (pkg/engine/project.go ``getPwdMain``). pip resolves ``-e`` paths against its working
    directory: run the real pip there, dry, offline, and it must find this project's infra extra."""
    import subprocess
    import sys

    project = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    assert project["runtime"]["options"]["toolchain"] == "pip"
    program_dir = ROOT / project.get("main", ".")
    requirements = program_dir / "requirements.txt"
    assert requirements.is_file(), f"Pulumi's installer looks for {requirements.relative_to(ROOT)}: it does not exist"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-index",
                           "--no-build-isolation", "--quiet", "--report", "-", "-r", "requirements.txt"],
                          cwd=program_dir, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    [install] = json.loads(done.stdout)["install"]
    assert install["metadata"]["name"] == "ml-training-platform" and install["requested_extras"] == ["infra"]
    assert install["download_info"]["url"] == ROOT.as_uri()


def test_stack_files_are_found_from_the_working_directory(tmp_path):
    (tmp_path / "Pulumi.yaml").write_text("name: consumer\nruntime: python\n")
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    assert default_project_dir(nested) == tmp_path
    assert default_project_dir(ROOT / "infra") == ROOT
