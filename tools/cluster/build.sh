#!/usr/bin/env bash
# Builds the controllers the platform relies on, at the versions the stacks pin, from the Go module
# proxy into .cache/cluster-tools/bin/ (see RUNNING.md for how each one runs on a loopback cluster).
#
# Each controller has its own tiny module under tools/cluster/<name>/ because their k8s.io
# dependencies (0.35.x, 0.36.x) conflict with each other and with the 1.32 control plane's.
# Source comes only from the module proxy (GOPROXY); no prebuilt release binaries are downloaded.
#
# Usage: tools/cluster/build.sh [NAME...]   (default: all). Idempotent: a binary is rebuilt only
# when its module's go.mod/go.sum/tools.go, this script's recipe for it or the Go version changed.
# Builds run one at a time (-p defaults to the core count; set GOFLAGS=-p=1 on a busy machine).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# One rule for where the binaries go, shared with the harness (tools/cluster/paths.py: $CLUSTER_TOOLS_BIN,
# else a worktree's main checkout's .cache, else this checkout's). Standard library only: no venv needed.
bin="$(cd "$repo" && python3 -m tools.cluster.paths bin)"
mkdir -p "$bin"
export CLUSTER_TOOLS_BIN="$bin"

want=("$@")
selected() {
  [[ ${#want[@]} -eq 0 ]] && return 0
  local w; for w in "${want[@]}"; do [[ "$w" == "$1" ]] && return 0; done; return 1
}

# etcd: Debian's etcd-server (the control plane's store). Installed here when missing and we may.
if selected etcd && ! command -v etcd >/dev/null; then
  if [[ "$(id -u)" -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "installing Debian's etcd-server"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null 2>&1 \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null; }
  else
    echo "error: etcd is missing. FIX: sudo apt-get install etcd-server" >&2
    exit 2
  fi
fi

# The 1.32 control plane and kubectl (one module, four binaries: tools/cluster/build-kubernetes.sh).
if selected kubernetes; then
  dir="$here/kubernetes"
  stamp="$(cat "$dir/go.mod" "$dir/go.sum" "$dir/tools.go" "$here/build-kubernetes.sh" <(cd "$dir" && go version) | sha256sum | cut -d' ' -f1)"
  complete=1
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do [[ -x "$bin/$b" ]] || complete=0; done
  if [[ $complete -eq 1 && -f "$bin/.kubernetes.stamp" && "$(cat "$bin/.kubernetes.stamp")" == "$stamp" ]]; then
    echo "up to date: $bin/kube-apiserver kube-controller-manager kube-scheduler kubectl"
  else
    echo "building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl -> $bin"
    start=$SECONDS
    (cd "$dir" && go mod download) && CLUSTER_TOOLS_BIN="$bin" bash "$here/build-kubernetes.sh"
    echo "$stamp" >"$bin/.kubernetes.stamp"
    echo "built the control plane in $((SECONDS - start))s:"
    (cd "$bin" && sha256sum kube-apiserver kube-controller-manager kube-scheduler kubectl)
  fi
fi

# name|binary|package|-X version flags (pkg.Var=value, space separated)
recipes=(
  "kwok|kwok|sigs.k8s.io/kwok/cmd/kwok|"
  "kueue|kueue|sigs.k8s.io/kueue/cmd/kueue|sigs.k8s.io/kueue/pkg/version.GitVersion=v0.19.2"
  "training-operator|training-operator|github.com/kubeflow/training-operator/cmd/training-operator.v1|"
  "jobset|jobset|sigs.k8s.io/jobset|sigs.k8s.io/jobset/pkg/version.GitVersion=v0.12.0"
  "trainer|trainer-controller-manager|github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager|"
  # Karpenter core with its kwok provider, wrapped to act as the AWS provider where the tests need it
  # (tools/cluster/karpenter/cmd/karpenter-kwok-aws/main.go: repair policies, interruption, registration).
  "karpenter|karpenter-kwok-aws|./cmd/karpenter-kwok-aws|sigs.k8s.io/karpenter/pkg/operator.Version=v1.14.1"
)


for r in "${recipes[@]}"; do
  IFS='|' read -r name out pkg xflags <<<"$r"
  selected "$name" || continue
  dir="$here/$name"
  ldflags="-s -w"
  for x in $xflags; do ldflags+=" -X $x"; done
  # The stamp covers the module's own Go files too (a wrapper's main.go).
  stamp="$(cat "$dir/go.mod" "$dir/go.sum" $(cd "$dir" && find . -name '*.go' | sort | sed "s#^#$dir/#") <(echo "$r") <(cd "$dir" && go version) | sha256sum | cut -d' ' -f1)"
  if [[ -x "$bin/$out" && -f "$bin/.$out.stamp" && "$(cat "$bin/.$out.stamp")" == "$stamp" ]]; then
    echo "up to date: $bin/$out"
    continue
  fi
  echo "building $pkg -> $bin/$out"
  start=$SECONDS
  (cd "$dir" && go mod download && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bin/$out.tmp" "$pkg")
  mv -f "$bin/$out.tmp" "$bin/$out"
  echo "$stamp" >"$bin/.$out.stamp"
  echo "built $out in $((SECONDS - start))s: $(sha256sum "$bin/$out" | cut -d' ' -f1)"
done
