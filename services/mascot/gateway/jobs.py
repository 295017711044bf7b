"""Create, follow, list and cancel training runs as Kubernetes Jobs.

One run is one ``batch/v1`` Job made from the phase's Job template (the chart's ``/etc/mascot/training/<phase>.yaml``
or ``training-jobs/k8s/<phase>-job.yaml``): the template's ``metadata.name`` is a prefix, the Job is named
``<prefix>-<run id>`` (at most 63 characters; Job specs are immutable, so every run gets its own Job), and carries
the labels ``mascot.ai/phase`` and ``mascot.ai/run-id`` (Job and pod template) plus ``app.kubernetes.io/*``. The chart's
pods read their run directory name from their Job's name (``batch.kubernetes.io/job-name``).

Runs on several nodes (the chart's ``training.nodes``): an Indexed Job template gets, with each Job, the headless
Service its pods meet through (:func:`~mascot.gateway.job_specs.rendezvous_service`), owned by the Job so that it goes
when the Job goes; a ``kubeflow.org/v1`` PyTorchJob template is created, listed, read and deleted as that custom
resource (its operator makes the pods and Services). Names of both kinds have at most 52 characters.

Semantics (:class:`JobManager`):

- **Idempotent per run id**: triggering a run id that already has a Job of the same phase returns that run
  (``already_existed``); a race lost to another creator (HTTP 409) is answered the same way. The same id in another
  phase is refused (:class:`AlreadyExists`).
- **Concurrency limit**: before creating, the phase's unfinished Jobs (label ``mascot.ai/phase``, including the
  chart's CronJob runs) are counted; at ``max_active_runs`` the trigger fails with
  :class:`~mascot.core.errors.ResourceExhausted`. Check and create are serialised inside this process only: two
  gateway replicas triggering at the same instant can overshoot the limit by one.
- **Status** follows the Job's ``status`` (see :func:`run_status`).
- **Cancel** deletes the Job (``propagationPolicy`` Background or Foreground, so its pods go too); the run is
  ``cancelled`` while the Job is being deleted and, afterwards, from an in-process record (lost when the gateway
  restarts: a cancelled run is then NOT_FOUND).

The kubernetes client is synchronous: call these methods from a thread (``asyncio.to_thread``). Objects are handled
as plain dicts (``_preload_content=False``), so nothing depends on the client's model classes.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import logging
import threading
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from mascot.core.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from mascot.gateway.job_specs import (  # noqa: F401  (the public names of the run model, re-exported)
    PHASES,
    LABEL_PHASE,
    LABEL_RUN_ID,
    ANNOTATION_CREATED,
    MANAGED_BY,
    SCOPE_LABELS,
    DNS1123_LABEL,
    MAX_NAME,
    MIN_RUN_ID,
    STATES,
    FINISHED,
    SA_NAMESPACE_FILE,
    _CANCELLED_KEPT,
    RunStatus,
    TriggerResult,
    template_path,
    load_template,
    max_run_id_len,
    validate_run_id,
    generate_run_id,
    job_from_template,
    _iso,
    parse_time,
    _condition_text,
    run_status,
    JOB,
    PYTORCH_JOB,
    MAX_MULTI_NODE_NAME,
    template_kind,
    name_limit,
    pod_templates,
    rendezvous_service,
    api_client,
    default_namespace,
    _api_reason,
)

log = logging.getLogger(__name__)


class JobManager:
    """Training runs of the configured phases as Kubernetes Jobs.

    Args:
        templates: ``{phase: Job template dict}`` (:func:`load_template`); phases not in :data:`PHASES` are refused.
        client: A kubernetes ``ApiClient`` (:func:`api_client`; tests pass one pointed at kmock). Closed by
            :meth:`close`.
        namespace: Where Jobs are created and read; "" = the first template's ``metadata.namespace``, else
            ``fallback_namespace``.
        fallback_namespace: The namespace when neither names one (:func:`default_namespace`).
        max_active_runs: Unfinished Jobs allowed per phase (>= 1).
        propagation: ``Background`` or ``Foreground`` deletion of a cancelled Job's pods.
        timeout_s: Timeout of each API request, in seconds.
        clock: Returns the current UTC time (tests).

    Raises:
        ValueError: no template, an unknown phase, a bad propagation policy or limit.
    """

    def __init__(self, templates: dict[str, dict], client: Any, namespace: str = "", *,
                 fallback_namespace: str = "default", max_active_runs: int = 1,
                 propagation: str = "Background", timeout_s: float = 30.0,
                 clock: Callable[[], dt.datetime] | None = None) -> None:
        from kubernetes import client as kclient

        if not templates:
            raise ValueError("no Job template: TrainingService needs at least one phase's template")
        unknown = set(templates) - set(PHASES)
        if unknown:
            raise ValueError(f"unknown training phase(s) {sorted(unknown)}; choose from {PHASES}")
        if propagation not in ("Background", "Foreground"):
            raise ValueError(f"propagation must be Background or Foreground, got {propagation!r}")
        if max_active_runs < 1:
            raise ValueError("max_active_runs must be >= 1")
        self.templates = {p: copy.deepcopy(t) for p, t in templates.items()}
        self.client = client
        self.api = kclient.BatchV1Api(client)
        self.core = kclient.CoreV1Api(client)
        self.custom = kclient.CustomObjectsApi(client)
        #: Kinds of the runs this manager creates (``job``, ``indexed``, ``pytorchjob``; :func:`template_kind`).
        self.kinds = {template_kind(t) for t in self.templates.values()}
        tmpl_ns = next((t["metadata"].get("namespace") for t in self.templates.values()
                        if t["metadata"].get("namespace")), "")
        self.namespace = namespace or tmpl_ns or fallback_namespace or "default"
        self.max_active_runs, self.propagation, self.timeout_s = max_active_runs, propagation, timeout_s
        self.clock = clock or (lambda: dt.datetime.now(dt.timezone.utc))
        self.scope: dict[str, str] = {}
        for key in SCOPE_LABELS:
            values = {(t["metadata"].get("labels") or {}).get(key) for t in self.templates.values()}
            if len(values) == 1 and None not in values:
                self.scope[key] = values.pop()
        self._lock = threading.Lock()
        self._cancelled: OrderedDict[str, RunStatus] = OrderedDict()

    @classmethod
    def from_directory(cls, directory: str | Path, client: Any, namespace: str = "", **kw: Any) -> "JobManager":
        """Load every phase's template found in ``directory`` (:func:`template_path`).

        Raises:
            ValueError: no template found, or one that :func:`load_template` refuses.
        """
        templates = {p: load_template(path) for p in PHASES if (path := template_path(directory, p)) is not None}
        if not templates:
            raise ValueError(f"no Job template in {directory}: expected {' or '.join(p + '.yaml' for p in PHASES)} "
                             "(or <phase>-job.yaml)")
        return cls(templates, client, namespace, **kw)

    @property
    def phases(self) -> tuple[str, ...]:
        """The phases with a template, in :data:`PHASES` order."""
        return tuple(p for p in PHASES if p in self.templates)

    def close(self) -> None:
        """Close the API client's connection pools."""
        close = getattr(self.client, "close", None)
        if close is not None:
            close()

    # ------------------------------------------------------------------------------------------ API calls
    def _call(self, what: str, fn: Callable, *args: Any, missing_ok: bool = False, **kw: Any) -> Any:
        """Call the API; return the decoded JSON body (None on 404 when ``missing_ok``).

        Raises:
            FailedPrecondition: the API refused the object (400/422: a template the cluster does not accept).
            Unavailable: any other API error or an unreachable server, with the reason.
            The ApiException itself for 409 (the caller decides).
        """
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            resp = fn(*args, _preload_content=False, _request_timeout=self.timeout_s, **kw)
            data = resp.data
            return json.loads(data) if data else {}
        except ApiException as e:
            if e.status == 404 and missing_ok:
                return None
            if e.status == 409:
                raise
            if e.status in (400, 422):
                raise FailedPrecondition(f"the Kubernetes API refused to {what} ({_api_reason(e)}); fix the Job "
                                         "template") from None
            hint = ("; check the gateway's Role (create/get/list/watch/delete on batch Jobs; create/delete on "
                    "Services for runs on several nodes; create/get/list/watch/delete on kubeflow.org PyTorchJobs)"
                    ) if e.status in (
                401, 403) else ""
            raise Unavailable(f"the Kubernetes API failed to {what} ({_api_reason(e)}){hint}") from None
        except (HTTPError, OSError, ValueError) as e:
            why = (str(e).splitlines() or [type(e).__name__])[0][:300]
            raise Unavailable(f"the Kubernetes API at {self.client.configuration.host} is unreachable while trying "
                              f"to {what} ({why})") from None

    def _list(self, equals: dict[str, str], exists: tuple[str, ...] = ()) -> list[dict]:
        """Jobs (and PyTorchJobs, when a template is one) in the namespace whose labels match (also checked here, so
        a server that ignores the selector cannot widen the result)."""
        sel = ",".join([*(f"{k}={v}" for k, v in equals.items()), *exists])
        body = self._call("list Jobs", self.api.list_namespaced_job, self.namespace, label_selector=sel)
        items = list((body or {}).get("items") or [])
        if "pytorchjob" in self.kinds:
            group, version = PYTORCH_JOB[0].split("/")
            more = self._call("list PyTorchJobs", self.custom.list_namespaced_custom_object, group, version,
                              self.namespace, "pytorchjobs", missing_ok=True, label_selector=sel)
            items += [{**j, "kind": "PyTorchJob"} for j in (more or {}).get("items") or []]
        out = []
        for job in items:
            labels = (job.get("metadata") or {}).get("labels") or {}
            if all(labels.get(k) == v for k, v in equals.items()) and all(k in labels for k in exists):
                out.append(job)
        return out

    def _jobs_of_run(self, run_id: str) -> list[dict]:
        return self._list(dict(self.scope, **{LABEL_RUN_ID: run_id}), (LABEL_PHASE,))

    def _read(self, name: str, kind: str = "Job") -> dict | None:
        if kind == "PyTorchJob":
            group, version = PYTORCH_JOB[0].split("/")
            got = self._call(f"read PyTorchJob {name}", self.custom.get_namespaced_custom_object, group, version,
                             self.namespace, "pytorchjobs", name, missing_ok=True)
            return None if got is None else {**got, "kind": "PyTorchJob"}
        return self._call(f"read Job {name}", self.api.read_namespaced_job, name, self.namespace, missing_ok=True)

    def _create(self, job: dict) -> dict:
        """Create the run's object (a Job or a PyTorchJob); the ApiException of a 409 is raised."""
        name = job["metadata"]["name"]
        if job["kind"] == "PyTorchJob":
            group, version = PYTORCH_JOB[0].split("/")
            got = self._call(f"create PyTorchJob {name}", self.custom.create_namespaced_custom_object, group,
                             version, self.namespace, "pytorchjobs", job)
            return {**(got or job), "kind": "PyTorchJob"}
        return self._call(f"create Job {name}", self.api.create_namespaced_job, self.namespace, job)

    def _delete(self, name: str, kind: str) -> None:
        """Delete a run's object (missing is fine), its pods by the configured propagation policy."""
        if kind == "PyTorchJob":
            group, version = PYTORCH_JOB[0].split("/")
            self._call(f"delete PyTorchJob {name}", self.custom.delete_namespaced_custom_object, group, version,
                       self.namespace, "pytorchjobs", name, missing_ok=True, propagation_policy=self.propagation)
        else:
            self._call(f"delete Job {name}", self.api.delete_namespaced_job, name, self.namespace,
                       missing_ok=True, propagation_policy=self.propagation)

    def _ensure_rendezvous(self, job: dict) -> None:
        """Create the headless Service of an Indexed Job (:func:`rendezvous_service`), owned by the Job when the API
        reported its uid; one that exists already is kept.

        Raises:
            FailedPrecondition, Unavailable: as :meth:`_call`.
        """
        from kubernetes.client.exceptions import ApiException

        name = job["metadata"]["name"]
        if rendezvous_service(job) is None:
            return
        uid = (job.get("metadata") or {}).get("uid") or ((self._read(name) or {}).get("metadata") or {}).get("uid")
        svc = rendezvous_service(job, uid or "")
        if not uid:
            log.warning("Job %s/%s has no uid: its rendezvous Service is not owned by it (deleted on cancel only)",
                        self.namespace, name)
        try:
            self._call(f"create Service {svc['metadata']['name']}", self.core.create_namespaced_service,
                       self.namespace, svc)
        except ApiException:  # 409: it exists (a trigger repeated)
            pass

    def _unfinished(self, phase: str) -> list[RunStatus]:
        runs = [run_status(j) for j in self._list(dict(self.scope, **{LABEL_PHASE: phase}))]
        return [r for r in runs if not r.finished]

    # ------------------------------------------------------------------------------------------ operations
    def phase_of(self, phase: str) -> str:
        """Check ``phase``.

        Raises:
            InvalidArgument: not one of :data:`PHASES`.
            FailedPrecondition: a known phase without a template here.
        """
        if phase not in PHASES:
            raise InvalidArgument(f"unknown training phase {phase!r}; choose from {', '.join(PHASES)}")
        if phase not in self.templates:
            raise FailedPrecondition(f"phase {phase} has no Job template on this gateway (training.templates_dir "
                                     f"holds {', '.join(self.phases)}); enable it in the chart")
        return phase

    def trigger(self, phase: str, run_id: str = "") -> TriggerResult:
        """Create the run's Job, or return the existing run of this phase with this id.

        Args:
            phase: ``persona-alignment`` or ``collaborative``.
            run_id: A DNS-1123 label (:func:`validate_run_id`); "" generates one (:func:`generate_run_id`).

        Returns:
            The run (``pending`` when new) and whether it existed before.

        Raises:
            InvalidArgument: bad phase or run id.
            AlreadyExists: the run id belongs to a run of another phase.
            FailedPrecondition: no template for the phase, a Job of this id still being deleted, or a template (or,
                on several nodes, a rendezvous Service) the API refuses; the Job of a run whose Service cannot be
                made is deleted again.
            ResourceExhausted: the phase has ``max_active_runs`` unfinished Jobs (the message names them).
            Unavailable: the Kubernetes API failed.
        """
        from kubernetes.client.exceptions import ApiException

        self.phase_of(phase)
        template = self.templates[phase]
        prefix, limit = template["metadata"]["name"], name_limit(template)
        generated = not run_id
        with self._lock:
            for _ in range(5):
                rid = generate_run_id(prefix, self.clock(), limit) if generated else \
                    validate_run_id(run_id, prefix, limit)
                name = f"{prefix}-{rid}"
                runs = self._jobs_of_run(rid)
                others = [j for j in runs if (j["metadata"].get("labels") or {}).get(LABEL_PHASE) != phase]
                mine = [j for j in runs if j not in others and j["metadata"].get("name") == name]
                existing = mine[0] if mine else self._read(name, template["kind"])
                if generated and (others or existing is not None):
                    continue  # a generated id collided: draw another
                break
            else:  # pragma: no cover - five collisions of a 16-bit suffix within one second
                raise Unavailable("could not generate a free run id; pass one")
            if others:
                o = run_status(others[0])
                raise AlreadyExists(f"run id {rid!r} belongs to a {o.phase} run (Job {o.job_name}); choose another")
            if existing is not None:
                run = run_status(existing)
                if run.state == "cancelled":
                    raise FailedPrecondition(f"run {rid} is still being deleted after a cancel; trigger it again "
                                             "once GetRun says NOT_FOUND or cancelled with no Job")
                if not run.finished:
                    self._ensure_rendezvous({**existing, "kind": existing.get("kind") or "Job"})
                return TriggerResult(run, already_existed=True)
            active = self._unfinished(phase)
            if len(active) >= self.max_active_runs:
                names = ", ".join(r.run_id or r.job_name for r in active[:5])
                raise ResourceExhausted(
                    f"phase {phase} already has {len(active)} unfinished run(s) ({names}); the limit is "
                    f"{self.max_active_runs} (training.max_active_runs): wait for one to finish or cancel it")
            job = job_from_template(template, phase, rid, self.namespace, self.clock())
            try:
                created = self._create(job)
            except ApiException:  # 409: another creator won the race
                again = self._read(name, job["kind"])
                if again is None:
                    raise Unavailable(f"Job {name} was reported to exist but cannot be read; retry") from None
                return TriggerResult(run_status(again), already_existed=True)
            try:
                self._ensure_rendezvous({**job, **(created or {}), "kind": job["kind"]})
            except (FailedPrecondition, Unavailable) as e:  # without its Service the pods could never meet
                self._delete(name, job["kind"])
                raise type(e)(f"{e} (Job {name} deleted again: its pods could not have met)") from None
            self._cancelled.pop(rid, None)
        log.info("training run %s (%s) created as Job %s/%s", rid, phase, self.namespace, name)
        return TriggerResult(run_status(created or job), already_existed=False)

    def get(self, run_id: str) -> RunStatus:
        """The run's current status.

        Raises:
            InvalidArgument: a malformed run id.
            NotFound: no Job carries the id and this process did not cancel it.
            Unavailable: the Kubernetes API failed.
        """
        validate_run_id(run_id)
        jobs = self._jobs_of_run(run_id)
        if jobs:
            return max((run_status(j) for j in jobs), key=_newest)
        with self._lock:
            if run_id in self._cancelled:
                return self._cancelled[run_id]
        raise NotFound(f"no training run {run_id!r} in namespace {self.namespace} (finished Jobs are deleted after "
                       "the template's ttlSecondsAfterFinished)")

    def list(self, phase: str = "", limit: int = 50) -> list[RunStatus]:
        """Runs whose Jobs exist (of ``phase``, or every phase when ""), newest first, at most ``limit``
        (0 = no limit).

        Raises:
            InvalidArgument: an unknown phase.
            Unavailable: the Kubernetes API failed.
        """
        if phase and phase not in PHASES:
            raise InvalidArgument(f"unknown training phase {phase!r}; choose from {', '.join(PHASES)}")
        equals = dict(self.scope, **({LABEL_PHASE: phase} if phase else {}))
        runs = sorted((run_status(j) for j in self._list(equals, (LABEL_RUN_ID, LABEL_PHASE))), key=_newest,
                      reverse=True)
        return runs[:limit] if limit else runs

    def cancel(self, run_id: str) -> tuple[RunStatus, bool]:
        """Delete a pending or running run's Job (pods with it, by the configured propagation policy).

        Returns:
            ``(run in state cancelled, already_cancelled)``.

        Raises:
            InvalidArgument: a malformed run id.
            NotFound: unknown run.
            FailedPrecondition: the run already succeeded or failed.
            Unavailable: the Kubernetes API failed.
        """
        validate_run_id(run_id)
        with self._lock:
            jobs = self._jobs_of_run(run_id)
            if not jobs:
                if run_id in self._cancelled:
                    return self._cancelled[run_id], True
                raise NotFound(f"no training run {run_id!r} in namespace {self.namespace}")
            run = max((run_status(j) for j in jobs), key=_newest)
            if run.state == "cancelled":
                return run, True
            if run.finished:
                raise FailedPrecondition(f"run {run_id} already {run.state}; only pending or running runs can be "
                                         "cancelled")
            self._delete(run.job_name, run.kind)
            if template_kind(self.templates.get(run.phase) or {}) == "indexed":  # owned by the Job; gone sooner
                self._call(f"delete Service {run.job_name}", self.core.delete_namespaced_service, run.job_name,
                           self.namespace, missing_ok=True)
            done = replace(run, state="cancelled", finish_time=self.clock(),
                           message=f"cancelled: {run.kind} deleted ({self.propagation} propagation)")
            self._cancelled[run_id] = done
            while len(self._cancelled) > _CANCELLED_KEPT:
                self._cancelled.popitem(last=False)
        log.info("training run %s (%s) cancelled: Job %s/%s deleted", run_id, run.phase, self.namespace,
                 run.job_name)
        return done, False


def _newest(run: RunStatus) -> dt.datetime:
    return run.create_time or dt.datetime.min.replace(tzinfo=dt.timezone.utc)
