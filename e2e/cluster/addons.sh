# KEDA and Karpenter beside the local control plane, as host processes (sourced by cluster.sh,
# which defines bin, kubeconfig, addons, here, kc, log and module_dir).
#
# KEDA v${KEDA_VERSION}: the operator (scale loop, HPA owner, gRPC metrics service), the metrics
# API server (`cmd/adapter`, serving external.metrics.k8s.io to the HPA controller) and the
# admission webhooks. In a cluster they reach each other through Services; here everything is on
# loopback on free ports:
# - one CA and one certificate (serverAuth + clientAuth) per cluster, whose SANs cover 127.0.0.1,
#   localhost and KEDA's Service names; the operator's gRPC link to the adapter is mutual TLS
#   with it (KEDA reads ca.crt, tls.crt, tls.key from --cert-dir: pkg/metricsservice/utils/tls.go);
# - the aggregated API: an ExternalName Service (externalName 127.0.0.1) and the APIService
#   v1beta1.external.metrics.k8s.io at the adapter's port with the CA as caBundle (Endpoints
#   holding 127.x addresses are refused by the API server's validation);
# - the webhooks: clientConfig.url at 127.0.0.1 (KEDA's config/webhooks/validation_webhooks.yaml,
#   same paths and rules, url instead of service);
# - env WATCH_NAMESPACE="" (all namespaces), POD_NAMESPACE and KEDA_CLUSTER_OBJECT_NAMESPACE = keda
#   (KEDA's Makefile `run` target), leader election and certificate rotation off.
# Karpenter v${KARPENTER_VERSION}, kwok provider: configured by environment only (KUBECONFIG,
# DISABLE_LEADER_ELECTION, METRICS_PORT, HEALTH_PROBE_PORT, INSTANCE_TYPES_FILE_PATH:
# pkg/operator/options and kwok/options in sigs.k8s.io/karpenter). The instance types file
# replaces the provider's built-in (GPU-less) types: H100 types with 1, 2 and 8 `nvidia.com/gpu`,
# and a CPU type; single-value offering requirements (instance-gpu-name, ...) become node labels.
# NodePools must reference a KWOKNodeClass (karpenter.kwok.sh/v1alpha1); `default` is created.

ADDONS=(keda-operator keda-adapter keda-webhooks karpenter)

free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

addon_pid() { # addon_pid NAME -> pid of the running addon, or nothing
	local pid
	pid="$(cat "$addons/$1.pid" 2>/dev/null)" || return 0
	# the pid file may outlive its process: only a live process running our binary counts
	if [[ -n "$pid" ]] && [[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" == "$bin/"* ]]; then echo "$pid"; fi
}

addons_running() {
	local a
	for a in "${ADDONS[@]}"; do [[ -n "$(addon_pid "$a")" ]] || return 1; done
}

start_addon() { # start_addon NAME BINARY [ARGS...]; env from the caller
	local name="$1" binary="$2"
	shift 2
	setsid "$bin/$binary" "$@" >"$addons/$name.log" 2>&1 </dev/null &
	echo $! >"$addons/$name.pid"
}

wait_http() { # wait_http URL WHAT LOG
	local deadline=$((SECONDS + 120))
	until curl -fsS -o /dev/null "$1" 2>/dev/null; do
		if ((SECONDS > deadline)); then
			log "$2 not ready after 120 s; last lines of $3:"
			tail -n 20 "$3" >&2
			return 1
		fi
		sleep 0.5
	done
}

make_certs() {
	local dir="$addons/certs" sans="DNS:localhost,IP:127.0.0.1" svc
	mkdir -p "$dir" "$addons/ca"
	for svc in keda-operator keda-metrics-apiserver keda-admission-webhooks; do
		sans+=",DNS:$svc,DNS:$svc.keda,DNS:$svc.keda.svc,DNS:$svc.keda.svc.cluster.local"
	done
	openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=tidegate-local-keda-ca" \
		-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
		-keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
	openssl req -newkey rsa:2048 -nodes -subj "/CN=keda" -keyout "$dir/tls.key" -out "$dir/tls.csr" 2>/dev/null
	printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\nbasicConstraints=CA:FALSE\n' \
		"$sans" >"$dir/ext.cnf"
	openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
		-days 3650 -extfile "$dir/ext.cnf" -out "$dir/tls.crt" 2>/dev/null
	# --ca-dir must hold CA certificates only (KEDA loads every file in it as a CA)
	cp "$dir/ca.crt" "$addons/ca/ca.crt"
}

keda_objects() { # keda_objects ADAPTER_PORT WEBHOOK_PORT CA_BUNDLE -> manifests on stdout
	local adapter_port="$1" webhook_port="$2" ca="$3" entry group resource path
	cat <<EOF
apiVersion: v1
kind: Service
metadata: {name: keda-metrics-apiserver, namespace: keda}
spec:
  type: ExternalName
  externalName: 127.0.0.1
  ports: [{name: https, port: $adapter_port, protocol: TCP}]
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1beta1.external.metrics.k8s.io}
spec:
  service: {name: keda-metrics-apiserver, namespace: keda, port: $adapter_port}
  group: external.metrics.k8s.io
  version: v1beta1
  caBundle: $ca
  groupPriorityMinimum: 100
  versionPriority: 100
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: keda-admission}
webhooks:
EOF
	for entry in keda.sh/scaledobjects keda.sh/scaledjobs keda.sh/triggerauthentications \
		keda.sh/clustertriggerauthentications eventing.keda.sh/cloudeventsources \
		eventing.keda.sh/clustercloudeventsources; do
		group="${entry%/*}" resource="${entry#*/}"
		path="/validate-${group//./-}-v1alpha1-${resource%s}"
		cat <<EOF
- name: v${resource%s}.kb.io
  admissionReviewVersions: [v1]
  clientConfig: {url: "https://127.0.0.1:$webhook_port$path", caBundle: $ca}
  failurePolicy: Ignore
  matchPolicy: Equivalent
  rules: [{apiGroups: [$group], apiVersions: [v1alpha1], operations: [CREATE, UPDATE], resources: [$resource]}]
  sideEffects: None
  timeoutSeconds: 10
EOF
	done
}

