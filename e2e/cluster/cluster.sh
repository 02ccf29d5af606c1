#!/usr/bin/env bash
# A local Kubernetes control plane without Docker: real etcd, kube-apiserver,
# kube-controller-manager and kube-scheduler run as processes by `kwokctl --runtime binary`;
# kwok fakes the nodes (four 8-GPU nodes, one CPU node) and moves pods to Running/Ready.
# The real KEDA (operator, metrics API server, admission webhooks) and the real Karpenter (its
# kwok provider, GPU instance types from manifests/gpu-instance-types.json) run beside it as
# host processes, with their CRDs (from their Go modules) and tidegate's CRD installed.
#
#   cluster.sh up       build what is missing, create (or reuse) the cluster, start KEDA and
#                       Karpenter (or keep them if running); prints the kubeconfig path
#   cluster.sh down     stop KEDA and Karpenter, delete the cluster
#   cluster.sh env      print `export` lines (KUBECONFIG, PATH with kubectl/helm)
#   cluster.sh status   exit 0 when the API server answers; prints whether KEDA and Karpenter run
#   cluster.sh pod-net  print the cluster's pod network 127.N (its pods are in 127.N.0.0/16)
#
# KEDA and Karpenter write their logs (and pid files, certificates, ports) under
# ${XDG_CACHE_HOME:-~/.cache}/tidegate/clusters/<name>/addons/.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

name="${TIDEGATE_CLUSTER_NAME:-tidegate}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/tidegate"
export KWOK_WORKDIR="$cache/kwok"
state="$cache/clusters/$name"
kubeconfig="$state/kubeconfig"
addons="$state/addons"
# Pod addresses are on loopback, so whatever connects to a pod IP (the scaler scraping sidecars, the
# e2e pod agent binding them) stays on this machine. Each cluster gets a /16 of its own, 127.N.0.0/16
# (N from its name, 30..199, never one another cluster under this cache holds; kept in $state/pod-net;
# below 200: clusters made before this held 127.1x, 127.20 and 127.200 and record nothing):
# the static nodes' podCIDRs are /20s at its start, and Karpenter's nodes, which have no podCIDR, get
# addresses from kwok's default range, its upper half. Two clusters with the same addresses would
# answer each other's scalers.
pod_net_file="$state/pod-net"
# The HPA controller's sync period (kube-controller-manager's default is 15 s): shorter here so
# tests of the real HPA wait less; every other HPA rule (tolerance, stabilisation) is the real one.
HPA_SYNC_PERIOD="${TIDEGATE_HPA_SYNC_PERIOD:-5s}"
log() { printf '[cluster] %s\n' "$*" >&2; }

bin_dir() { "$here/build.sh" | tail -n 1; }

kc() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

choose_pod_net() { # prints 127.N: the recorded one, else a free one derived from the name
	if [[ -s "$pod_net_file" ]]; then
		cat "$pod_net_file"
		return
	fi
	local taken n tries
	taken="$(cat "$cache"/clusters/*/pod-net 2>/dev/null || true)"
	n=$(($(printf '%s' "$name" | cksum | cut -d' ' -f1) % 170))
	for ((tries = 0; tries < 170; tries++)); do
		grep -qx "127.$((30 + n))" <<<"$taken" || break
		n=$(((n + 1) % 170))
	done
	echo "127.$((30 + n))"
}

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
		-f "$keda/config/crd/bases/" \
		-f "$karpenter/pkg/apis/crds/karpenter.sh_nodepools.yaml" \
		-f "$karpenter/pkg/apis/crds/karpenter.sh_nodeclaims.yaml" \
		-f "$karpenter/pkg/apis/crds/karpenter.sh_nodeoverlays.yaml" \
		-f "$karpenter/kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml" \
		-f "$repo/crds/" >/dev/null
	kc wait --for condition=established --timeout=60s \
		crd/scaledobjects.keda.sh crd/scaledjobs.keda.sh crd/triggerauthentications.keda.sh \
		crd/clustertriggerauthentications.keda.sh crd/cloudeventsources.eventing.keda.sh \
		crd/clustercloudeventsources.eventing.keda.sh \
		crd/nodepools.karpenter.sh crd/nodeclaims.karpenter.sh crd/kwoknodeclasses.karpenter.kwok.sh \
		crd/inferencepools.tidegate.dev >/dev/null
}

# shellcheck source=addons.sh
source "$here/addons.sh"

up() {
	bin="$(bin_dir)"
	if [[ -s "$pod_net_file" ]] && answering; then
		log "cluster '$name' already answering"
	else
		if "$bin/kwokctl" get clusters 2>/dev/null | grep -qx "$name"; then
			if answering; then # answering without a recorded net: made before each cluster had its own
				log "cluster '$name' was made before each cluster had pod addresses of its own: recreating"
			else
				log "cluster '$name' exists but does not answer: recreating"
			fi
			"$bin/kwokctl" delete cluster --name "$name" >&2 || true
		fi
		addons_down # any left from the previous cluster would talk to the new one with stale state
		mkdir -p "$(dirname "$kubeconfig")"
		rm -f "$kubeconfig" "$pod_net_file"
		# chosen and recorded under one lock: two clusters made at once never take the same net
		# (a group: a bare assignment's redirection is opened after its command substitution runs)
		{ pod_net="$(
			flock 9
			choose_pod_net | tee "$pod_net_file"
		)"; } 9>"$cache/clusters/.pod-net.lock"
		log "creating cluster '$name' (kube-apiserver v$K8S_VERSION, etcd v$ETCD_VERSION)"
		local start=$SECONDS
		"$bin/kwokctl" create cluster --name "$name" --runtime binary \
			--kubeconfig "$kubeconfig" \
			--etcd-binary "$bin/etcd" \
			--kube-apiserver-binary "$bin/kube-apiserver" \
			--kube-controller-manager-binary "$bin/kube-controller-manager" \
			--kube-scheduler-binary "$bin/kube-scheduler" \
			--kwok-controller-binary "$bin/kwok" \
			--extra-args "kwok-controller=cidr=$pod_net.128.0/17" \
			--extra-args "kube-controller-manager=horizontal-pod-autoscaler-sync-period=$HPA_SYNC_PERIOD" \
			--kube-admission=true \
			--kube-authorization=true \
			--wait 180s >&2
		log "control plane up in $((SECONDS - start)) s (pods on $pod_net.0.0/16)"
	fi
	pod_net="$(cat "$pod_net_file")"
	sed "s/\${POD_NET}/$pod_net/g" "$here/manifests/gpu-nodes.yaml" | kc apply -f - >/dev/null
	kc apply -f "$here/manifests/test-namespace.yaml" >/dev/null
	install_crds
	kc wait --for condition=Ready --timeout=60s node kwok-gpu-0 kwok-gpu-1 kwok-gpu-2 kwok-gpu-3 kwok-cpu-0 >/dev/null
	addons_up
	echo "$kubeconfig"
}

down() {
	bin="$(bin_dir)"
	addons_down
	"$bin/kwokctl" delete cluster --name "$name" >&2 || true
	rm -f "$kubeconfig" "$pod_net_file"
	rm -rf "$addons"
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
pod-net)
	choose_pod_net
	;;
status)
	bin="$(bin_dir)"
	answering || exit 1
	addons_status
	;;
*)
	echo "usage: $0 up|down|env|status|pod-net" >&2
	exit 2
	;;
esac
