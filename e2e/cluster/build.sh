#!/usr/bin/env bash
# Build the local control plane (kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl, etcd, kwok, kwokctl, helm), KEDA (operator, metrics adapter, webhooks) and
# Karpenter's kwok provider from Go modules into
#   ${XDG_CACHE_HOME:-~/.cache}/tidegate/bin/<versions>/
# Idempotent: a binary already there is kept. Prints the bin directory on stdout (last line).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

cache="${XDG_CACHE_HOME:-$HOME/.cache}/tidegate"
bin="$cache/bin/k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}"
bin+="_keda-${KEDA_VERSION}_karpenter-${KARPENTER_VERSION}"
mkdir -p "$bin"
export GOFLAGS="-mod=mod -buildvcs=false -trimpath"
export CGO_ENABLED=0

log() { printf '[build] %s\n' "$*" >&2; }

build() { # build MODULE_DIR OUTPUT PACKAGE [LDFLAGS]
	local dir="$1" out="$2" pkg="$3" ldflags="${4:-}"
	if [[ -x "$bin/$out" ]]; then return 0; fi
	log "go build $pkg -> $out"
	local start=$SECONDS
	(cd "$here/modules/$dir" && go build -ldflags "-s -w $ldflags" -o "$bin/$out.tmp" "$pkg")
	mv "$bin/$out.tmp" "$bin/$out"
	log "$out built in $((SECONDS - start)) s"
}

IFS=. read -r k8s_major k8s_minor _ <<<"$K8S_VERSION"
k8s_ldflags="-X k8s.io/component-base/version.gitVersion=v${K8S_VERSION}"
k8s_ldflags+=" -X k8s.io/component-base/version.gitMajor=${k8s_major}"
k8s_ldflags+=" -X k8s.io/component-base/version.gitMinor=${k8s_minor}"
k8s_ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
k8s_ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=v${K8S_VERSION}"
kwok_ldflags="-X sigs.k8s.io/kwok/pkg/consts.Version=v${KWOK_VERSION}"
kwok_ldflags+=" -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=v${K8S_VERSION}"

build etcd etcd go.etcd.io/etcd/server/v3
build kwok kwok sigs.k8s.io/kwok/cmd/kwok "$kwok_ldflags"
build kwok kwokctl sigs.k8s.io/kwok/cmd/kwokctl "$kwok_ldflags"
build kubernetes kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$k8s_ldflags"
build kubernetes kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$k8s_ldflags"
build kubernetes kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "$k8s_ldflags"
build kubernetes kubectl k8s.io/kubernetes/cmd/kubectl "$k8s_ldflags"
build helm helm helm.sh/helm/v3/cmd/helm \
	"-X helm.sh/helm/v3/internal/version.version=v${HELM_VERSION}"
# KEDA's Makefile stamps its version the same way (GO_LDFLAGS); the operator logs it at start.
keda_ldflags="-X github.com/kedacore/keda/v2/version.Version=${KEDA_VERSION}"
build keda keda-operator github.com/kedacore/keda/v2/cmd/operator "$keda_ldflags"
build keda keda-adapter github.com/kedacore/keda/v2/cmd/adapter "$keda_ldflags"
build keda keda-webhooks github.com/kedacore/keda/v2/cmd/webhooks "$keda_ldflags"
build karpenter karpenter-kwok sigs.k8s.io/karpenter/kwok
echo "$bin"