addons_up() {
	if addons_running; then
		log "KEDA and Karpenter already running (logs under $addons)"
		return 0
	fi
	addons_down
	mkdir -p "$addons"
	make_certs
	local certs="$addons/certs" ca
	ca="$(base64 -w0 <"$certs/ca.crt")"
	local grpc=$(free_port) op_metrics=$(free_port) op_probe=$(free_port)
	local adapter=$(free_port) adapter_metrics=$(free_port)
	local webhook=$(free_port) wh_metrics=$(free_port) wh_probe=$(free_port)
	local kp_metrics=$(free_port) kp_probe=$(free_port)
	printf 'KEDA_GRPC_PORT=%s\nKEDA_ADAPTER_PORT=%s\nKEDA_WEBHOOK_PORT=%s\nKARPENTER_HEALTH_PORT=%s\n' \
		"$grpc" "$adapter" "$webhook" "$kp_probe" >"$addons/ports.env"

	kc create namespace keda --dry-run=client -o yaml | kc apply -f - >/dev/null
	log "starting KEDA v$KEDA_VERSION (operator, metrics API server, webhooks) and Karpenter v$KARPENTER_VERSION (kwok provider)"
	local start=$SECONDS
	(
		export KUBECONFIG="$kubeconfig" WATCH_NAMESPACE="" POD_NAMESPACE=keda KEDA_CLUSTER_OBJECT_NAMESPACE=keda
		start_addon keda-operator keda-operator --leader-elect=false --enable-cert-rotation=false \
			--cert-dir="$certs" --ca-dir="$addons/ca" \
			--metrics-bind-address="127.0.0.1:$op_metrics" --health-probe-bind-address="127.0.0.1:$op_probe" \
			--metrics-service-bind-address="127.0.0.1:$grpc" --zap-log-level=info
		start_addon keda-adapter keda-adapter --secure-port="$adapter" --bind-address=127.0.0.1 \
			--cert-dir="$certs" --tls-cert-file="$certs/tls.crt" --tls-private-key-file="$certs/tls.key" \
			--lister-kubeconfig="$kubeconfig" --authentication-kubeconfig="$kubeconfig" \
			--authorization-kubeconfig="$kubeconfig" --metrics-service-address="127.0.0.1:$grpc" \
			--port="$adapter_metrics"
		start_addon keda-webhooks keda-webhooks --cert-dir="$certs" --port="$webhook" \
			--metrics-bind-address="127.0.0.1:$wh_metrics" --health-probe-bind-address="127.0.0.1:$wh_probe"
	)
	(
		export KUBECONFIG="$kubeconfig" DISABLE_LEADER_ELECTION=true METRICS_PORT="$kp_metrics" \
			HEALTH_PROBE_PORT="$kp_probe" INSTANCE_TYPES_FILE_PATH="$here/manifests/gpu-instance-types.json"
		start_addon karpenter karpenter-kwok
	)
	keda_objects "$adapter" "$webhook" "$ca" | kc apply -f - >/dev/null
	kc apply -f - >/dev/null <<EOF
apiVersion: karpenter.kwok.sh/v1alpha1
kind: KWOKNodeClass
metadata: {name: default}
EOF
	wait_http "http://127.0.0.1:$op_probe/readyz" "KEDA operator" "$addons/keda-operator.log"
	wait_http "http://127.0.0.1:$wh_probe/readyz" "KEDA webhooks" "$addons/keda-webhooks.log"
	wait_http "http://127.0.0.1:$kp_probe/readyz" "Karpenter" "$addons/karpenter.log"
	kc wait --for condition=Available --timeout=120s apiservice/v1beta1.external.metrics.k8s.io >/dev/null || {
		log "the KEDA metrics API server is not available; last lines of $addons/keda-adapter.log:"
		tail -n 20 "$addons/keda-adapter.log" >&2
		return 1
	}
	log "KEDA and Karpenter up in $((SECONDS - start)) s (logs under $addons)"
}

addons_down() {
	local a pid
	for a in "${ADDONS[@]}"; do
		pid="$(addon_pid "$a")"
		if [[ -n "$pid" ]]; then
			kill "$pid" 2>/dev/null || true
			for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
			kill -9 "$pid" 2>/dev/null || true
		fi
		rm -f "$addons/$a.pid"
	done
	if answering; then # what points at the stopped processes would only time out
		kc delete --ignore-not-found --wait=false apiservice/v1beta1.external.metrics.k8s.io \
			validatingwebhookconfiguration/keda-admission >/dev/null 2>&1 || true
	fi
}

addons_status() {
	local keda=up karpenter=up a
	for a in keda-operator keda-adapter keda-webhooks; do [[ -n "$(addon_pid "$a")" ]] || keda=down; done
	[[ -n "$(addon_pid karpenter)" ]] || karpenter=down
	echo "KEDA v$KEDA_VERSION: $keda; Karpenter v$KARPENTER_VERSION (kwok provider): $karpenter; logs under $addons"
}
