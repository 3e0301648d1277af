{{/*
Names and labels shared by every template. Object names are truncated to 63 characters because
some Kubernetes name fields are limited to a DNS label.
*/}}

{{- define "topo-reporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "topo-reporter.fullname" -}}
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

{{- define "topo-reporter.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: immutable on a DaemonSet, so nothing configurable goes in here. */}}
{{- define "topo-reporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "topo-reporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "topo-reporter.labels" -}}
helm.sh/chart: {{ include "topo-reporter.chart" . }}
{{ include "topo-reporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: node-agent
app.kubernetes.io/part-of: topo-reporter
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The metadata.annotations block of every object, or nothing; include it right after labels. */}}
{{- define "topo-reporter.annotations" -}}
{{- with .Values.commonAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
{{- end }}
{{- end }}

{{- define "topo-reporter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "topo-reporter.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "topo-reporter.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
"true" when the ValidatingAdmissionPolicy is to be installed, else empty. `auto` asks Helm's
view of the cluster (.Capabilities, filled from the API server's discovery on install and
upgrade, from --api-versions under `helm template`). The value may be a bool or the string
"auto", hence the comparison on its string form.
*/}}
{{- define "topo-reporter.admissionPolicyEnabled" -}}
{{- $mode := toString .Values.admissionPolicy.enabled }}
{{- if eq .Values.agent.sink "node" }}
{{- if eq $mode "true" }}true
{{- else if and (eq $mode "auto") (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") }}true
{{- end }}
{{- end }}
{{- end }}

{{/*
"true" when the policy confining the agent to its own NodeResourceTopology is rendered: with
nrt.enabled, whatever the sink, under the same admissionPolicy.enabled switch.
*/}}
{{- define "topo-reporter.nrtPolicyEnabled" -}}
{{- $mode := toString .Values.admissionPolicy.enabled }}
{{- if .Values.nrt.enabled }}
{{- if eq $mode "true" }}true
{{- else if and (eq $mode "auto") (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") }}true
{{- end }}
{{- end }}
{{- end }}

{{/*
"true" when the policy confining the agent to DeviceTaintRules of its own node's pool is rendered:
with dra.deviceTaints, under the same admissionPolicy.enabled switch.
*/}}
{{- define "topo-reporter.deviceTaintPolicyEnabled" -}}
{{- $mode := toString .Values.admissionPolicy.enabled }}
{{- if .Values.dra.deviceTaints }}
{{- if eq $mode "true" }}true
{{- else if and (eq $mode "auto") (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") }}true
{{- end }}
{{- end }}
{{- end }}

{{/*
"true" when the agents renew heartbeat Leases and the extender judges nodes by them: with
availability on (the Lease vouches for the availability keys) and availability.heartbeat.enabled.
*/}}
{{- define "topo-reporter.heartbeat" -}}
{{- if and .Values.availability.enabled .Values.availability.heartbeat.enabled }}true{{- end }}
{{- end }}

{{/*
"true" when the policy confining the agent to its own node's heartbeat Lease is rendered: with the
heartbeat on, under the same admissionPolicy.enabled switch.
*/}}
{{- define "topo-reporter.leasePolicyEnabled" -}}
{{- $mode := toString .Values.admissionPolicy.enabled }}
{{- if include "topo-reporter.heartbeat" . }}
{{- if eq $mode "true" }}true
{{- else if and (eq $mode "auto") (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") }}true
{{- end }}
{{- end }}
{{- end }}

{{/*
"true" when the policy confining the agent's Events to its own Node is rendered: whatever the
sink (both post Events), under the same admissionPolicy.enabled switch.
*/}}
{{- define "topo-reporter.eventPolicyEnabled" -}}
{{- $mode := toString .Values.admissionPolicy.enabled }}
{{- if eq $mode "true" }}true
{{- else if and (eq $mode "auto") (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") }}true
{{- end }}
{{- end }}

{{/* The agent's Kubernetes username, as the API server sees its service account token. */}}
{{- define "topo-reporter.serviceAccountUsername" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "topo-reporter.serviceAccountName" .) }}
{{- end }}

{{/*
The scheduler extender's objects: their own name and selector, so that neither the DaemonSet nor
the agents' metrics Service ever selects an extender pod.
*/}}
{{- define "topo-reporter.extenderName" -}}
{{- printf "%s-extender" (include "topo-reporter.fullname" . | trunc 54 | trimSuffix "-") }}
{{- end }}

{{- define "topo-reporter.extenderSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-extender" (include "topo-reporter.name" . | trunc 54 | trimSuffix "-") }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "topo-reporter.extenderLabels" -}}
helm.sh/chart: {{ include "topo-reporter.chart" . }}
{{ include "topo-reporter.extenderSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: scheduler-extender
app.kubernetes.io/part-of: topo-reporter
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- /*
The one foreign key family the agent writes, adds, changes and removes, with network.labelStyle
topograph only: NVIDIA Topograph's tier labels, by exact key
(reporter.schema.keys.TOPOGRAPH_TIER_KEYS), as a CEL regex.
*/ -}}
{{- define "topo-reporter.topographTierKeys" -}}
^fabric[.]topograph[.]run/tier-[012]$
{{- end }}
