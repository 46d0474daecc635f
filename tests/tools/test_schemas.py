"""Pinned upstream schemas: every file checked against its SHA-256, downloads refused on mismatch."""
from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import urllib.error
from pathlib import Path

import pytest

from tools import schemas as pinned

ROOT = Path(__file__).resolve().parent.parent.parent
MODULES = sorted({f.module for f in pinned.PINNED if f.module})


def _unreachable(url, timeout):
    raise urllib.error.URLError(OSError(-2, "Name or service not known"))


def _module_dirs(schemas: Path, root: Path, tamper: str = "") -> dict[str, Path]:
    """Each pinned module laid out as `go mod download` extracts it: the files at their upstream
    paths (one of them altered when ``tamper`` names it)."""
    dirs = {}
    for f in pinned.PINNED:
        if f.module:
            target = dirs.setdefault(f.module, root / f.module.replace("/", "_")) / f.upstream_path
            target.parent.mkdir(parents=True, exist_ok=True)
            body = (schemas / f.path).read_bytes()
            target.write_bytes(body + b"\n# injected\n" if f.path == tamper else body)
    return dirs


def test_the_configured_copy_is_exactly_the_pinned_set(schemas):
    assert pinned.problems(schemas) == []
    on_disk = {p.relative_to(schemas).as_posix() for p in schemas.rglob("*") if p.is_file() and p.name != "README.md"}
    assert on_disk == {f.path for f in pinned.PINNED}


def test_a_changed_or_missing_file_is_named(schemas, tmp_path):
    copy = tmp_path / "schemas"
    shutil.copytree(schemas, copy)
    nodepools = copy / "crds/karpenter-1.14.1/karpenter.sh_nodepools.yaml"
    nodepools.write_text(nodepools.read_text().replace("expireAfter", "expireAftr", 1))
    (copy / "pulumi/pulumi-eks-schema.json").unlink()
    found = pinned.problems(copy)
    assert len(found) == 2
    assert "karpenter.sh_nodepools.yaml: sha256" in found[0] or "karpenter.sh_nodepools.yaml: sha256" in found[1]
    assert any("pulumi-eks-schema.json: missing" in p and "raw.githubusercontent.com/pulumi/pulumi-eks" in p for p in found)


def test_fetch_keeps_only_files_whose_sum_matches(schemas, tmp_path):
    by_url = {f.url: (schemas / f.path).read_bytes() for f in pinned.PINNED}
    fetched: list[str] = []

    def upstream(url, timeout):
        fetched.append(url)
        return io.BytesIO(by_url[url])

    nothing_carried, no_module = tmp_path / "carried", lambda module: pytest.fail(f"asked the Go proxy for {module}")
    cache = tmp_path / "cache"
    assert pinned.fetch(cache, opener=upstream, vendored_dir=nothing_carried, module_dir=no_module) == []
    assert len(fetched) == len(pinned.PINNED) and pinned.problems(cache) == []
    # A second run downloads nothing: the cache is already verified.
    assert pinned.fetch(cache, opener=upstream, vendored_dir=nothing_carried, module_dir=no_module) == []
    assert len(fetched) == len(pinned.PINNED)

    def tampered(url, timeout):
        return io.BytesIO(by_url[url] + b"\n# injected\n")

    fresh = tmp_path / "fresh"
    found = pinned.fetch(fresh, opener=tampered, vendored_dir=nothing_carried, module_dir=lambda m: tmp_path / "none")
    # Every file named, each refused for its sum; nothing written.
    assert len(found) == len(pinned.PINNED)
    assert all("does not match; refused" in problem for problem in found)
    assert not any(p.is_file() for p in fresh.rglob("*"))


