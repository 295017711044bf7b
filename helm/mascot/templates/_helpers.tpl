{{/* Names, labels, images and the pieces shared by the gateway, the model services, the hooks and the Jobs. */}}

{{- define "mascot.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-mascot, or the release name when it already contains the chart name; at most 40 characters so that
     "<fullname>-<component>-predictor" stays a valid 63-character DNS label. */}}
{{- define "mascot.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "mascot.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels of one component: (dict "ctx" $ "component" "gateway"). */}}
{{- define "mascot.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mascot.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* All labels of one component's objects: (dict "ctx" $ "component" "gateway"). */}}
{{- define "mascot.labels" -}}
{{ include "mascot.selectorLabels" . }}
helm.sh/chart: {{ include "mascot.chart" .ctx }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: mascot
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The service image: (dict "ctx" $ "gpu" true|false). GPU: repository:tag (or @digest); CPU: repository:cpuTag. */}}
{{- define "mascot.image" -}}
{{- $img := .ctx.Values.image }}
{{- $tag := default .ctx.Chart.AppVersion $img.tag }}
{{- if .gpu }}
{{- if $img.digest }}{{ printf "%s@%s" $img.repository $img.digest }}{{ else }}{{ printf "%s:%s" $img.repository $tag }}{{ end }}
{{- else }}
{{- if $img.cpuDigest }}{{ printf "%s@%s" $img.repository $img.cpuDigest }}{{ else }}{{ printf "%s:%s" $img.repository (default (printf "%s-cpu" $tag) $img.cpuTag) }}{{ end }}
{{- end }}
{{- end }}

{{- define "mascot.trainingImage" -}}
{{- $img := .Values.trainingImage }}
{{- if $img.digest }}{{ printf "%s@%s" $img.repository $img.digest }}{{ else }}{{ printf "%s:%s" $img.repository (default .Chart.AppVersion $img.tag) }}{{ end }}
{{- end }}

{{/* imagePullSecrets of every pod: entries are {name: x} (the Kubernetes form) or plain names (older values). */}}
{{- define "mascot.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ if kindIs "map" . }}{{ .name }}{{ else }}{{ . }}{{ end }}
{{- end }}
{{- end }}
{{- end }}

{{/* The model components in a fixed order. */}}
{{- define "mascot.modelComponents" -}}
director speaker judge reward
{{- end }}

{{/* The components the generation service hosts on its one engine, as a JSON list: generation.components whose own
     section is enabled, in that order; [] when generation is disabled. */}}
{{- define "mascot.generationComponents" -}}
{{- $v := .Values }}
{{- $out := list }}
{{- if $v.generation.enabled }}
{{- range $c := $v.generation.components }}
{{- if (index $v $c).enabled }}{{ $out = append $out $c }}{{ end }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/* The model services the chart renders, in a fixed order: "generation" when it hosts any component, then each
     component it does not host. Each is a key of .Values with the same fields (grpcPort, gpu, replicas, pdb, ...);
     its workload, Services, config file, budget, scaler and scrape target are named after it. */}}
{{- define "mascot.modelServices" -}}
{{- $hosted := include "mascot.generationComponents" . | fromJsonArray }}
{{- $out := list }}
{{- if $hosted }}{{ $out = append $out "generation" }}{{ end }}
{{- range $c := splitList " " (include "mascot.modelComponents" .) }}
{{- if not (has $c $hosted) }}{{ $out = append $out $c }}{{ end }}
{{- end }}
{{- join " " $out }}
{{- end }}

{{/* The model service that serves a component: "generation" for a component it hosts, else the component itself
     (a service name maps to itself). (dict "ctx" $ "component" "speaker") */}}
{{- define "mascot.serviceOf" -}}
{{- if has .component (include "mascot.generationComponents" .ctx | fromJsonArray) }}generation{{ else }}{{ .component }}{{ end }}
{{- end }}

{{/* The `mascot serve-model` argument of a model service: its components, comma-separated. (dict "ctx" $ "component"
     "generation") */}}
{{- define "mascot.servedComponents" -}}
{{- if eq .component "generation" }}{{ include "mascot.generationComponents" .ctx | fromJsonArray | join "," }}{{ else }}{{ .component }}{{ end }}
{{- end }}

{{/* Name of a model service's ClusterIP Service: the one KServe creates for the predictor (<isvc>-predictor) or ours.
     It carries the REST port (the models ServiceMonitor scrapes /metrics through it, so it is the `service` label of
     the series); gRPC clients dial the headless Service instead (mascot.modelTarget). */}}
{{- define "mascot.modelHost" -}}
{{- if .ctx.Values.kserve.enabled }}
{{- printf "%s-%s-predictor" (include "mascot.fullname" .ctx) .component }}
{{- else }}
{{- printf "%s-%s" (include "mascot.fullname" .ctx) .component }}
{{- end }}
{{- end }}

{{/* Name of a model service's headless Service (templates/models-headless.yaml), in both the KServe and the
     Deployment form: (dict "ctx" $ "component" "speaker"). */}}
{{- define "mascot.modelHeadlessName" -}}
{{- printf "%s-%s-headless" (include "mascot.fullname" .ctx) .component }}
{{- end }}

{{/* The one gRPC target of a model service, for every client the chart configures (the gateway's director_target and
     speaker_target, the `helm test` Pod, NOTES): dns:///<headless>.<namespace>.svc.<clusterDomain>:<grpcPort> of the
     service that serves the component (mascot.serviceOf: generation for the components it hosts). The
     headless Service resolves to every ready pod, and channel() balances round_robin over them (chart README "Load
     balancing"). (dict "ctx" $ "component" "speaker") */}}
{{- define "mascot.modelTarget" -}}
{{- $ctx := .ctx }}
{{- $svc := include "mascot.serviceOf" . }}
{{- printf "dns:///%s.%s.svc.%s:%d" (include "mascot.modelHeadlessName" (dict "ctx" $ctx "component" $svc))
    $ctx.Release.Namespace $ctx.Values.clusterDomain (int (index $ctx.Values $svc).grpcPort) }}
{{- end }}

{{- define "mascot.gatewayTarget" -}}
{{- printf "%s-gateway:%d" (include "mascot.fullname" .) (int .Values.gateway.port) }}
{{- end }}

{{/* "true" when the control plane (`mascot serve --component control`: AdapterService, TrainingService) has
     something to do: an adapter store to manage or training runs to start; else "" and nothing of it renders. */}}
{{- define "mascot.controlPlaneEnabled" -}}
{{- if or .Values.adapters.store .Values.training.enabled }}true{{ end }}
{{- end }}

{{/* The control plane's address inside the cluster (its ClusterIP Service; never behind the Ingress). */}}
{{- define "mascot.controlTarget" -}}
{{- printf "%s-control:%d" (include "mascot.fullname" .) (int .Values.controlPlane.port) }}
{{- end }}

{{/* Parsed adapter store: {"scheme": "pvc"|"s3"|"", "claim": "<claim>"}. */}}
{{- define "mascot.adapterStore" -}}
{{- $uri := .Values.adapters.store }}
{{- if hasPrefix "pvc://" $uri }}
{{- $rest := trimPrefix "pvc://" $uri }}
{{- dict "scheme" "pvc" "claim" (first (splitList "/" $rest)) | toJson }}
{{- else if hasPrefix "s3://" $uri }}
{{- dict "scheme" "s3" "claim" "" | toJson }}
{{- else }}
{{- dict "scheme" "" "claim" "" | toJson }}
{{- end }}
{{- end }}

{{/* Storage URI of a model component ("" = none). */}}
{{- define "mascot.storageUri" -}}
{{- $c := index .ctx.Values .component }}
{{- if eq .component "reward" }}{{ $c.storageUri }}{{ else }}{{ default .ctx.Values.model.storageUri $c.storageUri }}{{ end }}
{{- end }}

{{/* "true" when the release serves TLS (tls.existingSecret names the Secret), else "". */}}
{{- define "mascot.tlsEnabled" -}}
{{- if .Values.tls.existingSecret }}true{{ end }}
{{- end }}

{{/* The files of the TLS Secret volume: Secret key -> server.tls setting (the file <mountPath>/<key>). */}}
{{- define "mascot.tlsFiles" -}}
tls.crt: cert_file
tls.key: key_file
{{- if .Values.tls.hasCA }}
ca.crt: ca_file
{{- end }}
{{- end }}

{{/* server.tls of every component (YAML; empty without TLS): the mounted Secret's files, client_auth, server_name. */}}
{{- define "mascot.tlsConfig" -}}
{{- $t := .Values.tls }}
{{- if include "mascot.tlsEnabled" . }}
{{- range $key, $setting := include "mascot.tlsFiles" . | fromYaml }}
{{ $setting }}: {{ printf "%s/%s" (trimSuffix "/" $t.mountPath) $key | quote }}
{{- end }}
{{- if $t.mutual }}
client_auth: true
{{- end }}
{{- with $t.serverName }}
server_name: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* The TLS Secret volume and its mount (empty without TLS): only the files server.tls names, so a key missing from
     the Secret keeps the pod from starting, by name. */}}
{{- define "mascot.tlsVolume" -}}
{{- if include "mascot.tlsEnabled" . }}
- name: tls
  secret:
    secretName: {{ .Values.tls.existingSecret }}
    defaultMode: 0440
    items:
      {{- range $key, $_ := include "mascot.tlsFiles" . | fromYaml }}
      - key: {{ $key }}
        path: {{ $key }}
      {{- end }}
{{- end }}
{{- end }}

