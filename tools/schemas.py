"""Pinned upstream schemas (CRDs, pulumi-eks) that generated objects are validated against.

``make schemas`` (``python -m tools.schemas fetch``, a prerequisite of ``make test``) lays each
pinned file out in ``.cache/schemas`` and keeps it only if its SHA-256 matches the sum pinned here,
whichever source it came from. Sources, first that has it wins:

1. the copies this repository carries (``tests/infra/upstream/schemas``: files no Go module
   version serves, some ``.xz``-compressed, and a pin newer than some offline mirrors);
2. the file at its upstream tag on GitHub (raw.githubusercontent.com), skipped for the rest of the
   run once the host cannot be reached;
3. the same file inside the upstream Go module at the same tag, through the Go module proxy
   (``go mod download``, which also checks the module against Go's checksum database): networks
   that reach only package registries still get it.

A file already there and matching its sum is left alone, so a second run only verifies.
``ML_PLATFORM_SCHEMAS`` points at a local copy instead (an offline mirror);
``python -m tools.schemas verify DIR`` checks such a copy against the same sums.
"""
from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

ENV_VAR = "ML_PLATFORM_SCHEMAS"
CACHE_DIR = Path(".cache") / "schemas"
VENDORED_DIR = Path("tests") / "infra" / "upstream" / "schemas"
PROJECT_DIR = Path(__file__).resolve().parent.parent
RAW = "https://raw.githubusercontent.com"
GO_DOWNLOAD_TIMEOUT_S = 600


@dataclass(frozen=True)
class PinnedFile:
    path: str          # relative to the schemas directory
    repository: str    # GitHub owner/name
    ref: str           # tag or commit
    upstream_path: str
    sha256: str
    # The Go module version whose zip holds upstream_path (same tag, module root = repository
    # root), "module/path@version"; None where the Go module proxy serves no such version.
    module: Optional[str] = None

    @property
    def url(self) -> str:
        return f"{RAW}/{self.repository}/{self.ref}/{self.upstream_path}"


def _crds(directory: str, repository: str, ref: str, upstream_dir: str, sums: dict[str, str],
          module: Optional[str]) -> list[PinnedFile]:
    return [PinnedFile(f"crds/{directory}/{name}", repository, ref, f"{upstream_dir}/{name}", digest, module)
            for name, digest in sums.items()]


