"""TLS and mutual TLS on every gRPC server and client: a throwaway CA, server
and client certificates made with `cryptography`; a round through a TLS (and an mTLS) stack whose gateway reaches the
director and speaker over TLS; plaintext clients, clients without a certificate and certificates of another CA are
refused (UNAVAILABLE); the model servers' gRPC port; the CLIs' --tls-* options."""

from __future__ import annotations

import asyncio
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
from mascot.core.config import MascotConfig
from mascot.core.server import ClientTLS, channel
from mascot.app.stack import start_stack
from tests.helpers.config import make_config
from tests.helpers.engine import ScriptedEngine
from tests.helpers.pki import PKI, Pair, make_pki
from tests.helpers.rpc import collect

pytestmark = pytest.mark.integration
DIRECTOR = "Agent: The Anchor\nAction: Comfort the user.\nTone: Warm"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> PKI:
    return make_pki(tmp_path_factory.mktemp("pki"))[0]


def tls_section(pki: PKI, client_auth: bool = False, server: Pair | None = None) -> dict:
    server = server or pki.server
    return {"tls": {"cert_file": str(server.cert), "key_file": str(server.key), "ca_file": str(pki.ca),
                    "client_auth": client_auth}}


async def tls_stack(tmp_path, pki, client_auth=False):
    cfg = make_config(tmp_path, server=tls_section(pki, client_auth))
    return await start_stack(cfg, engine=ScriptedEngine(lambda p: DIRECTOR, lambda p: "I hear you."))


async def round_trip(target: str, tls: ClientTLS) -> list:
    """StartConversation + one SendMessage round through ``target``; returns the events."""
    async with channel(target, tls=tls, token="") as ch:
        stub = cpb_grpc.ConversationServiceStub(ch)
        conv = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT),
                                             timeout=30)).conversation
        return await collect(stub.SendMessage(cpb.SendMessageRequest(conversation_id=conv.id, text="hello there",
                                                                     idempotency_key="k1"), timeout=60))


async def refused(target: str, tls: ClientTLS) -> grpc.StatusCode:
    async with channel(target, tls=tls, token="") as ch:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await cpb_grpc.ConversationServiceStub(ch).ListPersonas(cpb.ListPersonasRequest(), timeout=10)
    return e.value.code()


def test_tls_config_is_checked():
    with pytest.raises(ValueError, match="go together"):
        MascotConfig(server={"tls": {"cert_file": "/x.crt"}})
    with pytest.raises(ValueError, match="client_auth"):
        MascotConfig(server={"tls": {"cert_file": "/x.crt", "key_file": "/x.key", "client_auth": True}})
    assert not MascotConfig().server.tls.enabled


async def test_tls_round_and_plaintext_or_foreign_ca_clients_are_refused(tmp_path, pki):
    stack = await tls_stack(tmp_path, pki)
    try:
        target = stack.target("gateway")
        events = await round_trip(target, ClientTLS(ca_file=str(pki.ca)))  # gateway -> director/speaker over TLS too
        assert events[-1].round_completed.agent_turns == 3
        assert await refused(target, ClientTLS.plaintext()) == grpc.StatusCode.UNAVAILABLE
        assert await refused(target, ClientTLS(ca_file=str(pki.other_ca))) == grpc.StatusCode.UNAVAILABLE
        # the model services of the stack serve TLS as well: a plaintext client cannot reach the director
        async with channel(stack.target("director"), tls=ClientTLS.plaintext(), token="") as ch:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        async with channel(stack.target("director"), tls=ClientTLS(ca_file=str(pki.ca)), token="") as ch:
            ok = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert ok.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await stack.stop(0)


async def test_mtls_requires_a_client_certificate_of_the_ca(tmp_path, pki):
    stack = await tls_stack(tmp_path, pki, client_auth=True)  # gateway presents its certificate to the models
    try:
        target, ca = stack.target("gateway"), str(pki.ca)
        good = ClientTLS(ca_file=ca, cert_file=str(pki.client.cert), key_file=str(pki.client.key))
        assert (await round_trip(target, good))[-1].round_completed.agent_turns == 3
        assert await refused(target, ClientTLS(ca_file=ca)) == grpc.StatusCode.UNAVAILABLE  # no client certificate
        foreign = ClientTLS(ca_file=ca, cert_file=str(pki.other_client.cert), key_file=str(pki.other_client.key))
        assert await refused(target, foreign) == grpc.StatusCode.UNAVAILABLE  # a certificate of another CA
        assert await refused(target, ClientTLS.plaintext()) == grpc.StatusCode.UNAVAILABLE
    finally:
        await stack.stop(0)