{{- define "mascot.tlsMount" -}}
{{- if include "mascot.tlsEnabled" . }}
- name: tls
  mountPath: {{ .Values.tls.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{/* Secrets the code reads as files (a Secret volume, never an env var): the directory of each and its file.
     - the PostgreSQL URL (store.url_file): gateway, control plane, migrations hook;
     - the admin token (adapters.admin_token_file, publish.token_file): control plane, training pods;
     - the control plane's caller tokens (control.tokens_file), re-read when the Secret changes (no subPath);
     - the model services' REST token (server.rest_token_file). */}}
{{- define "mascot.storeUrlFile" -}}
/etc/mascot/store/url
{{- end }}

{{- define "mascot.adminTokenFile" -}}
/etc/mascot/admin-token/token
{{- end }}

{{- define "mascot.controlTokensFile" -}}
/etc/mascot/control-tokens/tokens
{{- end }}

{{- define "mascot.restTokenFile" -}}
/etc/mascot/rest-token/token
{{- end }}

{{/* A Secret key as one file, read-only for the pod's group: the volume and its mount, (dict "name" <volume name>
     "secret" <Secret> "key" <key> "file" <path of the file in the container>). Empty when "secret" is "". */}}
{{- define "mascot.secretFileVolume" -}}
{{- if .secret }}
- name: {{ .name }}
  secret:
    secretName: {{ .secret }}
    defaultMode: 0440
    items:
      - key: {{ .key }}
        path: {{ base .file }}
{{- end }}
{{- end }}

{{- define "mascot.secretFileMount" -}}
{{- if .secret }}
- name: {{ .name }}
  mountPath: {{ dir .file }}
  readOnly: true
{{- end }}
{{- end }}

{{/* The (dict ...) of mascot.secretFileVolume for the PostgreSQL URL (secret "" with SQLite), the model services'
     REST token and the admin token. */}}
{{- define "mascot.storeUrlSecret" -}}
{{- $pg := .Values.store.postgresql }}
{{- $secret := ternary $pg.existingSecret "" (eq .Values.store.type "postgresql") }}
{{- dict "name" "store-url" "secret" $secret "key" $pg.urlKey "file" (include "mascot.storeUrlFile" .) | toJson }}
{{- end }}

{{- define "mascot.restTokenSecret" -}}
{{- $r := .Values.models.restAuth }}
{{- dict "name" "rest-token" "secret" $r.existingSecret "key" $r.key "file" (include "mascot.restTokenFile" .) | toJson }}
{{- end }}

{{- define "mascot.adminTokenSecret" -}}
{{- $t := .Values.adminToken }}
{{- dict "name" "admin-token" "secret" $t.existingSecret "key" $t.key "file" (include "mascot.adminTokenFile" .) | toJson }}
{{- end }}

{{/* Where the gateway reads the caller tokens (security.caller_tokens_file): the callerAuth Secret's key mounted as
     the file "tokens". */}}
{{- define "mascot.callerTokensDir" -}}
/etc/mascot/caller-tokens
{{- end }}

{{- define "mascot.callerTokensFile" -}}
{{ include "mascot.callerTokensDir" . }}/tokens
{{- end }}

{{/* The gRPC health probe of a container's own gRPC port: (dict "ctx" $ "port" <port> "probe" <periodSeconds...>).
     Plaintext: a kubelet grpc probe. TLS: kubelet grpc probes cannot speak TLS, so an exec probe runs
     `mascot health` (mascot/health_cli.py), which reads the pod's own MascotConfig (MASCOT_CONFIG: server.tls, and
     under mutual TLS presents tls.crt) and checks 127.0.0.1:<port>; its deadline is a second under the probe's
     timeout. */}}
{{- define "mascot.healthProbe" -}}
{{- if include "mascot.tlsEnabled" .ctx }}
exec:
  command:
    - mascot
    - health
    - --port
    - {{ .port | quote }}
    - --timeout
    - {{ max 1 (sub (int (.probe.timeoutSeconds | default 1)) 1) | quote }}
{{- else }}
grpc:
  port: {{ .port }}
{{- end }}
{{ toYaml .probe }}
{{- end }}

{{/* The MascotConfig YAML of one component: chart-derived keys < .Values.config < <component>.config
     (controlPlane.config for the control plane). (dict "ctx" $ "component" "gateway"|"control"|"director"|...). */}}
{{- define "mascot.componentConfig" -}}
{{- $ctx := .ctx }}
{{- $v := $ctx.Values }}
{{- $comp := .component }}
{{- $cfg := dict "server" (dict "host" "0.0.0.0") }}
{{- with (include "mascot.tlsConfig" $ctx | fromYaml) }}{{ $_ := set $cfg.server "tls" . }}{{ end }}
{{- $personas := dict }}
{{- if $v.personas.sets }}
{{- $files := list }}
{{- range $name, $_ := $v.personas.sets }}
{{- $files = append $files (printf "/etc/mascot/personas/%s" $name) }}
{{- end }}
{{- $_ := set $personas "extra_files" $files }}
{{- end }}
{{- with $v.personas.activeSupport }}{{ $_ := set $personas "active_support" . }}{{ end }}
{{- with $v.personas.activeMeeting }}{{ $_ := set $personas "active_meeting" . }}{{ end }}
{{- if $personas }}{{ $_ := set $cfg "personas" $personas }}{{ end }}
{{- $adapters := dict }}
{{- if $v.adapters.store }}
{{- $_ := set $adapters "store" $v.adapters.store }}
{{- $_ := set $adapters "pvc_root" $v.adapters.pvcMountPath }}
{{- with $v.adapters.s3.endpointUrl }}{{ $_ := set $adapters "s3_endpoint_url" . }}{{ end }}
{{- end }}
{{- with $v.model.name }}{{ $_ := set $adapters "base_model" . }}{{ end }}
{{- /* The admin token names the control plane's legacy admin identity; the gateway serves no admin call. */}}
{{- if and (eq $comp "control") $v.adminToken.existingSecret }}
{{- $_ := set $adapters "admin_token_file" (include "mascot.adminTokenFile" $ctx) }}
{{- end }}
{{- if $adapters }}{{ $_ := set $cfg "adapters" $adapters }}{{ end }}
{{- /* The conversation store: PostgreSQL's URL (it holds the password) as a mounted file, or a SQLite file of the
       workload's own volume (the control plane keeps its audit trail apart from the gateway's conversations). */}}
{{- $store := dict }}
{{- if eq $v.store.type "postgresql" }}
{{- $store = dict "url_file" (include "mascot.storeUrlFile" $ctx) }}
{{- else if eq $comp "gateway" }}
{{- $store = dict "url" (printf "sqlite:///%s/mascot.db" $v.store.sqlite.mountPath) }}
{{- else if eq $comp "control" }}
{{- $store = dict "url" (printf "sqlite:///%s/control.db" $v.store.sqlite.mountPath) }}
{{- end }}
{{- if eq $comp "gateway" }}
{{- if $v.security.callerAuth.enabled }}
{{- $_ := set $cfg "security" (dict "caller_auth" true "caller_tokens_file" (include "mascot.callerTokensFile" $ctx)) }}
{{- end }}
{{- $_ := set $cfg.server "gateway_port" (int $v.gateway.port) }}
{{- $_ := set $cfg.server "metrics_port" (int $v.gateway.metricsPort) }}
{{- $_ := set $cfg.server "director_target" (include "mascot.modelTarget" (dict "ctx" $ctx "component" "director")) }}
{{- $_ := set $cfg.server "speaker_target" (include "mascot.modelTarget" (dict "ctx" $ctx "component" "speaker")) }}
{{- $_ := set $cfg.server "reflection" $v.gateway.reflection }}
{{- $_ := set $cfg "store" $store }}
{{- else if eq $comp "control" }}
{{- $cp := $v.controlPlane }}
{{- $_ := set $cfg.server "metrics_port" (int $cp.metricsPort) }}
{{- /* The promote gate replays situations through the speaker. */}}
{{- $_ := set $cfg.server "speaker_target" (include "mascot.modelTarget" (dict "ctx" $ctx "component" "speaker")) }}
{{- $_ := set $cfg "store" $store }}
{{- if $v.training.enabled }}
{{- /* TrainingService: the Job templates the control plane mounts (training.yaml); Jobs go to their namespace. */}}
{{- $_ := set $cfg "training" (dict "templates_dir" "/etc/mascot/training") }}
{{- end }}
{{- $control := dict "host" "0.0.0.0" "port" (int $cp.port) "reflection" $cp.reflection }}
{{- if $cp.tokens.existingSecret }}
{{- $_ := set $control "tokens_file" (include "mascot.controlTokensFile" $ctx) }}
{{- end }}
{{- if $cp.jwt.issuer }}
{{- $jwt := dict "issuer" $cp.jwt.issuer "audience" $cp.jwt.audience "jwks_url" $cp.jwt.jwksUrl }}
{{- $_ := set $jwt "role_claim" $cp.jwt.roleClaim }}
{{- $_ := set $control "jwt" $jwt }}
{{- end }}
{{- $_ := set $cfg "control" $control }}
{{- else }}
{{- $c := index $v $comp }}
{{- if $v.models.restAuth.existingSecret }}
{{- /* KServe REST inference needs the bearer token; health, readiness and /metrics stay open. */}}
{{- $_ := set $cfg.server "rest_token_file" (include "mascot.restTokenFile" $ctx) }}
{{- end }}
{{- $model := ternary "/mnt/models" "" (ne (include "mascot.storageUri" (dict "ctx" $ctx "component" $comp)) "") }}
{{- if eq $comp "reward" }}
{{- if $model }}{{ $_ := set $cfg "reward" (dict "model" $model) }}{{ end }}
{{- else }}
{{- $engine := dict }}
{{- if $c.gpu.enabled }}
{{- $engine = dict "kind" "vllm" "dtype" "bfloat16" }}
{{- end }}
{{- if $model }}{{ $_ := set $engine "model" $model }}{{ end }}
{{- if $engine }}{{ $_ := set $cfg "engine" $engine }}{{ end }}
{{- end }}
{{- end }}
{{- $own := (ternary $v.controlPlane (index $v $comp) (eq $comp "control")).config | default dict }}
{{- if eq $comp "generation" }}
{{- /* config < each hosted component's config (in generation.components order) < generation.config */}}
{{- $own = dict }}
{{- range $h := include "mascot.generationComponents" $ctx | fromJsonArray }}
{{- $own = mustMergeOverwrite $own (deepCopy ((index $v $h).config | default dict)) }}
{{- end }}
{{- $own = mustMergeOverwrite $own (deepCopy ($v.generation.config | default dict)) }}
{{- end }}
{{- $merged := mustMergeOverwrite $cfg (deepCopy ($v.config | default dict)) (deepCopy $own) }}
{{- /* A vLLM engine on GPUs shards the model over every GPU the pod requests (engine.tensor_parallel_size =
     gpu.count), unless config or <component>.config sets engine.tensor_parallel_size itself (that wins). */}}
{{- if not (has $comp (list "gateway" "control" "reward")) }}
{{- $gpu := (index $v $comp).gpu }}
{{- $engine := $merged.engine | default dict }}
{{- if and $gpu.enabled (eq (toString $engine.kind) "vllm") (not (hasKey $engine "tensor_parallel_size")) }}
{{- $_ := set $engine "tensor_parallel_size" (int $gpu.count) }}
{{- $_ := set $merged "engine" $engine }}
{{- end }}
{{- end }}
{{- toYaml $merged }}
{{- end }}

{{/* Writable scratch volumes of every pod (read-only root filesystem). */}}
{{- define "mascot.scratchVolumes" -}}
- name: home
  emptyDir:
    sizeLimit: {{ .Values.scratch.homeSizeLimit }}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.scratch.tmpSizeLimit }}
{{- end }}

