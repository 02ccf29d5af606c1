//go:build tools

// Package tools pins the KEDA commands built from this module (see e2e/cluster/build.sh).
package tools

import (
	_ "github.com/kedacore/keda/v2/cmd/adapter"
	_ "github.com/kedacore/keda/v2/cmd/operator"
	_ "github.com/kedacore/keda/v2/cmd/webhooks"
)
