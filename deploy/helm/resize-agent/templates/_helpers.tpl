{{/* The labels every object carries, as deploy/base gives them, plus Helm's own. */}}
{{- define "resize-agent.labels" -}}
app.kubernetes.io/name: resize-agent
{{ include "resize-agent.commonLabels" . }}
{{- end }}

{{/* What deploy/base puts on every object (kustomize labels:), plus Helm's own. */}}
{{- define "resize-agent.commonLabels" -}}
app.kubernetes.io/part-of: resize-agent
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Pod selector: fixed, as in deploy/base, so that an upgrade from one to the other keeps the DaemonSet. */}}
{{- define "resize-agent.selector" -}}
app.kubernetes.io/name: resize-agent
{{- end }}
