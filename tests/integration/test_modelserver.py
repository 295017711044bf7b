"""Model services under KServe: the one-port ModelServer serves our gRPC service and the Open
Inference Protocol on one gRPC port (same greedy result both ways, also over REST v2), gRPC health and KServe
readiness follow the engine and the adapter registry, /metrics lists mascot_ series, bad OIP input is
INVALID_ARGUMENT / 400, and `mascot serve-model` stops on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import httpx
import pytest
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.api.director.v1 import director_pb2 as dirpb
from mascot.api.director.v1 import director_pb2_grpc as dir_grpc
from mascot.api.speaker.v1 import speaker_pb2 as spb
from mascot.api.speaker.v1 import speaker_pb2_grpc as sp_grpc
from mascot.core.server import channel
from tests.helpers.config import make_config
from tests.helpers.lora import make_lora
from tests.helpers.modelserver import NOT_SERVING, SERVING, SPEAKER_REQ, OnePortModelServer, model_server, until_health
from tests.helpers.net import free_port
from tests.helpers.paths import ROOT

argv, sys.argv = sys.argv, sys.argv[:1]  # kserve parses sys.argv at import
try:
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as v2
    from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as v2_grpc
finally:
    sys.argv = argv

pytestmark = [pytest.mark.integration, pytest.mark.slow]
FAST_DIRECTOR = {"max_tokens": 48, "max_retries": 0}
GREEDY_SPEAKER = {"temperature": 0.0, "max_tokens": 12}
DIRECTOR_REQ = dirpb.NextDirectiveRequest(
    persona_ids=["empathetic_listener", "anchor", "beacon"],
    history=[dpb.Turn(role=dpb.ROLE_USER, text="I failed my exam and I feel terrible.")])


def oip_doc(method, request) -> str:
    return json.dumps({"method": method, "request": json_format.MessageToDict(request)})


async def oip_grpc(ch, model, doc, rid="r1"):
    """ModelInfer through KServe's generated v2 stub; returns the decoded JSON of output "response"."""
    resp = await v2_grpc.GRPCInferenceServiceStub(ch).ModelInfer(v2.ModelInferRequest(
        model_name=model, id=rid, inputs=[v2.ModelInferRequest.InferInputTensor(
            name="request", datatype="BYTES", shape=[1],
            contents=v2.InferTensorContents(bytes_contents=[doc.encode() if isinstance(doc, str) else doc]))]))
    assert resp.id == rid and resp.outputs[0].name == "response" and resp.outputs[0].datatype == "BYTES"
    return json.loads(resp.outputs[0].contents.bytes_contents[0])


async def oip_rest(http, model, doc):
    """REST v2 infer (no request id: the server must still answer with one); returns ``(status, body)``."""
    r = await http.post(f"/v2/models/{model}/infer", json={"inputs": [
        {"name": "request", "datatype": "BYTES", "shape": [1], "data": [doc]}]})
    return r.status_code, r.json()


def speaker_messages(items):
    """Streamed GenerateReplyResponse messages as (all delta text, the final with its timing cleared): the speaker
    coalesces deltas by time (``speaker.stream_interval_ms``), so where one delta ends differs call to call."""
    out = [m if isinstance(m, spb.GenerateReplyResponse) else json_format.ParseDict(m, spb.GenerateReplyResponse())
           for m in items]
    finals = [m.final for m in out if m.HasField("final")]
    for f in finals:
        f.ClearField("first_token")
    return "".join(m.delta.text for m in out if m.HasField("delta")), finals


