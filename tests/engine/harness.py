"""One stack under the real Pulumi engine, for the engine tests (tests/engine/).

What runs: the deploy driver (``python -m infra.plan.deploy``, inline program) drives the Pulumi CLI
built by ``make engine-tools``; the CLI starts the real Kubernetes provider (which links Helm) and
the stand-in ``aws`` and ``eks`` provider plugins (``tools/engine/standins``) found on PATH; the
state lives in a ``file://`` backend in a temporary directory, secrets under a passphrase; every
in-cluster object and Helm release lands on a test control plane (``tools.cluster.controlplane``),
whose admin kubeconfig the ``eks`` stand-in returns as the cluster's.

The project directory is a temporary one holding copies of ``Pulumi.yaml`` and the stack file
(creating a passphrase stack writes its salt into the stack file; a test edits the config) and
``infra`` as a link to this checkout's: the program's working directory (Pulumi.yaml ``main``) then
resolves to the checkout's ``infra/``, so the paths the program hands the providers are the ones a
real ``pulumi up`` in the checkout hands them.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

from tools.cluster.paths import _cache_root

ROOT = Path(__file__).resolve().parents[2]
# Where tools/engine/build.sh writes: $ENGINE_TOOLS_BIN, else the .cache a worktree shares with its
# main checkout (the rule of tools/cluster/paths.py), else this checkout's.
ENGINE_BIN = Path(os.environ.get("ENGINE_TOOLS_BIN") or _cache_root() / "engine-tools" / "bin")
STANDINS_DIR = ROOT / "tools" / "engine" / "standins"
ENGINE_TOOLS = ("pulumi", "pulumi-resource-kubernetes", "helm")
STANDIN_PLUGINS = ("pulumi-resource-aws", "pulumi-resource-eks")
# Only for this throw-away state; a real stack's passphrase never sits in code.
TEST_PASSPHRASE = "engine-tests-only"
STACK_RESOURCE = "pulumi:pulumi:Stack"


def missing_engine_tools() -> list[str]:
    missing = [name for name in ENGINE_TOOLS if not os.access(ENGINE_BIN / name, os.X_OK)]
    missing += [f"tools/engine/standins/{name}" for name in STANDIN_PLUGINS
                if not os.access(STANDINS_DIR / name, os.X_OK)]
    return missing


@dataclass
class Run:
    """One finished ``python -m infra.plan.deploy`` run."""

    args: list[str]
    returncode: Optional[int]
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def summary(self) -> Optional[dict[str, int]]:
        """The counts of the driver's ``<operation>: <outcome> {...}`` line."""
        for line in reversed(self.stdout.splitlines()):
            head, _, counts = line.partition(" {")
            if head.count(":") == 1 and counts:
                return json.loads("{" + counts)
        return None

    def explain(self) -> str:
        return f"$ {' '.join(self.args)}\nexit {self.returncode}\n--- stdout (tail)\n{self.stdout[-6000:]}\n--- stderr (tail)\n{self.stderr[-6000:]}"