def test_without_github_the_carried_copies_and_the_go_modules_lay_out_every_file(schemas, tmp_path):
    """A network that reaches only package registries (a new user behind a proxy, our CI): the
    files no Go module version serves come from the repository, the rest from the Go modules;
    GitHub is asked once, not once per file."""
    asked_github: list[str] = []

    def unreachable(url, timeout):
        asked_github.append(url)
        _unreachable(url, timeout)

    dirs = _module_dirs(schemas, tmp_path / "gomod")
    asked_go: list[str] = []

    def module_dir(module):
        asked_go.append(module)
        return dirs[module]

    cache = tmp_path / "cache"
    assert pinned.fetch(cache, opener=unreachable, module_dir=module_dir) == []
    assert pinned.problems(cache) == []
    assert len(asked_github) == 1 and sorted(asked_go) == MODULES  # one `go mod download` per module


def test_every_file_no_go_module_serves_is_carried_with_its_pinned_sum():
    """Otherwise a machine that reaches only package registries cannot lay out the set."""
    without_module = [f for f in pinned.PINNED if f.module is None]
    assert without_module
    for f in without_module:
        body = pinned._carried(f, ROOT / pinned.VENDORED_DIR)
        assert isinstance(body, bytes), f"{f.path}: not carried under {pinned.VENDORED_DIR}"
        assert hashlib.sha256(body).hexdigest() == f.sha256, f.path


def test_a_tampered_go_module_file_is_refused_and_named(schemas, tmp_path):
    victim = next(f for f in pinned.PINNED if f.module)
    dirs = _module_dirs(schemas, tmp_path / "gomod", tamper=victim.path)
    [problem] = pinned.fetch(tmp_path / "cache", opener=_unreachable, module_dir=dirs.__getitem__)
    assert problem.startswith(f"{tmp_path / 'cache' / victim.path}: no source had it")
    assert f"Go module {victim.module} {victim.upstream_path}: sha256" in problem and "refused" in problem
    assert not (tmp_path / "cache" / victim.path).exists()


def test_no_source_names_every_file_and_every_source(tmp_path):
    def no_go(module):
        raise OSError("no `go` on PATH (install Go to fetch from the Go module proxy)")

    found = pinned.fetch(tmp_path / "cache", opener=_unreachable, vendored_dir=tmp_path / "carried", module_dir=no_go)
    assert len(found) == len(pinned.PINNED)
    assert all("raw.githubusercontent.com unreachable" in p for p in found)
    assert sum("no `go` on PATH" in p for p in found) == sum(1 for f in pinned.PINNED if f.module)
    assert sum("no Go module version serves it" in p for p in found) == sum(1 for f in pinned.PINNED if not f.module)


def test_make_pytest_lays_out_the_schemas_first():
    """`make test` (the README's command) must not depend on a step the README does not name."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    plan = subprocess.run(["make", "-n", "pytest", "VENV=.venv-dry-run"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "MAKEFLAGS": ""}, check=True).stdout.splitlines()
    fetch = [n for n, line in enumerate(plan) if "-m tools.schemas fetch" in line]
    tests = [n for n, line in enumerate(plan) if "-m pytest" in line]
    assert fetch and tests and fetch[0] < tests[0], plan


def test_go_module_dir_reads_go_mod_download_and_names_its_error(tmp_path, monkeypatch):
    """`go mod download -json` prints the extracted Dir, or an Error (with a non-zero exit) for a
    version the proxy does not serve; a machine without Go is told so, not shown a traceback."""
    fake = tmp_path / "bin" / "go"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n"
                    'case "$4" in\n'
                    '  *@v9.9.9) printf \'{"Path": "x", "Error": "x@v9.9.9: reading proxy: 403 Forbidden\\\\n\\\\tnot available"}\'; exit 1;;\n'
                    '  *) printf \'{"Path": "x", "Version": "v1.0.0", "Dir": "/mod/x@v1.0.0"}\';;\n'
                    "esac\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    assert pinned.go_module_dir("example.com/x@v1.0.0") == Path("/mod/x@v1.0.0")
    with pytest.raises(OSError, match=r"`go mod download` failed: x@v9.9.9: reading proxy: 403 Forbidden not available$"):
        pinned.go_module_dir("example.com/x@v9.9.9")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(OSError, match="no `go` on PATH"):
        pinned.go_module_dir("example.com/x@v1.0.0")
