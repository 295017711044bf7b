"""Run ids, Job templates, run status and the API client of :mod:`mascot.gateway.jobs` (the pure part: no calls to the
Kubernetes API except building a client).

A run's Job is ``<template metadata.name>-<run id>`` (at most 63 characters) with the labels ``mascot.ai/phase`` and
``mascot.ai/run-id``; :func:`run_status` maps a Job's ``status`` to pending / running / succeeded / failed /
cancelled.

A run on several nodes is an Indexed Job (``completionMode: Indexed``, pods ``<job>-<index>``) whose pod template
names a ``subdomain``: the run gets the headless Service of that name (:func:`rendezvous_service`, the Job's own
name, owned by the Job) so that its pods resolve each other as ``<job>-<index>.<job>``; or a Kubeflow
``kubeflow.org/v1`` PyTorchJob (Master and Worker replicas). Both kinds' names are limited to
:data:`MAX_MULTI_NODE_NAME` characters.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import logging
import os
import re
import secrets

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mascot.core.errors import InvalidArgument

log = logging.getLogger(__name__)

PHASES = ("persona-alignment", "collaborative")
LABEL_PHASE = "mascot.ai/phase"
LABEL_RUN_ID = "mascot.ai/run-id"
#: Trigger time with microseconds (``creationTimestamp`` has whole seconds): the order of ListRuns.
ANNOTATION_CREATED = "mascot.ai/create-time"
MANAGED_BY = "mascot-gateway"
#: Labels that scope a listing to one installation when every template carries the same value.
SCOPE_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = 63
#: Longest name of a run on several nodes: the API refuses Indexed Job names over 52 characters (the pods' hostnames
#: append ``-<index>``); a PyTorchJob's pods and Services append ``-worker-<index>``.
MAX_MULTI_NODE_NAME = 52
#: ``(apiVersion, kind)`` of the run objects a template may be.
JOB = ("batch/v1", "Job")
PYTORCH_JOB = ("kubeflow.org/v1", "PyTorchJob")
#: The label the training operator puts on a PyTorchJob's pods (their run id, as ``batch.kubernetes.io/job-name``).
PYTORCH_JOB_NAME_LABEL = "training.kubeflow.org/job-name"
#: The shortest run id a template name must leave room for.
MIN_RUN_ID = 4
STATES = ("pending", "running", "succeeded", "failed", "cancelled")
FINISHED = frozenset({"succeeded", "failed", "cancelled"})
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
_CANCELLED_KEPT = 1000


@dataclass(frozen=True)
class RunStatus:
    """One run as read from its Job.

    Attributes:
        run_id: The run id (label ``mascot.ai/run-id``).
        phase: ``persona-alignment`` or ``collaborative`` (label ``mascot.ai/phase``).
        job_name: ``<template name>-<run id>``.
        namespace: The Job's namespace.
        state: One of :data:`STATES`.
        create_time: Trigger time (annotation ``mascot.ai/create-time``, else ``creationTimestamp``), UTC, or None.
        start_time: The Job's ``status.startTime``, or None.
        finish_time: Completion, failure or cancellation time, or None while unfinished.
        message: The deciding condition's ``reason: message``, or what the run waits for.
        active_pods: ``status.active`` (a PyTorchJob: summed over its replicas).
        failed_pods: ``status.failed`` (likewise).
        kind: The run object's kind: ``Job`` or ``PyTorchJob``.
    """

    run_id: str
    phase: str
    job_name: str
    namespace: str
    state: str
    create_time: dt.datetime | None = None
    start_time: dt.datetime | None = None
    finish_time: dt.datetime | None = None
    message: str = ""
    active_pods: int = 0
    failed_pods: int = 0
    kind: str = "Job"

    @property
    def finished(self) -> bool:
        """True for ``succeeded``, ``failed`` and ``cancelled``."""
        return self.state in FINISHED

    @property
    def key(self) -> tuple[str, str, str]:
        """Identity of this run instance: a run id triggered again after a cancel is another instance."""
        return (self.namespace, self.job_name, self.create_time.isoformat() if self.create_time else "")


@dataclass(frozen=True)
class TriggerResult:
    """What :meth:`JobManager.trigger` did: the run, and whether it existed before the call."""

    run: RunStatus
    already_existed: bool


# ------------------------------------------------------------------------------------------------ templates, ids
def template_path(directory: str | Path, phase: str) -> Path | None:
    """The Job template of ``phase`` in ``directory``: ``<phase>.yaml`` (the chart's ConfigMap keys) or
    ``<phase>-job.yaml`` (``training-jobs/k8s``); None when neither exists."""
    for name in (f"{phase}.yaml", f"{phase}-job.yaml"):
        p = Path(directory) / name
        if p.is_file():
            return p
    return None


def load_template(path: str | Path) -> dict:
    """Read and check one Job template.

    Returns:
        The Job (or PyTorchJob) as a dict (``status`` and server-set metadata removed).

    Raises:
        ValueError: unreadable YAML, not exactly one ``batch/v1`` Job or ``kubeflow.org/v1`` PyTorchJob (with a
            ``Master`` replica), or a ``metadata.name`` that is not a DNS-1123 label leaving at least
            :data:`MIN_RUN_ID` characters for the run id (within :func:`name_limit`).
    """
    try:
        docs = [d for d in yaml.safe_load_all(Path(path).read_text(encoding="utf-8")) if d is not None]
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"Job template {path}: {e}") from None
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise ValueError(f"Job template {path} must hold exactly one object, found {len(docs)}")
    job = docs[0]
    if (job.get("apiVersion"), job.get("kind")) not in (JOB, PYTORCH_JOB):
        raise ValueError(f"Job template {path} is a {job.get('apiVersion')}/{job.get('kind')}, not a batch/v1 Job "
                         "(or a kubeflow.org/v1 PyTorchJob)")
    name = (job.get("metadata") or {}).get("name") or ""
    limit = name_limit(job) - 1 - MIN_RUN_ID
    if not DNS1123_LABEL.match(name) or len(name) > limit:
        raise ValueError(f"Job template {path}: metadata.name {name!r} must be a DNS-1123 label of at most "
                         f"{limit} characters (the run id is appended)")
    if job["kind"] == "PyTorchJob":
        master = ((job.get("spec") or {}).get("pytorchReplicaSpecs") or {}).get("Master")
        if not isinstance((master or {}).get("template"), dict):
            raise ValueError(f"Job template {path} has no spec.pytorchReplicaSpecs.Master.template")
    elif not isinstance((job.get("spec") or {}).get("template"), dict):
        raise ValueError(f"Job template {path} has no spec.template")
    job = copy.deepcopy(job)
    job.pop("status", None)
    for k in ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "selfLink",
              "generateName", "ownerReferences", "deletionTimestamp"):
        job["metadata"].pop(k, None)
    return job


def template_kind(template: dict) -> str:
    """What one run of ``template`` is: ``job`` (one pod), ``indexed`` (an Indexed Job: one pod per index, several
    nodes when parallel) or ``pytorchjob`` (a Kubeflow PyTorchJob)."""
    if template.get("kind") == "PyTorchJob":
        return "pytorchjob"
    return "indexed" if (template.get("spec") or {}).get("completionMode") == "Indexed" else "job"


def name_limit(template: dict) -> int:
    """Most characters of the name of a run of ``template``: :data:`MAX_MULTI_NODE_NAME` for an Indexed Job or a
    PyTorchJob, else :data:`MAX_NAME`."""
    return MAX_NAME if template_kind(template) == "job" else MAX_MULTI_NODE_NAME


def pod_templates(job: dict) -> list[dict]:
    """The pod templates of a Job (``spec.template``) or of every PyTorchJob replica (``spec.pytorchReplicaSpecs.*
    .template``), as the objects inside ``job`` (editing them edits ``job``)."""
    spec = job.get("spec") or {}
    if job.get("kind") == "PyTorchJob":
        return [r["template"] for r in (spec.get("pytorchReplicaSpecs") or {}).values()
                if isinstance(r, dict) and isinstance(r.get("template"), dict)]
    return [spec["template"]] if isinstance(spec.get("template"), dict) else []


def max_run_id_len(prefix: str, limit: int = MAX_NAME) -> int:
    """Longest run id that keeps ``<prefix>-<run id>`` within ``limit`` characters (63: a Job of one pod)."""
    return limit - len(prefix) - 1


def validate_run_id(run_id: str, prefix: str | None = None, limit: int = MAX_NAME) -> str:
    """Check a run id: a DNS-1123 label (lower-case letters, digits, '-'; starts and ends alphanumeric), short enough
    for ``<prefix>-<run id>`` to have at most ``limit`` characters (63 alone when ``prefix`` is None).

    Raises:
        InvalidArgument: the message says which rule failed and the length allowed.
    """
    limit = MAX_NAME if prefix is None else max_run_id_len(prefix, limit)
    if not run_id:
        raise InvalidArgument("run_id is empty")
    if not DNS1123_LABEL.match(run_id):
        raise InvalidArgument(f"run_id {run_id[:80]!r} must be a DNS-1123 label: lower-case letters, digits and "
                              "'-', starting and ending with a letter or digit (e.g. 'nightly-20250101')")
    if len(run_id) > limit:
        where = f"the Job name {prefix}-<run id>" if prefix else "a label value"
        total = limit + len(prefix) + 1 if prefix else MAX_NAME
        raise InvalidArgument(f"run_id {run_id!r} has {len(run_id)} characters; at most {limit} fit in {where} "
                              f"({total} characters)")
    return run_id


def generate_run_id(prefix: str, now: dt.datetime | None = None, limit: int = MAX_NAME) -> str:
    """A new run id: ``<UTC yyyymmdd-hhmmss>-<4 hex>`` (20 characters), or only hex digits (4-8) when the template
    name leaves less room within ``limit`` characters. Sorts by time when the long form fits."""
    room = max_run_id_len(prefix, limit)
    now = now or dt.datetime.now(dt.timezone.utc)
    if room >= 20:
        return f"{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
    return secrets.token_hex(4)[:max(min(room, 8), 1)]


def job_from_template(template: dict, phase: str, run_id: str, namespace: str, created: dt.datetime) -> dict:
    """The Job of one run: the template named ``<template name>-<run id>`` in ``namespace``, labelled (Job and pod
    templates) with ``mascot.ai/phase``, ``mascot.ai/run-id`` and ``app.kubernetes.io/*`` (name and part-of default
    to ``mascot``, component to ``training``, managed-by is ``mascot-gateway``), annotated with the trigger time.
    An Indexed Job's pod ``subdomain`` becomes the Job's name (its :func:`rendezvous_service`); a PyTorchJob's
    replicas are labelled alike."""
    job = copy.deepcopy(template)
    meta = job.setdefault("metadata", {})
    meta["name"] = f"{meta['name']}-{run_id}"
    meta["namespace"] = namespace
    labels = dict(meta.get("labels") or {})
    labels.setdefault("app.kubernetes.io/name", "mascot")
    labels.setdefault("app.kubernetes.io/component", "training")
    labels.setdefault("app.kubernetes.io/part-of", "mascot")
    labels["app.kubernetes.io/managed-by"] = MANAGED_BY
    labels[LABEL_PHASE], labels[LABEL_RUN_ID] = phase, run_id
    meta["labels"] = labels
    meta["annotations"] = {**(meta.get("annotations") or {}), ANNOTATION_CREATED: _iso(created)}
    for pod in pod_templates(job):
        pod_meta = pod.setdefault("metadata", {})
        pod_meta["labels"] = {**(pod_meta.get("labels") or {}), LABEL_PHASE: phase, LABEL_RUN_ID: run_id}
        if template_kind(job) == "indexed" and (pod.get("spec") or {}).get("subdomain"):
            pod["spec"]["subdomain"] = meta["name"]
    return job


def rendezvous_service(job: dict, owner_uid: str = "") -> dict | None:
    """The headless Service the pods of an Indexed Job meet through, or None when the Job needs none (not Indexed,
    or its pod template names no ``subdomain``).

    The Service is named as the pods' ``subdomain`` (the Job's name, :func:`job_from_template`), selects the run's
    pods by ``mascot.ai/phase`` and ``mascot.ai/run-id``, publishes them before they are ready (the rendezvous
    precedes readiness) and exposes the named ports of their containers. With ``owner_uid`` (the created Job's
    ``metadata.uid``) the Job owns it: the garbage collector deletes it with the Job (cancel, TTL).
    """
    if template_kind(job) != "indexed":
        return None
    pod = job["spec"]["template"]
    subdomain = (pod.get("spec") or {}).get("subdomain")
    if not subdomain:
        return None
    meta = job["metadata"]
    labels = meta.get("labels") or {}
    pod_labels = (pod.get("metadata") or {}).get("labels") or {}
    ports = [{"name": p["name"], "port": p["containerPort"], "targetPort": p["name"],
              "protocol": p.get("protocol", "TCP")}
             for c in (pod.get("spec") or {}).get("containers") or [] for p in c.get("ports") or [] if p.get("name")]
    svc_meta: dict[str, Any] = {"name": subdomain, "namespace": meta.get("namespace"), "labels": dict(labels)}
    if owner_uid:
        svc_meta["ownerReferences"] = [{"apiVersion": JOB[0], "kind": JOB[1], "name": meta["name"], "uid": owner_uid}]
    spec: dict[str, Any] = {"clusterIP": "None", "publishNotReadyAddresses": True,
                            "selector": {k: pod_labels[k] for k in (LABEL_PHASE, LABEL_RUN_ID) if k in pod_labels}}
    if ports:
        spec["ports"] = ports
    return {"apiVersion": "v1", "kind": "Service", "metadata": svc_meta, "spec": spec}


# ---------------------------------------------------------------------------------------------------- status
def _iso(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")


def parse_time(value: Any) -> dt.datetime | None:
    """An RFC 3339 timestamp of the API (``2025-01-01T00:00:00Z``) as an aware UTC datetime; None when absent or
    unparseable."""
    if not value or not isinstance(value, str):
        return None
    try:
        t = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def _condition_text(c: dict) -> str:
    return ": ".join(x for x in (c.get("reason") or "", c.get("message") or "") if x)


def run_status(job: dict) -> RunStatus:
    """Map a Job (a dict as the API returns it) to a :class:`RunStatus`.

    Rules, first match wins: ``metadata.deletionTimestamp`` set -> ``cancelled``; condition ``Complete`` true ->
    ``succeeded`` (finish: ``status.completionTime``, else the condition's time); condition ``Failed`` true ->
    ``failed`` (finish: the condition's ``lastTransitionTime``; message its reason, e.g. ``BackoffLimitExceeded``);
    ``Suspended`` true -> ``pending``; a ready pod (``status.ready`` > 0, or ``active`` > 0 where the API does not
    report ``ready``) or a pending ``SuccessCriteriaMet``/``FailureTarget`` -> ``running``; otherwise ``pending``.
    Reference: Kubernetes Job status, https://kubernetes.io/docs/concepts/workloads/controllers/job/.
    A PyTorchJob (``kind`` PyTorchJob) is read by :func:`_pytorch_job_state` instead.
    """
    meta = job.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    st = job.get("status") or {}
    conds = {c.get("type"): c for c in st.get("conditions") or [] if str(c.get("status")) == "True"}
    if job.get("kind") == "PyTorchJob":
        state, finish, message, active, failed = _pytorch_job_state(meta, st, conds)
        return RunStatus(run_id=labels.get(LABEL_RUN_ID, ""), phase=labels.get(LABEL_PHASE, ""),
                         job_name=meta.get("name", ""), namespace=meta.get("namespace", ""), state=state,
                         create_time=parse_time(annotations.get(ANNOTATION_CREATED)) or parse_time(
                             meta.get("creationTimestamp")),
                         start_time=parse_time(st.get("startTime")), finish_time=finish, message=message[:500],
                         active_pods=active, failed_pods=failed, kind="PyTorchJob")
    active, failed = int(st.get("active") or 0), int(st.get("failed") or 0)
    ready = st.get("ready")
    start = parse_time(st.get("startTime"))
    finish = None
    if meta.get("deletionTimestamp"):
        state, finish = "cancelled", parse_time(meta["deletionTimestamp"])
        message = "cancelled: the Job is being deleted"
    elif "Complete" in conds:
        c = conds["Complete"]
        state, finish = "succeeded", parse_time(st.get("completionTime")) or parse_time(c.get("lastTransitionTime"))
        message = _condition_text(c) or "the Job completed; its adapters are published as staged"
    elif "Failed" in conds:
        c = conds["Failed"]
        state, finish = "failed", parse_time(c.get("lastTransitionTime"))
        message = _condition_text(c) or "the Job failed"
    elif "Suspended" in conds:
        state, message = "pending", "suspended: " + (_condition_text(conds["Suspended"]) or "spec.suspend is true")
    elif "FailureTarget" in conds or "SuccessCriteriaMet" in conds:
        c = conds.get("FailureTarget") or conds["SuccessCriteriaMet"]
        state, message = "running", f"finishing ({c.get('type')}): {_condition_text(c)}".rstrip(": ")
    elif (ready is not None and int(ready) > 0) or (ready is None and active > 0):
        state, message = "running", f"{active} pod(s) running"
    elif active > 0:
        state, message = "pending", f"{active} pod(s) not ready yet (scheduling or pulling the image)"
    else:
        state = "pending"
        message = f"waiting for a pod ({failed} failed so far)" if failed else "waiting for a pod"
    return RunStatus(run_id=labels.get(LABEL_RUN_ID, ""), phase=labels.get(LABEL_PHASE, ""),
                     job_name=meta.get("name", ""), namespace=meta.get("namespace", ""), state=state,
                     create_time=parse_time(annotations.get(ANNOTATION_CREATED)) or parse_time(
                         meta.get("creationTimestamp")),
                     start_time=start, finish_time=finish, message=message[:500], active_pods=active,
                     failed_pods=failed)


def _pytorch_job_state(meta: dict, st: dict, conds: dict) -> tuple[str, dt.datetime | None, str, int, int]:
    """``(state, finish, message, active pods, failed pods)`` of a PyTorchJob (Kubeflow training operator status:
    conditions Created, Running, Restarting, Suspended, Succeeded, Failed; pods per replica in
    ``replicaStatuses``). First match wins: being deleted -> cancelled; Succeeded -> succeeded; Failed -> failed;
    Suspended -> pending; Restarting or Running -> running; otherwise pending."""
    replicas = [r for r in (st.get("replicaStatuses") or {}).values() if isinstance(r, dict)]
    active = sum(int(r.get("active") or 0) for r in replicas)
    failed = sum(int(r.get("failed") or 0) for r in replicas)
    if meta.get("deletionTimestamp"):
        return "cancelled", parse_time(meta["deletionTimestamp"]), "cancelled: the PyTorchJob is being deleted", \
            active, failed
    if "Succeeded" in conds:
        c = conds["Succeeded"]
        finish = parse_time(st.get("completionTime")) or parse_time(c.get("lastTransitionTime"))
        return "succeeded", finish, _condition_text(c) or "the PyTorchJob succeeded", active, failed
    if "Failed" in conds:
        c = conds["Failed"]
        finish = parse_time(c.get("lastTransitionTime")) or parse_time(st.get("completionTime"))
        return "failed", finish, _condition_text(c) or "the PyTorchJob failed", active, failed
    if "Suspended" in conds:
        return "pending", None, "suspended: " + (_condition_text(conds["Suspended"]) or "runPolicy.suspend is true"), \
            active, failed
    if "Restarting" in conds:
        return "running", None, f"restarting: {_condition_text(conds['Restarting'])}".rstrip(": "), active, failed
    if "Running" in conds:
        return "running", None, f"{active} pod(s) running", active, failed
    return "pending", None, "waiting for the training operator's pods", active, failed


# ------------------------------------------------------------------------------------------------- API client
def api_client(kubeconfig: str = "", context: str = "") -> Any:
    """A kubernetes ``ApiClient``: the in-cluster config (service account token) when running in a pod and no
    ``kubeconfig`` is given, else the kubeconfig (``kubeconfig``, ``$KUBECONFIG`` or ``~/.kube/config``).

    Raises:
        ValueError: no usable configuration (the message names what was tried).
    """
    from kubernetes import client, config as kconfig

    cfg = client.Configuration()
    try:
        if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
            kconfig.load_incluster_config(client_configuration=cfg)
        else:
            kconfig.load_kube_config(config_file=kubeconfig or None, context=context or None,
                                     client_configuration=cfg)
    except (kconfig.ConfigException, OSError, TypeError) as e:
        raise ValueError(f"no Kubernetes API configuration (kubeconfig {kubeconfig or '$KUBECONFIG/~/.kube/config'}"
                         f"{', context ' + context if context else ''}; in-cluster when KUBERNETES_SERVICE_HOST is "
                         f"set): {e}") from None
    return client.ApiClient(cfg)


def default_namespace(kubeconfig: str = "", context: str = "") -> str:
    """The namespace to use when neither the config nor the template names one: the pod's own (service account
    mount) in a cluster, else the kubeconfig context's, else ``default``."""
    if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            return Path(SA_NAMESPACE_FILE).read_text(encoding="utf-8").strip() or "default"
        except OSError:
            return "default"
    try:
        from kubernetes import config as kconfig

        contexts, active = kconfig.list_kube_config_contexts(config_file=kubeconfig or None)
        ctx = next((c for c in contexts if c.get("name") == context), None) if context else active
        return ((ctx or {}).get("context") or {}).get("namespace") or "default"
    except Exception:  # noqa: BLE001 - no kubeconfig to read: the API default
        return "default"


def _api_reason(e: Any) -> str:
    """``<status> <reason>: <message>`` of an ApiException (the Status body's message when it has one)."""
    msg = ""
    try:
        msg = json.loads(e.body or "{}").get("message") or ""
    except (ValueError, AttributeError, TypeError):
        msg = str(e.body or "")[:300]
    return f"{e.status} {e.reason}{': ' + msg[:300] if msg else ''}"


# ------------------------------------------------------------------------------------------------ the manager
