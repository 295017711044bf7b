"""The control plane apart from the public API, over real gRPC servers on loopback: the admin services are not on the
gateway's port, roles (viewer / operator / admin) from a token file that is re-read without a restart, OIDC/JWT bearer
tokens verified with PyJWT against a JWKS, the audit trail (store, paging, the CLI) and reflection per listener."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from grpc_reflection.v1alpha import reflection_pb2 as rpb
from grpc_reflection.v1alpha import reflection_pb2_grpc as rpb_grpc

from mascot.api.adapter.v1 import adapter_pb2 as pb
from mascot.api.adapter.v1 import adapter_pb2_grpc
from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
from mascot.api.training.v1 import training_pb2 as tpb
from mascot.api.training.v1 import training_pb2_grpc
from mascot.app.stack import start_stack
from mascot.core.server import channel
from mascot.gateway.control_auth import parse_control_tokens
from tests.helpers.config import make_config
from tests.helpers.engine import ScriptedEngine
from tests.helpers.lora import make_lora
from tests.helpers.paths import ROOT
from tests.helpers.rpc import code_of

pytestmark = pytest.mark.integration
VIEWER, OPERATOR, ADMIN = "viewer-token-0123456789", "operator-token-0123456789", "admin-token-0123456789ab"
ISSUER, AUDIENCE = "https://idp.example.test/", "mascot-control"


def md(token: str) -> tuple:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture(scope="module")
def loras(tiny_model_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("cp-loras")
    return {i: make_lora(tiny_model_dir, d / f"v{i}", seed=i) for i in (1, 2)}


@pytest.fixture(scope="module")
def keys():
    """Two RSA keys: the identity provider's (in the JWKS) and an attacker's (not)."""
    return {name: rsa.generate_private_key(public_exponent=65537, key_size=2048) for name in ("idp", "other")}


def mint(key, *, iss=ISSUER, aud=AUDIENCE, exp_in=300, roles=("operator",), sub="carol@example.test", kid="k1",
         **extra) -> str:
    now = int(time.time())
    claims = {"iss": iss, "aud": aud, "sub": sub, "iat": now, "exp": now + exp_in, "roles": list(roles), **extra}
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid})


@pytest.fixture
async def plane(tmp_path, tiny_model_dir, keys):
    """A stack (gateway, director, speaker on a scripted engine) with its control plane: a token file of three
    identities, a JWKS file with the identity provider's key, reload every 0 s."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# identity:role=token\nvera:viewer={VIEWER}\notto:operator={OPERATOR}\nada:admin={ADMIN}\n")
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(keys["idp"].public_key()))
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "RS256"}]}))
    cfg = make_config(tmp_path, adapters={"store": str(tmp_path / "store"), "base_model": str(tiny_model_dir),
                                          "max_rank": 4, "admin_token_env": "MASCOT_NO_SUCH_VARIABLE"},
                      control={"tokens_file": str(tokens), "reload_s": 0,
                               "jwt": {"issuer": ISSUER, "audience": AUDIENCE, "jwks_file": str(jwks)}})
    stack = await start_stack(cfg, engine=ScriptedEngine(lambda p: "", lambda p: ""))
    gw, ctl = channel(stack.target("gateway"), token=""), channel(stack.target("control"), token="")
    yield stack, gw, ctl, tokens
    await gw.close()
    await ctl.close()
    await stack.stop(0)


async def test_the_admin_services_are_not_on_the_public_port(plane):
    stack, gw, ctl, _ = plane
    assert stack.servers["control"].port != stack.servers["gateway"].port
    assert stack.target("control").startswith("127.0.0.1:")  # loopback by default
    calls = [adapter_pb2_grpc.AdapterServiceStub(gw).ListAdapters(pb.ListAdaptersRequest(), metadata=md(ADMIN)),
             adapter_pb2_grpc.AdapterServiceStub(gw).ListAuditEvents(pb.ListAuditEventsRequest(), metadata=md(ADMIN)),
             adapter_pb2_grpc.AdapterServiceStub(gw).PromoteAdapter(
                 pb.PromoteAdapterRequest(persona_id="anchor", version=1), metadata=md(ADMIN)),
             training_pb2_grpc.TrainingServiceStub(gw).ListRuns(tpb.ListRunsRequest(), metadata=md(ADMIN))]
    for call in calls:
        code, _ = await code_of(call)
        assert code == grpc.StatusCode.UNIMPLEMENTED
    # and the conversation API is not on the control port
    code, _ = await code_of(cpb_grpc.ConversationServiceStub(ctl).ListPersonas(cpb.ListPersonasRequest()))
    assert code == grpc.StatusCode.UNIMPLEMENTED
    assert (await adapter_pb2_grpc.AdapterServiceStub(ctl).ListAdapters(pb.ListAdaptersRequest(),
                                                                        metadata=md(VIEWER))).revision == 0


