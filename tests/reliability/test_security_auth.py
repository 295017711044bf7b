"""Who may call what: the admin token on AdapterService and TrainingService,
optional per-caller tokens on ConversationService with conversations visible only to their owner (NOT_FOUND for
anyone else, exactly like an unknown id), and tokens that come only from a mounted file or the environment."""

from __future__ import annotations

import grpc
import pytest

from mascot.api.adapter.v1 import adapter_pb2 as apb
from mascot.api.adapter.v1 import adapter_pb2_grpc
from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.api.training.v1 import training_pb2 as tpb
from mascot.api.training.v1 import training_pb2_grpc
from mascot.core.config import MascotConfig
from mascot.core.metrics import Metrics
from mascot.core.server import build_server, channel
from mascot.gateway.security import CallerAuth, parse_caller_tokens
from mascot.app.stack import start_stack
from tests.helpers.config import make_config
from tests.helpers.engine import ScriptedEngine
from tests.helpers.rpc import code_of, collect

pytestmark = pytest.mark.integration
ALICE, BOB = "alice-token-0123456789abcdef", "bob-token-0123456789abcdef"
ADMIN = "admin-token-0123456789abcdef"
DIRECTOR = "Agent: The Anchor\nAction: Comfort the user.\nTone: Warm"


def md(token: str) -> tuple:
    return (("authorization", f"Bearer {token}"),)