{{- define "mascot.scratchMounts" -}}
- name: home
  mountPath: /home/mascot
- name: tmp
  mountPath: /tmp
{{- end }}

{{/* Environment shared by every mascot container. */}}
{{- define "mascot.baseEnv" -}}
- name: HOME
  value: /home/mascot
- name: PYTHONDONTWRITEBYTECODE
  value: "1"
- name: PYTHONUNBUFFERED
  value: "1"
{{- end }}

{{/* S3 credentials of the adapter store: a Secret holding an AWS shared credentials file (key "credentials"),
     mounted as a file and named by AWS_SHARED_CREDENTIALS_FILE (the standard AWS chain), never as env values. */}}
{{- define "mascot.s3Enabled" -}}
{{- $store := include "mascot.adapterStore" . | fromJson }}
{{- if and (eq $store.scheme "s3") .Values.adapters.s3.existingSecret }}true{{ end }}
{{- end }}

{{- define "mascot.s3Env" -}}
{{- if include "mascot.s3Enabled" . }}
- name: AWS_SHARED_CREDENTIALS_FILE
  value: /etc/mascot/aws/credentials
{{- end }}
{{- end }}

{{/* Config, personas, TLS and adapter-store volumes: (dict "ctx" $ "component" c "readOnlyStore" bool). */}}
{{- define "mascot.commonVolumes" -}}
{{- $v := .ctx.Values }}
- name: config
  configMap:
    name: {{ include "mascot.fullname" .ctx }}-config
    items:
      - key: {{ .component }}.yaml
        path: {{ .component }}.yaml
