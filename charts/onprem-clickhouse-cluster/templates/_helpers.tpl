{{/* The ClickHouseCluster's name: a DNS label (the operator names its objects after it). */}}
{{- define "onprem-clickhouse-cluster.name" -}}
{{- default .Release.Name .Values.nameOverride | trunc 40 | trimSuffix "-" }}
{{- end }}

{{- define "onprem-clickhouse-cluster.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "onprem-clickhouse-cluster.usersSecretName" -}}
{{- default (printf "%s-user-passwords" (include "onprem-clickhouse-cluster.name" .)) .Values.usersSecret.name }}
{{- end }}
