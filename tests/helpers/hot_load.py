"""Hot-loading adapter versions through the gateway's AdapterService while conversations run: the check the
transformers and the vLLM engines both pass (promote, stream through a promote, roll back, canary)."""

from __future__ import annotations

import grpc
from scipy.stats import binom

from mascot.api.adapter.v1 import adapter_pb2 as apb
from mascot.api.adapter.v1 import adapter_pb2_grpc
from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
from mascot.app.stack import start_stack
from mascot.core.dialogue import HistoryTurn
from mascot.core.personas import PersonaCatalog
from mascot.core.server import channel
from mascot.speaker.reply import ReplyOutcome, RetryPolicy, persona_reply
from tests.helpers.config import make_config
from tests.helpers.lora import make_lora
from tests.helpers.rpc import collect

#: The admin token the stack is started with.
TOKEN = "hot-load-token"
AUTH = (("authorization", f"Bearer {TOKEN}"),)


async def expected_reply(engine, adapter, turn, cfg):
    """The anchor's greedy reply on ``engine`` with ``adapter`` to "hello there" under ``turn``'s directive (the
    speaker settings of ``cfg``), computed outside the stack."""
    card = PersonaCatalog.load().get("anchor")
    out = None
    async for item in persona_reply(engine, card, [card], [HistoryTurn("user", "hello there")], [],
                                    turn.directive.action, turn.directive.tone, max_tokens=cfg.speaker.max_tokens,
                                    temperature=0.0, top_p=1.0, seed=0, adapter=adapter, guard=cfg.guard.settings(),
                                    policy=RetryPolicy(max_attempts=1),
                                    repetition_penalty=cfg.speaker.repetition_penalty,
                                    frequency_penalty=cfg.speaker.frequency_penalty):
        if isinstance(item, ReplyOutcome):
            out = item
    return out.text