- name: personas
  configMap:
    name: {{ include "mascot.fullname" .ctx }}-personas
{{- with (include "mascot.tlsVolume" .ctx | trim) }}
{{ . }}
{{- end }}
{{- if include "mascot.s3Enabled" .ctx }}
- name: aws-credentials
  secret:
    secretName: {{ $v.adapters.s3.existingSecret }}
    defaultMode: 0440
    items:
      - key: credentials
        path: credentials
{{- end }}
{{- $store := include "mascot.adapterStore" .ctx | fromJson }}
{{- if eq $store.scheme "pvc" }}
- name: adapter-store
  persistentVolumeClaim:
    claimName: {{ $store.claim }}
    readOnly: {{ .readOnlyStore }}
{{- end }}
{{- end }}

{{- define "mascot.commonMounts" -}}
{{- $v := .ctx.Values }}
- name: config
  mountPath: /etc/mascot/config
  readOnly: true
- name: personas
  mountPath: /etc/mascot/personas
  readOnly: true
{{- with (include "mascot.tlsMount" .ctx | trim) }}
{{ . }}
{{- end }}
{{- if include "mascot.s3Enabled" .ctx }}
- name: aws-credentials
  mountPath: /etc/mascot/aws
  readOnly: true
{{- end }}
{{- $store := include "mascot.adapterStore" .ctx | fromJson }}
{{- if eq $store.scheme "pvc" }}
- name: adapter-store
  mountPath: {{ $v.adapters.pvcMountPath }}
  readOnly: {{ .readOnlyStore }}
{{- end }}
{{- end }}

