#!/usr/bin/env bash
# A local Kubernetes control plane without Docker: real etcd, kube-apiserver,
# kube-controller-manager and kube-scheduler run as processes by `kwokctl --runtime binary`;
# kwok fakes the nodes (four 8-GPU nodes, one CPU node) and moves pods to Running/Ready.
# The real KEDA and Karpenter CRDs (from their Go modules) and tidegate's CRD are installed.
#
#   cluster.sh up       build what is missing, create (or reuse) the cluster; prints the kubeconfig path
#   cluster.sh down     delete the cluster
#   cluster.sh env      print `export` lines (KUBECONFIG, PATH with kubectl/helm)
#   cluster.sh status   exit 0 when the API server answers
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

name="${TIDEGATE_CLUSTER_NAME:-tidegate}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/tidegate"
export KWOK_WORKDIR="$cache/kwok"
kubeconfig="$cache/clusters/$name/kubeconfig"
log() { printf '[cluster] %s\n' "$*" >&2; }

bin_dir() { "$here/build.sh" | tail -n 1; }

kc() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

answering() { [[ -f "$kubeconfig" ]] && kc get --raw /readyz >/dev/null 2>&1; }

module_dir() { # module_dir MODULE VERSION -> directory in the Go module cache
	GOFLAGS= go mod download -json "$1@$2" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
}

install_crds() {
	local keda karpenter
	keda="$(module_dir github.com/kedacore/keda/v2 "v$KEDA_VERSION")"
	karpenter="$(module_dir sigs.k8s.io/karpenter "v$KARPENTER_VERSION")"
	[[ -d "$keda" && -d "$karpenter" ]] || { log "could not download the KEDA/Karpenter modules"; exit 1; }
	log "installing CRDs: KEDA v$KEDA_VERSION, Karpenter v$KARPENTER_VERSION, tidegate"
	kc apply --server-side --force-conflicts \
		-f "$keda/config/crd/bases/keda.sh_scaledobjects.yaml" \
		-f "$keda/config/crd/bases/keda.sh_triggerauthentications.yaml" \
		-f "$keda/config/crd/bases/keda.sh_clustertriggerauthentications.yaml" \
		-f "$karpenter/pkg/apis/crds/karpenter.sh_nodepools.yaml" \
		-f "$karpenter/pkg/apis/crds/karpenter.sh_nodeclaims.yaml" \
		-f "$karpenter/kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml" \
		-f "$repo/crds/" >/dev/null
	kc wait --for condition=established --timeout=60s \
		crd/scaledobjects.keda.sh crd/triggerauthentications.keda.sh \
		crd/nodepools.karpenter.sh crd/nodeclaims.karpenter.sh \
		crd/inferencepools.tidegate.dev >/dev/null
}

up() {
	bin="$(bin_dir)"
	if answering; then
		log "cluster '$name' already answering"
	else
		if "$bin/kwokctl" get clusters 2>/dev/null | grep -qx "$name"; then
			log "cluster '$name' exists but does not answer: recreating"
			"$bin/kwokctl" delete cluster --name "$name" >&2 || true
		fi
		mkdir -p "$(dirname "$kubeconfig")"
		rm -f "$kubeconfig"
		log "creating cluster '$name' (kube-apiserver v$K8S_VERSION, etcd v$ETCD_VERSION)"
		local start=$SECONDS
		"$bin/kwokctl" create cluster --name "$name" --runtime binary \
			--kubeconfig "$kubeconfig" \
			--etcd-binary "$bin/etcd" \
			--kube-apiserver-binary "$bin/kube-apiserver" \
			--kube-controller-manager-binary "$bin/kube-controller-manager" \
			--kube-scheduler-binary "$bin/kube-scheduler" \
			--kwok-controller-binary "$bin/kwok" \
			--kube-admission=true \
			--kube-authorization=true \
			--wait 180s >&2
		log "control plane up in $((SECONDS - start)) s"
	fi
	kc apply -f "$here/manifests/gpu-nodes.yaml" -f "$here/manifests/test-namespace.yaml" >/dev/null
	install_crds
	kc wait --for condition=Ready --timeout=60s node --all >/dev/null
	echo "$kubeconfig"
}

down() {
	bin="$(bin_dir)"
	"$bin/kwokctl" delete cluster --name "$name" >&2 || true
	rm -f "$kubeconfig"
	rmdir "$(dirname "$kubeconfig")" 2>/dev/null || true # leave nothing behind but what someone else put there
}

case "${1:-}" in
up) up ;;
down) down ;;
env)
	bin="$(bin_dir)"
	echo "export KUBECONFIG='$kubeconfig'"
	echo "export PATH='$bin':\"\$PATH\""
	;;
status)
	bin="$(bin_dir)"
	answering
	;;
*)
	echo "usage: $0 up|down|env|status" >&2
	exit 2
	;;
esac
