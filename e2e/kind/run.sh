#!/usr/bin/env bash
# tidegate on kind (needs Docker, kind, kubectl, helm on PATH): real containers, real KEDA.
# It cannot run on the development machines of this repo (no Docker there); CI runners with Docker can.
# The pool manifest comes from tests/e2e/conftest.py: run from a checkout with its venv (or set PYTHON).
#
#   e2e/kind/run.sh          create cluster `tidegate-e2e`, build + load the image, install KEDA and
#                            the chart, then check the loop on a sim-backend pool (see below)
#   KEEP=1 e2e/kind/run.sh   leave the cluster running afterwards
#
# What it checks, through the real Service and the real KEDA: the pool becomes a Deployment whose
# pods serve (sim-backend behind the admission sidecar); KEDA's ScaledObject is Ready against the
# chart's scaler; `kubectl scale` promotes a warm replica; a chat completion through the Service
# answers 200; deleting the pool removes its children. The timed scenarios of tests/e2e need the
# local launcher's pod agent (they read per-pod processes and route by loopback pod IP) and do not
# run here yet.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=../cluster/versions.env
source "$repo/e2e/cluster/versions.env"
name="${KIND_CLUSTER:-tidegate-e2e}"
image="tidegate:e2e"
ns="e2e-kind"
log() { printf '[kind] %s\n' "$*" >&2; }
cleanup() { [[ -n "${KEEP:-}" ]] || kind delete cluster --name "$name" >/dev/null 2>&1 || true; }
trap cleanup EXIT

kind get clusters 2>/dev/null | grep -qx "$name" || kind create cluster --name "$name" --wait 120s
kubectl config use-context "kind-$name" >/dev/null
log "building $image"
docker build -t "$image" "$repo"
kind load docker-image "$image" --name "$name"

log "installing KEDA $KEDA_VERSION and the chart"
helm repo add kedacore https://kedacore.github.io/charts >/dev/null 2>&1 || true
helm upgrade --install keda kedacore/keda -n keda --create-namespace --version "$KEDA_VERSION" --wait --timeout 5m
helm upgrade --install tidegate "$repo/charts/tidegate" -n tidegate-system --create-namespace \
	--set image.repository=tidegate --set image.tag=e2e --set image.pullPolicy=Never --wait --timeout 5m

log "a sim-backend pool: 1 active, 1 warm"
kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f -
(cd "$repo" && TIDEGATE_E2E_IMAGE="$image" "${PYTHON:-$repo/.venv/bin/python}" -c '
import json; from tests.e2e.conftest import pool_body
print(json.dumps(pool_body("kind", replicas=1, warm=1, max_replicas=3, min_replicas=1)))') |
	kubectl apply -n "$ns" -f -
wait_count() { # wait_count ROLE N
	for _ in $(seq 120); do
		[[ "$(kubectl get pods -n "$ns" -l "tidegate.dev/pool=kind,tidegate.dev/role=$1" \
			--field-selector=status.phase=Running -o name | wc -l)" -ge "$2" ]] && return 0
		sleep 2
	done
	log "timed out waiting for $2 $1 pod(s)"; kubectl get pods -n "$ns" -o wide; return 1
}
wait_count active 1
wait_count warm 1
kubectl wait -n "$ns" --for=condition=Ready scaledobject/kind --timeout=120s

log "kubectl scale -> the warm replica is promoted"
kubectl scale -n "$ns" inferencepool/kind --replicas 2
start=$SECONDS
wait_count active 2
log "2 active after $((SECONDS - start)) s"

log "a request through the Service"
kubectl port-forward -n "$ns" svc/kind 18081:8081 >/dev/null 2>&1 &
pf=$!
sleep 3
code="$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:18081/v1/chat/completions \
	-H 'content-type: application/json' -H 'x-tenant-id: acme' \
	-d '{"model":"sim-llama-3.1-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":4}')"
kill "$pf"
[[ "$code" == 200 ]] || { log "chat completion answered $code"; exit 1; }

log "deleting the pool removes its children"
kubectl delete -n "$ns" inferencepool/kind --wait=true
for kind in deployment service configmap scaledobject; do
	kubectl wait -n "$ns" --for=delete "$kind" -l tidegate.dev/pool=kind --timeout=60s 2>/dev/null || true
	[[ -z "$(kubectl get "$kind" -n "$ns" -l tidegate.dev/pool=kind -o name)" ]] || { log "$kind left behind"; exit 1; }
done
log "ok"
