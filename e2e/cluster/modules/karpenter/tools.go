//go:build tools

// Package tools pins the Karpenter kwok provider built from this module (see e2e/cluster/build.sh).
package tools

import _ "sigs.k8s.io/karpenter/kwok"
