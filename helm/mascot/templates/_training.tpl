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
{{- /* publish.gateway is the AdapterService address: the control plane's, never the public gateway's. */}}
{{- $publish := $cfg.publish | default dict }}
{{- if not $publish.gateway }}
{{- $_ := set $publish "gateway" (include "mascot.controlTarget" .ctx) }}
{{- end }}
{{- if and $v.adminToken.existingSecret (not $publish.token_file) }}
{{- $_ := set $publish "token_file" (include "mascot.adminTokenFile" .ctx) }}
{{- end }}
{{- $_ := set $cfg "publish" $publish }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/* Nodes of one run of a phase: training.phases.<phase>.nodes, else training.nodes:
     (dict "ctx" $ "phase" "persona-alignment"). */}}
{{- define "mascot.trainingNodes" -}}
{{- $t := .ctx.Values.training }}
{{- $p := index $t.phases (include "mascot.phaseKey" .phase) }}
{{- int ($p.nodes | default $t.nodes | default 1) }}
{{- end }}

{{/* What one run of a phase is: "job" (one pod), "indexed" (an Indexed Job, one pod per node, a headless Service
     for the rendezvous) or "pytorchjob" (a Kubeflow PyTorchJob): training.multiNode.kind, where auto takes the
     PyTorchJob when the cluster serves kubeflow.org/v1 PyTorchJob. A CronJob creates batch Jobs only ("cron"). */}}
{{- define "mascot.trainingKind" -}}
{{- $mn := .ctx.Values.training.multiNode | default dict }}
{{- $kind := $mn.kind | default "auto" }}
{{- $served := .ctx.Capabilities.APIVersions.Has "kubeflow.org/v1/PyTorchJob" }}
{{- if le (int (include "mascot.trainingNodes" .)) 1 }}job
{{- else if or .cron (eq $kind "indexed") }}indexed
{{- else if eq $kind "pytorchjob" }}
{{- if not $served }}{{ fail "training.multiNode.kind is pytorchjob but the cluster does not serve kubeflow.org/v1 PyTorchJob: install the Kubeflow training operator, or use kind indexed or auto (helm template: --api-versions kubeflow.org/v1/PyTorchJob)" }}{{ end }}pytorchjob
{{- else }}{{ ternary "pytorchjob" "indexed" $served }}
{{- end }}
{{- end }}

{{/* The kinds of the control plane's training runs, one word per phase (mascot.trainingKind): "job job" by default. */}}
{{- define "mascot.trainingKinds" -}}
{{- $kinds := list }}
{{- range $phase := list "persona-alignment" "collaborative" }}
{{- $kinds = append $kinds (include "mascot.trainingKind" (dict "ctx" $ "phase" $phase)) }}
{{- end }}
{{- join " " $kinds }}
{{- end }}