async def stream_code(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await collect(call)
    return e.value.code(), e.value.details()


# ---------------------------------------------------------------------------------------------------- admin token
async def test_admin_services_refuse_without_or_with_a_wrong_token(tmp_path, monkeypatch):
    """AdapterService (on a stack's control plane) and TrainingService (served alone, its Job manager never reached)
    refuse a call without the token and with a wrong one (UNAUTHENTICATED), and echo no token."""
    from mascot.gateway.training import TrainingServicer

    monkeypatch.setenv("MASCOT_TEST_ADMIN", ADMIN)
    cfg = make_config(tmp_path, adapters={"store": str(tmp_path / "store"), "base_model": "tiny-base",
                                          "admin_token_env": "MASCOT_TEST_ADMIN"})
    stack = await start_stack(cfg, engine=ScriptedEngine(lambda p: "", lambda p: ""))

    class NoManager:  # any use of it would be a call that got past the token check
        def clock(self):
            return None

        def __getattr__(self, name):
            raise AssertionError(f"TrainingService reached its Job manager ({name}) without a valid token")

    training = await build_server("gateway", Metrics(), [(
        training_pb2_grpc.add_TrainingServiceServicer_to_server, TrainingServicer(NoManager(), ADMIN, Metrics(),
                                                                                  counter=object()),
        "mascot.api.training.v1.TrainingService")])
    try:
        async with channel(stack.target("control"), token="") as ach, \
                channel(f"127.0.0.1:{training.port}", token="") as tch:
            adapters = adapter_pb2_grpc.AdapterServiceStub(ach)
            runs = training_pb2_grpc.TrainingServiceStub(tch)
            calls = [lambda m: adapters.ListAdapters(apb.ListAdaptersRequest(), metadata=m),
                     lambda m: adapters.PublishAdapter(apb.PublishAdapterRequest(
                         persona_id="anchor", source_path=str(tmp_path)), metadata=m),
                     lambda m: adapters.PromoteAdapter(apb.PromoteAdapterRequest(persona_id="anchor", version=1),
                                                       metadata=m),
                     lambda m: adapters.RetireAdapter(apb.RetireAdapterRequest(persona_id="anchor", version=1),
                                                      metadata=m),
                     lambda m: adapters.RollbackAdapter(apb.RollbackAdapterRequest(persona_id="anchor"), metadata=m),
                     lambda m: runs.TriggerRetraining(tpb.TriggerRetrainingRequest(
                         phase=tpb.TRAINING_PHASE_PERSONA_ALIGNMENT), metadata=m),
                     lambda m: runs.ListRuns(tpb.ListRunsRequest(), metadata=m),
                     lambda m: runs.GetRun(tpb.GetRunRequest(run_id="r1"), metadata=m),
                     lambda m: runs.CancelRun(tpb.CancelRunRequest(run_id="r1"), metadata=m)]
            for call in calls:
                for missing in ((), (("authorization", ADMIN),), (("authorization", f"Basic {ADMIN}"),)):
                    code, msg = await code_of(call(missing))  # no token, or not a bearer token
                    assert code == grpc.StatusCode.UNAUTHENTICATED and ADMIN not in msg, msg
                for wrong in (md("nope"), md(ADMIN + "x"), md(ALICE)):
                    code, msg = await code_of(call(wrong))
                    assert code == grpc.StatusCode.UNAUTHENTICATED and ADMIN not in msg, msg
            assert (await adapters.ListAdapters(apb.ListAdaptersRequest(), metadata=md(ADMIN))).revision == 0
            assert not (tmp_path / "store" / "anchor").exists()  # nothing was published
    finally:
        await training.stop(0)
        await stack.stop(0)


# ---------------------------------------------------------------------------------------------------- caller tokens
def test_caller_tokens_parse_from_file_or_env_only(tmp_path):
    toks = parse_caller_tokens(f"# callers\nalice={ALICE}\n\nbob = {BOB}\n", "file")
    assert sorted(toks.values()) == ["alice", "bob"] and ALICE not in repr(toks)  # only digests are kept
    assert len(parse_caller_tokens(f"alice={ALICE},bob={BOB}", "env")) == 2
    for bad, why in ((f"alice {ALICE}", "caller_id=token"), ("alice=short", "at least 16"),
                     (f"alice={ALICE}\nbob={ALICE}", "also the token"), (f"a b={ALICE}", "caller_id=token")):
        with pytest.raises(ValueError, match=why) as e:
            parse_caller_tokens(bad, "src")
        assert ALICE not in str(e.value)
    f = tmp_path / "tokens"
    f.write_text(f"alice={ALICE}\n")
    sec = MascotConfig(security={"caller_auth": True, "caller_tokens_file": str(f)}).security
    assert CallerAuth.from_config(sec, environ={}).enabled
    sec = MascotConfig(security={"caller_auth": True, "caller_tokens_env": "MY_TOKENS"}).security
    assert CallerAuth.from_config(sec, environ={"MY_TOKENS": f"bob={BOB}"}).enabled
    with pytest.raises(ValueError, match="holds no caller_id=token"):
        CallerAuth.from_config(sec, environ={})
    with pytest.raises(ValueError, match="cannot be read"):
        CallerAuth.from_config(MascotConfig(security={"caller_auth": True,
                                                      "caller_tokens_file": str(tmp_path / "nope")}).security)
    assert not CallerAuth.from_config(MascotConfig().security).enabled
    with pytest.raises(ValueError, match="extra"):  # no token can be written in the YAML / config itself
        MascotConfig(security={"caller_tokens": {"alice": ALICE}})


async def test_gateway_will_not_start_with_caller_auth_and_no_tokens(tmp_path, monkeypatch):
    monkeypatch.delenv("MASCOT_CALLER_TOKENS", raising=False)
    with pytest.raises(ValueError, match="caller_auth"):
        await start_stack(make_config(tmp_path, security={"caller_auth": True}),
                          engine=ScriptedEngine(lambda p: DIRECTOR, lambda p: "ok"))


@pytest.fixture
async def owned(tmp_path, monkeypatch):
    """A gateway with caller tokens for alice and bob (from the environment)."""
    monkeypatch.setenv("MASCOT_CALLER_TOKENS", f"alice={ALICE},bob={BOB}")
    stack = await start_stack(make_config(tmp_path, security={"caller_auth": True}),
                              engine=ScriptedEngine(lambda p: DIRECTOR, lambda p: "I hear you."))
    ch = channel(stack.target("gateway"), token="")
    yield cpb_grpc.ConversationServiceStub(ch), stack
    await ch.close()
    await stack.stop(0)


async def test_every_conversation_rpc_needs_a_valid_caller_token(owned):
    stub, stack = owned
    calls = [lambda m: stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT), metadata=m),
             lambda m: stub.GetConversation(cpb.GetConversationRequest(conversation_id="x"), metadata=m),
             lambda m: stub.DeleteConversation(cpb.DeleteConversationRequest(conversation_id="x"), metadata=m),
             lambda m: stub.ListPersonas(cpb.ListPersonasRequest(), metadata=m),
             lambda m: stub.SendMessage(cpb.SendMessageRequest(conversation_id="x", text="hi", idempotency_key="k"),
                                        metadata=m),
             lambda m: stub.RunSelfPlay(cpb.RunSelfPlayRequest(conversation_id="x", opening_text="hi",
                                                               user=dpb.UserSimulation(situation="s")), metadata=m)]
    for call in calls:
        code, msg = await code_of(call(()))
        assert code == grpc.StatusCode.UNAUTHENTICATED and "Bearer" in msg
        code, msg = await code_of(call((("authorization", ALICE),)))  # not a bearer token
        assert code == grpc.StatusCode.UNAUTHENTICATED and ALICE not in msg
        code, msg = await code_of(call(md("wrong-token-0123456789")))
        assert code == grpc.StatusCode.PERMISSION_DENIED and "wrong-token" not in msg
    assert (await stub.ListPersonas(cpb.ListPersonasRequest(),
                                    metadata=(("authorization", f"bearer {ALICE}"),))).personas  # any case
    from sqlalchemy import text

    with stack.store.engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM conversations")).scalar() == 0  # nothing stored
    assert (await stub.ListPersonas(cpb.ListPersonasRequest(), metadata=md(ALICE))).personas


