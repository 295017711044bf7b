"""A real Prometheus (Debian's `prometheus` package, on loopback) scraping the embedded stack (gateway, director,
speaker, judge and reward in one process on the tiny random Qwen3): after a director fallback and an adapter load
failure planted through the product (a director without constrained decoding on a random-init model writes
unparseable directives; an adapter whose stored weights were corrupted after publishing fails its digest check when
the speaker's reconcile loads it), the chart's alert expressions for those two events evaluate non-empty while the
target-health alerts stay empty, and every query of the Grafana dashboard returns a series."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from mascot.api.adapter.v1 import adapter_pb2 as apb
from mascot.api.adapter.v1 import adapter_pb2_grpc
from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.conversation.v1 import conversation_pb2_grpc
from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.api.judge.v1 import judge_pb2 as jpb
from mascot.api.judge.v1 import judge_pb2_grpc
from mascot.api.reward.v1 import reward_pb2 as rpb
from mascot.api.reward.v1 import reward_pb2_grpc
from mascot.core.server import channel
from mascot.app.stack import start_stack
from tests.helpers.chart import CHART, NAMESPACE, RELEASE, render
from tests.helpers.config import make_config
from tests.helpers.lora import make_lora
from tests.helpers.net import free_port
from tests.helpers.paths import need

TOKEN = "prom-test-admin-token"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
# Grafana's variables as a user with every value selected sees them; the rate window fits a short run.
GRAFANA_VARS = {"$__rate_interval": "5m", "$__range": "10m", "$__interval": "1s", "$namespace": ".*",
                "$release": ".*", "$component": ".*", "$persona": ".*"}


class Prometheus:
    """A Prometheus server on loopback scraping one target every second."""

    def __init__(self, tmp: Path, target: str) -> None:
        binary = shutil.which("prometheus")
        need(binary is not None, "prometheus not found: apt-get install prometheus (make setup installs it as root)")
        self.port = free_port()
        conf = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [{"job_name": f"{RELEASE}-mascot-gateway", "static_configs": [
                    {"targets": [target], "labels": {"namespace": NAMESPACE, "release": RELEASE}}]}]}
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(conf))
        self.log_path = tmp / "prometheus.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([binary, f"--config.file={tmp / 'prometheus.yml'}",
                                      f"--storage.tsdb.path={tmp / 'tsdb'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def query(self, expr: str) -> list:
        """The instant vector of ``expr`` now (HTTP API ``/api/v1/query``)."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]["result"]

    async def wait_for(self, expr: str, timeout: float = 90.0) -> list:
        """Poll ``expr`` until it returns a series (AssertionError after ``timeout`` seconds); the event loop (the
        stack's reconcile loop included) runs meanwhile."""
        end = time.monotonic() + timeout
        while True:
            try:
                result = await asyncio.to_thread(self.query, expr)
                if result:
                    return result
            except OSError:  # not listening yet
                pass
            if time.monotonic() > end:
                raise AssertionError(f"no series for {expr} after {timeout:.0f} s; Prometheus log: "
                                     f"{self.log_path.read_text()[-2000:]}")
            await asyncio.sleep(0.5)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def _alert_exprs() -> dict[str, str]:
    rendered = render(yaml.safe_load((CHART / "ci" / "full.yaml").read_text()))
    (rule,) = rendered.of_kind("PrometheusRule")
    return {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}


def _dashboard_queries() -> list[tuple[str, str]]:
    board = json.loads((CHART / "dashboards" / "mascot.json").read_text())
    out = []
    for p in board["panels"]:
        for t in p.get("targets", []):
            expr = t["expr"]
            for var, value in GRAFANA_VARS.items():
                expr = expr.replace(var, value)
            out.append((p["title"], expr))
    return out


