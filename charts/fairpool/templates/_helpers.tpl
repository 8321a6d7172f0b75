{{/*
fullname: the release name (or fullnameOverride), at most 49 characters so that
"<fullname>-gateway-admin" is still a 63-character DNS label.
*/}}
{{- define "fairpool.fullname" -}}
{{- default .Release.Name .Values.fullnameOverride | trunc 49 | trimSuffix "-" -}}
{{- end -}}

{{- define "fairpool.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "fairpool.labels" -}}
helm.sh/chart: {{ include "fairpool.chart" . }}
app.kubernetes.io/name: fairpool
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: fairpool
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "gateway"). */}}
{{- define "fairpool.selectorLabels" -}}
app.kubernetes.io/name: fairpool
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "fairpool.componentLabels" -}}
{{ include "fairpool.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* An image reference: (dict "root" $ "image" .Values.images.gateway "name" "gateway").
The repository defaults to <images.registry>/<name>; a digest pins it, so the tag (default the
appVersion) only names images that are not pinned. */}}
{{- define "fairpool.image" -}}
{{- $registry := trimSuffix "/" .root.Values.images.registry -}}
{{- $repository := .image.repository | default (printf "%s/%s" $registry .name) -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "fairpool.operator.name" -}}
{{- printf "%s-operator" (include "fairpool.fullname" .) -}}
{{- end -}}

{{- define "fairpool.gateway.name" -}}
{{- printf "%s-gateway" (include "fairpool.fullname" .) -}}
{{- end -}}

{{- define "fairpool.gatewayAdmin.name" -}}
{{- printf "%s-gateway-admin" (include "fairpool.fullname" .) -}}
{{- end -}}

