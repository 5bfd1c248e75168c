{{/* Chart name, possibly overridden. */}}
{{- define "dra-driver.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Prefix of every object name: "<release>-<chart>", or just the release when it already contains the chart name. */}}
{{- define "dra-driver.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "dra-driver.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "dra-driver.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "dra-driver.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: dra-driver
{{- end -}}

{{/* Selector labels; call with (dict "ctx" $ "component" "kubelet-plugin"). */}}
{{- define "dra-driver.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dra-driver.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "dra-driver.image" -}}
{{- printf "%s:%s" .Values.image.repository (toString (default .Chart.AppVersion .Values.image.tag)) -}}
{{- end -}}

{{- define "dra-driver.pluginServiceAccount" -}}
{{- default (printf "%s-kubelet-plugin" (include "dra-driver.fullname" .)) .Values.serviceAccount.kubeletPluginName -}}
{{- end -}}

{{- define "dra-driver.controllerServiceAccount" -}}
{{- default (printf "%s-controller" (include "dra-driver.fullname" .)) .Values.serviceAccount.controllerName -}}
{{- end -}}

{{/* Comma-separated sharing strategies the plugin accepts. */}}
{{- define "dra-driver.sharingStrategies" -}}
{{- $s := list "Exclusive" -}}
{{- if .Values.sharing.timeSlicing.enabled }}{{ $s = append $s "TimeSlicing" }}{{ end -}}
{{- if .Values.sharing.mps.enabled }}{{ $s = append $s "MPS" }}{{ end -}}
{{- join "," $s -}}
{{- end -}}

{{/* The driver name: NVIDIA's under apiProfile nvidia (driverName may then only be left as it is or
     say gpu.nvidia.com), else driverName (which may not be NVIDIA's), as the plugin decides it. */}}
{{- define "dra-driver.driverName" -}}
{{- if eq .Values.apiProfile "nvidia" -}}
{{- if not (has .Values.driverName (list "gpu.dra-driver.io" "gpu.nvidia.com")) -}}
{{- fail (printf "apiProfile nvidia publishes as gpu.nvidia.com, the name NVIDIA's classes and selectors read: unset driverName (it says %s)" .Values.driverName) -}}
{{- end -}}
gpu.nvidia.com
{{- else if eq .Values.driverName "gpu.nvidia.com" -}}
{{- fail "driverName gpu.nvidia.com is NVIDIA's DRA driver's: it goes with apiProfile nvidia, whose names its claims and classes read" -}}
{{- else -}}
{{- .Values.driverName -}}
{{- end -}}
{{- end -}}

{{/* CEL selecting this driver's devices of one type; call with (dict "driver" (include "dra-driver.driverName" .) "type" "gpu"). */}}
{{- define "dra-driver.celType" -}}
device.driver == '{{ .driver }}' && device.attributes['{{ .driver }}'].type == '{{ .type }}'
{{- end -}}

{{/* Whether an init container installs the image's nvidia-cdi-hook on the host: only the NVML
     backend writes the driver's CDI edits, whose hooks the runtime runs on the host. */}}
{{- define "dra-driver.installCdiHook" -}}
{{- if and (eq .Values.gpuBackend "nvml") .Values.nvml.driverEdits (eq .Values.nvml.cdiHook.source "install") }}true{{ end -}}
{{- end -}}

{{/* Host directory the image's nvidia-cdi-hook is installed into. */}}
{{- define "dra-driver.cdiHookInstallDir" -}}
{{- default (printf "/var/lib/dra-driver/%s/bin" (include "dra-driver.driverName" .)) (trimSuffix "/" .Values.nvml.cdiHook.installDir) -}}
{{- end -}}

{{/* nvidia-cdi-hook as the host's runtime finds it, named in every claim's CDI spec. */}}
{{- define "dra-driver.cdiHookPath" -}}
{{- if include "dra-driver.installCdiHook" . -}}
{{- printf "%s/nvidia-cdi-hook" (include "dra-driver.cdiHookInstallDir" .) -}}
{{- else -}}
{{- .Values.nvml.cdiHook.hostPath -}}
{{- end -}}
{{- end -}}

{{/* Kubelet directories on the host: set explicitly, or under kubelet.rootDir. */}}
{{- define "dra-driver.registryDir" -}}
{{- .Values.kubelet.registryDir | default (printf "%s/plugins_registry" (trimSuffix "/" .Values.kubelet.rootDir)) | trimSuffix "/" -}}
{{- end }}

{{- define "dra-driver.pluginsDir" -}}
{{- .Values.kubelet.pluginsDir | default (printf "%s/plugins" (trimSuffix "/" .Values.kubelet.rootDir)) | trimSuffix "/" -}}
{{- end }}

{{/* The plugin pod's affinity: kubeletPlugin.affinity, with a nodeAffinity to the nodes labelled
     as having NVIDIA GPUs (any of kubeletPlugin.gpuNodeLabels = "true") unless it brings its own. */}}
{{- define "dra-driver.pluginAffinity" -}}
{{- $p := .Values.kubeletPlugin }}
{{- $affinity := deepCopy ($p.affinity | default dict) }}
{{- if and $p.gpuNodeLabels (not (hasKey $affinity "nodeAffinity")) }}
{{- $terms := list }}
{{- range $p.gpuNodeLabels }}
{{- $terms = append $terms (dict "matchExpressions" (list (dict "key" . "operator" "In" "values" (list "true")))) }}
{{- end }}
{{- $_ := set $affinity "nodeAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (dict "nodeSelectorTerms" $terms)) }}
{{- end }}
{{- if $affinity }}{{ toYaml $affinity }}{{ end }}
{{- end -}}

{{/* "true" when the plugin DaemonSet selects the Node `.node` (call with (dict "ctx" $ "node" $node)):
     its nodeSelector and the required node affinity of dra-driver.pluginAffinity (matchExpressions
     with In, NotIn, Exists, DoesNotExist; Gt, Lt and matchFields count as matching, so a node is
     checked rather than skipped). Taints are not looked at. */}}
{{- define "dra-driver.pluginSelectsNode" -}}
{{- $labels := .node.metadata.labels | default dict }}
{{- $ok := true }}
{{- range $k, $v := .ctx.Values.kubeletPlugin.nodeSelector }}
{{- if ne (toString (get $labels $k)) (toString $v) }}{{ $ok = false }}{{ end }}
{{- if not (hasKey $labels $k) }}{{ $ok = false }}{{ end }}
{{- end }}
{{- $affinity := include "dra-driver.pluginAffinity" .ctx | fromYaml }}
{{- $terms := dig "nodeAffinity" "requiredDuringSchedulingIgnoredDuringExecution" "nodeSelectorTerms" list $affinity }}
{{- if and $ok $terms }}
{{- $any := false }}
{{- range $term := $terms }}
{{- $all := true }}
{{- range $e := ($term.matchExpressions | default list) }}
{{- $has := hasKey $labels $e.key }}
{{- $value := toString (get $labels $e.key) }}
{{- $values := $e.values | default list }}
{{- if and (eq $e.operator "In") (not (and $has (has $value $values))) }}{{ $all = false }}{{ end }}
{{- if and (eq $e.operator "NotIn") $has (has $value $values) }}{{ $all = false }}{{ end }}
{{- if and (eq $e.operator "Exists") (not $has) }}{{ $all = false }}{{ end }}
{{- if and (eq $e.operator "DoesNotExist") $has }}{{ $all = false }}{{ end }}
{{- end }}
{{- if $all }}{{ $any = true }}{{ end }}
{{- end }}
{{- $ok = $any }}
{{- end }}
{{- if $ok }}true{{ end }}
{{- end -}}

{{/* Name of the allocation-fence ValidatingAdmissionPolicy and its binding: the release's own,
     so that two releases never replace or delete each other's. */}}
{{- define "dra-driver.fenceName" -}}
{{- printf "%s-allocation-fence" (include "dra-driver.fullname" .) -}}
{{- end -}}
