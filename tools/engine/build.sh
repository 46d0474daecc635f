#!/usr/bin/env bash
# Builds the real deployment engine the engine tests drive (tests/engine/), at pinned versions, from
# the Go module proxy into .cache/engine-tools/bin/:
#   helm                        helm.sh/helm/v3 (the Helm release the Kubernetes provider links)
#   pulumi                      the Pulumi CLI (github.com/pulumi/pulumi/pkg/v3 cmd/pulumi)
#   pulumi-resource-kubernetes  the Kubernetes provider (github.com/pulumi/pulumi-kubernetes/provider/v4)
#
# Each tool has its own tiny module under tools/engine/<name>/ (go.mod pins the version, go.sum its
# hashes): the provider requires pkg/v3 v3.215.0 and does not compile against the CLI's v3.274.1.
# Source comes only from the module proxy (GOPROXY); no prebuilt release binaries are downloaded.
# Each binary gets the ldflags of its upstream release build (cited per recipe below), -trimpath and
# CGO_ENABLED=0, so the same inputs give the same bytes.
#
# Usage: tools/engine/build.sh [helm|pulumi|kubernetes...]   (default: all, Helm first).
# Idempotent: a binary is rebuilt only when its module's go.mod/go.sum/tools.go, this script's recipe
# for it or the Go version changed. Builds run one at a time; on a busy machine set GOFLAGS=-p=1.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# A worktree shares the main checkout's .cache (git-ignored) so binaries are built once.
common="$(git -C "$repo" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)"
if [[ -n "${ENGINE_TOOLS_BIN:-}" ]]; then
  bin="$ENGINE_TOOLS_BIN"
elif [[ -n "$common" && -d "$(dirname "$common")/.cache" ]]; then
  bin="$(dirname "$common")/.cache/engine-tools/bin"
else
  bin="$repo/.cache/engine-tools/bin"
fi
mkdir -p "$bin"
work="$(dirname "$bin")/src"

