//go:build tools

// Package tools pins the kwok commands built from this module.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
	_ "sigs.k8s.io/kwok/cmd/kwokctl"
)