async def test_director_native_equals_oip_health_and_metrics(tmp_path, engine):
    cfg = make_config(tmp_path, director=FAST_DIRECTOR)
    async with model_server("director", cfg, engine) as (srv, ch, http):
        await until_health(ch)
        check = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(
            service="mascot.api.director.v1.DirectorService"))
        assert check.status == SERVING
        assert (await http.get("/v2/health/ready")).json() == {"ready": True}
        assert (await http.get("/v2/models/director/ready")).json() == {"name": "director", "ready": True}
        assert (await http.get("/v2/health/live")).status_code == 200

        native = await dir_grpc.DirectorServiceStub(ch).NextDirective(DIRECTOR_REQ)
        assert native.directive.persona_id in DIRECTOR_REQ.persona_ids and native.raw_attempts
        doc = oip_doc("NextDirective", DIRECTOR_REQ)
        via_grpc = json_format.ParseDict(await oip_grpc(ch, "director", doc), dirpb.NextDirectiveResponse())
        status, body = await oip_rest(http, "director", doc)
        assert status == 200 and body["id"] and body["outputs"][0]["name"] == "response"
        via_rest = json_format.Parse(body["outputs"][0]["data"][0], dirpb.NextDirectiveResponse())
        assert via_grpc == native and via_rest == native

        metrics = (await http.get("/metrics")).text
        assert 'mascot_rpc_requests_total{code="OK",component="director",rpc="NextDirective"} 1.0' in metrics
        # ModelInfer: the gRPC and the REST call
        assert 'mascot_rpc_requests_total{code="OK",component="director",rpc="ModelInfer"} 2.0' in metrics
        assert "mascot_director_decisions_total{" in metrics and "mascot_engine_batch_size" in metrics
    assert srv.runtime.ready is False  # shut down


async def test_speaker_stream_native_equals_oip_list(tmp_path, engine):
    cfg = make_config(tmp_path, speaker=GREEDY_SPEAKER)
    async with model_server("speaker", cfg, engine) as (_, ch, http):
        await until_health(ch)
        native = [m async for m in sp_grpc.SpeakerServiceStub(ch).GenerateReply(SPEAKER_REQ)]
        assert native[-1].HasField("final")
        assert "".join(m.delta.text for m in native[:-1]) == native[-1].final.text
        doc = oip_doc("GenerateReply", SPEAKER_REQ)
        via_grpc = await oip_grpc(ch, "speaker", doc)
        assert isinstance(via_grpc, list) and via_grpc[-1].get("final")
        status, body = await oip_rest(http, "speaker", doc)
        assert status == 200
        via_rest = json.loads(body["outputs"][0]["data"][0])
        assert speaker_messages(via_grpc) == speaker_messages(native) == speaker_messages(via_rest)
        # both OIP calls, gRPC and REST, are counted like the native one
        metrics = (await http.get("/metrics")).text
        assert 'mascot_rpc_requests_total{code="OK",component="speaker",rpc="ModelInfer"} 2.0' in metrics
        assert 'mascot_rpc_requests_total{code="OK",component="speaker",rpc="GenerateReply"} 1.0' in metrics
        status, _ = await oip_rest(http, "speaker", "not a JSON request")
        assert status == 400
        metrics = (await http.get("/metrics")).text
        assert 'mascot_rpc_requests_total{code="INVALID_ARGUMENT",component="speaker",rpc="ModelInfer"} 1.0' in metrics


