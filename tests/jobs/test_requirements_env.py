"""`requirements.txt` in your code (review jobs-ops-4 §3 S5 and §7 gap 1: it was silently ignored).

From the outside: the container's entrypoint (`python -m trainer.launch`) in a subprocess, as the
pod runs it, with a code archive holding a `requirements.txt` and a `wheels/` directory of tiny
wheels built here (no network: pip runs with `--no-index`, as in a team pod whose NetworkPolicies
reach no package index). A real `python -m venv` and a real pip install each time."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from jobs import usercode
from trainer import requirements_env

ROOT = Path(__file__).resolve().parents[2]


def build_wheel(directory: Path, name: str, version: str, module_source: str) -> Path:
    """A minimal pure-Python wheel (PEP 427): the module, METADATA, WHEEL and a RECORD with hashes."""
    dist = f"{name.replace('-', '_')}-{version}"
    files = {f"{name.replace('-', '_')}.py": module_source.encode(),
             f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel


def launch(code_dir: Path, tmp_path: Path, venv_root: Path, pod: str):
    """The pod's launcher on an archive of code_dir, pinned by digest (as submit --code renders it)."""
    code = usercode.archive(code_dir)
    stored = tmp_path / "bucket" / pod / f"{code.sha256}.tar.gz"
    stored.parent.mkdir(parents=True, exist_ok=True)
    stored.write_bytes(code.data)
    termination = tmp_path / f"termination-{pod}"
    termination.write_text("")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "MLP_CODE_URI": f"file://{stored}",
           "MLP_CODE_SHA256": code.sha256, "MLP_CODE_DIR": str(tmp_path / pod), "MLP_VENV_ROOT": str(venv_root),
           "TRAINER_TERMINATION_LOG": str(termination), "HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, "-m", "trainer.launch", "--standalone", "--nproc-per-node=1", "train.py"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return run, termination.read_text()


@pytest.fixture
def code_dir(tmp_path):
    d = tmp_path / "code"
    d.mkdir()
    (d / "train.py").write_text("import sys, tinydep\nprint('tinydep says', tinydep.VALUE, 'from', sys.prefix)\n")
    build_wheel(d / "wheels", "tinydep", "1.0", "VALUE = 42\n")
    (d / "requirements.txt").write_text("# what train.py needs\ntinydep==1.0\n")
    return d


def test_the_requirement_is_installed_once_and_reused_by_the_next_pod(code_dir, tmp_path):
    venvs = tmp_path / "fsx" / ".venvs"
    run, _ = launch(code_dir, tmp_path, venvs, "pod-a")
    assert run.returncode == 0, run.stderr
    assert "tinydep says 42" in run.stdout, run.stdout + run.stderr
    (venv,) = [p for p in venvs.iterdir() if p.is_dir()]
    assert f"from {venv}" in run.stdout  # the workers ran in the job's environment
    marker = json.loads((venv / requirements_env.READY_MARKER).read_text())
    assert "installed into" in run.stderr

    # A restarted pod (or the job's other node): same archive, same image. Evidence that pip did
    # not run: the launcher's line, the marker (who built it, when) and pip's log are unchanged.
    log = venv / "pip-install.log"
    log_before = log.read_text()
    run, _ = launch(code_dir, tmp_path, venvs, "pod-b")
    assert run.returncode == 0, run.stderr
    assert "tinydep says 42" in run.stdout
    assert f"reusing {venv}" in run.stderr and "installing" not in run.stderr
    assert json.loads((venv / requirements_env.READY_MARKER).read_text()) == marker  # not rebuilt
    assert log.read_text() == log_before  # pip not run again


def test_two_pods_starting_together_build_the_environment_once(code_dir, tmp_path):
    """Both nodes of a job start at once: one takes the lock and installs, the other waits on it
    and reuses what the first finished (its marker), never installing into the same directory."""
    from concurrent.futures import ThreadPoolExecutor

    venvs = tmp_path / ".venvs"
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda pod: launch(code_dir, tmp_path, venvs, pod)[0], ["pod-a", "pod-b"]))
    assert all(r.returncode == 0 and "tinydep says 42" in r.stdout for r in runs), [r.stderr for r in runs]
    assert sorted("installed into" in r.stderr for r in runs) == [False, True], [r.stderr for r in runs]
    assert len([p for p in venvs.iterdir() if p.is_dir()]) == 1


def test_a_half_built_environment_is_rebuilt(code_dir, tmp_path):
    """A pod that died mid-install leaves a directory without the ready marker: never used."""
    venvs = tmp_path / ".venvs"
    run, _ = launch(code_dir, tmp_path, venvs, "pod-a")
    assert run.returncode == 0, run.stderr
    (venv,) = [p for p in venvs.iterdir() if p.is_dir()]
    (venv / requirements_env.READY_MARKER).unlink()
    run, _ = launch(code_dir, tmp_path, venvs, "pod-b")
    assert run.returncode == 0 and "installed into" in run.stderr and "reusing" not in run.stderr, run.stderr


