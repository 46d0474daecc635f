//go:build tools

// Package tools pins the Pulumi CLI this module builds (tools/engine/build.sh). pkg/v3 and sdk/v3
// move together: the CLI's own go.mod requires the sdk at the same version.
package tools

import (
	_ "github.com/pulumi/pulumi/pkg/v3/cmd/pulumi"
	_ "github.com/pulumi/pulumi/sdk/v3/go/common/version"
)
