//go:build tools

// Package tools pins the controller command this module builds (tools/cluster/build.sh).
package tools

import (
	_ "sigs.k8s.io/karpenter/kwok"
)