{{/* The command line of a phase under the configured launcher: {"command": [...], "args": [...]}.
     (dict "ctx" $ "phase" ... ["subdomain" <headless Service of a CronJob's runs>] ["cron" true]). Several nodes:
     torchrun with --nnodes; an Indexed Job meets at pod 0 of its Job (c10d rendezvous at
     <job>-0.<subdomain>:<port>, the subdomain being the Job's own headless Service unless given), a PyTorchJob at the
     master the operator names in MASTER_ADDR / MASTER_PORT (RANK: the node rank). */}}
{{- define "mascot.trainingArgv" -}}
{{- $t := .ctx.Values.training }}
{{- $n := int (ternary $t.gpu.count 1 $t.gpu.enabled) }}
{{- $nodes := int (include "mascot.trainingNodes" .) }}
{{- $tail := list "train" .phase "--config" "/etc/mascot/run/run.yaml" "--out" (printf "/runs/%s/$(MASCOT_RUN_ID)" .phase) }}
{{- if gt $nodes 1 }}
{{- if ne $t.launcher "torchrun" }}
{{- fail (printf "training: phase %s runs on %d nodes, which needs training.launcher torchrun (got %s)" .phase $nodes $t.launcher) }}
{{- end }}
{{- $port := int (($t.multiNode | default dict).port | default 29500) }}
{{- $head := list (printf "--nnodes=%d" $nodes) (printf "--nproc-per-node=%d" $n) }}
{{- if eq (include "mascot.trainingKind" .) "pytorchjob" }}
{{- $head = concat $head (list "--node-rank=$(RANK)" "--master-addr=$(MASTER_ADDR)" "--master-port=$(MASTER_PORT)") }}
{{- else }}
{{- /* the full name (pod 0 of the Job under its headless Service): a pod's /etc/hosts lists only that form, and
     torchrun's c10d rendezvous hosts its store on the pod whose own name matches the endpoint */}}
{{- $endpoint := printf "--rdzv-endpoint=$(MASCOT_RUN_ID)-0.%s.%s.svc.%s:%d" (.subdomain | default "$(MASCOT_RUN_ID)") .ctx.Release.Namespace .ctx.Values.clusterDomain $port }}
{{- $head = concat $head (list "--node-rank=$(MASCOT_NODE_RANK)" "--rdzv-backend=c10d" $endpoint "--rdzv-id=$(MASCOT_RUN_ID)") }}
{{- end }}
{{- dict "command" (list "torchrun") "args" (concat $head (list "-m" "mascot.cli") $tail) | toJson }}
{{- else if eq $t.launcher "torchrun" }}
{{- dict "command" (list "torchrun") "args" (concat (list "--standalone" "--nnodes=1" (printf "--nproc-per-node=%d" $n) "-m" "mascot.cli") $tail) | toJson }}
{{- else if eq $t.launcher "accelerate" }}
{{- $launch := list "launch" (printf "--num_processes=%d" $n) "--num_machines=1" }}
{{- if gt $n 1 }}{{ $launch = append $launch "--multi_gpu" }}{{ end }}
{{- dict "command" (list "accelerate") "args" (concat $launch (list "-m" "mascot.cli") $tail) | toJson }}
{{- else }}
{{- dict "command" (list "mascot" "train" .phase) "args" (slice $tail 2) | toJson }}
{{- end }}
{{- end }}

{{/* The pod template of a phase's training pods, shared by the Job templates, the PyTorchJob replicas and the
     CronJob: (dict "ctx" $ "phase" "persona-alignment" ["withoutRunConfig" true] ["subdomain" S] ["cron" true]
     ["extraLabels" dict]). The run id is the Job's name (one Job per run: Job specs are immutable), read through
     the pod label batch.kubernetes.io/job-name (training.kubeflow.org/job-name in a PyTorchJob); a restarted pod
     resumes the same run. The pods carry the checksum of their phase config, unless withoutRunConfig. */}}
{{- define "mascot.trainingPodTemplate" -}}
{{- $ctx := .ctx }}
{{- $v := $ctx.Values }}
{{- $t := $v.training }}
{{- $fullname := include "mascot.fullname" $ctx }}
{{- $argv := include "mascot.trainingArgv" . | fromJson }}
{{- $kind := include "mascot.trainingKind" . }}
{{- $nodes := int (include "mascot.trainingNodes" .) }}
{{- $phaseLabel := merge (dict "mascot.ai/phase" .phase) (.extraLabels | default dict) }}
{{- $podLabels := dict "ctx" $ctx "component" "training" "spec" $t "extra" $phaseLabel }}
{{- $checksums := dict }}
{{- if not .withoutRunConfig }}
{{- $_ := set $checksums "checksum/run-config" (include "mascot.trainingConfig" . | sha256sum) }}
{{- end }}
metadata:
  labels:
    {{- include "mascot.podLabels" $podLabels | nindent 4 }}
  annotations:
    {{- include "mascot.podAnnotations" (dict "spec" $t "own" $checksums) | nindent 4 }}
