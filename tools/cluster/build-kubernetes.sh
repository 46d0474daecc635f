#!/usr/bin/env bash
# kube-apiserver, kube-controller-manager, kube-scheduler and kubectl from tools/cluster/kubernetes (go.mod
# pins k8s.io/kubernetes and every staging module). The version is stamped the way Kubernetes'
# own build does (hack/lib/version.sh: -X k8s.io/component-base/version.gitVersion=...), so
# /version answers v1.32.13 and controllers that check the server version see the real one.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${CLUSTER_TOOLS_BIN:-$(cd "$here/../.." && python3 -m tools.cluster.paths bin)}"
mkdir -p "$out"
cd "$here/kubernetes"
version="$(sed -n 's#^require k8s.io/kubernetes \(v[0-9.]*\)$#\1#p' go.mod)"
major="${version#v}"; major="${major%%.*}"
minor="${version#v*.}"; minor="${minor%%.*}"
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
ldflags="$ldflags -X k8s.io/client-go/pkg/version.gitVersion=$version -X k8s.io/client-go/pkg/version.gitMajor=$major -X k8s.io/client-go/pkg/version.gitMinor=$minor"
go build -trimpath -ldflags "$ldflags" -o "$out/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
