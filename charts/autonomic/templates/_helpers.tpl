{{/* Names. One release per namespace: the Lease is named after the manager. */}}
{{- define "autonomic.fullname" -}}
{{- printf "%s-manager" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Cluster-scoped objects carry the namespace too: two installs must not collide. */}}
{{- define "autonomic.clusterName" -}}
{{- printf "%s-%s" (include "autonomic.fullname" .) .Release.Namespace | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "autonomic.selectorLabels" -}}
app.kubernetes.io/name: autonomic-manager
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "autonomic.labels" -}}
{{ include "autonomic.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: autonomic
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* registry/repository[:tag][@digest]; the registry from the image, else global, else ghcr.io. */}}
{{- define "autonomic.image" -}}
{{- $img := index . 0 -}}
{{- $root := index . 1 -}}
{{- $registry := $img.registry | default $root.Values.global.imageRegistry | default "ghcr.io" -}}
{{- $tag := $img.tag | default $root.Chart.AppVersion -}}
{{- if $img.digest -}}
{{- printf "%s/%s@%s" $registry $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s/%s:%s" $registry $img.repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "autonomic.caConfigMap" -}}
{{- if .Values.manager.caBundle.configMapName -}}
{{- .Values.manager.caBundle.configMapName -}}
{{- else -}}
{{- printf "%s-ca" (include "autonomic.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "autonomic.hasCA" -}}
{{- if or .Values.manager.caBundle.pem .Values.manager.caBundle.configMapName -}}true{{- end -}}
{{- end -}}

{{/*
The rules the manager needs in every namespace it watches; each says why.
No `update` anywhere. The caches see only objects labelled managed-by=autonomic, so
`get` remains where the manager must look at a same-named object that is not its own
(to refuse to touch it) or one the user names.
*/}}
{{/*
Interactive shells into agents' containers, and ending a shell's process: granted only
where they can be used (TRUST.md section 6), in managed mode over the WebSocket with
manager.shell.enabled. The exec is a WebSocket upgrade, a GET, which the API server
authorizes as `get`; newer API servers also check `create`. Both are needed.
*/}}
{{- define "autonomic.shellRules" -}}
{{- $m := .Values.manager -}}
{{- if and $m.managed $m.shell.enabled (eq $m.transport "ws") -}}
- apiGroups: [""]
  resources: ["pods/exec"]
  verbs: ["get", "create"]
{{- end -}}
{{- end -}}

{{/*
The control plane's `control` actions on Agents and Tools, granted only where they can
be asked (TRUST.md section 6), in managed mode with the action in
manager.control.actions: `pause` and `resume` set spec.paused (an Agent) or
spec.disabled (a Tool) by a merge patch; `delete` deletes the object. (`restart`
deletes the pod, which the workload rules grant anyway: a pod is recreated.)
*/}}
{{- define "autonomic.controlRules" -}}
{{- $m := .Values.manager -}}
{{- $a := $m.control.actions -}}
{{- if and $m.managed (or (has "pause" $a) (has "resume" $a)) }}
- apiGroups: ["autonomic.sh"]
  resources: ["agents", "tools"]
  verbs: ["patch"]
{{- end -}}
{{- if and $m.managed (has "delete" $a) }}
- apiGroups: ["autonomic.sh"]
  resources: ["agents", "tools"]
  verbs: ["delete"]
{{- end -}}
{{- end -}}

{{- define "autonomic.workloadRules" -}}
# The custom resources: watched (list/watch) into caches. Never written but for their
# status (the control plane's pause, resume and delete: autonomic.controlRules).
- apiGroups: ["autonomic.sh"]
  resources: ["agents", "tools", "runtimes", "memories"]
  verbs: ["list", "watch"]
# Status is written through the status subresource only (merge patch).
- apiGroups: ["autonomic.sh"]
  resources: ["agents/status", "tools/status", "runtimes/status", "memories/status"]
  verbs: ["patch"]
# Agent and Tool pods: watched (only those labelled managed-by=autonomic), created,
# deleted to recreate or pause; get when a create meets a pod of the same name, to
# tell ours from a stranger's. Never patched: pods are not modified in place.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete"]
# Tool Services and Agent/Memory Secrets: server-side applied (patch; create when
# the apply creates), watched by label; get before an apply that the cache cannot
# vouch for, so that a same-named object that is not ours is never taken over. On
# Secrets, get is also what a Memory's `secretRef` needs, which RBAC cannot narrow by
# label: the manager reads only Secrets offered to agents (label
# autonomic.sh/agents=allowed, watched by that label, names only), and never logs or
# sends their data.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch", "create", "patch"]
# The ServiceAccounts offered to agents (label autonomic.sh/agents=allowed), watched
# by that label, names only: an Agent runs as no other (TRUST.md section 2).
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["list", "watch"]
# Events, so `kubectl describe` tells what happened: on the custom resources, and on
# the manager's own pod for the control-plane link (rbac.yaml adds a Role in the
# release namespace when only other namespaces are watched).
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}
