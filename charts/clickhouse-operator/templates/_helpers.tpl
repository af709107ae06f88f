{{/* Chart name, truncated to the 63 characters of a label value. */}}
{{- define "clickhouse-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified name: the release name, followed by the chart name unless it contains it. */}}
{{- define "clickhouse-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "clickhouse-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "clickhouse-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "clickhouse-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "clickhouse-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "clickhouse-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "clickhouse-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "clickhouse-operator.pvcCleanerName" -}}
{{- printf "%s-pvc-cleaner" (include "clickhouse-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "clickhouse-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "clickhouse-operator.leaseName" -}}
{{- default (printf "%s-leader" (include "clickhouse-operator.fullname" .)) .Values.leaderElection.leaseName }}
{{- end }}

{{/*
The watched namespaces as a list: empty means all namespaces (cluster-wide RBAC).
Blanks and empty items are dropped and duplicates removed, as the operator parses WATCH_NAMESPACE.
*/}}
{{- define "clickhouse-operator.watchNamespaces" -}}
{{- $out := list }}
{{- range (splitList "," (default "" .Values.watchNamespace)) }}
{{- $ns := trim . }}
{{- if and $ns (not (has $ns $out)) }}
{{- $out = append $out $ns }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/* rbac.webIdentityNamespaces as a list, as watchNamespaces. */}}
{{- define "clickhouse-operator.webIdentityNamespaces" -}}
{{- $out := list }}
{{- range (.Values.rbac.webIdentityNamespaces | default list) }}
{{- $ns := trim . }}
{{- if and $ns (not (has $ns $out)) }}
{{- $out = append $out $ns }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
What the operator does to the objects of a ClickHouseCluster. Every rule is used; the comment says
where. tests/helm/in_cluster/lifecycle.rs checks against the API server's audit log that no request
of the operator is denied and that every rule here is used during a create, scale-out, scale-in,
roll, pause and delete. No wildcard anywhere.
*/}}
{{- define "clickhouse-operator.operatorRules" -}}
# ClickHouseClusters: the controller lists and watches them (kube-runtime reflector); a pass
# reads one again (get) when the cache is older than the operator's own last write, so that it
# never plans from a stale status; the finalizer is added and removed with a merge patch.
- apiGroups: ["clickhouse.com"]
  resources: ["clickhouseclusters"]
  verbs: ["get", "list", "watch", "patch"]
# ClickHouseBackups: watched by their controller and by the cluster controller (is a backup in
# flight?), listed by an incremental backup (its base), by the schedules and by a pass that
# reads the API server instead of its caches; read by name by a restore;
# created by a schedule when a slot is due and deleted by its retention.
- apiGroups: ["clickhouse.com"]
  resources: ["clickhousebackups"]
  verbs: ["get", "list", "watch", "create", "delete"]
# ClickHouseRestores: watched by their controller; never written but for their status.
- apiGroups: ["clickhouse.com"]
  resources: ["clickhouserestores"]
  verbs: ["list", "watch"]
# status of all three (state, conditions, replicaStateMap): one server-side-apply patch per pass.
- apiGroups: ["clickhouse.com"]
  resources: ["clickhouseclusters/status", "clickhousebackups/status", "clickhouserestores/status"]
  verbs: ["patch"]
# One StatefulSet per replica and per Keeper ensemble: watched into the passes' cache and listed by
# label when a pass reads the API server after its own writes,
# created, applied (patch), deleted on scale-in, and recreated with orphaned pods when an immutable
# field changes, e.g. a volume grows (delete; a later pass creates it once it is gone). Read by
# name (get) when a hand edit is repaired: its managed fields, which the caches keep only in
# part, say what another writer added (this holds for every kind the operator applies).
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# ClickHouse and Keeper configuration, and the client and headless Services: observed, watched,
# created, applied when they change, read by name to repair a hand edit, and deleted when no
# longer wanted (a removed replica's ConfigMap, the client Service switched off).
- apiGroups: [""]
  resources: ["configmaps", "services"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Secrets: the operator's credentials (<cluster>-operator) are created once; the users Secret it
# renders for ClickHouse is created and applied (patch) when a password changes; the Secrets the
# clusters own (by label) are listed and watched into the passes' cache; the Secrets a cluster
# references (spec.users.secretName, TLS) are read by name (get) when their resourceVersion
# changed; every Secret's metadata is listed and watched so that a changed password triggers a pass. No delete: the operator only
# deletes a Secret that carries its cluster label and that it does not render, which none of its
# flows produces; the cluster's Secrets go with the cluster (owner references).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch", "create", "patch"]
# One PodDisruptionBudget per shard and for Keeper: observed, watched, created, applied when
# maxUnavailable changes, read by name to repair a hand edit, deleted with a removed shard.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# NetworkPolicies of the server and Keeper pods (spec.networkPolicy): watched into the passes'
# cache, created, applied when the peers change, read by name to repair a hand edit, deleted
# when switched off.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# EndpointSlices of a cluster's client Service: listed while a replica is removed, whose shard
# is synced and tables dropped only once the Service no longer routes to its pod.
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["list"]
# Pods: observed and watched (readiness, revision); labels patched to take a replica out of the
# client Service before a restart or scale-in; deleted to restart a pod on its new revision.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "patch", "delete"]
# PVCs: watched into the passes' cache (list, watch); grown in place (patch spec.resources) and
# labelled clickhouse.com/delete-pvc for the PVC cleaner (patch). The operator itself never
# deletes one.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["list", "watch", "patch"]
# Backups: one agent Job per shard beside the shard's backup replica (created; read by name;
# listed and watched to follow it; deleted with its pod once the backup's outcome is recorded);
# its pod's termination message is read from the pod list.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
# Events about a cluster (events.k8s.io/v1): created, and patched when the same event repeats.
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{/*
The previous run's log of a server or Keeper container in CrashLoopBackOff: its last error line,
credentials masked, is the status' reason for the crash loop (nothing else of a log is read).
In the watched namespaces' Roles; cluster-wide only with rbac.clusterWidePodLogs (decision 72).
*/}}
{{- define "clickhouse-operator.podLogRules" -}}
# a crash-looping container's previous log: its last error line is the crash loop's reason
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
{{- end }}

{{/*
Backups with webIdentity (decision 43): the destination's ServiceAccount is read by name (does
it opt in with the label clickhouse.com/s3-credentials?) and a 10-minute token of it, with the
destination's audience, is requested to check the bucket and read and write manifests. Only in
the namespaces of rbac.webIdentityNamespaces (decision 72): elsewhere no token is minted.
*/}}
{{- define "clickhouse-operator.webIdentityRules" -}}
# the destination's ServiceAccount, read by name: does it opt in?
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get"]
# the token of that ServiceAccount (TokenRequest), exchanged with STS, never stored
- apiGroups: [""]
  resources: ["serviceaccounts/token"]
  verbs: ["create"]
{{- end }}

{{/* What the PVC cleaner does: nothing else. */}}
{{- define "clickhouse-operator.pvcCleanerRules" -}}
# PVCs labelled clickhouse.com/delete-pvc=true are watched, listed and deleted once no pod
# mounts them.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["list", "watch", "delete"]
# Which PVCs are still mounted: every pod of the namespace is listed.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
{{- end }}

{{- define "clickhouse-operator.pvcDeleteKeyName" -}}
{{- printf "%s-pvc-delete-key" (include "clickhouse-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "clickhouse-operator.exporterCredentialsName" -}}
{{- printf "%s-exporter-credentials" (include "clickhouse-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
PVC_DELETE_KEY of the operator and the PVC cleaner: from pvcDeleteKey.existingSecret when set
(made outside the chart, so that a GitOps render never changes it), else from the chart's Secret.
*/}}
{{- define "clickhouse-operator.pvcDeleteKeyEnv" -}}
- name: PVC_DELETE_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.pvcDeleteKey.existingSecret | default (include "clickhouse-operator.pvcDeleteKeyName" .) }}
      key: {{ .Values.pvcDeleteKey.key | default "key" }}
{{- end }}

{{/*
OPERATOR_NETWORKS: `operatorNetworks`, required (decision 71). Nothing is looked up in the
cluster: the Nodes' pod CIDRs miss Nodes added later and the addresses CNIs with their own
pools hand out, and a lookup renders differently with and without a cluster (`helm template`,
Argo CD, Flux). Where the API allows, peers are chosen by selector instead (the clusters'
NetworkPolicies let the operator's pods in by OPERATOR_POD_SELECTOR and namespace); a
ClickHouse account's networks are addresses, so they must be given.
*/}}
{{- define "clickhouse-operator.operatorNetworks" -}}
{{- if not .Values.operatorNetworks }}
{{- fail "operatorNetworks is required: the CIDRs every pod of the cluster gets its address from (the whole pod network: kubeadm's podSubnet, the --cluster-cidr, Calico's or Cilium's IP pools, with the AWS VPC CNI the VPC's subnets), not the pod CIDR of one Node. The operator's, the exporter's and the backup agents' ClickHouse accounts accept logins only from these, and the operator refuses to start on an address outside them. Example: --set operatorNetworks={10.244.0.0/16}" }}
{{- end }}
{{- join "," .Values.operatorNetworks }}
{{- end }}

{{/* The label naming the ClickHouseCluster on the servers' series (exporter, PodMonitor). */}}
{{- define "clickhouse-operator.serverClusterLabel" -}}
{{- .Values.exporter.clusterLabel | default "clickhouse_cluster" }}
{{- end }}

{{/* The label naming the ClickHouseCluster on the operator's per-cluster series. */}}
{{- define "clickhouse-operator.operatorClusterLabel" -}}
{{- .Values.metrics.clusterLabel | default "clickhouse_cluster" }}
{{- end }}

{{/*
A dashboard of dashboards/ (written for the default names: ClickHouse's own, the label
clickhouse_cluster) named as the values name the series: with exporter.metricNames operator the
servers' figures take the earlier names, and the cluster label of each selector is the one of
its series, metrics.clusterLabel for the operator's (clickhouse_operator_*) and
exporter.clusterLabel for the others. Called with (list $ text).
*/}}
{{- define "clickhouse-operator.dashboard" -}}
{{- $ := index . 0 }}
{{- $text := index . 1 }}
{{- if eq ($.Values.exporter.metricNames | default "clickhouse") "operator" }}
{{- $text = regexReplaceAll "ClickHouseMetrics_([A-Za-z0-9_:]+)" $text "clickhouse_metric_${1}" }}
{{- $text = regexReplaceAll "ClickHouseProfileEvents_([A-Za-z0-9_:]+)" $text "clickhouse_event_${1}_total" }}
{{- $text = regexReplaceAll "ClickHouseAsyncMetrics_([A-Za-z0-9_:]+)" $text "clickhouse_asynchronous_metric_${1}" }}
{{- end }}
{{- $text = regexReplaceAll "(clickhouse_operator_[A-Za-z0-9_]+\\{[^}]*)clickhouse_cluster=" $text "${1}OPERATOR_CLUSTER_LABEL=" }}
{{- $text = regexReplaceAll "(label_values\\(clickhouse_operator_[^,]*, *)clickhouse_cluster\\)" $text "${1}OPERATOR_CLUSTER_LABEL)" }}
{{- $text = replace "clickhouse_cluster" (include "clickhouse-operator.serverClusterLabel" $) $text }}
{{- replace "OPERATOR_CLUSTER_LABEL" (include "clickhouse-operator.operatorClusterLabel" $) $text }}
{{- end }}
