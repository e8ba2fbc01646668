{{/* Object names start with this: the release name unless overridden. */}}
{{- define "nodefabric.fullname" -}}
{{- default .Release.Name .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* Helm's own labels on every object, beside the part-of label deploy/ sets. */}}
{{- define "nodefabric.labels" -}}
app.kubernetes.io/part-of: nodefabric
{{ include "nodefabric.helmLabels" . }}
{{- end -}}

{{/* Helm's own labels alone (the CRD, which deploy/ leaves unlabelled). */}}
{{- define "nodefabric.helmLabels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "nodefabric.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The seed's block, as the binaries read it. */}}
{{- define "nodefabric.rails" -}}
{{- toYaml .Values.nodeMetadata.plugins.gpuNicRailMapping -}}
{{- end -}}

{{/* "true" when the rail mapping runs: the broker, the observer and their RBAC. */}}
{{- define "nodefabric.railsOn" -}}
{{- if .Values.nodeMetadata.plugins.gpuNicRailMapping.enabled }}true{{ end -}}
{{- end -}}

{{/* "true" when the broker runs nvidia-smi in the GPU Operator's pod. */}}
{{- define "nodefabric.gpuExec" -}}
{{- $g := .Values.nodeMetadata.plugins.gpuNicRailMapping.gpuSource | default dict -}}
{{- if and (include "nodefabric.railsOn" .) $g.gpuOperatorNamespace $g.daemonSet }}true{{ end -}}
{{- end -}}

{{/* The ConfigMap holding the rails config file (never the shared record). */}}
{{- define "nodefabric.railsConfigName" -}}
{{ include "nodefabric.fullname" . }}-rails-config
{{- end -}}

{{- define "nodefabric.railsConfigDir" -}}/etc/nodefabric/rails{{- end -}}
{{- define "nodefabric.railsConfigFile" -}}gpuNicRailMapping.yaml{{- end -}}

{{/* The rail source's name, empty when the mapping is off. */}}
{{- define "nodefabric.railSource" -}}
{{- $r := .Values.nodeMetadata.plugins.gpuNicRailMapping -}}
{{- if and (include "nodefabric.railsOn" .) $r.railSource }}{{ $r.railSource.name }}{{ end -}}
{{- end -}}

{{/*
The interval publisher's arguments (after `--sysfs-root=/host/sys publish`).
*/}}
{{- define "nodefabric.publishArgs" -}}
- --features-dir={{ .Values.publisher.featuresDir }}
- --cdi-dir={{ .Values.publisher.cdiDir }}
- --state-dir={{ .Values.publisher.stateDir }}
{{- if include "nodefabric.railsOn" . }}
- --rails-config={{ include "nodefabric.railsConfigDir" . }}/{{ include "nodefabric.railsConfigFile" . }}
{{- if eq .Values.railRecord "custom-resource" }}
- --rails-record=custom-resource
{{- end }}
{{- if eq (include "nodefabric.railSource" .) "host-lldp" }}
- --lldp-socket={{ .Values.publisher.lldpdSocket }}
{{- end }}
{{- end }}
{{- if ne .Values.publisher.logLevel "warn" }}
- --log-level={{ .Values.publisher.logLevel }}
{{- end }}
{{- end -}}

{{/* The publisher's mounts, shared by both modes. */}}
{{- define "nodefabric.publishMounts" -}}
- name: sys
  mountPath: /host/sys
  readOnly: true
- name: features-d
  mountPath: {{ .Values.publisher.featuresDir }}
- name: cdi
  mountPath: {{ .Values.publisher.cdiDir }}
- name: state
  mountPath: {{ .Values.publisher.stateDir }}
{{- if include "nodefabric.railsOn" . }}
- name: rails-config
  mountPath: {{ include "nodefabric.railsConfigDir" . }}
  readOnly: true
{{- if eq (include "nodefabric.railSource" .) "host-lldp" }}
- name: lldpd-socket
  mountPath: {{ .Values.publisher.lldpdSocket }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The publisher container's security context, shared by both modes. */}}
{{- define "nodefabric.rootNoCaps" -}}
runAsUser: 0
runAsNonRoot: false
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
{{- end -}}

{{- define "nodefabric.nodeNameEnv" -}}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- end -}}

{{/* The node label whose value `dra` moves a node from the device plugin to the DRA driver. */}}
{{- define "nodefabric.draLabel" -}}nodefabric.gpustack.ai/rdma-allocator{{- end -}}