PINNED: tuple[PinnedFile, ...] = tuple([
    *_crds("karpenter-1.14.1", "aws/karpenter-provider-aws", "v1.14.1", "pkg/apis/crds", {
        "karpenter.k8s.aws_ec2nodeclasses.yaml": "62dec59f01c0972d4503ca3ed25f243ba9c2f561be0d964ce7a14c8df406132f",
        "karpenter.sh_nodeclaims.yaml": "96037dc241031fe0f7a09ddf78183d885ce6a1dfe115f7b3fbf8a12c564be694",
        "karpenter.sh_nodepools.yaml": "3bb64a20c80776b77aa19a699ebdaf34480a7b2e7ec4ef890b43225b3517f878",
        # NodeOverlay (karpenter.sh/v1alpha1): shared GPU pools declare their slices with it.
        "karpenter.sh_nodeoverlays.yaml": "6ff6199aff096cc87cd9508f8c5ae62c6d3452aa90c2828ee36380340f3ece62",
    }, "github.com/aws/karpenter-provider-aws@v1.14.1"),
    *_crds("training-operator-1.9.4", "kubeflow/trainer", "v1.9.4", "manifests/base/crds", {
        "kubeflow.org_pytorchjobs.yaml": "8b8a8a719cc94173169290251e817f7ac2bb425c20b6c2fa813397bcf4e932ed",
    # v1.9.4 predates the repository's rename: its go.mod still names the old module path.
    }, "github.com/kubeflow/training-operator@v1.9.4"),
    *_crds("trainer-2.3.0", "kubeflow/trainer", "v2.3.0", "manifests/base/crds", {
        "trainer.kubeflow.org_clustertrainingruntimes.yaml": "ec84dc3388fcdbe8c61d3c247a773d14458dd9438e995bea8e50d2a18080eef9",
        "trainer.kubeflow.org_trainingruntimes.yaml": "69b8dbdf60a18e28cddcc2b8dfc4ce72a943e14b531b9389d593118faee4919f",
        "trainer.kubeflow.org_trainjobs.yaml": "a742cafc5b5582640c7e0b7467c024fc237256fbca5ba0a9f0531dfb66d64416",
    }, "github.com/kubeflow/trainer/v2@v2.3.0"),
    *_crds("argo-cd-3.5.1", "argoproj/argo-cd", "v3.5.1", "manifests/crds", {
        "application-crd.yaml": "5dde0e229249b6b707beb98674c1deae3949d5c319a6c45b9f5a80c99618e40c",
        "applicationset-crd.yaml": "7d282054f41ca2b71a22bab04a8caf0000e07e53a62432e6ea292dae5ab4f07d",
        "appproject-crd.yaml": "ab225266944322750136f1198d93786e4a79a0e43c8d149abfba44da30a3eac8",
    }, "github.com/argoproj/argo-cd/v3@v3.5.1"),
    *_crds("kueue-0.19.2", "kubernetes-sigs/kueue", "v0.19.2", "config/components/crd/bases", {
        "kueue.x-k8s.io_admissionchecks.yaml": "2bf4003c0a3ea3d6ceab940c7a271ad211372dab59d2739acfa8b2bdb0724acb",
        "kueue.x-k8s.io_clusterqueues.yaml": "e0a5fc9b370c70f3d993d4f599865817338ecf94187b30b15b12ff33c579bd55",
        "kueue.x-k8s.io_cohorts.yaml": "61fbe5ec55d45e7fae2d65321fb32517b197257ab78ad55316673183aac911c2",
        "kueue.x-k8s.io_localqueues.yaml": "dd10ef8d3578e7212fa52763549e7b6be0949793a5b924495fcd293330109fed",
        "kueue.x-k8s.io_provisioningrequestconfigs.yaml": "0399b2689d7468c64a1ef4e3c8bf9603c261a152f822b6698903b23f69e790dc",
        "kueue.x-k8s.io_resourceflavors.yaml": "19e339c47e9ca3fa2c9eeddd27715a512f765c4794ed859733408a9715720173",
        "kueue.x-k8s.io_topologies.yaml": "f703575d3bb64d26f6e839f831e01646367ed41a89b3abf163f8e842ca1c4d2b",
        "kueue.x-k8s.io_workloadpriorityclasses.yaml": "0b755726aab05b8def9a53ee15b201eed3846bcffd1ff5528fed123f4ae03519",
    }, "sigs.k8s.io/kueue@v0.19.2"),
    *_crds("argo-workflows-4.1.2", "argoproj/argo-workflows", "v4.1.2", "manifests/base/crds/full", {
        "argoproj.io_clusterworkflowtemplates.yaml": "1a1e40dca1a544c44b382ff9f50d44a4b6a6a7ff76c0a2d8e6a929c2ddb13749",
        "argoproj.io_cronworkflows.yaml": "31abde1c89c6c11cf1c97753676327e02b2f8dc47827e49383732ac6b1d828c6",
        "argoproj.io_workflows.yaml": "35ffc0d16c9c71db69ae113e562d90057eac75a60e7371aa3012a3171ccd8c39",
        "argoproj.io_workflowtemplates.yaml": "e932631a04a0f3a226b2ca8c68d43214c071c5d8aa6961b23298b81cbea3d9a5",
    # The Go module proxy serves github.com/argoproj/argo-workflows/v4 up to v4.0.5 only, so these
    # four (2.7 MB each) are carried in the repository, xz-compressed.
    }, None),
    # pulumi-eks v4.3.0+9 (Aug 2026): the schema of the provider the pulumi-eks SDK pin talks to.
    # Its Go module (github.com/pulumi/pulumi-eks/provider/v4) is not served by the Go module proxy:
    # carried in the repository.
    PinnedFile("pulumi/pulumi-eks-schema.json", "pulumi/pulumi-eks", "7bf0c1b",
               "provider/cmd/pulumi-resource-eks/schema.json",
               "339e9f1fa804acbc90b363b9cb02d7eb827607ecf705538d2096d470118d3693"),
])


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def problems(directory: Path) -> list[str]:
    """Every pinned file that is missing from ``directory`` or differs from its pinned sum."""
    found = []
    for pinned in PINNED:
        path = directory / pinned.path
        if not path.is_file():
            found.append(f"{path}: missing (upstream {pinned.url})")
        elif (digest := sha256_of(path)) != pinned.sha256:
            found.append(f"{path}: sha256 {digest}, pinned {pinned.sha256} (upstream {pinned.url})")
    return found


