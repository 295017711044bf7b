"""A ConversationService client on a started stack's gateway."""

from __future__ import annotations

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
from mascot.core.server import channel
from tests.helpers.rpc import collect


class Client:
    """A channel to ``stack``'s gateway (``ch``; the caller closes it) and shortcuts for the conversation RPCs."""

    def __init__(self, stack):
        self.stack = stack
        self.ch = channel(stack.target("gateway"))
        self.stub = cpb_grpc.ConversationServiceStub(self.ch)

    async def start(self, mode=cpb.MODE_SUPPORT, **kw):
        """StartConversation; returns the conversation."""
        return (await self.stub.StartConversation(cpb.StartConversationRequest(mode=mode, **kw))).conversation

    async def send(self, conv_id, text, key="k1"):
        """SendMessage with idempotency key ``key``; returns the round's events."""
        return await collect(self.stub.SendMessage(cpb.SendMessageRequest(conversation_id=conv_id, text=text,
                                                                          idempotency_key=key)))

    async def get(self, conv_id, think=False):
        """GetConversation (the whole response), with the think text when ``think``."""
        return await self.stub.GetConversation(cpb.GetConversationRequest(conversation_id=conv_id, include_think=think))
