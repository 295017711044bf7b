"""The control plane's guard: roles on every call, and an audit trail of every call that changes state.

:class:`ControlGuard` is what AdapterService and TrainingService call first. A read (:meth:`ControlGuard.read`) needs
the method's role. A change (:meth:`ControlGuard.change`: publish, canary, promote, roll back, retire, a promote past
the evaluation gate, run start and cancel) is recorded once, after it ended, with who, what, when, the outcome (``OK``
or the status code name) and the request id — in the store's ``audit_events`` table (:class:`~mascot.gateway.store.
AuditEventRow`) and as one JSON log line on the logger ``mascot.audit``. A caller whose role is too low is recorded
too (outcome ``PERMISSION_DENIED``); a call without a valid token is not (it names nobody) and is only logged by the
access log. Before a change the store is probed: when the trail cannot be written the change is refused with
UNAVAILABLE, so nothing changes unrecorded. Tokens and the contents of files are never recorded.
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import timezone
from typing import Any, Awaitable, Callable, TypeVar

from mascot.core.errors import InvalidArgument, PermissionDenied, ServiceError, Unavailable
from mascot.core.interceptors import CURRENT_REQUEST_ID
from mascot.gateway.control_auth import METHOD_ROLES, ControlAuth, Identity

audit_log = logging.getLogger("mascot.audit")
T = TypeVar("T")
DEFAULT_PAGE = 50


class ControlGuard:
    """Roles and the audit trail of the control plane.

    Args:
        auth: The :class:`~mascot.gateway.control_auth.ControlAuth` of the control plane.
        store: The :class:`~mascot.gateway.store.Store` that keeps the trail; None keeps it only in the log (a
            servicer built without a store, e.g. in a unit test).
        page_max: Largest page of :meth:`list_events` (``control.audit_page_max``).
    """

    def __init__(self, auth: ControlAuth, store: Any = None, page_max: int = 500) -> None:
        self.auth, self.store, self.page_max = auth, store, page_max

    @classmethod
    def of(cls, guard_or_token: "ControlGuard | str") -> "ControlGuard":
        """A guard as given, or one that accepts only the single legacy admin token ``str`` ("" refuses all)."""
        if isinstance(guard_or_token, ControlGuard):
            return guard_or_token
        return cls(ControlAuth(None, legacy_token=guard_or_token))

    def read(self, context: Any, method: str) -> Identity:
        """Check a read-only call (its role from :data:`~mascot.gateway.control_auth.METHOD_ROLES`).

        Raises:
            Unauthenticated, PermissionDenied, Unavailable: see :meth:`ControlAuth.authorize`.
        """
        return self.auth.authorize(context, method)

    async def change(self, context: Any, method: str, target: str, detail: dict, action: Callable[[Identity],
                     Awaitable[T]], need: str | None = None) -> T:
        """Authorize, run and record a state change.

        Args:
            context: The call's context (its bearer token).
            method: The audited method name (``PromoteAdapter``, ``PromoteAdapter.skip_eval_gate``, ...).
            target: What it acts on (``anchor/v3``, ``run/<id>``, ``phase/<phase>``).
            detail: The request's non-secret fields, stored as JSON.
            action: ``async (identity) -> result``: the change itself.
            need: The least role; default the method's in ``METHOD_ROLES`` (``admin`` when not listed).

        Returns:
            ``action``'s result.

        Raises:
            Unavailable: the audit trail's store cannot be written (nothing was changed).
            The errors of :meth:`ControlAuth.authenticate` and of ``action`` (each recorded with its code).
        """
        who = self.auth.authenticate(context)
        need = need or METHOD_ROLES.get(method.split(".")[0], "admin")
        if not who.allows(need):
            e = PermissionDenied(f"{method} needs the role {need} or above; {who.name} has {who.role}")
            await self._record(who, method, target, detail, e.code.name, e.message)
            raise e
        if self.store is not None:
            try:
                await asyncio.to_thread(self.store.check)
            except Exception as e:  # noqa: BLE001 - whatever the probe hit, the trail cannot be written now
                raise Unavailable(f"the audit trail cannot be written ({getattr(e, 'message', type(e).__name__)}); "
                                  "nothing was changed; retry once the store is back") from None
        try:
            result = await action(who)
        except ServiceError as e:
            await self._record(who, method, target, detail, e.code.name, e.message)
            raise
        except BaseException as e:
            await self._record(who, method, target, detail, "CANCELLED" if isinstance(e, asyncio.CancelledError)
                               else "INTERNAL", type(e).__name__)
            raise
        await self._record(who, method, target, detail, "OK", "")
        return result

    async def _record(self, who: Identity, method: str, target: str, detail: dict, outcome: str,
                      message: str) -> None:
        """One JSON log line, then the store row; a store that fails now is logged (the log line stands)."""
        rid = CURRENT_REQUEST_ID.get()
        audit_log.info(json.dumps({"audit": method, "actor": who.name, "role": who.role, "via": who.via,
                                   "target": target, "outcome": outcome, "request_id": rid, "detail": detail,
                                   "message": message[:300]}, sort_keys=True, default=str))
        if self.store is None:
            return
        try:
            await asyncio.to_thread(self.store.add_audit_event, actor=who.name, role=who.role, via=who.via,
                                    method=method, target=target, outcome=outcome, message=message, detail=detail,
                                    request_id=rid)
        except Exception as e:  # noqa: BLE001 - the change is done; the log line above is its record
            audit_log.error("audit event of %s on %s not stored (%s); the log line above is its only record",
                            method, target, type(e).__name__)

    async def list_events(self, page_size: int, page_token: str, actor: str = "", method: str = "",
                          target: str = "") -> tuple[list[dict], str]:
        """A page of the trail, newest first, as dicts of the AuditEvent fields, and the next page's token.

        Raises:
            InvalidArgument: ``page_size`` outside [0, ``page_max``], or a malformed ``page_token``.
            Unavailable: no store keeps the trail.
        """
        if not 0 <= page_size <= self.page_max:
            raise InvalidArgument(f"page_size must be in [0, {self.page_max}] (0 = {DEFAULT_PAGE}); got {page_size}")
        size = page_size or min(DEFAULT_PAGE, self.page_max)
        before = 0
        if page_token:
            if not page_token.isdigit() or len(page_token) > 18:
                raise InvalidArgument("page_token is not a token this server returned; start again without it")
            before = int(page_token)
        if self.store is None:
            raise Unavailable("this control plane keeps no audit store")
        rows = await asyncio.to_thread(self.store.audit_events, limit=size + 1, before_id=before, actor=actor,
                                       method=method, target=target)
        more = len(rows) > size
        rows = rows[:size]
        events = [{"id": r.id, "time": r.created_at.replace(tzinfo=r.created_at.tzinfo or timezone.utc).isoformat(),
                   "actor": r.actor, "role": r.role, "via": r.via, "method": r.method, "target": r.target,
                   "outcome": r.outcome, "message": r.message, "request_id": r.request_id,
                   "detail_json": json.dumps(r.detail or {}, sort_keys=True)} for r in rows]
        return events, (str(rows[-1].id) if more and rows else "")
