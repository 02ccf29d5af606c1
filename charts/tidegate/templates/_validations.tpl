{{/*
Impossible values fail the render with a message that says what to change. values.schema.json
checks types and ranges; these are the rules that span fields.
*/}}
{{- define "tidegate.validate" -}}
{{- $op := .Values.operator }}
{{- $sc := .Values.scaler }}
{{- $image := .Values.image }}
{{- if and (or $op.enabled $sc.enabled) (not $image.repository) }}
{{- fail (printf `image.repository is not set, and tidegate publishes no image. Build it from the repository's Dockerfile, push it where the cluster pulls from, and name it:
  docker build -t REGISTRY/tidegate:%[1]s . && docker push REGISTRY/tidegate:%[1]s
  helm install ... --set image.repository=REGISTRY/tidegate
(the tag defaults to the chart's appVersion %[1]s; image.tag or image.digest choose another)` .Chart.AppVersion) }}
{{- end }}
{{- if regexMatch "(:[^/]*|@.*)$" $image.repository }}
{{- fail (printf "image.repository %q carries a tag or digest: give the repository alone and the rest as image.tag or image.digest" $image.repository) }}
{{- end }}
{{- if and $op.enabled (ne (int $op.replicas) 1) }}
{{- fail "operator.replicas must be 1: the operator runs kopf --standalone (no peering), and two replicas would both reconcile every pool" }}
{{- end }}
{{- if and $sc.tls.enabled (not $sc.tls.secretName) }}
{{- fail "scaler.tls.enabled needs scaler.tls.secretName: a kubernetes.io/tls Secret with tls.crt and tls.key" }}
{{- end }}
{{- if and $sc.tls.clientAuth (not $sc.tls.enabled) }}
{{- fail "scaler.tls.clientAuth (mTLS) needs scaler.tls.enabled=true" }}
{{- end }}
{{- if and $sc.enabled (eq (int $sc.port) (int $sc.metricsPort)) }}
{{- fail (printf "scaler.port and scaler.metricsPort are both %d: give them different ports" (int $sc.port)) }}
{{- end }}
{{- if and $sc.enabled $sc.podDisruptionBudget.enabled (ge (int $sc.podDisruptionBudget.minAvailable) (int $sc.replicas)) }}
{{- fail (printf "scaler.podDisruptionBudget.minAvailable (%d) must be below scaler.replicas (%d), or node drains block forever (or set scaler.podDisruptionBudget.enabled=false)" (int $sc.podDisruptionBudget.minAvailable) (int $sc.replicas)) }}
{{- end }}
{{- if and $op.enabled (not $sc.enabled) (not $op.scalerAddress) }}
{{- fail "scaler.enabled=false needs operator.scalerAddress: the host:port of a tidegate scaler KEDA can reach" }}
{{- end }}
{{- if and .Values.alerts.enabled (not (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1")) }}
{{- fail "alerts.enabled needs the Prometheus Operator's PrometheusRule (monitoring.coreos.com/v1), which this cluster does not serve: install the Prometheus Operator (e.g. kube-prometheus-stack) or set alerts.enabled=false (helm template: pass --api-versions monitoring.coreos.com/v1)" }}
{{- end }}
{{- if and .Values.monitoring.serviceMonitor.enabled $sc.enabled (eq (int $sc.metricsPort) 0) (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") }}
{{- fail "monitoring.serviceMonitor.enabled needs scaler.metricsPort > 0 (or set monitoring.serviceMonitor.enabled=false)" }}
{{- end }}
{{- end }}