async def test_roles_viewer_reads_operator_changes_and_every_change_is_audited_once(plane, loras):
    stack, _, ctl, _ = plane
    stub = adapter_pb2_grpc.AdapterServiceStub(ctl)
    pub = pb.PublishAdapterRequest(persona_id="anchor", source_path=str(loras[1]), run_id="r1")
    code, msg = await code_of(stub.PublishAdapter(pub, metadata=md(VIEWER)))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "operator" in msg and "vera" in msg and VIEWER not in msg
    assert not (stack.cfg.adapters.store and Path(stack.cfg.adapters.store, "anchor").exists())
    v1 = await stub.PublishAdapter(pub, metadata=md(OPERATOR))
    assert v1.version.version == 1
    code, _ = await code_of(stub.PromoteAdapter(pb.PromoteAdapterRequest(persona_id="anchor", version=1),
                                                metadata=md(VIEWER)))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    r = await stub.PromoteAdapter(pb.PromoteAdapterRequest(persona_id="anchor", version=1), metadata=md(OPERATOR))
    assert r.persona.stable == 1
    code, _ = await code_of(stub.PromoteAdapter(pb.PromoteAdapterRequest(persona_id="anchor", version=1),
                                                metadata=md(OPERATOR)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION  # already stable: refused, and recorded as refused
    await stub.PublishAdapter(pb.PublishAdapterRequest(persona_id="anchor", source_path=str(loras[2])),
                              metadata=md(ADMIN))
    await stub.RetireAdapter(pb.RetireAdapterRequest(persona_id="anchor", version=2), metadata=md(ADMIN))
    assert (await stub.ListAdapters(pb.ListAdaptersRequest(), metadata=md(VIEWER))).personas[0].stable == 1

    events = (await stub.ListAuditEvents(pb.ListAuditEventsRequest(), metadata=md(VIEWER))).events
    got = [(e.actor, e.role, e.method, e.target, e.outcome) for e in reversed(events)]
    assert got == [("vera", "viewer", "PublishAdapter", "anchor", "PERMISSION_DENIED"),
                   ("otto", "operator", "PublishAdapter", "anchor", "OK"),
                   ("vera", "viewer", "PromoteAdapter", "anchor/v1", "PERMISSION_DENIED"),
                   ("otto", "operator", "PromoteAdapter", "anchor/v1", "OK"),
                   ("otto", "operator", "PromoteAdapter", "anchor/v1", "FAILED_PRECONDITION"),
                   ("ada", "admin", "PublishAdapter", "anchor", "OK"),
                   ("ada", "admin", "RetireAdapter", "anchor/v2", "OK")]
    assert all(e.request_id and e.time.endswith("+00:00") for e in events)
    assert json.loads(events[-2].detail_json)["run_id"] == "r1"  # otto's publish (newest first)
    assert events[2].outcome == "FAILED_PRECONDITION" and "stable" in events[2].message  # the refusal says why
    rows = stack.store.audit_events(limit=100)
    assert len(rows) == 7  # once each, in the store the conversations use
    # reads are not recorded; a token is never
    assert not any(x in json.dumps([e.detail_json for e in events]) for x in (VIEWER, OPERATOR, ADMIN))


async def test_audit_pages_filters_and_the_request_id(plane, loras):
    stack, _, ctl, _ = plane
    stub = adapter_pb2_grpc.AdapterServiceStub(ctl)
    for i in range(5):
        await code_of(stub.RollbackAdapter(pb.RollbackAdapterRequest(persona_id="anchor"),
                                           metadata=(*md(OPERATOR), ("x-request-id", f"req-{i}"))))
    await code_of(stub.RollbackAdapter(pb.RollbackAdapterRequest(persona_id="anchor"),
                                       metadata=(*md(OPERATOR), ("x-request-id", 'a "quoted" id ' + "x" * 200))))
    seen, token = [], ""
    while True:
        page = await stub.ListAuditEvents(pb.ListAuditEventsRequest(page_size=4, page_token=token),
                                          metadata=md(VIEWER))
        seen += list(page.events)
        token = page.next_page_token
        if not token:
            break
    assert len(seen) == 6 and [e.id for e in seen] == sorted((e.id for e in seen), reverse=True)
    assert [e.request_id for e in seen[1:]] == [f"req-{i}" for i in reversed(range(5))]
    assert seen[0].request_id and " " not in seen[0].request_id and len(seen[0].request_id) <= 64
    assert all(e.outcome == "NOT_FOUND" for e in seen)  # no anchor yet: refused, still recorded
    only = await stub.ListAuditEvents(pb.ListAuditEventsRequest(actor="nobody"), metadata=md(VIEWER))
    assert not only.events
    for bad in (pb.ListAuditEventsRequest(page_size=100000), pb.ListAuditEventsRequest(page_token="x")):
        code, _ = await code_of(stub.ListAuditEvents(bad, metadata=md(VIEWER)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_token_removed_from_the_file_is_refused_without_a_restart(plane):
    _, _, ctl, tokens = plane
    stub = adapter_pb2_grpc.AdapterServiceStub(ctl)
    assert (await stub.ListAdapters(pb.ListAdaptersRequest(), metadata=md(VIEWER))).revision == 0
    new = tokens.with_name("tokens.new")  # replaced as a mounted Secret is: a new file renamed over the old one
    new.write_text(f"otto:operator={OPERATOR}\n")
    os.replace(new, tokens)
    code, msg = await code_of(stub.ListAdapters(pb.ListAdaptersRequest(), metadata=md(VIEWER)))
    assert code == grpc.StatusCode.UNAUTHENTICATED and VIEWER not in msg
    assert (await stub.ListAdapters(pb.ListAdaptersRequest(), metadata=md(OPERATOR))).revision == 0
    tokens.write_text("otto:superuser=" + OPERATOR)  # a broken file fails closed and says so
    code, msg = await code_of(stub.ListAdapters(pb.ListAdaptersRequest(), metadata=md(OPERATOR)))
    assert code == grpc.StatusCode.UNAVAILABLE and "token file" in msg and OPERATOR not in msg
    tokens.write_text(f"vera:viewer={VIEWER}\n")
    assert (await stub.ListAdapters(pb.ListAdaptersRequest(), metadata=md(VIEWER))).revision == 0


async def test_jwt_bearer_tokens_are_verified(plane, keys):
    _, _, ctl, _ = plane
    stub = adapter_pb2_grpc.AdapterServiceStub(ctl)
    ok = mint(keys["idp"], roles=["viewer"])
    assert (await stub.ListAdapters(pb.ListAdaptersRequest(), metadata=md(ok))).revision == 0
    bad = {"wrong issuer": mint(keys["idp"], iss="https://evil.example.test/"),
           "wrong audience": mint(keys["idp"], aud="another-service"),
           "wrong signature": mint(keys["other"]),
           "expired": mint(keys["idp"], exp_in=-3600),
           "unknown key id": mint(keys["idp"], kid="k2"),
           "no role": mint(keys["idp"], roles=["superuser"]),
           "no exp": jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "sub": "x", "roles": ["admin"]}, keys["idp"],
                                algorithm="RS256", headers={"kid": "k1"}),
           "alg none": jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "sub": "x", "roles": ["admin"],
                                   "exp": int(time.time()) + 300}, None, algorithm="none")}
    for why, token in bad.items():
        code, msg = await code_of(stub.ListAdapters(pb.ListAdaptersRequest(), metadata=md(token)))
        assert code == grpc.StatusCode.UNAUTHENTICATED, (why, code, msg)
    # a JWT's role and identity reach the audit trail
    code, msg = await code_of(stub.RollbackAdapter(pb.RollbackAdapterRequest(persona_id="anchor"), metadata=md(ok)))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "carol@example.test" in msg
    op = mint(keys["idp"], roles=["viewer", "operator"], sub="dave@example.test")
    code, _ = await code_of(stub.RollbackAdapter(pb.RollbackAdapterRequest(persona_id="anchor"), metadata=md(op)))
    assert code == grpc.StatusCode.NOT_FOUND  # authorized; nothing to roll back
    events = (await stub.ListAuditEvents(pb.ListAuditEventsRequest(), metadata=md(op))).events
    assert [(e.actor, e.role, e.via) for e in events] == [("dave@example.test", "operator", "jwt"),
                                                          ("carol@example.test", "viewer", "jwt")]


