"""A long conversation costs a constant amount per turn and never breaks.

Found by a reviewer: the whole stored history went to the director and speaker on every turn (latency grew with it);
once it outgrew the gRPC message limit every SendMessage failed with UNAVAILABLE "retry later", and GetConversation
failed with RESOURCE_EXHAUSTED. Now a round sends the most recent turns within ``dialogue.history_window_*`` and
GetConversation pages long histories (``page_size`` / ``next_page_token``)."""

from __future__ import annotations

import grpc
import pytest

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
from mascot.core.server import channel
from mascot.gateway.store import NewTurn
from mascot.app.runjob import read_conversation
from mascot.app.stack import start_stack
from tests.helpers.config import make_config
from tests.helpers.engine import ScriptedEngine
from tests.helpers.rpc import collect

pytestmark = [pytest.mark.integration]
DIRECTOR = "Agent: The Catalyst\nAction: Ask one question.\nTone: Curious"
LIMIT = 64 * 1024  # server.max_message_bytes of this stack


def _fill(store, conv_id: str, rounds: int, chars: int) -> None:
    """``rounds`` stored rounds of a ``chars``-character user message and one agent reply each (as if answered)."""
    for r in range(rounds):
        key = f"old{r}"
        store.start_round(conv_id, key, f"message {r} " + "x" * chars)
        store.append_turn(conv_id, NewTurn(role="agent", text=f"reply {r} " + "y" * 200, persona_id="anchor",
                                           directive={"persona_id": "anchor", "action": "Listen.", "tone": "Calm",
                                                      "source": "model", "raw": ""}, round_key=key))
        store.finish_round(conv_id, key, "completed", 1)


async def test_a_conversation_past_the_message_limit_still_answers_and_pages(tmp_path):
    eng = ScriptedEngine(lambda p: DIRECTOR, lambda p: "What would help you most right now?")
    cfg = make_config(tmp_path, server={"max_message_bytes": LIMIT},
                      dialogue={"history_window_turns": 64, "history_window_chars": 8000})
    stack = await start_stack(cfg, ("gateway", "director", "speaker"), engine=eng)
    ch = channel(stack.target("gateway"), LIMIT)
    stub = cpb_grpc.ConversationServiceStub(ch)
    try:
        conv = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
        _fill(stack.store, conv.id, rounds=60, chars=3000)  # ~190 KB of history: three times the message limit
        seen = len(eng.requests)
        events = await collect(stub.SendMessage(cpb.SendMessageRequest(conversation_id=conv.id, text="Still here.",
                                                                       idempotency_key="new")))
        assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_COMPLETED
        assert [e.turn_completed.turn.index for e in events if e.HasField("turn_completed")] == [121, 122, 123]
        prompts = [r.prompt for r in eng.requests[seen:]]
        assert prompts and all(len(p) < 8000 + 6000 for p in prompts)  # the window, not the 190 KB behind it
        assert all("message 59 " in p for p in prompts) and not any("message 40 " in p for p in prompts)
        # GetConversation pages: within the limit, in order, every turn once
        first = await stub.GetConversation(cpb.GetConversationRequest(conversation_id=conv.id))
        assert first.next_page_token and len(first.conversation.turns) < 124
        whole = await read_conversation(stub, conv.id)
        assert [t.index for t in whole.conversation.turns] == list(range(124))
        assert whole.conversation.turns[-1].text == "What would help you most right now?"
        small = await stub.GetConversation(cpb.GetConversationRequest(conversation_id=conv.id, page_size=5,
                                                                      page_token="10"))
        assert [t.index for t in small.conversation.turns] == [10, 11, 12, 13, 14] and small.next_page_token == "15"
        for bad in ("abc", "-1", "9" * 20, "\u00b2", "\u0663"):  # superscript two, Arabic-Indic three
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.GetConversation(cpb.GetConversationRequest(conversation_id=conv.id, page_token=bad))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await ch.close()
        await stack.stop(0)
