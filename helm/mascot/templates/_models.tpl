{{/* The pod of one model service, shared by the InferenceService predictor (kserve.enabled) and the plain
     Deployment: (dict "ctx" $ "component" "director"). Emits PodSpec fields (no "spec:" key). */}}
{{- define "mascot.modelPodSpec" -}}
{{- $ctx := .ctx }}
{{- $v := $ctx.Values }}
{{- $comp := .component }}
{{- $c := index $v $comp }}
{{- $m := $v.models }}
{{- $gpu := $c.gpu.enabled }}
{{- $uri := include "mascot.storageUri" . }}
serviceAccountName: {{ include "mascot.fullname" $ctx }}-models
automountServiceAccountToken: false
{{- with (include "mascot.imagePullSecrets" $ctx | trim) }}{{- "\n" }}{{- . }}{{- end }}
securityContext:
  {{- toYaml $v.podSecurityContext | nindent 2 }}
terminationGracePeriodSeconds: {{ $m.terminationGracePeriodSeconds }}
{{- with (include "mascot.scheduling" (dict "ctx" $ctx "spec" $c) | trim) }}{{- "\n" }}{{- . }}{{- end }}
{{- with (include "mascot.podExtensions" $c | trim) }}{{- "\n" }}{{- . }}{{- end }}
containers:
  # KServe's storage initializer fills /mnt/models from STORAGE_URI only for the container of this name.
  - name: kserve-container
    image: {{ include "mascot.image" (dict "ctx" $ctx "gpu" $gpu) }}
    imagePullPolicy: {{ $v.image.pullPolicy }}
    command: ["mascot", "serve-model"]
    args:
      - {{ include "mascot.servedComponents" . }}
      - --port
      - {{ $c.grpcPort | quote }}
      - --rest-port
      - {{ $m.httpPort | quote }}
      - --host
      - 0.0.0.0
    env:
      {{- include "mascot.baseEnv" $ctx | nindent 6 }}
      - name: MASCOT_CONFIG
        value: /etc/mascot/config/{{ $comp }}.yaml
      - name: HF_HUB_OFFLINE
        value: "1"
      {{- with (include "mascot.s3Env" $ctx | trim) }}{{- . | nindent 6 }}{{- end }}
      {{- if and $v.kserve.enabled $uri }}
      - name: STORAGE_URI
        value: {{ $uri | quote }}
      {{- end }}
      {{- if $v.kserve.enabled }}
      - name: PROTOCOL
        value: v2
      {{- end }}
      {{- with $c.extraEnv }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    ports:
      # The first port is KServe's Service port 80; the others keep their numbers.
      - name: http
        containerPort: {{ $m.httpPort }}
        protocol: TCP
      - name: grpc
        containerPort: {{ $c.grpcPort }}
        protocol: TCP
    startupProbe:
      httpGet:
        path: /v2/health/live
        port: {{ $m.httpPort }}
      {{- toYaml $m.startupProbe | nindent 6 }}
    readinessProbe:
      # SERVING once the engine runs and the registry's stable/canary adapters are loaded (gRPC health; with TLS a
      # `mascot health` exec probe: kubelet grpc probes cannot do TLS).
      {{- include "mascot.healthProbe" (dict "ctx" $ctx "port" $c.grpcPort "probe" $m.readinessProbe) | nindent 6 }}
    livenessProbe:
      httpGet:
        path: /v2/health/live
        port: {{ $m.httpPort }}
      {{- toYaml $m.livenessProbe | nindent 6 }}
    resources:
      {{- include "mascot.resources" (dict "ctx" $ctx "spec" $c) | nindent 6 }}
    securityContext:
      {{- toYaml $v.containerSecurityContext | nindent 6 }}
    volumeMounts:
      {{- include "mascot.scratchMounts" $ctx | nindent 6 }}
      {{- with (include "mascot.commonMounts" (dict "ctx" $ctx "component" $comp "readOnlyStore" true) | trim) }}{{- . | nindent 6 }}{{- end }}
      {{- with (include "mascot.secretFileMount" (include "mascot.restTokenSecret" $ctx | fromJson) | trim) }}{{- . | nindent 6 }}{{- end }}
      {{- if $gpu }}
      - name: shm
        mountPath: /dev/shm
      {{- end }}
      {{- if and (not $v.kserve.enabled) $uri }}
      - name: model
        mountPath: /mnt/models
        subPath: {{ include "mascot.pvcPath" $uri }}
        readOnly: true
      {{- end }}
      {{- with $c.extraVolumeMounts }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
volumes:
  {{- include "mascot.scratchVolumes" $ctx | nindent 2 }}
  {{- with (include "mascot.commonVolumes" (dict "ctx" $ctx "component" $comp "readOnlyStore" true) | trim) }}{{- . | nindent 2 }}{{- end }}
  {{- /* The bearer token of KServe REST inference (server.rest_token_file). */}}
  {{- with (include "mascot.secretFileVolume" (include "mascot.restTokenSecret" $ctx | fromJson) | trim) }}{{- . | nindent 2 }}{{- end }}
  {{- if $gpu }}
  - name: shm
    emptyDir:
      medium: Memory
      sizeLimit: {{ $m.shmSizeLimit }}
  {{- end }}
  {{- if and (not $v.kserve.enabled) $uri }}
  - name: model
    persistentVolumeClaim:
      claimName: {{ include "mascot.pvcClaim" $uri }}
      readOnly: true
  {{- end }}
  {{- with $c.extraVolumes }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/* pvc://<claim>/<path>: the claim, and the path inside it ("" for the whole claim). */}}
{{- define "mascot.pvcClaim" -}}
{{- if not (hasPrefix "pvc://" .) }}
{{- fail (printf "kserve.enabled=false mounts model storage URIs itself and supports only pvc://<claim>/<path> (or \"\" for the tiny model); got %q" .) }}
{{- end }}
{{- first (splitList "/" (trimPrefix "pvc://" .)) }}
{{- end }}

{{- define "mascot.pvcPath" -}}
{{- $_ := include "mascot.pvcClaim" . }}
{{- join "/" (rest (splitList "/" (trimPrefix "pvc://" .))) }}
{{- end }}
