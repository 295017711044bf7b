"""A message within ``dialogue.max_message_chars`` is valid whatever the model's window: on the real tiny model
(window 2048 tokens) a 4000-character message (and one of 4000 emoji) completes its round, every turn of it; the
prompts show the message with its middle elided, the store keeps every character."""

from __future__ import annotations

import pytest

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
from mascot.core.server import channel
from mascot.app.stack import start_stack
from tests.helpers.config import make_config

pytestmark = [pytest.mark.integration]

SENTENCE = "Yesterday I failed my driving test for the third time and I feel like a complete idiot. "
MESSAGES = {"prose-4000": (SENTENCE * 60)[:4000], "emoji-4000": "😞" * 4000}


@pytest.mark.parametrize("text", list(MESSAGES.values()), ids=list(MESSAGES))
async def test_a_message_at_the_character_limit_gets_a_whole_round(engine, tmp_path, text):
    # the message alone fills most of the window (the emoji one overflows it): with the persona card, the directive
    # and the reply's max_tokens, the prompt only fits with the message elided (this failed mid-round before)
    assert engine.count_tokens(text) > 0.85 * engine.max_context_tokens
    stack = await start_stack(make_config(tmp_path), engine=engine)
    try:
        async with channel(stack.target("gateway")) as ch:
            stub = cpb_grpc.ConversationServiceStub(ch)
            conv = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
            for key in ("r1", "r2"):  # a second long message: history and the elided message together
                events = [r.event async for r in stub.SendMessage(cpb.SendMessageRequest(
                    conversation_id=conv.id, text=text, idempotency_key=key))]
                assert events[-1].round_completed.agent_turns == 3
            stored = (await stub.GetConversation(cpb.GetConversationRequest(conversation_id=conv.id))).conversation
            assert len(stored.turns) == 8 and stored.turns[0].text == text and stored.turns[4].text == text
    finally:
        await stack.stop(0)
