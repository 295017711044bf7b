{{/* Scaling a model service on load (<component>.autoscaling, models.autoscaling): which autoscaler the chart
     renders for it, "hpa" (an autoscaling/v2 HorizontalPodAutoscaler on the Prometheus adapter's Pods metric,
     models-hpa.yaml), "keda" (a KEDA ScaledObject with a prometheus trigger, models-scaledobject.yaml) or "" (none:
     KServe's own CPU/memory HPA from scaleMetric/scaleTarget when maxReplicas > minReplicas, else a fixed count).
     With one of them the InferenceService gets serving.kserve.io/autoscalerClass: external (KServe then creates no
     HPA and leaves the predictor Deployment's replicas to it) and the plain Deployment no replicas field.
     Fails, naming the values, when both are requested, when minReplicas < 1 (the load is measured by the service's
     own pods: from zero pods nothing would scale it up) or when maxReplicas <= minReplicas (nothing to scale).
     (dict "ctx" $ "component" c); "" for a disabled component. */}}
{{- define "mascot.loadAutoscaler" -}}
{{- $c := index .ctx.Values .component }}
{{- $a := $c.autoscaling | default dict }}
{{- $hpa := ($a.hpa | default dict).enabled }}
{{- $keda := ($a.keda | default dict).enabled }}
{{- if and $c.enabled (or $hpa $keda) }}
{{- $kind := "keda" }}
{{- if $hpa }}{{ $kind = "hpa" }}{{ end }}
{{- if and $hpa $keda }}
{{- fail (printf "%s.autoscaling.hpa.enabled and %s.autoscaling.keda.enabled are both true: choose one (KEDA drives an HPA of its own, and two autoscalers on one Deployment fight over its replicas)" .component .component) }}
{{- end }}
{{- if lt (int $c.minReplicas) 1 }}
{{- fail (printf "%s.autoscaling.%s.enabled needs %s.minReplicas >= 1 (got %d): the load metric comes from the service's own pods, so from zero pods nothing would scale it up" .component $kind .component (int $c.minReplicas)) }}
{{- end }}
{{- if le (int $c.maxReplicas) (int $c.minReplicas) }}
{{- fail (printf "%s.autoscaling.%s.enabled needs %s.maxReplicas (%d) above %s.minReplicas (%d): there is nothing to scale" .component $kind .component (int $c.maxReplicas) .component (int $c.minReplicas)) }}
{{- end }}
{{- $kind }}
{{- end }}
{{- end }}

{{/* The Deployment a load autoscaler scales: the predictor Deployment KServe creates for the InferenceService
     (<isvc>-predictor, RawDeployment) or the chart's own. (dict "ctx" $ "component" c) */}}
{{- define "mascot.loadScaleTarget" -}}
apiVersion: apps/v1
kind: Deployment
name: {{ include "mascot.fullname" .ctx }}-{{ .component }}{{ if .ctx.Values.kserve.enabled }}-predictor{{ end }}
{{- end }}
