//go:build tools

// Package tools pins the Kubernetes provider this module builds (tools/engine/build.sh). Its own
// module, apart from the CLI's: the provider requires pkg/v3 v3.215.0 and does not compile against
// the CLI's newer pkg/v3.
package tools

import (
	_ "github.com/pulumi/pulumi-kubernetes/provider/v4/cmd/pulumi-resource-kubernetes"
)
