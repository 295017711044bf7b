"""JudgeService request builders: what the evaluation and the training ``judge`` stage send, in one shape.

History and block turns are transcript dicts (``role``, ``text``, ``persona_id``), context is ``(speaker, content)``
pairs; both become the proto turns and context utterances of :mod:`mascot.api.judge.v1`.
"""

from __future__ import annotations

from typing import Sequence

from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.api.judge.v1 import judge_pb2 as jpb
from mascot.core.dialogue import history_from_dicts, history_to_proto


def _proto_turns(turns: Sequence[dict]) -> list[dpb.Turn]:
    return history_to_proto(history_from_dicts(turns))


def _proto_context(context: Sequence[Sequence[str]]) -> list[dpb.ContextUtterance]:
    return [dpb.ContextUtterance(speaker=a, content=b) for a, b in context]


def agent_request(judge: str, history: Sequence[dict], context: Sequence[Sequence[str]],
                  candidates: Sequence[tuple[str, str, str]]) -> jpb.JudgeCandidatesRequest:
    """A RUBRIC_AGENT request.

    Args:
        judge: Name of the judge configured on the service.
        history: Turns before the candidates, oldest first, as dicts with ``role``, ``text``, ``persona_id``.
        context: Seed context as ``(speaker, content)`` pairs.
        candidates: ``(candidate_id, persona_id, text)`` per reply (non-empty text).
    """
    return jpb.JudgeCandidatesRequest(
        rubric=jpb.RUBRIC_AGENT, judge=judge, history=_proto_turns(history), context=_proto_context(context),
        candidates=[jpb.Candidate(candidate_id=cid, persona_id=pid, text=text) for cid, pid, text in candidates])


def collective_request(judge: str, history: Sequence[dict], context: Sequence[Sequence[str]], block: Sequence[dict],
                       roster: Sequence[str]) -> jpb.JudgeCandidatesRequest:
    """A RUBRIC_COLLECTIVE request for one block of turns (dicts as in :func:`agent_request`'s history)."""
    return jpb.JudgeCandidatesRequest(
        rubric=jpb.RUBRIC_COLLECTIVE, judge=judge, history=_proto_turns(history), context=_proto_context(context),
        roster_persona_ids=list(roster), candidates=[jpb.Candidate(candidate_id="block", block=_proto_turns(block))])