spec:
  {{- if ne $kind "pytorchjob" }}
  restartPolicy: OnFailure
  {{- end }}
  {{- if eq $kind "indexed" }}
  # Indexed Job pods are named <job>-<index>; the headless Service named here (the Job's own, which the control
  # plane creates with the Job, or the CronJob's) gives them the DNS names <job>-<index>.<subdomain> of the rendezvous.
  subdomain: {{ .subdomain | default (printf "%s-%s" $fullname .phase) }}
  {{- end }}
  serviceAccountName: {{ $fullname }}-training
  automountServiceAccountToken: false
  {{- with (include "mascot.imagePullSecrets" $ctx | trim) }}{{- . | nindent 2 }}{{- end }}
  securityContext:
    {{- toYaml $v.podSecurityContext | nindent 4 }}
  {{- with (include "mascot.scheduling" (dict "ctx" $ctx "spec" $t) | trim) }}{{- . | nindent 2 }}{{- end }}
  {{- with (include "mascot.podExtensions" $t | trim) }}{{- . | nindent 2 }}{{- end }}
  containers:
    # A PyTorchJob's operator looks for its container by the name "pytorch".
    - name: {{ ternary "pytorch" "train" (eq $kind "pytorchjob") }}
      image: {{ include "mascot.trainingImage" $ctx }}
      imagePullPolicy: {{ $v.trainingImage.pullPolicy }}
      command: {{ toJson $argv.command }}
      args: {{ toJson $argv.args }}
      env:
        {{- include "mascot.baseEnv" $ctx | nindent 8 }}
        - name: HF_HUB_OFFLINE
          value: "1"
        - name: MASCOT_RUN_ID
          valueFrom:
            fieldRef:
              fieldPath: metadata.labels['{{ ternary "training.kubeflow.org/job-name" "batch.kubernetes.io/job-name" (eq $kind "pytorchjob") }}']
        {{- if eq $kind "indexed" }}
        - name: MASCOT_NODE_RANK
          valueFrom:
            fieldRef:
              fieldPath: metadata.annotations['batch.kubernetes.io/job-completion-index']
        {{- end }}
        {{- with $t.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- if gt $nodes 1 }}
      ports:
        # The rendezvous of the nodes (torchrun's c10d store on node 0, or the PyTorchJob master's port).
        - name: {{ ternary "pytorchjob-port" "rendezvous" (eq $kind "pytorchjob") }}
          containerPort: {{ int (($t.multiNode | default dict).port | default 29500) }}
          protocol: TCP
      {{- end }}
      resources:
        {{- include "mascot.resources" (dict "ctx" $ctx "spec" $t) | nindent 8 }}
      securityContext:
        {{- toYaml $v.containerSecurityContext | nindent 8 }}
      volumeMounts:
        {{- include "mascot.scratchMounts" $ctx | nindent 8 }}
        - name: run-config
          mountPath: /etc/mascot/run
          readOnly: true
        - name: runs
          mountPath: /runs
        {{- /* The publish step's admin token (publish.token_file), a file of the Secret, never an env var. */}}
        {{- with (include "mascot.secretFileMount" (include "mascot.adminTokenSecret" $ctx | fromJson) | trim) }}{{- . | nindent 8 }}{{- end }}
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
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    {{- include "mascot.scratchVolumes" $ctx | nindent 4 }}
    - name: run-config
      configMap:
        name: {{ $fullname }}-training-{{ .phase }}
    - name: runs
      persistentVolumeClaim:
        claimName: {{ $t.runs.existingClaim | default (printf "%s-training-runs" $fullname) }}
    {{- with (include "mascot.secretFileVolume" (include "mascot.adminTokenSecret" $ctx | fromJson) | trim) }}{{- . | nindent 4 }}{{- end }}
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
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{/* A training Job's spec (batch/v1 JobSpec), shared by the Job templates and the CronJob; the arguments of
     mascot.trainingPodTemplate. On several nodes an Indexed Job: one pod per node (completions = parallelism =
     nodes). */}}
{{- define "mascot.trainingJobSpec" -}}
{{- $t := .ctx.Values.training }}
{{- if eq (include "mascot.trainingKind" .) "indexed" }}
{{- $nodes := int (include "mascot.trainingNodes" .) }}
completionMode: Indexed
completions: {{ $nodes }}
parallelism: {{ $nodes }}
{{- end }}
backoffLimit: {{ $t.backoffLimit }}
activeDeadlineSeconds: {{ $t.activeDeadlineSeconds }}
ttlSecondsAfterFinished: {{ $t.ttlSecondsAfterFinished }}
template:
  {{- include "mascot.trainingPodTemplate" . | trim | nindent 2 }}
{{- end }}

