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

{{/*
The manager's configuration: its environment, and the token and CA files it reads.
One definition for the Deployment and for the `helm test` pod (templates/tests), so that
`helm test` checks the release exactly as it runs.
*/}}
{{- define "autonomic.env" -}}
{{- $m := .Values.manager -}}
- name: AUTONOMIC_MANAGED
  value: {{ $m.managed | quote }}
- name: AUTONOMIC_BASE_URL
  value: {{ $m.baseURL | quote }}
# The token is a file from the Secret (below), re-read before every dial and
# watched while waiting to dial again: no restart on creation or rotation.
- name: AUTONOMIC_AUTH_TOKEN_FILE
  value: /var/run/secrets/autonomic/auth/token
{{- with $m.clusterID }}
- name: AUTONOMIC_CLUSTER_ID
  value: {{ . | quote }}
{{- end }}
- name: AUTONOMIC_TRANSPORT
  value: {{ $m.transport | quote }}
{{- if $m.allowInsecure }}
- name: AUTONOMIC_ALLOW_INSECURE
  value: "true"
{{- end }}
{{- if include "autonomic.hasCA" . }}
- name: AUTONOMIC_CA_FILE
  value: /etc/autonomic/ca/ca.crt
{{- end }}
{{- with $m.proxy.httpsProxy }}
- name: HTTPS_PROXY
  value: {{ . | quote }}
{{- end }}
{{- with $m.proxy.noProxy }}
- name: NO_PROXY
  value: {{ . | quote }}
{{- end }}
# Comma-separated namespaces to watch; empty watches all.
- name: AUTONOMIC_NAMESPACES
  value: {{ join "," $m.watchNamespaces | quote }}
- name: AUTONOMIC_AGENTLET_IMAGE
  value: {{ include "autonomic.image" (list $m.agentlet.image .) | quote }}
- name: AUTONOMIC_AGENTLET_RESOURCES
  value: {{ toJson $m.agentlet.resources | quote }}
- name: AUTONOMIC_LEADER_ELECTION
  value: {{ $m.leaderElection | quote }}
- name: AUTONOMIC_LOG_FORMAT
  value: {{ $m.log.format | quote }}
- name: AUTONOMIC_LOG
  value: {{ $m.log.level | quote }}
- name: AUTONOMIC_MAX_SESSIONS
  value: {{ $m.maxSessions | quote }}
- name: AUTONOMIC_ROLL_MAX
  value: {{ $m.rollMax | quote }}
- name: AUTONOMIC_POD_SECURITY
  value: {{ $m.podSecurity | quote }}
{{- /* int64: Helm reads a values file's numbers as floats, 1.048576e+06 */}}
- name: AUTONOMIC_MAX_SPEC_BYTES
  value: {{ $m.maxSpecBytes | int64 | quote }}
- name: AUTONOMIC_WIRE_ENV_VALUES
  value: {{ $m.wire.envValues | quote }}
- name: AUTONOMIC_SHELL_ENABLED
  value: {{ $m.shell.enabled | quote }}
- name: AUTONOMIC_CONTROL_ACTIONS
  value: {{ $m.control.actions | join "," | default "none" | quote }}
- name: AUTONOMIC_PROBE_ADDR
  value: ":8081"
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
# Link Events go on the manager's pod; `kubectl describe pod` finds them by uid.
- name: POD_UID
  valueFrom:
    fieldRef:
      fieldPath: metadata.uid
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- with $m.extraEnv }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end -}}

{{- define "autonomic.volumeMounts" -}}
{{- $m := .Values.manager -}}
- name: auth
  mountPath: /var/run/secrets/autonomic/auth
  readOnly: true
{{- if include "autonomic.hasCA" . }}
- name: ca
  mountPath: /etc/autonomic/ca
  readOnly: true
{{- end }}
{{- end -}}

{{- define "autonomic.volumes" -}}
{{- $m := .Values.manager -}}
# optional: the Secret may come after the install; the kubelet fills the volume
# when it appears and refreshes it when it changes.
- name: auth
  secret:
    secretName: {{ $m.authTokenSecret.name }}
    optional: true
    items:
      - key: {{ $m.authTokenSecret.key }}
        path: token
{{- if include "autonomic.hasCA" . }}
- name: ca
  configMap:
    name: {{ include "autonomic.caConfigMap" . }}
    items:
      - key: {{ if $m.caBundle.configMapName }}{{ $m.caBundle.configMapKey }}{{ else }}ca.crt{{ end }}
        path: ca.crt
{{- end }}
{{- end -}}
