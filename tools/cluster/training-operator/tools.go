//go:build tools

// Package tools pins the controller command this module builds (tools/cluster/build.sh).
package tools

import (
	_ "github.com/kubeflow/training-operator/cmd/training-operator.v1"
)