{{/* The Job template of a phase, as the control plane's TrainingService loads it (training-templates ConfigMap):
     (dict "ctx" $ "phase" "persona-alignment" ["withoutRunConfig" true]). A batch/v1 Job (Indexed on several
     nodes), or a kubeflow.org/v1 PyTorchJob (one Master and nodes - 1 Workers). */}}
{{- define "mascot.trainingJobTemplate" -}}
{{- $t := .ctx.Values.training }}
{{- $kind := include "mascot.trainingKind" . }}
{{- $name := printf "%s-%s" (include "mascot.fullname" .ctx) .phase }}
{{- if and (ne $kind "job") (gt (len $name) 47) }}
{{- fail (printf "training: the Job name prefix %s has %d characters; a run on several nodes allows 47 (the API refuses Indexed Job names over 52 characters and the run id needs 5): shorten the release name or set fullnameOverride" $name (len $name)) }}
{{- end }}
{{- if eq $kind "pytorchjob" }}
apiVersion: kubeflow.org/v1
kind: PyTorchJob
{{- else }}
apiVersion: batch/v1
kind: Job
{{- end }}
metadata:
  name: {{ $name }}
  namespace: {{ .ctx.Release.Namespace }}
  labels:
    {{- include "mascot.labels" (dict "ctx" .ctx "component" "training") | nindent 4 }}
    mascot.ai/phase: {{ .phase }}
spec:
  {{- if eq $kind "pytorchjob" }}
  {{- $nodes := int (include "mascot.trainingNodes" .) }}
  runPolicy:
    # A failed master leaves its workers waiting at the rendezvous: the run's running pods go when it ends.
    cleanPodPolicy: Running
    backoffLimit: {{ $t.backoffLimit }}
    activeDeadlineSeconds: {{ $t.activeDeadlineSeconds }}
    ttlSecondsAfterFinished: {{ $t.ttlSecondsAfterFinished }}
  pytorchReplicaSpecs:
    {{- range $type, $replicas := dict "Master" 1 "Worker" (sub $nodes 1) }}
    {{ $type }}:
      replicas: {{ $replicas }}
      restartPolicy: OnFailure
      template:
        {{- include "mascot.trainingPodTemplate" $ | trim | nindent 8 }}
    {{- end }}
  {{- else }}
  {{- include "mascot.trainingJobSpec" . | trim | nindent 2 }}
  {{- end }}
{{- end }}

{{/* Restart trigger of the control plane, whose TrainingService loads the Job templates once at start: their
     checksum without the phase configs' (a Job reads its phase config from its ConfigMap when it starts, so a phase
     config change needs no restart). */}}
{{- define "mascot.trainingTemplatesChecksum" -}}
{{- $templates := list }}
{{- range $phase := list "persona-alignment" "collaborative" }}
{{- $template := include "mascot.trainingJobTemplate" (dict "ctx" $ "phase" $phase "withoutRunConfig" true) }}
{{- $templates = append $templates $template }}
{{- end }}
{{- join "\n---\n" $templates | sha256sum }}
{{- end }}