async def test_reflection_per_listener(plane):
    """The public listener reflects its services (server.reflection on); the control plane's reflects nothing
    (control.reflection off by default)."""
    _, gw, ctl, _ = plane

    async def services(ch) -> tuple[grpc.StatusCode, list[str]]:
        stub = rpb_grpc.ServerReflectionStub(ch)
        try:
            async for r in stub.ServerReflectionInfo(iter([rpb.ServerReflectionRequest(list_services="")])):
                return grpc.StatusCode.OK, [s.name for s in r.list_services_response.service]
        except grpc.aio.AioRpcError as e:
            return e.code(), []
        return grpc.StatusCode.OK, []

    code, names = await services(gw)
    assert code == grpc.StatusCode.OK and "mascot.api.conversation.v1.ConversationService" in names
    assert not any("AdapterService" in n or "TrainingService" in n for n in names)
    code, names = await services(ctl)
    assert code == grpc.StatusCode.UNIMPLEMENTED and names == []


async def test_promote_past_the_evaluation_gate_needs_admin(tmp_path, tiny_model_dir, loras):
    """With the evaluation gate on, skip_eval_gate is an admin override: an operator is refused (and recorded), an
    admin promotes without the gate running (recorded as PromoteAdapter.skip_eval_gate)."""
    from mascot.gateway.admin import AdapterServicer
    from mascot.gateway.audit import ControlGuard
    from mascot.gateway.control_auth import ControlAuth
    from mascot.gateway.store import Store
    from mascot.core.metrics import Metrics
    from mascot.core.server import build_server

    ran = []

    async def gate(persona_id, candidate, baseline):  # the gate must not run for a skip
        ran.append(candidate)
        raise AssertionError("the evaluation gate ran for a skip")

    store = Store(f"sqlite:///{tmp_path}/audit.db")
    tokens = parse_control_tokens(f"otto:operator={OPERATOR}\nada:admin={ADMIN}", "test")
    servicer = AdapterServicer(tmp_path / "store", str(tiny_model_dir), ControlGuard(ControlAuth(tokens), store),
                               max_rank=4, gate=gate)
    server = await build_server("control", Metrics(), [(adapter_pb2_grpc.add_AdapterServiceServicer_to_server,
                                                        servicer, "mascot.api.adapter.v1.AdapterService")],
                                reflection_on=False)
    try:
        async with channel(f"127.0.0.1:{server.port}", token="") as ch:
            stub = adapter_pb2_grpc.AdapterServiceStub(ch)
            await stub.PublishAdapter(pb.PublishAdapterRequest(persona_id="anchor", source_path=str(loras[1])),
                                      metadata=md(OPERATOR))
            skip = pb.PromoteAdapterRequest(persona_id="anchor", version=1, skip_eval_gate=True)
            code, msg = await code_of(stub.PromoteAdapter(skip, metadata=md(OPERATOR)))
            assert code == grpc.StatusCode.PERMISSION_DENIED and "admin" in msg
            assert (await stub.PromoteAdapter(skip, metadata=md(ADMIN))).persona.stable == 1
            assert not ran
        rows = [(r.actor, r.method, r.outcome) for r in reversed(store.audit_events(limit=10))]
        assert rows == [("otto", "PublishAdapter", "OK"),
                        ("otto", "PromoteAdapter.skip_eval_gate", "PERMISSION_DENIED"),
                        ("ada", "PromoteAdapter.skip_eval_gate", "OK")]
    finally:
        await server.stop(0)
        store.close()