{{- define "fairpool.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create -}}
{{- default (include "fairpool.operator.name" .) .Values.operator.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.operator.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "fairpool.gateway.serviceAccountName" -}}
{{- if .Values.gateway.serviceAccount.create -}}
{{- default (include "fairpool.gateway.name" .) .Values.gateway.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.gateway.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The pod-level security context shared by every pod of the chart. */}}
{{- define "fairpool.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.podSecurity.runAsUser }}
runAsGroup: {{ .Values.podSecurity.runAsGroup }}
fsGroup: {{ .Values.podSecurity.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The container-level security context shared by every container of the chart. */}}
{{- define "fairpool.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.podSecurity.runAsUser }}
runAsGroup: {{ .Values.podSecurity.runAsGroup }}
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The Secret holding the admin API's bearer token (key `token`). */}}
{{- define "fairpool.adminToken.secretName" -}}
{{- default (printf "%s-gateway-admin-token" (include "fairpool.fullname" .)) .Values.gateway.adminToken.existingSecret -}}
{{- end -}}

{{/* The NetworkPolicy peer of Prometheus: its namespace, and its pods' labels there. */}}
{{- define "fairpool.monitoringPeer" -}}
namespaceSelector:
  matchLabels:
    kubernetes.io/metadata.name: {{ .Values.networkPolicy.monitoring.namespace | quote }}
podSelector:
  {{- with .Values.networkPolicy.monitoring.podLabels }}
  matchLabels:
    {{- toYaml . | nindent 4 }}
  {{- else }} {}
  {{- end }}
{{- end -}}

{{/* Whether the gateway's replicas share state: "true" with more than one pod or more
than one process a pod (gateway.workers), else "". */}}
{{- define "fairpool.sharedState.enabled" -}}
{{- if or (gt (int .Values.gateway.replicas) 1) (gt (int .Values.gateway.workers) 1) }}true{{ end -}}
{{- end -}}

{{/* Whether the chart runs the bundled Valkey: shared state and no url of the user's. */}}
{{- define "fairpool.sharedState.bundled" -}}
{{- if and (include "fairpool.sharedState.enabled" .) (not .Values.gateway.sharedState.url) }}true{{ end -}}
{{- end -}}

{{- define "fairpool.sharedState.name" -}}
{{- printf "%s-shared-state" (include "fairpool.fullname" .) -}}
{{- end -}}

{{/* The URL the gateways share: the user's, or the bundled Valkey's Service. */}}
{{- define "fairpool.sharedState.url" -}}
{{- if .Values.gateway.sharedState.url -}}
{{- .Values.gateway.sharedState.url -}}
{{- else -}}
{{- printf "redis://%s.%s:6379/0" (include "fairpool.sharedState.name" .) .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* The first part of every key and channel the gateways use (sharedState.keyPrefix):
the value's, or <namespace>.<fullname>, one per release on a server that several share. */}}
{{- define "fairpool.sharedState.keyPrefix" -}}
{{- default (printf "%s.%s" .Release.Namespace (include "fairpool.fullname" .)) .Values.gateway.sharedState.keyPrefix -}}
{{- end -}}

{{/* The ACL user the gateways log in as: the value's; with the bundled Valkey,
fairpool-gateway by default; "" (the server's default user) with your own url and none. */}}
{{- define "fairpool.sharedState.username" -}}
{{- if .Values.gateway.sharedState.username -}}
{{- .Values.gateway.sharedState.username -}}
{{- else if include "fairpool.sharedState.bundled" . -}}
fairpool-gateway
{{- end -}}
{{- end -}}

{{/* The bundled Valkey's ACL rule for the gateways' user, less its password: the release's
keys and channels alone, and the commands the gateway sends, nothing else (no KEYS, FLUSHALL,
CONFIG, DEBUG, MODULE...). docs/gateway.md ("Shared state is not trusted") gives it for a
server of your own; tests/test_shared_state_acl.py runs two gateways under it. */}}
{{- define "fairpool.sharedState.aclRule" -}}
{{- $prefix := include "fairpool.sharedState.keyPrefix" . -}}
{{- $commands := list "ping" "time" "select" "evalsha" "script|load" "script|exists" "type" "del" "expire" "pexpire" "hget" "hgetall" "hset" "hdel" "hincrby" "hincrbyfloat" "zadd" "zrem" "zcard" "zscore" "zrange" "zrangebyscore" "zremrangebyscore" "xadd" "xrange" "xrevrange" "publish" "subscribe" "unsubscribe" -}}
{{- printf "%s on resetkeys resetchannels ~%s:* &%s:* -@all +%s" (include "fairpool.sharedState.username" .) $prefix $prefix (join " +" $commands) -}}
{{- end -}}

{{/* The Secret holding the server's password (key `password`), or "" for none. */}}
{{- define "fairpool.sharedState.secretName" -}}
{{- if .Values.gateway.sharedState.existingSecret -}}
{{- .Values.gateway.sharedState.existingSecret -}}
{{- else if include "fairpool.sharedState.bundled" . -}}
{{- include "fairpool.sharedState.name" . -}}
{{- end -}}
{{- end -}}

{{/* The Secrets the operator makes when missing, as NAME/KEY/LENGTH (FAIRPOOL_GENERATED_SECRETS):
the admin token and the bundled Valkey's password, unless they are Secrets of your own. The
chart renders no random value, so a renderer without cluster access (Argo CD, Flux,
`helm template`) renders the same objects every time. */}}
{{- define "fairpool.generatedSecrets" -}}
{{- $generated := list -}}
{{- if not .Values.gateway.adminToken.existingSecret -}}
{{- $generated = append $generated (printf "%s/token/48" (include "fairpool.adminToken.secretName" .)) -}}
{{- end -}}
{{- if and (include "fairpool.sharedState.bundled" .) (not .Values.gateway.sharedState.existingSecret) -}}
{{- $generated = append $generated (printf "%s/password/40" (include "fairpool.sharedState.name" .)) -}}
{{- end -}}
{{- join "," $generated -}}
{{- end -}}

{{/* The names of images.pullSecrets, comma-separated (what the operator gives engine pods). */}}
{{- define "fairpool.pullSecretNames" -}}
{{- join "," .Values.images.pullSecrets -}}
{{- end }}

{{/* Whether a Prometheus Operator object is rendered: its value is true, or "auto" and the
cluster serves its API (.Capabilities: the cluster's for helm install and Argo CD; for
`helm template`, what --api-versions says). Call with (dict "root" . "enabled" VALUE "api"
"monitoring.coreos.com/v1/ServiceMonitor"). */}}
{{- define "fairpool.monitorEnabled" -}}
{{- if eq (toString .enabled) "true" -}}true
{{- else if and (eq (toString .enabled) "auto") (.root.Capabilities.APIVersions.Has .api) -}}true
{{- end -}}
{{- end -}}
