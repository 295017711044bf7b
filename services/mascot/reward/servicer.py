"""RewardService: proto <-> domain and validation; the logic is :class:`mascot.reward.scorer.RewardScorer`."""

from __future__ import annotations

import asyncio
from typing import Any

from mascot.api.reward.v1 import reward_pb2 as pb
from mascot.api.reward.v1 import reward_pb2_grpc as pb_grpc
from mascot.core.dialogue import context_from_proto, history_from_proto
from mascot.core.errors import InvalidArgument
from mascot.core.personas import PersonaCatalog
from mascot.reward.scorer import RewardScorer


class RewardServicer(pb_grpc.RewardServiceServicer):
    """Serves ScoreCandidates.

    Args:
        scorer: The loaded reward model.
        catalog: Persona cards.
        max_batch: Most candidates per call.
        metrics: Optional :class:`~mascot.core.metrics.Metrics`.
    """

    def __init__(self, scorer: RewardScorer, catalog: PersonaCatalog, max_batch: int = 64, metrics: Any = None) -> None:
        self.scorer, self.catalog, self.max_batch, self.metrics = scorer, catalog, max_batch, metrics
        if metrics is not None:
            metrics.declare(reward_models=[scorer.meta.name])

    async def ScoreCandidates(self, request: pb.ScoreCandidatesRequest, context: Any) -> pb.ScoreCandidatesResponse:
        if not request.persona_id or request.persona_id not in self.catalog.cards:
            raise InvalidArgument(f"persona_id {request.persona_id!r} is missing or unknown; ListPersonas shows the "
                                  "known ids")
        n = len(request.candidates)
        if n == 0:
            raise InvalidArgument("candidates is empty; send at least one reply")
        if n > self.max_batch:
            raise InvalidArgument(f"{n} candidates exceed the batch limit of {self.max_batch}; split the call")
        history = history_from_proto(request.history, known_personas=list(self.catalog.cards))
        names = {pid: c.name for pid, c in self.catalog.cards.items()}
        try:
            inputs = self.scorer.build_inputs(self.catalog.get(request.persona_id), history, list(request.candidates),
                                              context_from_proto(request.context), names)
        except ValueError as e:
            if self.metrics is not None:
                self.metrics.reward_failures.labels("too_long").inc()
            raise InvalidArgument(f"a candidate does not fit the reward model's window: {e}") from None
        raw = await asyncio.to_thread(self.scorer.score_texts, [t for t, _ in inputs])
        meta = self.scorer.meta
        scores = []
        for r, (_, cut) in zip(raw, inputs):
            z = self.scorer.standardize(r)
            if self.metrics is not None:
                self.metrics.reward_scores.labels(meta.name).observe(z)
            scores.append(pb.Score(raw=r, standardized=z, truncated=cut))
        return pb.ScoreCandidatesResponse(scores=scores, model=meta.name, mu=meta.mu, sigma=meta.sigma,
                                          trained=meta.trained)
