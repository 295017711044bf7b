{{/* Training phases: the values key of a phase name. */}}
{{- define "mascot.phaseKey" -}}
{{- if eq . "persona-alignment" }}personaAlignment{{ else if eq . "collaborative" }}collaborative{{ else }}{{ fail (printf "unknown training phase %q: persona-alignment or collaborative" .) }}{{ end }}
{{- end }}

{{/* The run config of a phase (training-jobs/configs keys): (dict "ctx" $ "phase" "persona-alignment"). */}}
{{- define "mascot.trainingConfig" -}}
{{- $v := .ctx.Values }}
{{- $p := index $v.training.phases (include "mascot.phaseKey" .phase) }}
{{- $cfg := deepCopy ($p.config | default dict) }}
{{- if and $v.training.publishThroughGateway $v.adapters.store }}
{{- $publish := $cfg.publish | default dict }}
{{- if not $publish.gateway }}
{{- $_ := set $publish "gateway" (include "mascot.gatewayTarget" .ctx) }}
{{- end }}
{{- $_ := set $cfg "publish" $publish }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/* The command line of a phase under the configured launcher: {"command": [...], "args": [...]}. */}}
{{- define "mascot.trainingArgv" -}}
{{- $t := .ctx.Values.training }}
{{- $n := int (ternary $t.gpu.count 1 $t.gpu.enabled) }}
{{- $tail := list "train" .phase "--config" "/etc/mascot/run/run.yaml" "--out" (printf "/runs/%s/$(MASCOT_RUN_ID)" .phase) }}
{{- if eq $t.launcher "torchrun" }}
{{- dict "command" (list "torchrun") "args" (concat (list "--standalone" "--nnodes=1" (printf "--nproc-per-node=%d" $n) "-m" "mascot.cli") $tail) | toJson }}
{{- else if eq $t.launcher "accelerate" }}
{{- $launch := list "launch" (printf "--num_processes=%d" $n) "--num_machines=1" }}
{{- if gt $n 1 }}{{ $launch = append $launch "--multi_gpu" }}{{ end }}
{{- dict "command" (list "accelerate") "args" (concat $launch (list "-m" "mascot.cli") $tail) | toJson }}
{{- else }}
{{- dict "command" (list "mascot" "train" .phase) "args" (slice $tail 2) | toJson }}
{{- end }}
{{- end }}

