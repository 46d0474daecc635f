//go:build tools

// Package tools pins the Helm command this module builds (tools/engine/build.sh): the same Helm
// release the pinned pulumi-kubernetes provider links (its go.mod requires helm.sh/helm/v3 v3.18.6),
// so `helm template` here renders what the provider installs.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