async def test_alerts_fire_on_planted_events_and_every_dashboard_query_has_data(tmp_path, tiny_model_dir, monkeypatch):
    from mascot.reward.scorer import build_tiny_reward_model

    monkeypatch.setenv("MASCOT_PROM_TEST_ADMIN", TOKEN)
    store = tmp_path / "adapters"
    loras = {p: make_lora(tiny_model_dir, tmp_path / f"lora-{p}", seed=i, scale=0.01)
             for i, p in enumerate(("beacon", "anchor"))}
    cfg = make_config(
        tmp_path,
        adapters={"store": str(store), "base_model": str(tiny_model_dir), "max_rank": 4,
                  "admin_token_env": "MASCOT_PROM_TEST_ADMIN", "poll_s": 1.0},
        # a random-init director without constrained decoding writes directives that do not parse: fallbacks
        director={"constrained": False, "max_retries": 1, "max_tokens": 16},
        speaker={"max_tokens": 12}, guard={"enabled": False}, dialogue={"agent_turns_per_round": 2},
        judge={"cache_url": "", "max_retries": 0, "judges": [{"name": "local", "max_tokens": 16}]},
        reward={"model": str(build_tiny_reward_model(tmp_path / "rm"))},
        engine={"model": str(tiny_model_dir), "max_model_len": 2048})
    # the stack builds its own engine, as `mascot serve` does, so the engine's series are on the served registry
    stack = await start_stack(cfg, ("gateway", "director", "speaker", "judge", "reward"), serve_metrics=True)
    prom = Prometheus(tmp_path, f"127.0.0.1:{stack.metrics_port}")
    chans = []
    try:
        # two scrapes before anything happens: every counter is seen at zero first
        await prom.wait_for(f'count_over_time(up{{job="{RELEASE}-mascot-gateway"}}[1m]) >= 2')
        gw = channel(stack.target("gateway"))
        chans.append(gw)
        control = channel(stack.target("control"))
        chans.append(control)
        admin = adapter_pb2_grpc.AdapterServiceStub(control)

        async def publish_and_promote(persona: str, corrupt: bool = False) -> None:
            await admin.PublishAdapter(apb.PublishAdapterRequest(
                persona_id=persona, source_path=str(loras[persona]), run_id="r1",
                eval_metrics_json='{"gate": {"passed": true}}'), metadata=AUTH)
            if corrupt:  # the stored weights change after publishing (a bad disk, a hand edit)
                weights = store / persona / "v1" / "adapter_model.safetensors"
                data = weights.read_bytes()
                weights.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
            await admin.PromoteAdapter(apb.PromoteAdapterRequest(persona_id=persona, version=1), metadata=AUTH)

        await publish_and_promote("beacon")  # a good version: loaded by the reconcile
        conversations = conversation_pb2_grpc.ConversationServiceStub(gw)
        conv = (await conversations.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
        for k, text in enumerate(["I failed my driving test again.", "My friend is moving away."]):
            events = [e async for e in conversations.SendMessage(cpb.SendMessageRequest(
                conversation_id=conv.id, text=text, idempotency_key=f"k{k}"))]
            assert events[-1].event.HasField("round_completed")
        stored = (await conversations.GetConversation(cpb.GetConversationRequest(conversation_id=conv.id))).conversation
        assert dpb.DIRECTIVE_SOURCE_FALLBACK in {t.directive.source for t in stored.turns if t.role == dpb.ROLE_AGENT}
        history = [dpb.Turn(role=dpb.ROLE_USER, text="I failed my driving test again.")]
        await judge_pb2_grpc.JudgeServiceStub(ch := channel(stack.target("judge"))).JudgeCandidates(
            jpb.JudgeCandidatesRequest(rubric=jpb.RUBRIC_AGENT, history=history, candidates=[
                jpb.Candidate(candidate_id="a", persona_id="anchor", text="That sounds hard; what happened?")]))
        chans.append(ch)
        await reward_pb2_grpc.RewardServiceStub(ch := channel(stack.target("reward"))).ScoreCandidates(
            rpb.ScoreCandidatesRequest(persona_id="anchor", history=history, candidates=["Try again."]))
        chans.append(ch)
        await publish_and_promote("anchor", corrupt=True)  # the reconcile's load fails its digest check

        await prom.wait_for('mascot_adapter_load_failures_total{reason="digest"} > 0')
        await prom.wait_for('mascot_adapter_load_seconds_count{persona="beacon"} > 0')
        await asyncio.sleep(3)  # a few scrapes after the last event

        alerts = _alert_exprs()
        for fired in ("MascotDirectorFallbackRatioHigh", "MascotAdapterLoadFailures"):
            result = prom.query(alerts[fired])
            assert result, f"{fired}: {alerts[fired]} returned nothing"
        (failed,) = prom.query(alerts["MascotAdapterLoadFailures"])
        assert failed["metric"]["reason"] == "digest"
        for silent in ("MascotTargetDown", "MascotMetricsAbsent", "MascotGatewayAtCapacity"):
            assert prom.query(alerts[silent]) == [], silent
        empty = [(title, expr) for title, expr in _dashboard_queries() if not prom.query(expr)]
        assert not empty, f"dashboard queries without a series: {empty}; " + "; ".join(
            f"{n}: {prom.query(n)}" for n in ("mascot_reward_scores_count", "mascot_engine_batch_size_count"))
    finally:
        for ch in chans:
            await ch.close()
        prom.stop()
        await stack.stop(0)