{{/* The GPU scheduling of a workload: (dict "ctx" $ "spec" <component or training values>). */}}
{{- define "mascot.scheduling" -}}
{{- $v := .ctx.Values }}
{{- $s := .spec }}
{{- $gpu := false }}
{{- if $s.gpu }}{{ $gpu = $s.gpu.enabled }}{{ end }}
{{- $nodeSelector := $s.nodeSelector | default (ternary $v.gpu.nodeSelector dict $gpu) }}
{{- $tolerations := $s.tolerations | default (ternary $v.gpu.tolerations list $gpu) }}
{{- with $nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $s.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Container resources, plus the GPU count as request and limit when the workload uses GPUs. */}}
{{- define "mascot.resources" -}}
{{- $v := .ctx.Values }}
{{- $s := .spec }}
{{- $res := deepCopy ($s.resources | default dict) }}
{{- if and $s.gpu $s.gpu.enabled }}
{{- $limits := $res.limits | default dict }}
{{- $requests := $res.requests | default dict }}
{{- $_ := set $limits $v.gpu.resourceName (toString $s.gpu.count) }}
{{- $_ := set $requests $v.gpu.resourceName (toString $s.gpu.count) }}
{{- $_ := set $res "limits" $limits }}
{{- $_ := set $res "requests" $requests }}
{{- end }}
{{- toYaml $res }}
{{- end }}