def schemas_dir(project_dir: Optional[Path] = None) -> Path:
    """Where the schemas are: ``$ML_PLATFORM_SCHEMAS``, else the project's download cache."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    return (project_dir or Path.cwd()) / CACHE_DIR


def go_module_dir(module: str) -> Path:
    """The extracted module ``path@version`` from the Go module proxy (``go mod download``).

    Raises OSError naming what failed: no ``go`` on PATH, the version not served, a checksum
    mismatch reported by Go."""
    go = shutil.which("go")
    if go is None:
        raise OSError("no `go` on PATH (install Go to fetch from the Go module proxy)")
    # Outside any module or workspace, so a go.mod or go.work around the caller cannot interfere.
    with tempfile.TemporaryDirectory(prefix="schemas-go-") as cwd:
        result = subprocess.run([go, "mod", "download", "-json", module], cwd=cwd, capture_output=True, text=True,
                                env={**os.environ, "GOWORK": "off"}, timeout=GO_DOWNLOAD_TIMEOUT_S)
    try:
        info = json.loads(result.stdout or "{}")
    except json.JSONDecodeError:
        info = {}
    if result.returncode != 0 or info.get("Error") or not info.get("Dir"):
        detail = " ".join((info.get("Error") or result.stderr or f"exit {result.returncode}").split())
        raise OSError(f"`go mod download` failed: {detail}")
    return Path(info["Dir"])


def _carried(pinned: PinnedFile, vendored_dir: Path) -> bytes | str | None:
    path = vendored_dir / pinned.path
    if path.is_file():
        return path.read_bytes()
    compressed = path.with_name(path.name + ".xz")
    if compressed.is_file():
        try:
            return lzma.decompress(compressed.read_bytes())
        except lzma.LZMAError as error:
            return f"carried copy {compressed}: not valid xz ({error})"
    return None


def fetch(directory: Path, *, opener=urllib.request.urlopen, vendored_dir: Optional[Path] = None,
          module_dir: Callable[[str], Path] = go_module_dir) -> list[str]:
    """Lay out every pinned file not already present and valid; returns the problems left, one per
    file that no source had with its pinned sum, each source's answer named. Raises OSError only
    when ``directory`` cannot be written."""
    vendored_dir = PROJECT_DIR / VENDORED_DIR if vendored_dir is None else vendored_dir
    github_unreachable: Optional[str] = None
    modules: dict[str, Path | str] = {}

    def from_github(pinned: PinnedFile) -> bytes | str:
        nonlocal github_unreachable
        if github_unreachable:
            return github_unreachable
        try:
            with opener(pinned.url, timeout=60) as response:
                return response.read()
        except urllib.error.HTTPError as error:  # the host answered: keep asking it for the others
            return f"{pinned.url}: HTTP {error.code}"
        except (OSError, http.client.HTTPException) as error:  # no route, no DNS, a timeout: do not wait again
            github_unreachable = f"{RAW} unreachable ({getattr(error, 'reason', None) or error})"
            return github_unreachable

    def from_go_module(pinned: PinnedFile) -> bytes | str:
        if pinned.module is None:
            return "no Go module version serves it (tools/schemas.py)"
        if pinned.module not in modules:
            try:
                modules[pinned.module] = module_dir(pinned.module)
            except (OSError, subprocess.SubprocessError) as error:
                modules[pinned.module] = f"Go module {pinned.module}: {error}"
        where = modules[pinned.module]
        if isinstance(where, str):
            return where
        try:
            return (where / pinned.upstream_path).read_bytes()
        except OSError as error:
            return f"Go module {pinned.module} {pinned.upstream_path}: {error.strerror or error}"

    found: list[str] = []
    for pinned in PINNED:
        path = directory / pinned.path
        if path.is_file() and sha256_of(path) == pinned.sha256:
            continue
        tried: list[str] = []
        sources = (
            (f"carried copy {vendored_dir / pinned.path}[.xz]", lambda p: _carried(p, vendored_dir)),
            (pinned.url, from_github),
            (f"Go module {pinned.module} {pinned.upstream_path}", from_go_module),
        )
        for name, source in sources:
            body = source(pinned)
            if body is None:
                continue  # not carried: the usual case, not worth a line
            if isinstance(body, str):
                tried.append(body)
                continue
            if (digest := hashlib.sha256(body).hexdigest()) != pinned.sha256:
                tried.append(f"{name}: sha256 {digest} does not match; refused (the file changed upstream, "
                             "or the copy was altered)")
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(path.name + ".partial")
            partial.write_bytes(body)
            partial.replace(path)
            break
        else:
            found.append(f"{path}: no source had it with sha256 {pinned.sha256}: " + "; ".join(tried))
    return found


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.schemas", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["fetch", "verify"])
    parser.add_argument("directory", nargs="?", type=Path, help=f"default: ${ENV_VAR} or {CACHE_DIR}")
    args = parser.parse_args(argv)
    directory = args.directory or schemas_dir()
    try:
        found = fetch(directory) if args.command == "fetch" else problems(directory)
    except OSError as error:  # the cache itself cannot be written
        found = [f"{directory}: {error}"]
    for problem in found:
        print(f"error: {problem}", file=sys.stderr)
    if found and args.command == "fetch":
        print(f"error: {len(found)} of {len(PINNED)} pinned schema files not laid out in {directory}; reach GitHub "
              f"or the Go module proxy (with Go installed), or set {ENV_VAR} to a verified copy", file=sys.stderr)
    if found:
        return 1
    print(f"{len(PINNED)} pinned schema files verified in {directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