async def test_gateway_refuses_model_services_with_a_certificate_of_another_ca(tmp_path, pki):
    """A director/speaker serving a certificate the gateway's CA did not sign: the gateway's calls fail
    (UNAVAILABLE), the gateway keeps serving."""
    models_cfg = make_config(tmp_path / "models", server=tls_section(pki, server=pki.other_server))
    models = await start_stack(models_cfg, ("director", "speaker"),
                               engine=ScriptedEngine(lambda p: DIRECTOR, lambda p: "I hear you."))
    try:
        gw_cfg = make_config(tmp_path, server={**tls_section(pki), "director_target": models.target("director"),
                                               "speaker_target": models.target("speaker"), "call_timeout_s": 10})
        gw = await start_stack(gw_cfg, ("gateway",))
        try:
            async with channel(gw.target("gateway"), tls=ClientTLS(ca_file=str(pki.ca)), token="") as ch:
                stub = cpb_grpc.ConversationServiceStub(ch)
                conv = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await collect(stub.SendMessage(cpb.SendMessageRequest(conversation_id=conv.id, text="hi",
                                                                          idempotency_key="k1"), timeout=60))
                assert e.value.code() == grpc.StatusCode.UNAVAILABLE
                assert (await stub.ListPersonas(cpb.ListPersonasRequest())).personas
        finally:
            await gw.stop(0)
    finally:
        await models.stop(0)


def test_client_tls_from_env_and_config(pki):
    assert not ClientTLS.from_env({}).enabled
    assert ClientTLS.from_env({"MASCOT_TLS": "1"}).enabled
    env = ClientTLS.from_env({"MASCOT_TLS_CA": str(pki.ca), "MASCOT_TLS_SERVER_NAME": "localhost"})
    assert env.enabled and env.ca_file == str(pki.ca) and env.server_name == "localhost"
    cfg = MascotConfig(server=tls_section(pki, client_auth=True)).server.tls
    out = ClientTLS.from_config(cfg)
    assert out.cert_file == str(pki.server.cert) and out.ca_file == str(pki.ca)  # mTLS: the gateway's own certificate
    assert ClientTLS.from_config(MascotConfig().server.tls) == ClientTLS.plaintext()
    with pytest.raises(ValueError, match="needs its key"):
        ClientTLS(ca_file=str(pki.ca), cert_file=str(pki.client.cert)).credentials()
    with pytest.raises(ValueError, match="cannot be read"):
        ClientTLS(ca_file="/nonexistent/ca.pem").credentials()


@pytest.mark.slow
async def test_model_server_grpc_port_serves_mtls(tmp_path, pki):
    argv, sys.argv = sys.argv, sys.argv[:1]  # kserve parses sys.argv at import
    try:
        from mascot.app.modelserver import OnePortModelServer
    finally:
        sys.argv = argv
    cfg = make_config(tmp_path, server=tls_section(pki, client_auth=True))
    srv = OnePortModelServer("director", cfg, grpc_port=0, http_port=0, host="127.0.0.1",
                             engine=ScriptedEngine(lambda p: DIRECTOR, lambda p: ""), grace_s=1)
    await srv.start_async()
    target = f"127.0.0.1:{srv.grpc_port}"
    try:
        good = ClientTLS(ca_file=str(pki.ca), cert_file=str(pki.client.cert), key_file=str(pki.client.key))
        for tls, ok in ((good, True), (ClientTLS(ca_file=str(pki.ca)), False), (ClientTLS.plaintext(), False)):
            async with channel(target, tls=tls, token="") as ch:
                call = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
                if ok:
                    await call
                else:
                    with pytest.raises(grpc.aio.AioRpcError) as e:
                        await call
                    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await srv.shutdown()


