"""SpeakerService: validation and proto conversion around :mod:`mascot.speaker.reply`."""

from __future__ import annotations

from typing import Any, AsyncIterator

from google.protobuf.duration_pb2 import Duration

from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.api.speaker.v1 import speaker_pb2 as pb
from mascot.api.speaker.v1 import speaker_pb2_grpc as pb_grpc
from mascot.core.dialogue import context_from_proto, history_from_proto, roster_from_ids
from mascot.core.enums import enum_name
from mascot.core.errors import InvalidArgument
from mascot.core.personas import PersonaCatalog
from mascot.core.personas.personality import personality_text
from mascot.speaker.reply import ReplyOutcome, choose_adapter, coalesced, persona_reply, user_reply

MAX_TOKENS_LIMIT = 4096
#: TraitLevel values other than unspecified by their names (``low``, ``high``), as personality_text takes them.
_LEVELS = {n: enum_name(dpb.TraitLevel, n) for n in dpb.TraitLevel.values() if n != dpb.TRAIT_LEVEL_UNSPECIFIED}


def _duration(seconds: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


class SpeakerServicer(pb_grpc.SpeakerServiceServicer):
    """Serves GenerateReply on a shared engine.

    Args:
        engine: The generation engine.
        catalog: Persona cards.
        speaker_cfg: :class:`~mascot.core.config.SpeakerConfig`.
        selfplay_cfg: :class:`~mascot.core.config.SelfPlayConfig` (simulated user's token budget).
        metrics: :class:`~mascot.core.metrics.Metrics`.
        resolver: :class:`~mascot.core.adapters.reconcile.AdapterResolver` for pinned ``adapter_version`` requests;
            None builds one without a store (only loaded adapters resolve).
        guard_cfg: :class:`~mascot.core.config.GuardConfig` (reply checks and regeneration); None = defaults.
    """

    def __init__(self, engine: Any, catalog: PersonaCatalog, speaker_cfg: Any, selfplay_cfg: Any, metrics: Any,
                 resolver: Any = None, guard_cfg: Any = None) -> None:
        from mascot.core.adapters.reconcile import AdapterResolver
        from mascot.core.config import GuardConfig

        self.guard = guard_cfg if guard_cfg is not None else GuardConfig()

        self.engine, self.catalog, self.cfg, self.selfplay, self.metrics = (
            engine, catalog, speaker_cfg, selfplay_cfg, metrics)
        self.resolver = resolver or AdapterResolver(engine, None, metrics)

    def _guard_kwargs(self) -> dict:
        from mascot.speaker.reply import RetryPolicy

        g = self.guard
        return {"repetition_penalty": self.cfg.repetition_penalty, "frequency_penalty": self.cfg.frequency_penalty,
                "guard": g.settings(), "policy": RetryPolicy.from_guard(g)}

    def _count_rejections(self, label: str, item: ReplyOutcome) -> None:
        """Count refused attempts (regenerate; the last one ``exclude`` when every attempt was refused) and a cut."""
        m = self.metrics.reply_rejections
        for k, r in enumerate(item.rejections):
            last = item.rejected and k == len(item.rejections) - 1
            m.labels(component="speaker", persona=label, reason=r["reason"],
                     action="exclude" if last else "regenerate").inc()
        if item.cut_reason:
            m.labels(component="speaker", persona=label, reason=item.cut_reason, action="cut").inc()

    async def GenerateReply(self, request: pb.GenerateReplyRequest,
                            context: Any) -> AsyncIterator[pb.GenerateReplyResponse]:
        if not 0 <= request.max_tokens <= MAX_TOKENS_LIMIT:
            raise InvalidArgument(f"max_tokens must be in 0..{MAX_TOKENS_LIMIT}, got {request.max_tokens}")
        history = history_from_proto(request.history, known_personas=list(self.catalog.cards))
        ctx = context_from_proto(request.context)
        roster = roster_from_ids(self.catalog, list(request.roster_persona_ids)) if request.roster_persona_ids else []
        which = request.WhichOneof("speaker")
        seed = request.seed
        if which == "persona_id":
            if request.persona_id not in self.catalog.cards:
                raise InvalidArgument(f"unknown persona id {request.persona_id!r}; ListPersonas shows the known ids")
            if not request.HasField("directive") or request.directive.persona_id != request.persona_id:
                raise InvalidArgument("a persona reply needs a directive whose persona_id equals persona_id")
            if not request.directive.action.strip() or not request.directive.tone.strip():
                raise InvalidArgument("directive.action and directive.tone must not be empty")
            card = self.catalog.get(request.persona_id)
            if request.adapter_version:
                adapter = await self.resolver.ensure(request.adapter_version, card.id)
            elif self.resolver.store is not None and self.cfg.adapter_mode == "per_persona":
                adapter = self.resolver.default_adapter(card.id)  # the registry's stable version, never a canary
            else:
                adapter = choose_adapter(self.engine.adapters(), card.id, self.cfg.adapter_mode,
                                         self.cfg.shared_adapter)
            label = card.id
            gen = persona_reply(self.engine, card, roster or [card], history, ctx, request.directive.action,
                                request.directive.tone, max_tokens=request.max_tokens or self.cfg.max_tokens,
                                temperature=self.cfg.temperature, top_p=self.cfg.top_p, seed=seed, adapter=adapter,
                                persona_prompt=self.cfg.persona_prompts, **self._guard_kwargs())
        elif which == "user_simulation":
            u = request.user_simulation
            if not u.situation.strip():
                raise InvalidArgument("user_simulation.situation must not be empty")
            try:
                personality = personality_text(
                    mbti=u.mbti if u.WhichOneof("personality") == "mbti" else "",
                    big_five={k: _LEVELS[getattr(u.big_five, k)] for k in
                              ("openness", "conscientiousness", "extraversion", "agreeableness", "neuroticism")
                              if getattr(u.big_five, k) in _LEVELS} if u.HasField("big_five") else None)
            except ValueError as e:
                raise InvalidArgument(str(e)) from None
            label = "user"
            gen = user_reply(self.engine, u.situation, u.emotion, personality, roster, history, ctx,
                             max_tokens=request.max_tokens or self.selfplay.user_max_tokens,
                             temperature=self.cfg.temperature, top_p=self.cfg.top_p, seed=seed,
                             **self._guard_kwargs())
        else:
            raise InvalidArgument("set exactly one speaker: persona_id or user_simulation")
        try:
            async for item in coalesced(gen, self.cfg.stream_interval_ms / 1000):
                if isinstance(item, ReplyOutcome):
                    self.metrics.generated_tokens.labels(component="speaker", persona=label,
                                                         adapter_version=item.adapter_version).inc(item.delivered_tokens)
                    self.metrics.discarded_tokens.labels(component="speaker", persona=label).inc(
                        item.generated_tokens - item.delivered_tokens)
                    self._count_rejections(label, item)
                    pid = "" if label == "user" else label
                    yield pb.GenerateReplyResponse(final=pb.ReplyFinal(
                        text=item.text, think=item.think, adapter_version=item.adapter_version,
                        generated_tokens=item.generated_tokens, first_token=_duration(item.first_token_seconds),
                        truncated=item.truncated, rejected=item.rejected, cut_reason=item.cut_reason,
                        attempts=item.attempts, rejections=[dpb.ReplyRejection(
                            persona_id=pid, attempt=r["attempt"], reason=r["reason"], text=r["text"])
                            for r in item.rejections]))
                else:
                    yield pb.GenerateReplyResponse(delta=pb.ReplyDelta(text=item))
        except ValueError as e:  # prompt cannot fit
            raise InvalidArgument(str(e)) from None
