"""DirectorService: proto <-> domain and validation; the logic is :func:`mascot.director.decide.decide`."""

from __future__ import annotations

from typing import Any

from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.api.director.v1 import director_pb2 as pb
from mascot.api.director.v1 import director_pb2_grpc as pb_grpc
from mascot.core.dialogue import context_from_proto, history_from_proto, roster_from_ids
from mascot.core.engine import BASE_ADAPTER
from mascot.core.enums import enum_value
from mascot.core.errors import InvalidArgument
from mascot.core.personas import PersonaCatalog
from mascot.director.decide import decide


class DirectorServicer(pb_grpc.DirectorServiceServicer):
    """Serves NextDirective on a shared engine.

    Args:
        engine: The generation engine.
        catalog: Persona cards.
        cfg: :class:`~mascot.core.config.DirectorConfig`.
        metrics: :class:`~mascot.core.metrics.Metrics`.
        resolver: :class:`~mascot.core.adapters.reconcile.AdapterResolver` for pinned ``adapter_version`` requests.
    """

    def __init__(self, engine: Any, catalog: PersonaCatalog, cfg: Any, metrics: Any, resolver: Any = None) -> None:
        from mascot.core.adapters.reconcile import AdapterResolver

        self.engine, self.catalog, self.cfg, self.metrics = engine, catalog, cfg, metrics
        self.resolver = resolver or AdapterResolver(engine, None, metrics)
        metrics.declare(personas=[c.id for c in catalog.servable()])

    async def NextDirective(self, request: pb.NextDirectiveRequest, context: Any) -> pb.NextDirectiveResponse:
        roster = roster_from_ids(self.catalog, list(request.persona_ids))
        history = history_from_proto(request.history, known_personas=list(self.catalog.cards),
                                     names={i: c.name for i, c in self.catalog.cards.items()})
        if request.adapter_version:
            adapter = await self.resolver.ensure(request.adapter_version, "director")
        else:
            adapter = self.cfg.adapter or None
        exclude = list(request.exclude_persona_ids)
        unknown = [p for p in exclude if p not in request.persona_ids]
        if unknown:
            raise InvalidArgument(f"exclude_persona_ids {unknown} are not in persona_ids")
        if exclude and set(exclude) >= set(request.persona_ids):
            raise InvalidArgument("exclude_persona_ids excludes every persona; leave at least one allowed")
        try:
            d = await decide(self.engine, roster, history, context_from_proto(request.context), self.cfg,
                             adapter=adapter, seed=request.seed, exclude=exclude)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
        for reason in d.rejection_reasons:
            self.metrics.reply_rejections.labels(component="director", persona="director", reason=reason,
                                                 action="reprompt").inc()
        version = adapter or BASE_ADAPTER
        self.metrics.director_decisions.labels(persona=d.directive.persona_id, source=d.source).inc()
        self.metrics.generated_tokens.labels(component="director", persona="director",
                                             adapter_version=version).inc(d.delivered_tokens)
        self.metrics.discarded_tokens.labels(component="director", persona="director").inc(
            d.generated_tokens - d.delivered_tokens)
        return pb.NextDirectiveResponse(
            directive=dpb.Directive(persona_id=d.directive.persona_id, action=d.directive.action,
                                    tone=d.directive.tone, source=enum_value(dpb.DirectiveSource, d.source), raw=d.raw),
            retries=d.retries, raw_attempts=d.raw_attempts, parse_errors=d.parse_errors,
            model_choice=d.model_choice, adapter_version=version)