async def test_cli_chat_and_adapters_use_tls_options(tmp_path, pki, monkeypatch):
    """`mascot chat --tls-ca/--tls-cert/--tls-key` talks to an mTLS gateway; `mascot adapters --tls-ca ...` too;
    without the options the CLI is refused."""
    from typer.testing import CliRunner

    from mascot.cli import app

    for name in ("MASCOT_TLS_CA", "MASCOT_TLS_CERT", "MASCOT_TLS_KEY", "MASCOT_TLS", "MASCOT_CALLER_TOKEN"):
        monkeypatch.setenv(name, "")  # restored after the test (the adapters group exports its options)
    monkeypatch.setenv("MASCOT_TEST_ADMIN", "admin-token-0123456789")
    monkeypatch.setenv("MASCOT_ADMIN_TOKEN", "admin-token-0123456789")
    cfg = make_config(tmp_path, server=tls_section(pki, client_auth=True),
                      adapters={"store": str(tmp_path / "store"), "base_model": "tiny-base",
                                "admin_token_env": "MASCOT_TEST_ADMIN"})
    stack = await start_stack(cfg, engine=ScriptedEngine(lambda p: DIRECTOR, lambda p: "I hear you."))
    runner = CliRunner()
    tls = ["--tls-ca", str(pki.ca), "--tls-cert", str(pki.client.cert), "--tls-key", str(pki.client.key)]
    try:
        target = stack.target("gateway")
        r = await asyncio.to_thread(runner.invoke, app, ["chat", "--target", target, *tls], input="hello there\n\n")
        assert r.exit_code == 0, r.output
        assert "I hear you." in r.output
        r = await asyncio.to_thread(runner.invoke, app, ["chat", "--target", target], input="hello\n\n")
        assert r.exit_code == 1 and "UNAVAILABLE" in r.output
        control = stack.target("control")  # the control plane's listener serves TLS under server.tls too
        r = await asyncio.to_thread(runner.invoke, app, ["adapters", *tls, "list", "--target", control, "--json"])
        assert r.exit_code == 0, r.output
        for name in ("MASCOT_TLS_CA", "MASCOT_TLS_CERT", "MASCOT_TLS_KEY"):
            monkeypatch.setenv(name, "")  # the first call exported its options into this process
        r = await asyncio.to_thread(runner.invoke, app, ["adapters", "list", "--target", control])
        assert r.exit_code == 1 and "UNAVAILABLE" in r.output
    finally:
        await stack.stop(0)


async def test_cli_run_target_uses_tls_options_and_caller_token(tmp_path, pki, monkeypatch):
    """`mascot run --target --tls-ca ... --token-file ...` against a TLS gateway with caller tokens: the
    conversation is stored under the caller's id."""
    import json

    from typer.testing import CliRunner

    from mascot.cli import app

    token = "runner-token-0123456789abcdef"
    for name in ("MASCOT_TLS_CA", "MASCOT_TLS_CERT", "MASCOT_TLS_KEY", "MASCOT_TLS", "MASCOT_CALLER_TOKEN"):
        monkeypatch.setenv(name, "")  # restored after the test (`mascot run` exports its options)
    monkeypatch.setenv("MASCOT_CALLER_TOKENS", f"runner={token}")
    cfg = make_config(tmp_path, server=tls_section(pki), security={"caller_auth": True})
    stack = await start_stack(cfg, engine=ScriptedEngine(lambda p: DIRECTOR, lambda p: "I hear you."))
    situations = tmp_path / "s.jsonl"
    situations.write_text(json.dumps({"id": "s1", "situation": "I lost my job.", "first_utterance": "I lost my job",
                                      "emotion": "sad"}) + "\n")
    (tmp_path / "token").write_text(token + "\n")
    try:
        r = await asyncio.to_thread(CliRunner().invoke, app, [
            "run", "--situations", str(situations), "--out", str(tmp_path / "out"), "--agent-turns", "1",
            "--target", stack.target("gateway"), "--tls-ca", str(pki.ca), "--token-file", str(tmp_path / "token")])
        assert r.exit_code == 0, r.output
        summary = json.loads(r.stdout)  # the summary alone on stdout (progress goes to stderr)
        assert summary["conversations"] == 1, r.stdout
        from sqlalchemy import text

        with stack.store.engine.connect() as c:
            assert c.execute(text("SELECT owner FROM conversations")).scalars().all() == ["runner"]
    finally:
        await stack.stop(0)