async def test_a_change_is_refused_when_the_audit_trail_cannot_be_written(plane, loras):
    stack, _, ctl, _ = plane
    stub = adapter_pb2_grpc.AdapterServiceStub(ctl)
    db = Path(stack.cfg.store.url.removeprefix("sqlite:///"))
    db.rename(db.with_suffix(".moved"))  # the store's file is gone: nothing may change unrecorded
    code, msg = await code_of(stub.PublishAdapter(pb.PublishAdapterRequest(persona_id="anchor",
                                                                           source_path=str(loras[1])),
                                                  metadata=md(OPERATOR)))
    assert code == grpc.StatusCode.UNAVAILABLE and "audit trail" in msg
    assert not Path(stack.cfg.adapters.store, "anchor").exists()


def test_the_cli_lists_the_audit_trail(tmp_path):
    """`mascot adapters audit` against a running `mascot serve` whose control plane is on its own port: the events
    with their actors, and --json."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"otto:operator={OPERATOR}\n")
    env = {**os.environ, "MASCOT_CONTROL__TOKENS_FILE": str(tokens), "MASCOT_ADAPTERS__STORE": str(tmp_path / "s"),
           "MASCOT_SERVER__METRICS_PORT": "0", "MASCOT_SAFETY__CLASSIFIER": "none", "COLUMNS": "200"}
    # the gateway and the control plane only (the model services are not called here)
    proc = subprocess.Popen([sys.executable, "-m", "mascot.cli", "serve", "--component", "gateway",
                             "--component", "control", "--director-target", "127.0.0.1:9",
                             "--speaker-target", "127.0.0.1:9", "--port", "0", "--control-port", "0",
                             "--store-url", f"sqlite:///{tmp_path}/db.sqlite"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        ports = None
        deadline = time.monotonic() + 180
        while ports is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("{"):
                ports = json.loads(line)
        assert ports and "control" in ports, proc.stderr.read() if proc.poll() is not None else ports
        target = f"127.0.0.1:{ports['control']}"

        def run(*a: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "mascot.cli", "adapters", *a, "--target", target],
                                  env={**env, "MASCOT_ADMIN_TOKEN": OPERATOR}, capture_output=True, text=True,
                                  cwd=ROOT, timeout=120)

        r = run("rollback", "anchor")
        assert r.returncode == 1 and "NOT_FOUND" in r.stdout + r.stderr
        r = run("audit")
        assert r.returncode == 0 and "otto" in r.stdout and "RollbackAdapter" in r.stdout and "NOT_FOUND" in r.stdout
        r = run("audit", "--json")
        events = json.loads(r.stdout)["events"]
        assert [(e["actor"], e["method"], e["outcome"]) for e in events] == [("otto", "RollbackAdapter",
                                                                               "NOT_FOUND")]
        r = subprocess.run([sys.executable, "-m", "mascot.cli", "adapters", "audit", "--target",
                            f"127.0.0.1:{ports['gateway']}"], env={**env, "MASCOT_ADMIN_TOKEN": OPERATOR},
                           capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert r.returncode == 1 and "serves no AdapterService" in r.stdout + r.stderr
    finally:
        proc.terminate()
        proc.wait(30)


async def test_jwt_keys_from_a_jwks_url(tmp_path, tiny_model_dir, keys):
    """control.jwt.jwks_url: the keys are fetched from the identity provider's JWKS endpoint (a real HTTP server on
    loopback) and cached; a token signed by a key it does not list is refused."""
    import http.server
    import threading

    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(keys["idp"].public_key()))
    body = json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "RS256"}]}).encode()
    hits = []

    class JWKS(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), JWKS)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/.well-known/jwks.json"
    cfg = make_config(tmp_path, adapters={"store": str(tmp_path / "store"), "base_model": str(tiny_model_dir),
                                          "admin_token_env": "MASCOT_NO_SUCH_VARIABLE"},
                      control={"jwt": {"issuer": ISSUER, "audience": AUDIENCE, "jwks_url": url}})
    stack = await start_stack(cfg, ("control",))
    try:
        async with channel(stack.target("control"), token="") as ch:
            stub = adapter_pb2_grpc.AdapterServiceStub(ch)
            for _ in range(3):
                r = await stub.ListAdapters(pb.ListAdaptersRequest(), metadata=md(mint(keys["idp"], roles=["viewer"])))
                assert r.revision == 0
            assert hits == ["/.well-known/jwks.json"]  # fetched once, then cached
            code, _ = await code_of(stub.ListAdapters(pb.ListAdaptersRequest(), metadata=md(mint(keys["other"]))))
            assert code == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await stack.stop(0)
        httpd.shutdown()