async def test_conversations_are_visible_only_to_their_owner(owned):
    stub, stack = owned
    conv = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT),
                                         metadata=md(ALICE))).conversation
    events = await collect(stub.SendMessage(cpb.SendMessageRequest(conversation_id=conv.id, text="hello",
                                                                   idempotency_key="k1"), metadata=md(ALICE)))
    assert events[-1].HasField("round_completed")
    assert stack.store.get_conversation(conv.id)[0].owner == "alice"
    unknown = "00000000-0000-0000-0000-000000000000"

    async def as_bob(conv_id):
        return [
            await code_of(stub.GetConversation(cpb.GetConversationRequest(conversation_id=conv_id), metadata=md(BOB))),
            await code_of(stub.DeleteConversation(cpb.DeleteConversationRequest(conversation_id=conv_id),
                                                  metadata=md(BOB))),
            await stream_code(stub.SendMessage(cpb.SendMessageRequest(conversation_id=conv_id, text="mine now",
                                                                      idempotency_key="k2"), metadata=md(BOB))),
            await stream_code(stub.RunSelfPlay(cpb.RunSelfPlayRequest(
                conversation_id=conv_id, opening_text="hi", user=dpb.UserSimulation(situation="s")),
                metadata=md(BOB)))]

    theirs, missing = await as_bob(conv.id), await as_bob(unknown)
    assert all(code == grpc.StatusCode.NOT_FOUND for code, _ in theirs + missing)
    # the same answer as for an id that does not exist (only the id itself differs): nothing says it exists
    assert [m.replace(conv.id, "ID") for _, m in theirs] == [m.replace(unknown, "ID") for _, m in missing]
    got = (await stub.GetConversation(cpb.GetConversationRequest(conversation_id=conv.id),
                                      metadata=md(ALICE))).conversation
    assert [t.text for t in got.turns][0] == "hello" and len(got.turns) == 4  # bob changed nothing
    await stub.DeleteConversation(cpb.DeleteConversationRequest(conversation_id=conv.id), metadata=md(ALICE))
    code, _ = await code_of(stub.GetConversation(cpb.GetConversationRequest(conversation_id=conv.id),
                                                 metadata=md(ALICE)))
    assert code == grpc.StatusCode.NOT_FOUND


async def test_self_play_of_another_callers_conversation_is_not_found(owned):
    stub, _ = owned
    conv = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT),
                                         metadata=md(BOB))).conversation
    code, _ = await stream_code(stub.RunSelfPlay(cpb.RunSelfPlayRequest(
        conversation_id=conv.id, opening_text="hi", user=dpb.UserSimulation(situation="s"), agent_turns=1),
        metadata=md(ALICE)))
    assert code == grpc.StatusCode.NOT_FOUND
    events = await collect(stub.RunSelfPlay(cpb.RunSelfPlayRequest(
        conversation_id=conv.id, opening_text="hi", user=dpb.UserSimulation(situation="s"), agent_turns=1),
        metadata=md(BOB)))
    assert events[-1].HasField("round_completed")


async def test_the_caller_token_travels_from_the_environment(owned, monkeypatch):
    """`channel()` sends MASCOT_CALLER_TOKEN (how `mascot run --target` and other clients authenticate)."""
    _, stack = owned
    monkeypatch.setenv("MASCOT_CALLER_TOKEN", BOB)
    async with channel(stack.target("gateway")) as ch:
        conv = (await cpb_grpc.ConversationServiceStub(ch).StartConversation(
            cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
    assert stack.store.get_conversation(conv.id)[0].owner == "bob"
