{{/* Names, labels and the image reference shared by every template. */}}

{{- define "tidegate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-tidegate, or the release name alone when it already contains the chart name. */}}
{{- define "tidegate.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 54 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "tidegate.operator.fullname" -}}
{{- printf "%s-operator" (include "tidegate.fullname" .) }}
{{- end }}

{{- define "tidegate.scaler.fullname" -}}
{{- printf "%s-scaler" (include "tidegate.fullname" .) }}
{{- end }}

{{- define "tidegate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tidegate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tidegate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tidegate.labels" -}}
helm.sh/chart: {{ include "tidegate.chart" . }}
{{ include "tidegate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tidegate
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "tidegate.operator.selectorLabels" -}}
{{ include "tidegate.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "tidegate.operator.labels" -}}
{{ include "tidegate.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "tidegate.scaler.selectorLabels" -}}
{{ include "tidegate.selectorLabels" . }}
app.kubernetes.io/component: scaler
{{- end }}

{{- define "tidegate.scaler.labels" -}}
{{ include "tidegate.labels" . }}
app.kubernetes.io/component: scaler
{{- end }}

{{- define "tidegate.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "tidegate.operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "tidegate.scaler.serviceAccountName" -}}
{{- if .Values.scaler.serviceAccount.create }}
{{- default (include "tidegate.scaler.fullname" .) .Values.scaler.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.scaler.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag, or repository@digest when a digest is given. */}}
{{- define "tidegate.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The scaler address ScaledObjects point KEDA at: the chart's scaler Service unless overridden. */}}
{{- define "tidegate.scalerAddress" -}}
{{- if .Values.operator.scalerAddress }}
{{- .Values.operator.scalerAddress }}
{{- else }}
{{- printf "%s.%s.svc:%d" (include "tidegate.scaler.fullname" .) .Release.Namespace (int .Values.scaler.port) }}
{{- end }}
{{- end }}

{{- define "tidegate.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