{{/* Labels of a workload's pods: the component's labels (plus `extra`, chart-owned) over <spec>.podLabels; the
     chart's keys win, so selectors and PodDisruptionBudgets keep matching.
     (dict "ctx" $ "component" "gateway" "spec" <values of the workload> ["extra" (dict ...)]). */}}
{{- define "mascot.podLabels" -}}
{{- $own := include "mascot.labels" (dict "ctx" .ctx "component" .component) | fromYaml }}
{{- $own = mergeOverwrite $own (.extra | default dict) }}
{{- toYaml (merge $own (deepCopy (.spec.podLabels | default dict))) }}
{{- end }}

{{/* Annotations of a workload's pods: the chart's (`own`: checksums) over <spec>.podAnnotations.
     (dict "spec" <values of the workload> "own" (dict ...)). */}}
{{- define "mascot.podAnnotations" -}}
{{- toYaml (merge (.own | default dict) (deepCopy (.spec.podAnnotations | default dict))) }}
{{- end }}

{{/* Pod-level extension points of a workload (PodSpec fields; empty when unset): priorityClassName,
     runtimeClassName and topologySpreadConstraints of <spec>. */}}
{{- define "mascot.podExtensions" -}}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The restart triggers of a component's pods: (dict "ctx" $ "component" "gateway"|"director"|...).
     checksum/config covers only the component's own file of the config ConfigMap (the one its pods mount), so a
     change to another component's config restarts nothing here; checksum/personas covers the persona ConfigMap's
     data, which every component reads once at start (the gateway, and the director, speaker, judge and reward
     through the persona catalog of their servicers). */}}
{{- define "mascot.checksums" -}}
{{- $personas := include (print .ctx.Template.BasePath "/configmap-personas.yaml") .ctx | fromYaml }}
{{- $config := include "mascot.componentConfig" . | sha256sum }}
{{- dict "checksum/config" $config "checksum/personas" (toYaml $personas.data | sha256sum) | toYaml }}
{{- end }}

