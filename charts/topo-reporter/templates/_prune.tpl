{{/*
The prune hook's names and labels (prune-hook.yaml, prune-admission-policy.yaml): its own name
and selector labels, so that neither the DaemonSet, the agents' metrics Service nor the doctor's
agent selector ever picks the prune Job's pod.
*/}}
{{- define "topo-reporter.pruneName" -}}
{{- printf "%s-prune" (include "topo-reporter.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{- define "topo-reporter.pruneLabels" -}}
helm.sh/chart: {{ include "topo-reporter.chart" . }}
app.kubernetes.io/name: {{ printf "%s-prune" (include "topo-reporter.name" . | trunc 57 | trimSuffix "-") }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: prune
app.kubernetes.io/part-of: topo-reporter
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The prune Job's Kubernetes username, as the API server sees its service account token. */}}
{{- define "topo-reporter.pruneUsername" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "topo-reporter.pruneName" .) }}
{{- end }}

{{/*
"true" when the policy confining the prune Job is rendered: with prune.enabled, under the
admissionPolicy.enabled switch (whatever the sink: prune also cleans Nodes a node sink wrote
before a switch to nodefeature).
*/}}
{{- define "topo-reporter.prunePolicyEnabled" -}}
{{- $mode := toString .Values.admissionPolicy.enabled }}
{{- if .Values.prune.enabled }}
{{- if eq $mode "true" }}true
{{- else if and (eq $mode "auto") (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") }}true
{{- end }}
{{- end }}
{{- end }}

{{/* The metadata.annotations of a hook object: Helm's hook annotations, then commonAnnotations. */}}
{{- define "topo-reporter.pruneHookAnnotations" }}
  annotations:
    helm.sh/hook: pre-delete
    helm.sh/hook-weight: {{ .weight | quote }}
    helm.sh/hook-delete-policy: {{ .policy }}
    {{- with .root.Values.commonAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}