{{/* A training Job's spec (batch/v1 JobSpec), shared by the Job templates and the CronJob:
     (dict "ctx" $ "phase" "persona-alignment" ["withoutRunConfig" true]). The run id is the Job's name (one Job per
     run: Job specs are immutable), read through the pod label batch.kubernetes.io/job-name; a restarted pod resumes
     the same run. The pods carry the checksum of their phase config, unless withoutRunConfig. */}}
{{- define "mascot.trainingJobSpec" -}}
{{- $ctx := .ctx }}
{{- $v := $ctx.Values }}
{{- $t := $v.training }}
{{- $fullname := include "mascot.fullname" $ctx }}
{{- $argv := include "mascot.trainingArgv" . | fromJson }}
{{- $phaseLabel := dict "mascot.ai/phase" .phase }}
{{- $podLabels := dict "ctx" $ctx "component" "training" "spec" $t "extra" $phaseLabel }}
{{- $checksums := dict }}
{{- if not .withoutRunConfig }}
{{- $_ := set $checksums "checksum/run-config" (include "mascot.trainingConfig" . | sha256sum) }}
{{- end }}
backoffLimit: {{ $t.backoffLimit }}
activeDeadlineSeconds: {{ $t.activeDeadlineSeconds }}
ttlSecondsAfterFinished: {{ $t.ttlSecondsAfterFinished }}
template:
  metadata:
    labels:
      {{- include "mascot.podLabels" $podLabels | nindent 6 }}
    annotations:
      {{- include "mascot.podAnnotations" (dict "spec" $t "own" $checksums) | nindent 6 }}
  spec:
    restartPolicy: OnFailure
    serviceAccountName: {{ $fullname }}-training
    automountServiceAccountToken: false
    {{- with (include "mascot.imagePullSecrets" $ctx | trim) }}{{- . | nindent 4 }}{{- end }}
    securityContext:
      {{- toYaml $v.podSecurityContext | nindent 6 }}
    {{- with (include "mascot.scheduling" (dict "ctx" $ctx "spec" $t) | trim) }}{{- . | nindent 4 }}{{- end }}
    {{- with (include "mascot.podExtensions" $t | trim) }}{{- . | nindent 4 }}{{- end }}
    containers:
      - name: train
        image: {{ include "mascot.trainingImage" $ctx }}
        imagePullPolicy: {{ $v.trainingImage.pullPolicy }}
        command: {{ toJson $argv.command }}
        args: {{ toJson $argv.args }}
        env:
          {{- include "mascot.baseEnv" $ctx | nindent 10 }}
          - name: HF_HUB_OFFLINE
            value: "1"
          - name: MASCOT_RUN_ID
            valueFrom:
              fieldRef:
                fieldPath: metadata.labels['batch.kubernetes.io/job-name']
          {{- if $v.adminToken.existingSecret }}
          # mascot_training.publish reads the admin token only from this variable.
          - name: MASCOT_ADMIN_TOKEN
            valueFrom:
              secretKeyRef:
                name: {{ $v.adminToken.existingSecret }}
                key: {{ $v.adminToken.key }}
          {{- end }}
          {{- with $t.extraEnv }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        resources:
          {{- include "mascot.resources" (dict "ctx" $ctx "spec" $t) | nindent 10 }}
        securityContext:
          {{- toYaml $v.containerSecurityContext | nindent 10 }}
        volumeMounts:
          {{- include "mascot.scratchMounts" $ctx | nindent 10 }}
          - name: run-config
            mountPath: /etc/mascot/run
            readOnly: true
          - name: runs
            mountPath: /runs
          {{- if $t.modelsClaim }}
          - name: models
            mountPath: /models
            readOnly: true
          {{- end }}
          {{- if $t.dataClaim }}
          - name: data
            mountPath: /data
            readOnly: true
          {{- end }}
          {{- if $t.gpu.enabled }}
          - name: shm
            mountPath: /dev/shm
          {{- end }}
          {{- with $t.extraVolumeMounts }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
    volumes:
      {{- include "mascot.scratchVolumes" $ctx | nindent 6 }}
      - name: run-config
        configMap:
          name: {{ $fullname }}-training-{{ .phase }}
      - name: runs
        persistentVolumeClaim:
          claimName: {{ $t.runs.existingClaim | default (printf "%s-training-runs" $fullname) }}
      {{- if $t.modelsClaim }}
      - name: models
        persistentVolumeClaim:
          claimName: {{ $t.modelsClaim }}
          readOnly: true
      {{- end }}
      {{- if $t.dataClaim }}
      - name: data
        persistentVolumeClaim:
          claimName: {{ $t.dataClaim }}
          readOnly: true
      {{- end }}
      {{- if $t.gpu.enabled }}
      - name: shm
        emptyDir:
          medium: Memory
          sizeLimit: {{ $v.models.shmSizeLimit }}
      {{- end }}
      {{- with $t.extraVolumes }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
{{- end }}

{{/* The Job template of a phase, as the gateway's TrainingService loads it (training-templates ConfigMap):
     (dict "ctx" $ "phase" "persona-alignment" ["withoutRunConfig" true]). */}}
{{- define "mascot.trainingJobTemplate" -}}
apiVersion: batch/v1
kind: Job
metadata:
  name: {{ include "mascot.fullname" .ctx }}-{{ .phase }}
  namespace: {{ .ctx.Release.Namespace }}
  labels:
    {{- include "mascot.labels" (dict "ctx" .ctx "component" "training") | nindent 4 }}
    mascot.ai/phase: {{ .phase }}
spec:
  {{- include "mascot.trainingJobSpec" . | trim | nindent 2 }}
{{- end }}

{{/* Restart trigger of the gateway, whose TrainingService loads the Job templates once at start: their checksum
     without the phase configs' (a Job reads its phase config from its ConfigMap when it starts, so a phase config
     change needs no gateway restart). */}}
{{- define "mascot.trainingTemplatesChecksum" -}}
{{- $templates := list }}
{{- range $phase := list "persona-alignment" "collaborative" }}
{{- $template := include "mascot.trainingJobTemplate" (dict "ctx" $ "phase" $phase "withoutRunConfig" true) }}
{{- $templates = append $templates $template }}
{{- end }}
{{- join "\n---\n" $templates | sha256sum }}
{{- end }}