{{/* The most pods a component runs: the gateway's replicaCount or autoscaling.maxReplicas; a model service's
     maxReplicas under KServe (its HPA) or with load autoscaling (mascot.loadAutoscaler), else minReplicas as a plain
     Deployment (a fixed count). */}}
{{- define "mascot.maxPods" -}}
{{- $v := .ctx.Values }}
{{- if eq .component "gateway" }}
{{- ternary $v.gateway.autoscaling.maxReplicas $v.gateway.replicaCount $v.gateway.autoscaling.enabled | int }}
{{- else }}
{{- $c := index $v .component }}
{{- ternary $c.maxReplicas $c.minReplicas (or $v.kserve.enabled (ne (include "mascot.loadAutoscaler" .) "")) | int }}
{{- end }}
{{- end }}

{{/* The fewest pods a component runs, the ones a PodDisruptionBudget can count on, with the value that sets them, as
     JSON {"key": <value>, "pods": n}: the gateway's autoscaling.minReplicas (its HPA may scale down to it) or
     replicaCount; a model service's minReplicas, under KServe (its HPA may scale down to it) and as a Deployment (a
     fixed count). (dict "ctx" $ "component" c) */}}
{{- define "mascot.minPods" -}}
{{- $v := .ctx.Values }}
{{- if and (eq .component "gateway") $v.gateway.autoscaling.enabled }}
{{- dict "key" "gateway.autoscaling.minReplicas" "pods" (int $v.gateway.autoscaling.minReplicas) | toJson }}
{{- else if eq .component "gateway" }}
{{- dict "key" "gateway.replicaCount" "pods" (int $v.gateway.replicaCount) | toJson }}
{{- else }}
{{- dict "key" (printf "%s.minReplicas" .component) "pods" (int (index $v .component).minReplicas) | toJson }}
{{- end }}
{{- end }}

{{/* The pdb.minAvailable a component sets, or "" when it sets none (unset, null or ""): an explicit 0 or "0%" is kept
     (Go templates' `default` would take 0 for unset). (dict "ctx" $ "component" c) */}}
{{- define "mascot.pdbMinAvailable" -}}
{{- $min := (index .ctx.Values .component).pdb.minAvailable }}
{{- if not (kindIs "invalid" $min) }}{{ $min }}{{ end }}
{{- end }}

{{/* "true" when a component gets a PodDisruptionBudget: (dict "ctx" $ "component" c). The gateway: pdb.enabled. A
     model service: pdb.enabled true, or "auto" and the service can run more than one pod (a budget on a single pod
     protects nothing and, with minAvailable, blocks node drains). */}}
{{- define "mascot.pdbEnabled" -}}
{{- $c := index .ctx.Values .component }}
{{- $on := toString $c.pdb.enabled }}
{{- if eq .component "gateway" }}
{{- if $c.pdb.enabled }}true{{ end }}
{{- else if $c.enabled }}
{{- if or (eq $on "true") (and (eq $on "auto") (gt (int (include "mascot.maxPods" .)) 1)) }}true{{ end }}
{{- end }}
{{- end }}

{{/* The spec of a PodDisruptionBudget: minAvailable when set (an explicit 0 too), else maxUnavailable.
     (dict "ctx" $ "component" c). */}}
{{- define "mascot.pdbSpec" -}}
{{- $pdb := (index .ctx.Values .component).pdb }}
{{- if ne (include "mascot.pdbMinAvailable" .) "" }}
minAvailable: {{ $pdb.minAvailable }}
{{- else }}
maxUnavailable: {{ $pdb.maxUnavailable }}
{{- end }}
selector:
  matchLabels:
    {{- include "mascot.selectorLabels" . | nindent 4 }}
{{- end }}