class EngineStack:
    """A stack of this project in a file backend, driven through ``infra.plan.deploy``."""

    def __init__(self, stack: str, workdir: Path, kubeconfig: Path, extra_env: Optional[dict[str, str]] = None):
        self.stack = stack
        self.workdir = workdir
        self.project_dir = workdir / "project"
        self.backend_dir = workdir / "state"
        self.kubeconfig = kubeconfig
        for path in (self.project_dir, self.backend_dir, workdir / "pulumi-home"):
            path.mkdir(parents=True, exist_ok=True)
        if not self.stack_file.exists():  # else: attach to a workdir an earlier run set up
            shutil.copy(ROOT / "Pulumi.yaml", self.project_dir / "Pulumi.yaml")
            shutil.copy(ROOT / f"Pulumi.{stack}.yaml", self.stack_file)
            main = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["main"].rstrip("/")
            (self.project_dir / main).symlink_to(ROOT / main, target_is_directory=True)
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("PULUMI_", "AWS_")) and key not in ("KUBECONFIG",)}
        env.update({
            "PATH": os.pathsep.join([str(ENGINE_BIN), str(STANDINS_DIR), env.get("PATH", "")]),
            "PULUMI_HOME": str(workdir / "pulumi-home"),
            "PULUMI_CONFIG_PASSPHRASE": TEST_PASSPHRASE,
            # Offline: never look for a newer CLI or download a plugin; the ones on PATH answer.
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
            # The eks stand-in returns this as the cluster's kubeconfig.
            "MLP_STANDIN_KUBECONFIG": str(kubeconfig),
            # The stand-ins run on this interpreter (its packages are the project's pins).
            "MLP_STANDIN_PYTHON": sys.executable,
            "PYTHONPATH": str(ROOT),
        })
        env.update(extra_env or {})
        self.env = env
        self.runs: list[Run] = []

    @property
    def stack_file(self) -> Path:
        return self.project_dir / f"Pulumi.{self.stack}.yaml"

    @property
    def backend_url(self) -> str:
        return f"file://{self.backend_dir}"

    def deploy(self, operation: str, *flags: str, timeout_s: float = 1200, python_prelude: str = "") -> Run:
        """``python -m infra.plan.deploy OPERATION`` for this stack (``python_prelude``: code run first in
        that process, to inject a fault from outside the program)."""
        argv = [operation, "--stack", self.stack, "--project-dir", str(self.project_dir),
                "--backend-url", self.backend_url, "--secrets-provider", "passphrase",
                "--inline", "--no-aws-cli", *flags]
        code = f"{python_prelude}\nimport sys\nfrom infra.plan import deploy\nsys.exit(deploy.main({argv!r}))\n"
        number = len(self.runs) + 1
        out_path, err_path = (self.workdir / f"run-{number:02d}-{operation}.{kind}" for kind in ("out", "err"))
        # Its own session: on a timeout the CLI and the plugins it started go too, not only the driver.
        with out_path.open("w") as out, err_path.open("w") as err:
            process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=self.env, stdout=out, stderr=err,
                                       text=True, start_new_session=True)
            returncode = None
            try:
                returncode = process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
            finally:
                if process.poll() is None:  # timed out, or this process is being stopped
                    kill_session(process.pid)
                    process.wait()
        run = Run(["python", "-m", "infra.plan.deploy", *argv], returncode, out_path.read_text(), err_path.read_text())
        self.runs.append(run)
        if returncode is None:
            raise AssertionError(f"`infra.plan.deploy {operation}` ran past {timeout_s:.0f} s\n{run.explain()}")
        return run

    def cli(self, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
        """The Pulumi CLI itself, in the project directory, on this stack's backend."""
        env = {**self.env, "PULUMI_BACKEND_URL": self.backend_url}
        return subprocess.run([str(ENGINE_BIN / "pulumi"), *args, "--stack", self.stack, "--non-interactive"],
                              cwd=self.project_dir, env=env, capture_output=True, text=True, timeout=timeout_s)

    def state(self) -> list[dict[str, Any]]:
        """The stack's resources as the engine recorded them (``pulumi stack export``)."""
        done = self.cli("stack", "export")
        if done.returncode != 0:
            raise AssertionError(f"pulumi stack export failed: {done.stderr}")
        return json.loads(done.stdout)["deployment"].get("resources") or []

    def helm(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([str(ENGINE_BIN / "helm"), "--kubeconfig", str(self.kubeconfig), *args],
                              capture_output=True, text=True, timeout=timeout_s, env=self.env)

    def release_chart_crds(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The CRDs of the deployed release's chart folder ``crds/`` (Helm installs them first and
        unannotated), read from the release record Helm keeps (Secret ``sh.helm.release.v1.*``:
        base64 of gzip of JSON, inside the Secret's own base64)."""
        import base64
        import gzip

        found = self.plane.kubectl("get", "secret", "--namespace", namespace, "-l",
                                   f"owner=helm,name={name},status=deployed", "-o", "json")
        docs = []
        for secret in json.loads(found.stdout)["items"]:
            record = json.loads(gzip.decompress(base64.b64decode(base64.b64decode(secret["data"]["release"]))))
            for chart in _with_dependencies(record["chart"]):
                for file in chart.get("files") or []:
                    if file["name"].startswith("crds/"):
                        docs += [d for d in yaml.safe_load_all(base64.b64decode(file["data"]))
                                 if isinstance(d, dict) and d.get("kind") == "CustomResourceDefinition"]
        return docs

    def edit_config(self, edit) -> None:
        """``edit(config)`` on the stack file's ``config:`` mapping, then written back."""
        document = yaml.safe_load(self.stack_file.read_text())
        edit(document["config"])
        self.stack_file.write_text(yaml.safe_dump(document, sort_keys=False))

    def set_config(self, path: str, value: Any) -> None:
        """Edit the stack file's config (``path`` dotted below the project's namespace), as a person would."""
        document = yaml.safe_load(self.stack_file.read_text())
        project = yaml.safe_load((self.project_dir / "Pulumi.yaml").read_text())["name"]
        head, *rest = path.split(".")
        node = document["config"][f"{project}:{head}"]
        for part in rest[:-1]:
            node = node[int(part)] if isinstance(node, list) else node[part]
        last = rest[-1]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
        self.stack_file.write_text(yaml.safe_dump(document, sort_keys=False))


def _with_dependencies(chart: dict[str, Any]) -> list[dict[str, Any]]:
    return [chart, *[c for dep in chart.get("dependencies") or [] for c in _with_dependencies(dep)]]


def kill_session(session_id: int) -> None:
    """SIGKILL every process of the session the driver was started in: the driver, the CLI and
    the plugins the CLI started (each plugin in a process group of its own, the session is shared)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getsid(int(entry)) == session_id:
                os.kill(int(entry), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
