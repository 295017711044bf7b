"""Run ids, Job templates, run status and the API client of :mod:`mascot.core.jobs` (the pure part: no calls to the
Kubernetes API except building a client).

A run's Job is ``<template metadata.name>-<run id>`` (at most 63 characters) with the labels ``mascot.ai/phase`` and
``mascot.ai/run-id``; :func:`run_status` maps a Job's ``status`` to pending / running / succeeded / failed /
cancelled.
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
        active_pods: ``status.active``.
        failed_pods: ``status.failed``.
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
        The Job as a dict (``status`` and server-set metadata removed).

    Raises:
        ValueError: unreadable YAML, not exactly one ``batch/v1`` Job, or a ``metadata.name`` that is not a DNS-1123
            label leaving at least :data:`MIN_RUN_ID` characters for the run id.
    """
    try:
        docs = [d for d in yaml.safe_load_all(Path(path).read_text(encoding="utf-8")) if d is not None]
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"Job template {path}: {e}") from None
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise ValueError(f"Job template {path} must hold exactly one object, found {len(docs)}")
    job = docs[0]
    if job.get("apiVersion") != "batch/v1" or job.get("kind") != "Job":
        raise ValueError(f"Job template {path} is a {job.get('apiVersion')}/{job.get('kind')}, not a batch/v1 Job")
    name = (job.get("metadata") or {}).get("name") or ""
    if not DNS1123_LABEL.match(name) or len(name) > MAX_NAME - 1 - MIN_RUN_ID:
        raise ValueError(f"Job template {path}: metadata.name {name!r} must be a DNS-1123 label of at most "
                         f"{MAX_NAME - 1 - MIN_RUN_ID} characters (the run id is appended)")
    if not isinstance((job.get("spec") or {}).get("template"), dict):
        raise ValueError(f"Job template {path} has no spec.template")
    job = copy.deepcopy(job)
    job.pop("status", None)
    for k in ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "selfLink",
              "generateName", "ownerReferences", "deletionTimestamp"):
        job["metadata"].pop(k, None)
    return job


def max_run_id_len(prefix: str) -> int:
    """Longest run id that keeps ``<prefix>-<run id>`` within 63 characters."""
    return MAX_NAME - len(prefix) - 1


def validate_run_id(run_id: str, prefix: str | None = None) -> str:
    """Check a run id: a DNS-1123 label (lower-case letters, digits, '-'; starts and ends alphanumeric), short enough
    for ``<prefix>-<run id>`` to have at most 63 characters (63 alone when ``prefix`` is None).

    Raises:
        InvalidArgument: the message says which rule failed and the length allowed.
    """
    limit = MAX_NAME if prefix is None else max_run_id_len(prefix)
    if not run_id:
        raise InvalidArgument("run_id is empty")
    if not DNS1123_LABEL.match(run_id):
        raise InvalidArgument(f"run_id {run_id[:80]!r} must be a DNS-1123 label: lower-case letters, digits and "
                              "'-', starting and ending with a letter or digit (e.g. 'nightly-20250101')")
    if len(run_id) > limit:
        where = f"the Job name {prefix}-<run id>" if prefix else "a label value"
        raise InvalidArgument(f"run_id {run_id!r} has {len(run_id)} characters; at most {limit} fit in {where} "
                              "(63 characters)")
    return run_id


def generate_run_id(prefix: str, now: dt.datetime | None = None) -> str:
    """A new run id: ``<UTC yyyymmdd-hhmmss>-<4 hex>`` (20 characters), or only hex digits (4-8) when the template
    name leaves less room. Sorts by time when the long form fits."""
    room = max_run_id_len(prefix)
    now = now or dt.datetime.now(dt.timezone.utc)
    if room >= 20:
        return f"{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
    return secrets.token_hex(4)[:max(min(room, 8), 1)]


def job_from_template(template: dict, phase: str, run_id: str, namespace: str, created: dt.datetime) -> dict:
    """The Job of one run: the template named ``<template name>-<run id>`` in ``namespace``, labelled (Job and pod
    template) with ``mascot.ai/phase``, ``mascot.ai/run-id`` and ``app.kubernetes.io/*`` (name and part-of default
    to ``mascot``, component to ``training``, managed-by is ``mascot-gateway``), annotated with the trigger time."""
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
    pod_meta = job["spec"]["template"].setdefault("metadata", {})
    pod_meta["labels"] = {**(pod_meta.get("labels") or {}), LABEL_PHASE: phase, LABEL_RUN_ID: run_id}
    return job


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
    """
    meta = job.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    st = job.get("status") or {}
    conds = {c.get("type"): c for c in st.get("conditions") or [] if str(c.get("status")) == "True"}
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
