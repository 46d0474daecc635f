//go:build tools

// Package tools pins the Karpenter kwok provider this module wraps (cmd/karpenter-kwok-aws, built by
// tools/cluster/build.sh).
package tools

import (
	_ "sigs.k8s.io/karpenter/kwok"
)
