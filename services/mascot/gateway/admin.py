"""AdapterService: the adapter registry's admin service, hosted by the control plane.

The control plane is the only writer of ``<store>/registry.json``; the store is any URI
:func:`mascot.core.adapters.store.open_store` takes (a local directory, ``pvc://<claim>/<path>``,
``s3://<bucket>/<prefix>``). Every call needs ``authorization: Bearer <token>`` metadata whose identity has the
method's role (:mod:`mascot.gateway.control_auth`); every change is recorded in the audit trail
(:mod:`mascot.gateway.audit`), which ListAuditEvents pages through. Writes go through
:meth:`mascot.core.adapters.store.AdapterStore.update` (lock + compare-and-swap on the registry), so two writers never
lose an update and a refused transition writes nothing. Store trouble (unreadable registry, lock held too long, a
registry that kept changing, I/O or S3 errors) is UNAVAILABLE with the reason. PublishAdapter reads only absolute
local directories inside ``adapters.allowed_source_prefixes`` (docs/security.md).
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
from pathlib import Path
from typing import Any

from mascot.api.adapter.v1 import adapter_pb2 as pb
from mascot.api.adapter.v1 import adapter_pb2_grpc as pb_grpc
from mascot.core.adapters import registry as rg
from mascot.core.adapters import store as st
from mascot.core.enums import enum_value
from mascot.core.errors import FailedPrecondition, InvalidArgument, Unavailable
from mascot.gateway.audit import ControlGuard

log = logging.getLogger(__name__)


def read_admin_token(env_name: str, file_path: str) -> str:
    """The admin token from ``file_path`` (stripped) when set, else from the environment variable ``env_name``;
    "" when neither holds one."""
    if file_path:
        try:
            return Path(file_path).read_text(encoding="utf-8").strip()
        except OSError:
            return ""
    return os.environ.get(env_name, "").strip() if env_name else ""


def check_source_path(source: str, prefixes: list[str]) -> Path:
    """The resolved adapter directory of PublishAdapter if it lies inside one of ``prefixes``
    (``adapters.allowed_source_prefixes``; symlinks resolved), with no link at any depth in it leading outside the
    adapter directory itself.

    Raises:
        InvalidArgument: a path that is not absolute or is a URI, one outside every allowed prefix, or one holding
            a link (at any depth) that leaves it.
    """
    if not source.startswith("/") or "://" in source or "\0" in source:
        raise InvalidArgument("source_path must be an absolute local directory of the gateway (no URI, no relative "
                              "path)")
    roots = [Path(os.path.realpath(p)) for p in prefixes]

    real = Path(os.path.realpath(source))
    outside = not any(st.path_inside(real, r) for r in roots)
    if not outside and real.is_dir():  # every link at any depth must stay inside the adapter directory itself
        for dirpath, dirnames, filenames in os.walk(real):
            for name in [*dirnames, *filenames]:
                f = Path(dirpath) / name
                if f.is_symlink() and not st.path_inside(Path(os.path.realpath(f)), real):
                    raise InvalidArgument(f"source_path holds a link {f.relative_to(real).as_posix()[:200]!r} that "
                                          "leads outside the adapter directory; the gateway copies no file through "
                                          "such links: copy the file into the directory")
    if outside:
        allowed = ", ".join(prefixes) if prefixes else "none: publishing is off"
        raise InvalidArgument(f"source_path {source[:200]!r} is outside the directories the gateway publishes from "
                              f"(adapters.allowed_source_prefixes: {allowed}); write the adapter under one of them or "
                              "add its directory to that setting")
    return real


def persona_to_proto(persona_id: str, entry: dict) -> pb.PersonaAdapters:
    """A registry entry as :class:`PersonaAdapters` (versions oldest first)."""
    def name(n: str, v: dict) -> str:
        return v["name"] if "name" in v else rg.version_name(persona_id, int(n))

    def state(v: dict) -> int:
        return enum_value(pb.AdapterState, v.get("state"), default=pb.ADAPTER_STATE_UNSPECIFIED)

    versions = [pb.AdapterVersion(version=int(n), name=name(n, v), state=state(v),
                                  digest=v.get("digest", ""), create_time=v.get("created", ""))
                for n, v in sorted(entry.get("versions", {}).items(), key=lambda kv: int(kv[0]))]
    return pb.PersonaAdapters(persona_id=persona_id, versions=versions, stable=entry.get("stable") or 0,
                              canary=entry.get("canary") or 0, canary_weight=float(entry.get("canary_weight") or 0),
                              previous_stable=list(entry.get("previous_stable") or []))


class AdapterServicer(pb_grpc.AdapterServiceServicer):
    """Serves AdapterService on an adapter store.

    Args:
        store: Store URI or path (local, ``file://``, ``pvc://``, ``s3://``) or an opened
            :class:`~mascot.core.adapters.store.AdapterStore`.
        base_model: The serving base model adapters must name.
        token: The :class:`~mascot.gateway.audit.ControlGuard` (roles and audit trail), or a single admin token
            (role admin, no stored trail; "" refuses every call).
        max_rank: Serving limit on the LoRA rank.
        known_ids: Persona ids that may own adapters (the catalog's plus "director"); None accepts any snake_case id.
        config: Optional ``AdaptersConfig`` supplying ``pvc_root`` and ``s3_endpoint_url`` for opening ``store``.
        gate: Optional evaluation gate of PromoteAdapter, ``async (persona_id, candidate, baseline) -> GateResult``
            (:func:`mascot.gateway.promote_gate.evaluate_promotion` bound to the speaker, judge and situations);
            it runs for persona versions, not for the director's.

    Raises:
        ValueError: ``store`` is not a supported URI.
    """

    def __init__(self, store: str | Path | st.AdapterStore, base_model: str, token: "ControlGuard | str",
                 max_rank: int = st.MAX_RANK,
                 known_ids: set[str] | None = None, *, config: Any = None, gate: Any = None) -> None:
        self.store = st.open_store(store, config=config)
        self.gate = gate
        self.base_model, self.guard, self.max_rank = base_model, ControlGuard.of(token), max_rank
        if config is None:
            from mascot.core.config import AdaptersConfig

            config = AdaptersConfig()
        self.allowed_prefixes = list(config.allowed_source_prefixes)
        self.known_ids = known_ids

    def _persona_id(self, value: str) -> str:
        if not st.ID_RE.match(value or ""):
            raise InvalidArgument(f"persona_id {value[:64]!r} must be snake_case (lower-case letters, digits, '_'), "
                                  "e.g. 'anchor' or 'director'")
        if self.known_ids is not None and value not in self.known_ids:
            raise InvalidArgument(f"unknown persona id {value!r}; adapters belong to a persona of the catalog "
                                  "(ListPersonas) or to 'director'")
        return value

    async def _store_call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        """Run a store function in a thread; registry and file-system trouble become UNAVAILABLE with the reason."""
        try:
            return await asyncio.to_thread(fn, *args, **kw)
        except st.RegistryConflict as e:
            raise Unavailable(f"the registry is busy ({e}); retry") from None
        except RuntimeError as e:  # unreadable or malformed registry.json
            raise Unavailable(str(e)) from None
        except st.backend_errors() as e:  # OSError, or a botocore error s3fs passed through
            why = getattr(e, "strerror", None) or (str(e).splitlines() or [type(e).__name__])[0][:300]
            raise Unavailable(f"the adapter store {self.store.display()} cannot be written or read ({why}); "
                              "fix its permissions, mount or S3 endpoint/credentials") from None

    async def _update(self, change: Any) -> dict:
        return await self._store_call(self.store.update, change)

    async def _read(self) -> dict:
        return await self._store_call(self.store.read_registry)

    async def ListAdapters(self, request: pb.ListAdaptersRequest, context: Any) -> pb.ListAdaptersResponse:
        self.guard.read(context, "ListAdapters")
        reg = await self._read()
        items = sorted(reg.get("adapters", {}).items())
        if request.persona_id:
            items = [(p, e) for p, e in items if p == request.persona_id]
        return pb.ListAdaptersResponse(revision=reg.get("revision", 0),
                                       personas=[persona_to_proto(p, e) for p, e in items])

    async def PublishAdapter(self, request: pb.PublishAdapterRequest, context: Any) -> pb.PublishAdapterResponse:
        detail = {"source_path": request.source_path[:300], "run_id": request.run_id[:128],
                  "data_ids": list(request.data_ids)[:20]}
        return await self.guard.change(context, "PublishAdapter", request.persona_id[:64], detail,
                                       lambda _who: self._publish(request))

    async def _publish(self, request: pb.PublishAdapterRequest) -> pb.PublishAdapterResponse:
        pid = self._persona_id(request.persona_id)
        src = Path(request.source_path)
        if not request.source_path or not src.is_dir():
            raise InvalidArgument(f"source_path {request.source_path[:200]!r} is not a directory the gateway can read")
        src = check_source_path(request.source_path, self.allowed_prefixes)
        try:
            metrics = json.loads(request.eval_metrics_json) if request.eval_metrics_json else {}
        except ValueError:
            raise InvalidArgument("eval_metrics_json is not valid JSON") from None
        if not isinstance(metrics, dict):
            raise InvalidArgument("eval_metrics_json must be a JSON object")
        try:  # the checks come first: a duplicate is only a duplicate of a valid adapter with the same config
            await asyncio.to_thread(st.check_adapter, src, base_model=self.base_model, max_rank=self.max_rank)
        except st.PublishError as e:
            raise InvalidArgument(str(e)) from None
        digest = await self._store_call(st.file_digest, src / "adapter_model.safetensors")
        prior = await self._store_call(self.store.find_version, pid, digest, src)
        if prior is not None:
            reg = await self._read()
            v = persona_to_proto(pid, reg["adapters"][pid])
            return pb.PublishAdapterResponse(version=next(x for x in v.versions if x.version == prior["version"]),
                                             already_published=True, revision=reg.get("revision", 0))
        try:
            res = await self._store_call(self.store.publish, pid, src, base_model=self.base_model,
                                         run_id=request.run_id, data_ids=list(request.data_ids),
                                         eval_metrics=metrics, max_rank=self.max_rank)
        except st.PublishError as e:
            raise InvalidArgument(str(e)) from None
        reg = await self._read()
        v = persona_to_proto(pid, reg["adapters"][pid])
        return pb.PublishAdapterResponse(version=next(x for x in v.versions if x.version == res["version"]),
                                         revision=res["revision"])

    async def PromoteAdapter(self, request: pb.PromoteAdapterRequest, context: Any) -> pb.PromoteAdapterResponse:
        skip = request.skip_eval_gate and self.gate is not None and request.persona_id != "director"
        method = "PromoteAdapter.skip_eval_gate" if skip else "PromoteAdapter"  # past the gate: admin only
        detail = {"version": request.version, "canary_weight": request.canary_weight,
                  "skip_eval_gate": request.skip_eval_gate}
        return await self.guard.change(context, method, f"{request.persona_id[:64]}/v{request.version}", detail,
                                       lambda _who: self._promote(request), need="admin" if skip else None)

    async def _promote(self, request: pb.PromoteAdapterRequest) -> pb.PromoteAdapterResponse:
        pid = self._persona_id(request.persona_id)
        if request.version < 1:
            raise InvalidArgument(f"version must be >= 1, got {request.version}")
        gate = pb.EvalGateResult()
        if self.gate is not None and not request.skip_eval_gate and pid != "director":
            gate = await self._run_gate(pid, request.version, request.canary_weight)
        elif self.gate is not None and request.skip_eval_gate:
            log.warning("PromoteAdapter %s v%d without the evaluation gate (skip_eval_gate)", pid, request.version)
        new = await self._update(lambda reg: rg.promote(reg, pid, request.version, request.canary_weight))
        return pb.PromoteAdapterResponse(persona=persona_to_proto(pid, new["adapters"][pid]),
                                         revision=new["revision"], eval_gate=gate)

    async def _run_gate(self, pid: str, version: int, canary_weight: float) -> pb.EvalGateResult:
        """Check the promote on a copy of the registry (so a request that would fail anyway fails before the
        judge runs), then score the version against the stable one (or the base model).

        Raises:
            FailedPrecondition: the gate refused the version (the message gives both scores).
            The errors of :func:`mascot.core.adapters.registry.promote` and of the gate itself.
        """
        reg = await self._store_call(self.store.read_registry)
        trial = copy.deepcopy(reg)
        rg.promote(trial, pid, version, canary_weight)
        stable = reg["adapters"][pid].get("stable")
        baseline = rg.version_name(pid, stable) if stable else "base"
        r = await self.gate(pid, rg.version_name(pid, version), baseline)
        result = pb.EvalGateResult(ran=True, candidate=r.candidate, baseline=r.baseline,
                                   candidate_score=r.candidate_score, baseline_score=r.baseline_score,
                                   situations=r.situations, passed=r.passed, replies=r.replies)
        if r.candidate_compliance is not None:
            result.candidate_compliance = r.candidate_compliance
            result.baseline_compliance = r.baseline_compliance
        if not r.passed:
            why = []
            if not r.score_passed:
                why.append(f"mean judge score {r.candidate_score:.3f} vs {r.baseline_score:.3f} for {r.baseline} on "
                           f"{r.situations} held-out replies (allowed drop adapters.promote_gate.max_drop = "
                           f"{r.max_drop})")
            if not r.compliance_passed:
                why.append(f"move compliance {r.candidate_compliance:.3f} vs {r.baseline_compliance:.3f} for "
                           f"{r.baseline} over {r.replies} replies (allowed drop "
                           f"adapters.promote_gate.max_compliance_drop = {r.max_compliance_drop})")
            raise FailedPrecondition(f"evaluation gate refused {r.candidate}: {'; '.join(why)}; retrain, or promote "
                                     "with skip_eval_gate (--skip-eval-gate)")
        return result

    async def RollbackAdapter(self, request: pb.RollbackAdapterRequest, context: Any) -> pb.RollbackAdapterResponse:
        async def rollback(_who: Any) -> pb.RollbackAdapterResponse:
            pid = self._persona_id(request.persona_id)
            new = await self._update(lambda reg: rg.rollback(reg, pid))
            return pb.RollbackAdapterResponse(persona=persona_to_proto(pid, new["adapters"][pid]),
                                              revision=new["revision"])

        return await self.guard.change(context, "RollbackAdapter", request.persona_id[:64], {}, rollback)

    async def RetireAdapter(self, request: pb.RetireAdapterRequest, context: Any) -> pb.RetireAdapterResponse:
        async def retire(_who: Any) -> pb.RetireAdapterResponse:
            pid = self._persona_id(request.persona_id)
            if request.version < 1:
                raise InvalidArgument(f"version must be >= 1, got {request.version}")
            new = await self._update(lambda reg: rg.retire(reg, pid, request.version))
            return pb.RetireAdapterResponse(persona=persona_to_proto(pid, new["adapters"][pid]),
                                            revision=new["revision"])

        return await self.guard.change(context, "RetireAdapter", f"{request.persona_id[:64]}/v{request.version}",
                                       {"version": request.version}, retire)

    async def ListAuditEvents(self, request: pb.ListAuditEventsRequest,
                              context: Any) -> pb.ListAuditEventsResponse:
        self.guard.read(context, "ListAuditEvents")
        events, token = await self.guard.list_events(request.page_size, request.page_token, request.actor[:128],
                                                     request.method[:64], request.target[:256])
        return pb.ListAuditEventsResponse(events=[pb.AuditEvent(**e) for e in events], next_page_token=token)