async def check_hot_load(tmp_path, tiny_model_dir, monkeypatch, engine=None, reference=None):
    """Publish three versions, then promote, stream through a promote, roll back and canary; ``engine`` is the
    serving engine (None: the stack builds a transformers engine), ``reference`` the engine expected outputs come
    from (None: the serving engine itself); versions are loaded into the reference from the store."""
    monkeypatch.setenv("MASCOT_ADMIN_TOKEN", TOKEN)
    seeds = {1: 11, 2: 13, 3: 21}  # random LoRAs whose greedy replies are not empty on this prompt
    loras = {i: make_lora(tiny_model_dir, tmp_path / f"lora{i}", r=4, seed=seeds[i]) for i in (1, 2, 3)}
    # director.policy random: a fixed directive (fallback action, default tone), so every conversation gives the
    # speaker the same prompt and the outputs compare across versions
    cfg = make_config(tmp_path, engine={"model": str(tiny_model_dir)}, dialogue={"agent_turns_per_round": 1},
                      security={"conversations_per_minute": 0},  # the canary split is sampled over many conversations
                      director={"policy": "random"},
                      speaker={"temperature": 0.0, "max_tokens": 12},
                      adapters={"store": str(tmp_path / "store"), "poll_s": 0.2})
    stack = await start_stack(cfg, engine=engine)
    ref = reference or stack.engine

    async def expected(name, turn):
        if name not in ref.adapters():
            n = name.split("--v")[1]
            await ref.load_adapter(name, str(tmp_path / "store" / "anchor" / f"v{n}"))
        return await expected_reply(ref, name, turn, cfg)

    ch, cch = channel(stack.target("gateway")), channel(stack.target("control"))
    admin, conv = adapter_pb2_grpc.AdapterServiceStub(cch), cpb_grpc.ConversationServiceStub(ch)
    try:
        for i in (1, 2, 3):
            await admin.PublishAdapter(apb.PublishAdapterRequest(persona_id="anchor", source_path=str(loras[i])),
                                       metadata=AUTH)
        await admin.PromoteAdapter(apb.PromoteAdapterRequest(persona_id="anchor", version=1), metadata=AUTH)

        async def new_conversation():
            return (await conv.StartConversation(cpb.StartConversationRequest(
                mode=cpb.MODE_SUPPORT, persona_ids=["anchor"]))).conversation

        async def agent_turn(c, key="k1"):
            events = await collect(conv.SendMessage(cpb.SendMessageRequest(conversation_id=c.id, text="hello there",
                                                                           idempotency_key=key)))
            turns = [e.turn_completed.turn for e in events if e.HasField("turn_completed")
                     and e.turn_completed.turn.persona_id == "anchor"]
            assert turns, [e for e in events if not e.HasField("turn_delta")]
            return turns[0]

        a = await new_conversation()
        assert dict(a.adapter_versions) == {"anchor": "anchor--v1", "director": "base"}
        ta = await agent_turn(a)
        assert ta.adapter_version == "anchor--v1"
        assert ta.text == await expected("anchor--v1", ta)

        # a promote while a reply streams from the old version: that reply completes on v1
        stream = conv.SendMessage(cpb.SendMessageRequest(conversation_id=a.id, text="hello there",
                                                         idempotency_key="k-stream"))
        events = [(await stream.read()).event]
        await admin.PromoteAdapter(apb.PromoteAdapterRequest(persona_id="anchor", version=2), metadata=AUTH)
        while (e := await stream.read()) is not grpc.aio.EOF:
            events.append(e.event)
        streamed = [e.turn_completed.turn for e in events if e.HasField("turn_completed")
                    and e.turn_completed.turn.persona_id == "anchor"]
        assert streamed and streamed[0].adapter_version == "anchor--v1"
        b = await new_conversation()
        tb = await agent_turn(b)
        assert tb.adapter_version == "anchor--v2"
        assert tb.text == await expected("anchor--v2", tb)
        # the adapters really differ, so the equalities are about the version used
        assert await expected("anchor--v2", ta) != ta.text
        # the conversation started before the promote keeps v1
        ta2 = await agent_turn(a, key="k2")
        assert ta2.adapter_version == "anchor--v1"

        await admin.RollbackAdapter(apb.RollbackAdapterRequest(persona_id="anchor"), metadata=AUTH)
        c = await new_conversation()
        tc = await agent_turn(c)
        assert tc.adapter_version == "anchor--v1" and tc.text == ta.text  # same opening, same greedy output

        await admin.PromoteAdapter(apb.PromoteAdapterRequest(persona_id="anchor", version=3, canary_weight=0.3),
                                   metadata=AUTH)
        pins = [(await new_conversation()).adapter_versions["anchor"] for _ in range(400)]
        # conversation keys are random here, so the bound is wide (a false failure once in a million runs); a
        # weight that is ignored (0 or 400 canary pins) or misread as 0.5 (about 200) still falls far outside it
        lo, hi = binom.interval(1 - 1e-6, 400, 0.3)
        assert set(pins) == {"anchor--v1", "anchor--v3"} and lo <= pins.count("anchor--v3") <= hi
        # the engine loaded every serving version under its own name, and reports them
        assert {"anchor--v1", "anchor--v3"} <= set(stack.engine.adapters())
        got = stack.metrics.registry.get_sample_value("mascot_adapter_info", {
            "persona": "anchor", "adapter_version": "anchor--v3", "state": "canary"})
        assert got == 1.0
        # per-version series: v1 served 4 turns (a, the streamed one, a again, c), v2 one (b); tokens counted per
        # version by the speaker
        reg = stack.metrics.registry
        for version, turns in (("anchor--v1", 4), ("anchor--v2", 1)):
            assert reg.get_sample_value("mascot_turn_duration_seconds_count",
                                        {"persona": "anchor", "adapter_version": version}) == turns
            assert reg.get_sample_value("mascot_generated_tokens_total", {
                "component": "speaker", "persona": "anchor", "adapter_version": version}) > 0
        # v1, v2, v3 loaded once each
        assert reg.get_sample_value("mascot_adapter_load_seconds_count", {"persona": "anchor"}) == 3
    finally:
        await ch.close()
        await cch.close()
        await stack.stop(0)