def test_a_requirement_replacing_the_images_torch_is_refused_permanently(code_dir, tmp_path):
    """The attack on the image: `torch>=99` with a wheel named torch 99.0 at hand. The constraint
    file pins the image's torch; pip refuses to resolve, the launcher exits 3 (permanent) before
    torchrun, naming the requirement, and the image's torch is untouched."""
    from importlib.metadata import version

    build_wheel(code_dir / "wheels", "torch", "99.0", "__version__ = '99.0'\n")
    (code_dir / "requirements.txt").write_text("tinydep==1.0\ntorch>=99\n")
    venvs = tmp_path / ".venvs"
    run, message = launch(code_dir, tmp_path, venvs, "pod-a")
    assert run.returncode == requirements_env.EXIT_REQUIREMENTS, run.stderr
    assert "pip could not install requirement torch>=99" in run.stderr
    # The constraint it ran into, in pip's words: the image's installed torch.
    assert f"The user requested (constraint) torch=={version('torch')}" in run.stderr
    assert "torchrun exited" not in run.stderr and "tinydep says" not in run.stdout
    assert message.startswith("requirements: pip could not install requirement torch>=99")
    assert not [p for p in venvs.iterdir() if p.is_dir()]  # nothing half-built left to reuse


def test_a_requirement_that_cannot_be_found_exits_permanent_with_its_name(code_dir, tmp_path):
    (code_dir / "requirements.txt").write_text("tinydep==1.0\nnot-vendored-pkg==2.0  # forgot the wheel\n")
    run, message = launch(code_dir, tmp_path, tmp_path / ".venvs", "pod-a")
    assert run.returncode == requirements_env.EXIT_REQUIREMENTS, run.stderr
    assert "pip could not install requirement not-vendored-pkg==2.0" in message
    assert "wheels/" in message and "Fix:" in message
    assert 1 <= run.returncode <= 127  # permanent under restartPolicy ExitCode
    from jobs.client import exit_code_meaning  # what `describe` says of the attempt

    assert exit_code_meaning(run.returncode).startswith("requirements.txt not installable (permanent")


def test_code_without_requirements_runs_in_the_image_as_before(tmp_path):
    d = tmp_path / "code"
    d.mkdir()
    (d / "train.py").write_text("import sys; print('prefix', sys.prefix)\n")
    venvs = tmp_path / ".venvs"
    run, _ = launch(d, tmp_path, venvs, "pod-a")
    assert run.returncode == 0, run.stderr
    assert f"prefix {sys.prefix}" in run.stdout and not venvs.exists()


def test_the_environment_is_keyed_by_requirements_image_and_wheels(tmp_path):
    pins = requirements_env.image_constraints()
    assert any(p.startswith("torch==") for p in pins) and not any(p.startswith("pip==") for p in pins)
    base = requirements_env.env_key(b"tinydep==1.0\n", pins)
    assert requirements_env.env_key(b"tinydep==1.0\n", pins) == base
    assert requirements_env.env_key(b"tinydep==1.1\n", pins) != base
    assert requirements_env.env_key(b"tinydep==1.0\n", [*pins, "extra==1"]) != base  # another image
    wheels = tmp_path / "wheels"
    build_wheel(wheels, "tinydep", "1.0", "VALUE = 1\n")
    with_wheel = requirements_env.env_key(b"tinydep==1.0\n", pins, str(wheels))
    build_wheel(wheels, "tinydep", "1.0", "VALUE = 2\n")  # rebuilt, same version
    assert requirements_env.env_key(b"tinydep==1.0\n", pins, str(wheels)) != with_wheel


@pytest.mark.slow
def test_local_submit_installs_once_for_both_pods_and_every_restart(tmp_path, capsys):
    """`submit examples/own-code/ddp.yaml --stack dev --local --code DIR --interrupt-at-step 10`
    with DIR's train.py importing a vendored package: the two pods of the job start together, one
    installs, the other waits and reuses; after the preemption both recreated pods reuse it."""
    import re
    import shutil

    from jobs import __main__ as cli

    code = tmp_path / "code"
    code.mkdir()
    source = (ROOT / "examples" / "own-code" / "ddp" / "train.py").read_text()
    future = "from __future__ import annotations\n"
    (code / "train.py").write_text(source.replace(future, future + "import tinydep  # vendored in wheels/\n", 1))
    build_wheel(code / "wheels", "tinydep", "1.0", "VALUE = 1\n")
    (code / "requirements.txt").write_text("tinydep==1.0\n")
    workdir = tmp_path / "run"
    rc = cli.main(["submit", str(ROOT / "examples" / "own-code" / "ddp.yaml"), "--stack", "dev", "--offline", "--local",
                   "--code", str(code), "--interrupt-at-step", "10", "--workdir", str(workdir), "--timeout", "400"])
    out = capsys.readouterr().out
    logs = {p.name: p.read_text() for p in sorted(workdir.glob("attempt-*.log"))}
    assert rc == 0 and "attempts: [[143, 143], [0, 0]]" in out, out + "".join(v[-2000:] for v in logs.values())
    said = {name: re.findall(r"requirements\.txt: (installed into|reusing) ", text) for name, text in logs.items()}
    assert sorted(sum(said.values(), [])) == ["installed into", "reusing", "reusing", "reusing"], said
    assert all(not re.findall("installed into", logs[n]) for n in logs if n.startswith("attempt-2")), said
    assert len([p for p in workdir.glob("fsx/checkpoints/*/.venvs/*") if p.is_dir()]) == 1
    shutil.rmtree(workdir)
