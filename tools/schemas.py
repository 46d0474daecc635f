"""Pinned upstream schemas (CRDs, pulumi-eks) that generated objects are validated against.

The files are not in the repository: ``make schemas`` (``python -m tools.schemas fetch``)
downloads each from its upstream tag into ``.cache/schemas`` and keeps it only if its SHA-256
matches the sum pinned here. ``ML_PLATFORM_SCHEMAS`` points at a local copy instead (an offline
mirror); ``python -m tools.schemas verify DIR`` checks such a copy against the same sums.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ENV_VAR = "ML_PLATFORM_SCHEMAS"
CACHE_DIR = Path(".cache") / "schemas"
RAW = "https://raw.githubusercontent.com"


@dataclass(frozen=True)
class PinnedFile:
    path: str          # relative to the schemas directory
    repository: str    # GitHub owner/name
    ref: str           # tag or commit
    upstream_path: str
    sha256: str

    @property
    def url(self) -> str:
        return f"{RAW}/{self.repository}/{self.ref}/{self.upstream_path}"


def _crds(directory: str, repository: str, ref: str, upstream_dir: str, sums: dict[str, str]) -> list[PinnedFile]:
    return [PinnedFile(f"crds/{directory}/{name}", repository, ref, f"{upstream_dir}/{name}", digest)
            for name, digest in sums.items()]


PINNED: tuple[PinnedFile, ...] = tuple([
    *_crds("karpenter-1.14.1", "aws/karpenter-provider-aws", "v1.14.1", "pkg/apis/crds", {
        "karpenter.k8s.aws_ec2nodeclasses.yaml": "62dec59f01c0972d4503ca3ed25f243ba9c2f561be0d964ce7a14c8df406132f",
        "karpenter.sh_nodeclaims.yaml": "96037dc241031fe0f7a09ddf78183d885ce6a1dfe115f7b3fbf8a12c564be694",
        "karpenter.sh_nodepools.yaml": "3bb64a20c80776b77aa19a699ebdaf34480a7b2e7ec4ef890b43225b3517f878",
        # NodeOverlay (karpenter.sh/v1alpha1): shared GPU pools declare their slices with it.
        "karpenter.sh_nodeoverlays.yaml": "6ff6199aff096cc87cd9508f8c5ae62c6d3452aa90c2828ee36380340f3ece62",
    }),
    *_crds("training-operator-1.9.4", "kubeflow/trainer", "v1.9.4", "manifests/base/crds", {
        "kubeflow.org_pytorchjobs.yaml": "8b8a8a719cc94173169290251e817f7ac2bb425c20b6c2fa813397bcf4e932ed",
    }),
    *_crds("trainer-2.3.0", "kubeflow/trainer", "v2.3.0", "manifests/base/crds", {
        "trainer.kubeflow.org_clustertrainingruntimes.yaml": "ec84dc3388fcdbe8c61d3c247a773d14458dd9438e995bea8e50d2a18080eef9",
        "trainer.kubeflow.org_trainingruntimes.yaml": "69b8dbdf60a18e28cddcc2b8dfc4ce72a943e14b531b9389d593118faee4919f",
        "trainer.kubeflow.org_trainjobs.yaml": "a742cafc5b5582640c7e0b7467c024fc237256fbca5ba0a9f0531dfb66d64416",
    }),
    *_crds("argo-cd-3.5.1", "argoproj/argo-cd", "v3.5.1", "manifests/crds", {
        "application-crd.yaml": "5dde0e229249b6b707beb98674c1deae3949d5c319a6c45b9f5a80c99618e40c",
        "applicationset-crd.yaml": "7d282054f41ca2b71a22bab04a8caf0000e07e53a62432e6ea292dae5ab4f07d",
        "appproject-crd.yaml": "ab225266944322750136f1198d93786e4a79a0e43c8d149abfba44da30a3eac8",
    }),
    *_crds("kueue-0.19.2", "kubernetes-sigs/kueue", "v0.19.2", "config/components/crd/bases", {
        "kueue.x-k8s.io_admissionchecks.yaml": "2bf4003c0a3ea3d6ceab940c7a271ad211372dab59d2739acfa8b2bdb0724acb",
        "kueue.x-k8s.io_clusterqueues.yaml": "e0a5fc9b370c70f3d993d4f599865817338ecf94187b30b15b12ff33c579bd55",
        "kueue.x-k8s.io_cohorts.yaml": "61fbe5ec55d45e7fae2d65321fb32517b197257ab78ad55316673183aac911c2",
        "kueue.x-k8s.io_localqueues.yaml": "dd10ef8d3578e7212fa52763549e7b6be0949793a5b924495fcd293330109fed",
        "kueue.x-k8s.io_provisioningrequestconfigs.yaml": "0399b2689d7468c64a1ef4e3c8bf9603c261a152f822b6698903b23f69e790dc",
        "kueue.x-k8s.io_resourceflavors.yaml": "19e339c47e9ca3fa2c9eeddd27715a512f765c4794ed859733408a9715720173",
        "kueue.x-k8s.io_topologies.yaml": "f703575d3bb64d26f6e839f831e01646367ed41a89b3abf163f8e842ca1c4d2b",
        "kueue.x-k8s.io_workloadpriorityclasses.yaml": "0b755726aab05b8def9a53ee15b201eed3846bcffd1ff5528fed123f4ae03519",
    }),
    *_crds("argo-workflows-4.1.2", "argoproj/argo-workflows", "v4.1.2", "manifests/base/crds/full", {
        "argoproj.io_clusterworkflowtemplates.yaml": "1a1e40dca1a544c44b382ff9f50d44a4b6a6a7ff76c0a2d8e6a929c2ddb13749",
        "argoproj.io_cronworkflows.yaml": "31abde1c89c6c11cf1c97753676327e02b2f8dc47827e49383732ac6b1d828c6",
        "argoproj.io_workflows.yaml": "35ffc0d16c9c71db69ae113e562d90057eac75a60e7371aa3012a3171ccd8c39",
        "argoproj.io_workflowtemplates.yaml": "e932631a04a0f3a226b2ca8c68d43214c071c5d8aa6961b23298b81cbea3d9a5",
    }),
    # pulumi-eks v4.3.0+9 (Aug 2026): the schema of the provider the pulumi-eks SDK pin talks to.
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


def fetch(directory: Path, *, opener=urllib.request.urlopen) -> list[str]:
    """Download every pinned file not already present and valid; returns the problems left."""
    for pinned in PINNED:
        path = directory / pinned.path
        if path.is_file() and sha256_of(path) == pinned.sha256:
            continue
        with opener(pinned.url, timeout=60) as response:
            body = response.read()
        if hashlib.sha256(body).hexdigest() != pinned.sha256:
            return [f"{pinned.url}: sha256 {hashlib.sha256(body).hexdigest()} does not match the pinned "
                    f"{pinned.sha256}; refusing to use it (upstream changed the file, or the download was altered)"]
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        partial.write_bytes(body)
        partial.replace(path)
    return problems(directory)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.schemas", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["fetch", "verify"])
    parser.add_argument("directory", nargs="?", type=Path, help=f"default: ${ENV_VAR} or {CACHE_DIR}")
    args = parser.parse_args(argv)
    directory = args.directory or schemas_dir()
    try:
        found = fetch(directory) if args.command == "fetch" else problems(directory)
    except OSError as error:
        print(f"error: downloading the pinned schemas failed: {error}; set {ENV_VAR} to a local copy instead",
              file=sys.stderr)
        return 1
    for problem in found:
        print(f"error: {problem}", file=sys.stderr)
    if not found:
        print(f"{len(PINNED)} pinned schema files verified in {directory}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
