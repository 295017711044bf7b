"""JudgeService: proto <-> domain and validation; the logic is :class:`mascot.judge.judging.Judge`."""

from __future__ import annotations

from typing import Any

from mascot.api.judge.v1 import judge_pb2 as pb
from mascot.api.judge.v1 import judge_pb2_grpc as pb_grpc
from mascot.core.dialogue import context_from_proto, history_from_proto, roster_from_ids
from mascot.core.errors import InvalidArgument
from mascot.core.personas import PersonaCatalog
from mascot.judge import rubric as rb
from mascot.judge.judging import OK, Judge, JudgeItem, agent_item, build_judges, collective_item

#: ``build_judges`` is re-exported: the composition root builds the service's judges from here.
__all__ = ["JudgeServicer", "build_judges", "parse_judge_spec"]

RUBRICS = {pb.RUBRIC_AGENT: rb.AGENT, pb.RUBRIC_COLLECTIVE: rb.COLLECTIVE}


class JudgeServicer(pb_grpc.JudgeServiceServicer):
    """Serves JudgeCandidates over one or more configured judges.

    Args:
        judges: Judges by name, in configuration order (the first is the default).
        catalog: Persona cards.
        max_batch: Most candidates per call.
    """

    def __init__(self, judges: dict[str, Judge], catalog: PersonaCatalog, max_batch: int = 64) -> None:
        if not judges:
            raise ValueError("at least one judge is required")
        self.judges, self.catalog, self.max_batch = judges, catalog, max_batch

    def _judge(self, name: str) -> Judge:
        if not name:
            return next(iter(self.judges.values()))
        if name not in self.judges:
            raise InvalidArgument(f"unknown judge {name!r}; configured judges: {', '.join(self.judges)}")
        return self.judges[name]

    def build_items(self, request: pb.JudgeCandidatesRequest, backend: Any = None) -> tuple[str, list[JudgeItem]]:
        """Validate a request and build each candidate's :class:`~mascot.judge.judging.JudgeItem` (its first-attempt
        judge messages and the parts they were built from). The agent rubric's roster is ``roster_persona_ids``, or
        the judged persona's set.

        With a local backend (an engine with a finite window), seed context and then history are dropped oldest
        first until the prompt fits (:func:`fit_prompt`).

        Returns:
            ``(rubric, item per candidate)``.

        Raises:
            InvalidArgument: see the RPC's error list.
        """
        if request.rubric not in RUBRICS:
            raise InvalidArgument("rubric must be RUBRIC_AGENT or RUBRIC_COLLECTIVE")
        n = len(request.candidates)
        if n == 0:
            raise InvalidArgument("candidates is empty; send at least one")
        if n > self.max_batch:
            raise InvalidArgument(f"{n} candidates exceed the batch limit of {self.max_batch}; split the call")
        rubric = RUBRICS[request.rubric]

        known = list(self.catalog.cards)
        history = history_from_proto(request.history, known_personas=known)
        context = context_from_proto(request.context)
        items = []
        if rubric == rb.AGENT:
            names = {pid: c.name for pid, c in self.catalog.cards.items()}
            for i, c in enumerate(request.candidates):
                if not c.persona_id or c.persona_id not in self.catalog.cards:
                    raise InvalidArgument(f"candidates[{i}]: persona_id {c.persona_id!r} is missing or unknown; "
                                          "ListPersonas shows the known ids")
                if not c.text.strip():
                    raise InvalidArgument(f"candidates[{i}]: text is empty; the agent rubric judges a reply")
                card = self.catalog.get(c.persona_id)
                roster = (roster_from_ids(self.catalog, list(request.roster_persona_ids))
                          if request.roster_persona_ids else self.catalog.in_set(card.persona_set))
                items.append(agent_item(backend, card, roster, history, c.text, context, names))
        else:
            for i, c in enumerate(request.candidates):
                block = history_from_proto(c.block, known_personas=known)
                if not any(t.role == "agent" for t in block):
                    raise InvalidArgument(f"candidates[{i}]: block has no agent turn; the collective rubric "
                                          "judges a block of agent turns")
                ids = list(request.roster_persona_ids) or list(dict.fromkeys(
                    t.persona_id for t in history + block if t.role == "agent"))
                outside = sorted({t.persona_id for t in block if t.role == "agent"} - set(ids))
                if outside:
                    raise InvalidArgument(f"candidates[{i}]: the block has turns of {', '.join(outside)}, which "
                                          "roster_persona_ids leaves out; list every persona that speaks in it")
                cards = roster_from_ids(self.catalog, ids)
                items.append(collective_item(backend, cards, history, block, context))
        return rubric, items

    async def JudgeCandidates(self, request: pb.JudgeCandidatesRequest, context: Any) -> pb.JudgeCandidatesResponse:
        judge = self._judge(request.judge)
        rubric, items = self.build_items(request, judge.backend)
        verdicts = await judge.judge_many(rubric, items)
        out = []
        for c, v in zip(request.candidates, verdicts):
            ok = v.status == OK
            out.append(pb.Judgement(
                candidate_id=c.candidate_id,
                status=pb.JUDGEMENT_STATUS_OK if ok else pb.JUDGEMENT_STATUS_UNPARSEABLE,
                scores=v.scores, rationale=v.rationale, mean_score=v.mean, attempts=v.attempts, cached=v.cached,
                error=v.error, content_hash=v.content_hash))
        return pb.JudgeCandidatesResponse(judgements=out, judge=judge.name, model=judge.model,
                                          rubric_version=judge.version)


def parse_judge_spec(spec: str) -> dict:
    """Parse a CLI judge spec into a :class:`~mascot.core.config.JudgeSpec` dict.

    Forms: ``local``; ``metrics``; ``openai:MODEL@URL``; ``NAME=openai:MODEL@URL`` (e.g.
    ``gpt4o=openai:gpt-4o@https://api.openai.com/v1``); ``NAME=local``; ``NAME=metrics``.

    Raises:
        ValueError: any other form.
    """
    name, _, body = spec.partition("=") if "=" in spec.split(":", 1)[0] else ("", "", spec)
    body = body.strip()
    if body in ("local", "metrics"):
        return {"name": name or body, "kind": body}
    if body.startswith("openai:") and "@" in body:
        model, _, url = body[len("openai:"):].partition("@")
        if model and url:
            return {"name": name or model.replace("/", "_")[:64], "kind": "openai", "model": model, "endpoint": url}
    raise ValueError(f"bad judge spec {spec!r}: use 'local', 'metrics', 'openai:MODEL@URL' or "
                     "'NAME=openai:MODEL@URL'")