async def test_judge_and_reward_native_equal_oip(tmp_path, engine):
    from mascot.api.judge.v1 import judge_pb2 as jpb
    from mascot.api.judge.v1 import judge_pb2_grpc as jpb_grpc
    from mascot.api.reward.v1 import reward_pb2 as rpb
    from mascot.api.reward.v1 import reward_pb2_grpc as rpb_grpc
    from mascot.reward.scorer import build_tiny_reward_model

    history = [dpb.Turn(role=dpb.ROLE_USER, text="I failed my driving test again.")]
    # no judgement cache: a second call would otherwise come back `cached`
    cfg = make_config(tmp_path, judge={"cache_url": "", "max_retries": 0,
                                       "judges": [{"name": "local", "max_tokens": 24}]},
                      reward={"model": str(build_tiny_reward_model(tmp_path / "rm"))})
    judge_req = jpb.JudgeCandidatesRequest(rubric=jpb.RUBRIC_AGENT, history=history, candidates=[
        jpb.Candidate(candidate_id="a", persona_id="anchor", text="That sounds hard; what happened?")])
    reward_req = rpb.ScoreCandidatesRequest(persona_id="anchor", history=history, candidates=["Try again.", "Ugh."])
    async with model_server("judge", cfg, engine) as (_, ch, _http):
        await until_health(ch)
        native = await jpb_grpc.JudgeServiceStub(ch).JudgeCandidates(judge_req)
        assert [j.candidate_id for j in native.judgements] == ["a"]
        oip = await oip_grpc(ch, "judge", oip_doc("JudgeCandidates", judge_req))
        assert json_format.ParseDict(oip, jpb.JudgeCandidatesResponse()) == native
    async with model_server("reward", cfg) as (_, ch, _http):
        await until_health(ch)
        native = await rpb_grpc.RewardServiceStub(ch).ScoreCandidates(reward_req)
        assert len(native.scores) == 2
        oip = await oip_grpc(ch, "reward", oip_doc("ScoreCandidates", reward_req))
        assert json_format.ParseDict(oip, rpb.ScoreCandidatesResponse()) == native


async def test_director_speaker_and_judge_share_one_engine_on_one_port(tmp_path, tiny_model_dir):
    """The default generation service: three components, one engine built by the server, one gRPC port, a KServe
    model each, metrics labelled by the component called."""
    from mascot.api.judge.v1 import judge_pb2 as jpb
    from mascot.api.judge.v1 import judge_pb2_grpc as jpb_grpc

    cfg = make_config(tmp_path, engine={"model": str(tiny_model_dir)}, director=FAST_DIRECTOR, speaker=GREEDY_SPEAKER,
                      judge={"cache_url": "", "max_retries": 0, "judges": [{"name": "local", "max_tokens": 16}]})
    async with model_server("director,speaker,judge", cfg) as (srv, ch, http):
        await until_health(ch)
        assert [rt.component for rt in srv.runtimes] == ["director", "speaker", "judge"]
        shared = srv.runtimes[0].engine
        assert shared is not None and all(rt.engine is shared for rt in srv.runtimes)  # ONE engine
        health = health_pb2_grpc.HealthStub(ch)
        for service in ("mascot.api.director.v1.DirectorService", "mascot.api.speaker.v1.SpeakerService",
                        "mascot.api.judge.v1.JudgeService"):
            assert (await health.Check(health_pb2.HealthCheckRequest(service=service))).status == SERVING
        for model in ("director", "speaker", "judge"):
            assert (await http.get(f"/v2/models/{model}/ready")).json() == {"name": model, "ready": True}

        directive = await dir_grpc.DirectorServiceStub(ch).NextDirective(DIRECTOR_REQ)
        assert directive.directive.persona_id in DIRECTOR_REQ.persona_ids
        native = [m async for m in sp_grpc.SpeakerServiceStub(ch).GenerateReply(SPEAKER_REQ)]
        assert native[-1].HasField("final")
        judged = await jpb_grpc.JudgeServiceStub(ch).JudgeCandidates(jpb.JudgeCandidatesRequest(
            rubric=jpb.RUBRIC_AGENT, history=list(SPEAKER_REQ.history),
            candidates=[jpb.Candidate(candidate_id="a", persona_id="anchor", text="That sounds hard.")]))
        assert [j.candidate_id for j in judged.judgements] == ["a"]
        doc = oip_doc("GenerateReply", SPEAKER_REQ)
        assert speaker_messages(await oip_grpc(ch, "speaker", doc)) == speaker_messages(native)
        status, _ = await oip_rest(http, "speaker", doc)
        assert status == 200

        metrics = (await http.get("/metrics")).text
        assert 'mascot_rpc_requests_total{code="OK",component="director",rpc="NextDirective"} 1.0' in metrics
        assert 'mascot_rpc_requests_total{code="OK",component="speaker",rpc="GenerateReply"} 1.0' in metrics
        assert 'mascot_rpc_requests_total{code="OK",component="judge",rpc="JudgeCandidates"} 1.0' in metrics
        # REST names its model in the path; gRPC ModelInfer carries it inside the request
        assert 'mascot_rpc_requests_total{code="OK",component="speaker",rpc="ModelInfer"} 1.0' in metrics
        assert ('mascot_rpc_requests_total{code="OK",component="director+speaker+judge",rpc="ModelInfer"} 1.0'
                in metrics)
        assert 'mascot_engine_batch_size_count{component="director+speaker+judge"}' in metrics
    assert all(rt.ready is False for rt in srv.runtimes)


