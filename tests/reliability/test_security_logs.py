"""No user text, model text or secret in logs:
a round (and a safety round) with caller tokens and an adapter publish with the admin token, every logger at DEBUG
plus the access log and whatever reaches the process's stdout/stderr; neither the messages, the replies nor any
token appear."""

from __future__ import annotations

import importlib
import logging

import pytest

from mascot.api.adapter.v1 import adapter_pb2 as apb
from mascot.api.adapter.v1 import adapter_pb2_grpc
from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
from mascot.core.server import channel
from mascot.app.stack import start_stack
from tests.helpers.config import make_config
from tests.helpers.engine import ScriptedEngine
from tests.helpers.lora import make_lora
from tests.helpers.rpc import collect

# The store imports SQLAlchemy, whose loggers are set to DEBUG below too (imported for that side effect alone).
importlib.import_module("mascot.gateway.store")
pytestmark = pytest.mark.integration
CALLER = "caller-tok-Q7xZpL2mW9vR4kT8"
WRONG = "wrong-tok-H3nB6cJ1sD5fG0aY"
ADMIN = "admin-tok-U2eI8oP4yT6rE1wQ"
MESSAGE = "my cat Bartholomew-Quintessence-4471 ran away"
RISKY = "I want to kill myself after Zanzibar-Oblique-9902"
REPLY = "Replying-Marmalade-Cascade-5518 with care"
DIRECTOR = "Agent: The Anchor\nAction: Comfort the user.\nTone: Warm"
SECRETS = (CALLER, WRONG, ADMIN, "Bartholomew-Quintessence", "Zanzibar-Oblique", "Marmalade-Cascade")


async def test_no_user_text_model_text_or_token_in_any_log(tmp_path, tiny_model_dir, monkeypatch, caplog, capfd):
    lora = make_lora(tiny_model_dir, tmp_path / "lora", seed=3)
    monkeypatch.setenv("MASCOT_CALLER_TOKENS", f"alice={CALLER}")
    monkeypatch.setenv("MASCOT_TEST_ADMIN", ADMIN)
    caplog.set_level(logging.DEBUG)  # the root logger: every logger without its own level logs at DEBUG

    def everything_at_debug() -> None:  # and every logger that has a level of its own (SQLAlchemy's, grpc's, ...)
        for name, obj in list(logging.root.manager.loggerDict.items()):
            if isinstance(obj, logging.Logger):
                caplog.set_level(logging.DEBUG, logger=name)

    everything_at_debug()
    cfg = make_config(tmp_path, security={"caller_auth": True, "rate_limit_per_minute": 600},
                      adapters={"store": str(tmp_path / "store"), "base_model": str(tiny_model_dir),
                                "admin_token_env": "MASCOT_TEST_ADMIN"})
    stack = await start_stack(cfg, engine=ScriptedEngine(lambda p: DIRECTOR, lambda p: REPLY))
    everything_at_debug()  # loggers made while the stack started
    try:
        async with channel(stack.target("gateway"), token=CALLER) as ch:
            stub = cpb_grpc.ConversationServiceStub(ch)
            conv = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
            events = await collect(stub.SendMessage(cpb.SendMessageRequest(conversation_id=conv.id, text=MESSAGE,
                                                                           idempotency_key="k1")))
            assert any(REPLY in e.turn_completed.turn.text for e in events if e.HasField("turn_completed"))
            events = await collect(stub.SendMessage(cpb.SendMessageRequest(conversation_id=conv.id, text=RISKY,
                                                                           idempotency_key="k2")))
            assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_SAFETY
            await collect(stub.SendMessage(cpb.SendMessageRequest(conversation_id=conv.id, text=MESSAGE,
                                                                  idempotency_key="k1")))  # a replay
            got = await stub.GetConversation(cpb.GetConversationRequest(conversation_id=conv.id, include_think=True))
            assert got.conversation.turns[0].text == MESSAGE
            with pytest.raises(Exception):  # a refused call is logged too (access log), without its token
                await stub.ListPersonas(cpb.ListPersonasRequest(), metadata=(("authorization", f"Bearer {WRONG}"),))
        async with channel(stack.target("control"), token="") as ch:
            admin = adapter_pb2_grpc.AdapterServiceStub(ch)
            auth = (("authorization", f"Bearer {ADMIN}"),)
            r = await admin.PublishAdapter(apb.PublishAdapterRequest(persona_id="anchor", source_path=str(lora),
                                                                     run_id="r1"), metadata=auth)
            assert r.version.version == 1
            with pytest.raises(Exception):
                await admin.ListAdapters(apb.ListAdaptersRequest(), metadata=(("authorization", f"Bearer {WRONG}"),))
    finally:
        await stack.stop(0)
    text = caplog.text + "\n".join(repr(r.args) + str(getattr(r, "exc_text", "")) for r in caplog.records)
    assert any(r.name == "mascot.access" and "SendMessage" in r.getMessage() for r in caplog.records)  # captured
    out, err = capfd.readouterr()
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} appears in the log"
        assert secret not in out and secret not in err, f"{secret!r} appears on stdout/stderr"