{{/* Checks across values that values.schema.json cannot express (it cannot compare two fields): install and upgrade
     fail with every broken rule, naming the values. Invoked by templates/validate.yaml.
     - minReplicas <= maxReplicas: the gateway's autoscaling (when enabled) and every enabled model service;
     - an integer pdb.minAvailable leaves a pod evictable: it is below the fewest pods the component runs
       (mascot.minPods, taken as at least 1), since a budget that keeps every running pod blocks node drains;
     - a GPU model service's vLLM engine.tensor_parallel_size (its rendered config) is at most its gpu.count. */}}
{{- define "mascot.validate" -}}
{{- $v := .Values }}
{{- $models := splitList " " (include "mascot.modelServices" .) }}
{{- $errors := list }}
{{- range $c := include "mascot.generationComponents" . | fromJsonArray }}
{{- $own := (index $v $c).storageUri }}
{{- if and $own (ne $own (default $v.model.storageUri $v.generation.storageUri)) }}
{{- $errors = append $errors (printf "%s.storageUri (%s) names another model than the generation service's; remove %s from generation.components to serve it on its own, or clear %s.storageUri" $c $own $c $c) }}
{{- end }}
{{- end }}
{{- $ranges := list }}
{{- if $v.gateway.autoscaling.enabled }}
{{- $ranges = append $ranges (dict "key" "gateway.autoscaling" "spec" $v.gateway.autoscaling) }}
{{- end }}
{{- range $c := $models }}
{{- if (index $v $c).enabled }}{{ $ranges = append $ranges (dict "key" $c "spec" (index $v $c)) }}{{ end }}
{{- end }}
{{- range $r := $ranges }}
{{- $min := int $r.spec.minReplicas }}
{{- $max := int $r.spec.maxReplicas }}
{{- if gt $min $max }}
{{- $msg := printf "%s.minReplicas (%d) is greater than %s.maxReplicas (%d)" $r.key $min $r.key $max }}
{{- $errors = append $errors $msg }}
{{- end }}
{{- end }}
{{- range $c := prepend $models "gateway" }}
{{- $scope := dict "ctx" $ "component" $c }}
{{- $min := (index $v $c).pdb.minAvailable }}
{{- if and (include "mascot.pdbEnabled" $scope) (not (kindIs "invalid" $min)) (not (kindIs "string" $min)) }}
{{- $floor := include "mascot.minPods" $scope | fromJson }}
{{- $pods := int $floor.pods }}
{{- if ge (int $min) (max 1 $pods) }}
{{- $msg := printf "%s.pdb.minAvailable (%d) leaves no pod evictable when %s (%d) pods run"
    $c (int $min) $floor.key $pods }}
{{- $fix := printf "lower it, or clear it to use %s.pdb.maxUnavailable" $c }}
{{- $errors = append $errors (printf "%s: node drains would block; %s" $msg $fix) }}
{{- end }}
{{- end }}
{{- end }}
{{- range $c := list "director" "speaker" }}
{{- if not (index $v $c).enabled }}
{{- $errors = append $errors (printf "%s.enabled is false, but the gateway sends every turn through a %s (server.%s_target would name a Service that does not exist); keep %s enabled (for the no-director ablation set director.config.director.policy: random instead)" $c $c $c $c) }}
{{- end }}
{{- end }}
{{- range $c := without $models "reward" }}
{{- $spec := index $v $c }}
{{- $engine := (include "mascot.componentConfig" (dict "ctx" $ "component" $c) | fromYaml).engine | default dict }}
{{- if and $spec.enabled (gt (int ($engine.tensor_parallel_size | default 1)) 1) (ne (toString $engine.kind) "vllm") }}
{{- $errors = append $errors (printf "%s: engine.tensor_parallel_size (%d) needs the vllm engine, and this service runs %s (it has no GPU: %s.gpu.enabled is false, or its config sets another engine.kind); set engine.tensor_parallel_size in %s.config only" $c (int $engine.tensor_parallel_size) (toString (default "transformers" $engine.kind)) $c $c) }}
{{- end }}
{{- if and $spec.enabled $spec.gpu.enabled }}
{{- $tp := int ($engine.tensor_parallel_size | default 1) }}
{{- if and (eq (toString $engine.kind) "vllm") (gt $tp (int $spec.gpu.count)) }}
{{- $msg := printf "%s: engine.tensor_parallel_size (%d) exceeds %s.gpu.count (%d)" $c $tp $c (int $spec.gpu.count) }}
{{- $errors = append $errors (printf "%s: vLLM could not start on the GPUs the pod gets; raise %s.gpu.count or lower it" $msg $c) }}
{{- end }}
{{- end }}
{{- end }}
{{- with $errors }}
{{- fail (printf "invalid values:\n  - %s" (join "\n  - " .)) }}
{{- end }}
{{- end }}

{{/* "true" when the cluster serves the prometheus-operator API of a kind (monitoring.coreos.com/v1/<kind>):
     (dict "ctx" $ "kind" "ServiceMonitor"|"PrometheusRule"). Helm fills .Capabilities.APIVersions from the cluster
     on install and upgrade; `helm template` needs --api-versions monitoring.coreos.com/v1/<kind>. */}}
{{- define "mascot.monitoringApi" -}}
{{- if .ctx.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" .kind) }}true{{ end }}
{{- end }}
