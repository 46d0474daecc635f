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
# A worktree shares the main checkout's .cache (git-ignored) so binaries are built once.
common="$(git -C "$repo" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)"
if [[ -n "${CLUSTER_TOOLS_BIN:-}" ]]; then
  bin="$CLUSTER_TOOLS_BIN"
elif [[ -n "$common" && -d "$(dirname "$common")/.cache" ]]; then
  bin="$(dirname "$common")/.cache/cluster-tools/bin"
else
  bin="$repo/.cache/cluster-tools/bin"
fi
mkdir -p "$bin"

# name|binary|package|-X version flags (pkg.Var=value, space separated)
recipes=(
  "kwok|kwok|sigs.k8s.io/kwok/cmd/kwok|"
  "kueue|kueue|sigs.k8s.io/kueue/cmd/kueue|sigs.k8s.io/kueue/pkg/version.GitVersion=v0.19.2"
  "training-operator|training-operator|github.com/kubeflow/training-operator/cmd/training-operator.v1|"
  "jobset|jobset|sigs.k8s.io/jobset|sigs.k8s.io/jobset/pkg/version.GitVersion=v0.12.0"
  "trainer|trainer-controller-manager|github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager|"
  "karpenter|karpenter-kwok|sigs.k8s.io/karpenter/kwok|sigs.k8s.io/karpenter/pkg/operator.Version=v1.14.1"
)

want=("$@")
selected() {
  [[ ${#want[@]} -eq 0 ]] && return 0
  local w; for w in "${want[@]}"; do [[ "$w" == "$1" ]] && return 0; done; return 1
}

for r in "${recipes[@]}"; do
  IFS='|' read -r name out pkg xflags <<<"$r"
  selected "$name" || continue
  dir="$here/$name"
  ldflags="-s -w"
  for x in $xflags; do ldflags+=" -X $x"; done
  stamp="$(cat "$dir/go.mod" "$dir/go.sum" "$dir/tools.go" <(echo "$r") <(cd "$dir" && go version) | sha256sum | cut -d' ' -f1)"
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
