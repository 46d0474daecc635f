"""Pinned upstream schemas: every file checked against its SHA-256, downloads refused on mismatch."""
from __future__ import annotations

import io
import shutil
from pathlib import Path

from tools import schemas as pinned


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

    assert pinned.fetch(tmp_path, opener=upstream) == []
    assert len(fetched) == len(pinned.PINNED) and pinned.problems(tmp_path) == []
    # A second run downloads nothing: the cache is already verified.
    assert pinned.fetch(tmp_path, opener=upstream) == [] and len(fetched) == len(pinned.PINNED)

    def tampered(url, timeout):
        return io.BytesIO(by_url[url] + b"\n# injected\n")

    fresh = tmp_path / "fresh"
    [problem] = pinned.fetch(fresh, opener=tampered)
    assert "does not match the pinned" in problem
    assert not any(p.is_file() for p in fresh.rglob("*"))