want=("$@")
selected() {
  [[ ${#want[@]} -eq 0 ]] && return 0
  local w; for w in "${want[@]}"; do [[ "$w" == "$1" ]] && return 0; done; return 1
}

# The version a module requires of a dependency (go.mod is the one place each pin lives).
required() { (cd "$here/$1" && go list -m -f '{{.Version}}' "$2"); }

stamp_of() {  # module dir name, recipe text
  cat "$here/$1/go.mod" "$here/$1/go.sum" "$here/$1/tools.go" <(echo "$2") <(sed -n "/^# recipe:$1\$/,/^# end:$1\$/p" "${BASH_SOURCE[0]}") \
    <(cd "$here/$1" && go version) | sha256sum | cut -d' ' -f1
}

up_to_date() {  # binary, stamp
  [[ -x "$bin/$1" && -f "$bin/.$1.stamp" && "$(cat "$bin/.$1.stamp")" == "$2" ]]
}

finish() {  # binary, stamp, start seconds
  mv -f "$bin/$1.tmp" "$bin/$1"
  echo "$2" >"$bin/.$1.stamp"
  echo "built $1 in $((SECONDS - $3))s: $(sha256sum "$bin/$1" | cut -d' ' -f1)"
}

# recipe:helm
# Helm's release Makefile (v3.18.6, `make build`): -trimpath, CGO_ENABLED=0, -s -w, the version
# stamps, and the Kubernetes version its client-go is built for (major+1 of client-go's 0.x, minor):
# without those, `helm template` renders for Kubernetes 1.20 and kubeVersion checks fail.
if selected helm; then
  helm_version="$(required helm helm.sh/helm/v3)"
  helm_commit=b76a950f6835474e0906b96c9ec68a2eff3a6430   # the v3.18.6 tag of github.com/helm/helm
  stamp="$(stamp_of helm "$helm_version $helm_commit")"
  if up_to_date helm "$stamp"; then
    echo "up to date: $bin/helm"
  else
    echo "building helm $helm_version -> $bin/helm"
    start=$SECONDS
    (
      cd "$here/helm"
      go mod download
      IFS=. read -r k8s_major k8s_minor _ <<<"$(go list -m -f '{{.Version}}' k8s.io/client-go | sed 's/^v//')"
      k8s_major=$((k8s_major + 1))
      ldflags="-w -s -X helm.sh/helm/v3/internal/version.version=$helm_version"
      ldflags+=" -X helm.sh/helm/v3/internal/version.metadata="
      ldflags+=" -X helm.sh/helm/v3/internal/version.gitCommit=$helm_commit"
      ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
      ldflags+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=$k8s_major"
      ldflags+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$k8s_minor"
      ldflags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=$k8s_major"
      ldflags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$k8s_minor"
      CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bin/helm.tmp" helm.sh/helm/v3/cmd/helm
    )
    finish helm "$stamp" "$start"
  fi
fi
# end:helm

# recipe:pulumi
# pulumi/pulumi's .goreleaser.yml builds ./cmd/pulumi from pkg/ with only the version stamp; its home
# moved to sdk/v3/go/common/version (without it `pulumi version` prints nothing and the Automation
# API refuses the CLI). -s -w as for the other tools: debug info only.
if selected pulumi; then
  pulumi_version="$(required pulumi github.com/pulumi/pulumi/pkg/v3)"
  stamp="$(stamp_of pulumi "$pulumi_version")"
  if up_to_date pulumi "$stamp"; then
    echo "up to date: $bin/pulumi"
  else
    echo "building the Pulumi CLI $pulumi_version -> $bin/pulumi"
    start=$SECONDS
    (
      cd "$here/pulumi"
      go mod download
      CGO_ENABLED=0 go build -trimpath \
        -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$pulumi_version" \
        -o "$bin/pulumi.tmp" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi
    )
    finish pulumi "$stamp" "$start"
  fi
fi
# end:pulumi

# recipe:kubernetes
# pulumi-kubernetes' release (.goreleaser.yml, Makefile `k8sprovider`): `go generate` in
# cmd/pulumi-resource-kubernetes first (generate.go writes schema-embed.json, the schema stamped with
# the version, and terraform-mapping-embed.json, which main.go embeds and the module zip lacks), then
# CGO_ENABLED=0 with -s -w and the version stamp. The generate step needs a writable copy of the
# module (the module cache is read-only); the build reaches that copy through a replace in a
# throw-away copy of our module, after `go mod download` has checked the module against our go.sum.
# The replace is relative (`../pulumi-kubernetes-provider`, the copy beside that throw-away module):
# Go writes a directory replacement into the binary's build info as go.mod spells it, so an absolute
# path would make the bytes depend on where the checkout lives.
# The proxy serves this module only as a pseudo-version: the tag it was cut from is the version.
if selected kubernetes; then
  k8s_module=github.com/pulumi/pulumi-kubernetes/provider/v4
  k8s_pseudo="$(required kubernetes "$k8s_module")"
  k8s_version=4.25.0   # f47bc2d6f1996444d11c12b4ef083b82585f7c07 is the v4.25.0 tag of pulumi/pulumi-kubernetes
  stamp="$(stamp_of kubernetes "$k8s_pseudo $k8s_version")"
  if up_to_date pulumi-resource-kubernetes "$stamp"; then
    echo "up to date: $bin/pulumi-resource-kubernetes"
  else
    echo "building pulumi-resource-kubernetes $k8s_version ($k8s_pseudo) -> $bin/pulumi-resource-kubernetes"
    start=$SECONDS
    (
      cd "$here/kubernetes"
      go mod download
      src="$(go list -m -f '{{.Dir}}' "$k8s_module")"
      copy="$work/pulumi-kubernetes-provider"
      rm -rf "$copy" "$work/kubernetes-mod"
      mkdir -p "$work/kubernetes-mod"
      cp -R "$src" "$copy"
      chmod -R u+w "$copy"
      go build -trimpath -o "$work/kubernetes-mod/generate" "$copy/cmd/pulumi-resource-kubernetes/generate.go"
      (cd "$copy/cmd/pulumi-resource-kubernetes" && VERSION="$k8s_version" "$work/kubernetes-mod/generate")
      cp go.mod go.sum "$work/kubernetes-mod/"
      cd "$work/kubernetes-mod"
      go mod edit -replace="$k8s_module=../$(basename "$copy")"
      CGO_ENABLED=0 go build -trimpath \
        -ldflags "-s -w -X $k8s_module/pkg/version.Version=v$k8s_version" \
        -o "$bin/pulumi-resource-kubernetes.tmp" "$k8s_module/cmd/pulumi-resource-kubernetes"
      rm -rf "$copy" "$work/kubernetes-mod"
    )
    finish pulumi-resource-kubernetes "$stamp" "$start"
  fi
fi
# end:kubernetes