def test_rest_routes_are_kserves_without_importing_vllm():
    """The REST app has KServe's live, V1 and V2 routes, and building it does not import vLLM (KServe's OpenAI routes
    would, at 10-15 s of CPU per start, for models that never implement them)."""
    code = """
import sys
sys.argv = sys.argv[:1]
from fastapi import FastAPI
from kserve.model_repository import ModelRepository
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.model_repository_extension import ModelRepositoryExtension
from kserve.protocol.rest.server import RESTServer
from mascot.app.modelserver import _register_kserve_routes
repo = ModelRepository()
rest = RESTServer("kserve.model_server:app", DataPlane(model_registry=repo), ModelRepositoryExtension(repo), 0)
app = FastAPI()
_register_kserve_routes(rest, app)
print(sorted(r.path for r in app.routes))
print("vllm" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    routes_line, vllm_line = out.stdout.strip().splitlines()[-2:]
    for path in ("/", "/metrics", "/v1/models", "/v1/models/{model_name}:predict", "/v2/health/live",
                 "/v2/health/ready", "/v2/models/{model_name}/infer", "/v2/models/{model_name}/ready"):
        assert f"'{path}'" in routes_line, (path, routes_line)
    assert "openai" not in routes_line
    assert vllm_line == "False"


def test_serve_model_refuses_unknown_or_repeated_components():
    from typer.testing import CliRunner

    from mascot.cli import app

    for arg in ("director,nobody", "speaker,speaker", ","):
        result = CliRunner().invoke(app, ["serve-model", arg, "--port", "0", "--rest-port", "0"])
        assert result.exit_code == 2, (arg, result.output)
    with pytest.raises(ValueError, match="each once"):
        OnePortModelServer("director,director", make_config(Path("/tmp")), grpc_port=0, http_port=0)


async def test_bad_oip_input_is_invalid_argument_and_the_server_keeps_serving(tmp_path, engine):
    cfg = make_config(tmp_path, director=FAST_DIRECTOR)
    good = oip_doc("NextDirective", DIRECTOR_REQ)
    bad = {"not json": ("{not json", "not UTF-8 JSON"),
           "not an object": ("[1, 2]", "must be a JSON object"),
           "unknown method": (json.dumps({"method": "GenerateReply", "request": {}}), "unknown method"),
           "wrong request shape": (json.dumps({"method": "NextDirective", "request": {"personaIds": 5}}),
                                   "is not a mascot.api.director.v1.NextDirectiveRequest"),
           "unknown field": (json.dumps({"method": "NextDirective", "request": {"speaker": "x"}}),
                             "is not a mascot.api.director.v1.NextDirectiveRequest"),
           "servicer validation": (json.dumps({"method": "NextDirective", "request": {"personaIds": ["nobody"]}}),
                                   "unknown persona id"),
           "not utf-8": (b"\xff\xfe", "not UTF-8 JSON")}
    async with model_server("director", cfg, engine) as (_, ch, http):
        await until_health(ch)
        for case, (doc, fragment) in bad.items():
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await oip_grpc(ch, "director", doc)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and fragment in e.value.details(), case
            if isinstance(doc, str):
                status, body = await oip_rest(http, "director", doc)
                assert status == 400 and fragment in body["error"], (case, body)
        # a tensor other than "request", and two elements
        resp = await http.post("/v2/models/director/infer", json={"inputs": [
            {"name": "prompt", "datatype": "BYTES", "shape": [1], "data": [good]}]})
        assert resp.status_code == 400 and 'one BYTES input "request"' in resp.json()["error"]
        resp = await http.post("/v2/models/director/infer", json={"inputs": [
            {"name": "request", "datatype": "BYTES", "shape": [2], "data": [good, good]}]})
        assert resp.status_code == 400 and "exactly one element" in resp.json()["error"]
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await oip_grpc(ch, "nobody", good)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        # still serving, both ways
        assert (await oip_grpc(ch, "director", good))["directive"]["personaId"]
        assert (await dir_grpc.DirectorServiceStub(ch).NextDirective(DIRECTOR_REQ)).directive.persona_id
        metrics = (await http.get("/metrics")).text
        assert 'mascot_rpc_requests_total{code="INVALID_ARGUMENT",component="director",rpc="ModelInfer"}' in metrics


async def test_not_ready_until_the_registry_adapters_load(tmp_path, tiny_model_dir):
    from mascot.core.adapters import registry as rg
    from mascot.core.adapters import store as st

    store = tmp_path / "store"
    lora = make_lora(tiny_model_dir, tmp_path / "lora", r=4, seed=11)
    st.publish_adapter(store, "anchor", lora, base_model=str(tiny_model_dir), run_id="t", data_ids=[],
                       eval_metrics={})
    st.update_registry(store, lambda reg: rg.promote(reg, "anchor", 1))
    version_dir, away = store / "anchor" / "v1", tmp_path / "v1-away"
    shutil.move(version_dir, away)  # the stable version's files vanish after publish
    cfg = make_config(tmp_path, engine={"model": str(tiny_model_dir)}, speaker=GREEDY_SPEAKER,
                      adapters={"store": str(store), "poll_s": 0.2})
    async with model_server("speaker", cfg) as (srv, ch, http):
        health = health_pb2_grpc.HealthStub(ch)
        # the engine starts, the reconcile fails: wait for the reason, then check every surface
        await asyncio.wait_for(srv.runtime.wait_until(lambda rt: "anchor--v1" in rt.missing), 60)
        assert (await health.Check(health_pb2.HealthCheckRequest(service=""))).status == NOT_SERVING
        assert (await http.get("/v2/health/ready")).status_code == 503
        assert (await http.get("/v2/models/speaker/ready")).status_code == 503
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await sp_grpc.SpeakerServiceStub(ch).GenerateReply(SPEAKER_REQ).read()
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "not ready" in e.value.details() and "anchor--v1" in e.value.details()
        doc = oip_doc("GenerateReply", SPEAKER_REQ)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await oip_grpc(ch, "speaker", doc)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "anchor--v1" in e.value.details()
        status, _ = await oip_rest(http, "speaker", doc)
        assert status == 503

        shutil.move(away, version_dir)  # restored: the background reconcile loads it, no restart
        await until_health(ch, SERVING, timeout=60)
        assert (await http.get("/v2/health/ready")).json() == {"ready": True}
        assert "anchor--v1" in srv.runtime.engine.adapters()
        native = [m async for m in sp_grpc.SpeakerServiceStub(ch).GenerateReply(SPEAKER_REQ)]
        assert native[-1].final.adapter_version == "anchor--v1"
        assert speaker_messages(await oip_grpc(ch, "speaker", doc)) == speaker_messages(native)
        metrics = (await http.get("/metrics")).text
        assert 'mascot_adapter_info{adapter_version="anchor--v1",persona="anchor",state="stable"} 1.0' in metrics
        assert re.search(r'^mascot_adapter_load_failures_total\{reason="\w+"\} [1-9]', metrics, re.M)


def test_serve_model_cli_answers_then_stops_on_sigterm(tmp_path, tiny_model_dir):
    gport, hport = free_port(), free_port()
    conf = tmp_path / "mascot.yaml"
    # unconstrained: no grammar to compile in the fresh process (the serving path is what this test is about)
    conf.write_text(json.dumps({"engine": {"model": str(tiny_model_dir)},
                                "director": {**FAST_DIRECTOR, "constrained": False}}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "mascot.cli", "serve-model", "director", "--port", str(gport),
                             "--rest-port", str(hport), "--config", str(conf)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        async def talk():
            async with channel(f"127.0.0.1:{gport}") as ch:
                await until_health(ch, timeout=90)
                r = await dir_grpc.DirectorServiceStub(ch).NextDirective(DIRECTOR_REQ, timeout=60)
                assert r.directive.persona_id in DIRECTOR_REQ.persona_ids
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{hport}") as http:
                assert (await http.get("/v2/health/ready")).json() == {"ready": True}
                assert "mascot_rpc_requests_total" in (await http.get("/metrics")).text

        asyncio.run(talk())
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)  # it stops (does not hang); how fast is not a unit-test matter
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    announced = [json.loads(line) for line in out.splitlines() if line.startswith('{"component"')]
    assert announced == [{"component": "director", "grpc_port": gport, "http_port": hport}]


async def test_rest_inference_needs_the_token_when_one_is_configured(tmp_path, engine):
    """server.rest_token_file: REST inference without the token (or with another) is 401; with it the call is
    answered; health, readiness and /metrics stay open; a rotated token applies without a restart; gRPC is untouched
    (the NetworkPolicy guards it)."""
    token = tmp_path / "rest-token"
    token.write_text("rest-token-0123456789\n")
    cfg = make_config(tmp_path, director=FAST_DIRECTOR, server={"rest_token_file": str(token)})
    doc = oip_doc("NextDirective", DIRECTOR_REQ)
    body = {"inputs": [{"name": "request", "datatype": "BYTES", "shape": [1], "data": [doc]}]}
    async with model_server("director", cfg, engine) as (srv, ch, http):
        await until_health(ch)
        assert (await http.get("/v2/health/ready")).json() == {"ready": True}
        assert (await http.get("/v2/models/director/ready")).status_code == 200
        assert "mascot_" in (await http.get("/metrics")).text
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic rest-token-0123456789"}):
            r = await http.post("/v2/models/director/infer", json=body, headers=headers)
            assert r.status_code == 401 and "rest-token-0123456789" not in r.text
            assert r.headers.get("www-authenticate") == "Bearer"
        r = await http.post("/v2/models/director/infer", json=body,
                            headers={"Authorization": "Bearer rest-token-0123456789"})
        assert r.status_code == 200 and r.json()["outputs"][0]["name"] == "response"
        token.write_text("rotated-token-0123456789")
        os.utime(token, ns=(1, 10**18))  # a change the watcher sees even within one mtime tick
        await asyncio.sleep(1.1)
        r = await http.post("/v2/models/director/infer", json=body,
                            headers={"Authorization": "Bearer rest-token-0123456789"})
        assert r.status_code == 401
        r = await http.post("/v2/models/director/infer", json=body,
                            headers={"Authorization": "Bearer rotated-token-0123456789"})
        assert r.status_code == 200
        native = await dir_grpc.DirectorServiceStub(ch).NextDirective(DIRECTOR_REQ)
        assert native.directive.persona_id in DIRECTOR_REQ.persona_ids


async def test_an_unreadable_rest_token_file_fails_the_start(tmp_path, engine):
    cfg = make_config(tmp_path, server={"rest_token_file": str(tmp_path / "missing")})
    srv = OnePortModelServer("director", cfg, grpc_port=0, http_port=0, host="127.0.0.1", engine=engine, grace_s=1)
    with pytest.raises(ValueError, match="cannot be read"):
        await srv.start_async()
    await srv.shutdown()
