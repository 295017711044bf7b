"""The chart's monitoring: every metric named in the PrometheusRule and the Grafana dashboard exists in
mascot.core.metrics (the docs catalog; counters end in _total, histograms are read through
_bucket/_sum/_count), the rules pass `promtool check rules` and the unit tests of tests/contract/promtool/ (Debian's
`prometheus` package), the dashboard queries parse, and the ServiceMonitors scrape the ports that serve /metrics."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers.chart import CHART, NAMESPACE, RELEASE, render
from tests.helpers.promql import catalog_series, metric_names, promtool_path

PROMTOOL_TESTS = Path(__file__).parent / "promtool"
RUNBOOKS = Path(__file__).resolve().parents[2] / "docs" / "runbooks.md"
ALERTS = {  # alert -> the metrics its expression must read (the catalog's, or Prometheus' own `up`)
    "MascotTargetDown": {"up"},
    "MascotMetricsAbsent": {"up"},
    "MascotGatewayAtCapacity": {"mascot_rpc_requests_total"},
    "MascotRpcErrorRatioHigh": {"mascot_rpc_requests_total"},
    "MascotDirectorFallbackRatioHigh": {"mascot_director_decisions_total"},
    "MascotRewardFailures": {"mascot_reward_failures_total"},
    "MascotAdapterLoadFailures": {"mascot_adapter_load_failures_total"},
    "MascotTurnLatencyP95High": {"mascot_turn_duration_seconds_bucket"},
    "MascotSafetyEventsHigh": {"mascot_safety_events_total"},
}
GRAFANA_VARS = {"$__rate_interval": "5m", "$__range": "1d", "$__interval": "1m", "$namespace": ".*", "$release": ".*",
                "$component": ".*", "$persona": ".*"}
#: Series that are not in the catalog but every scrape has: Prometheus' own `up`, and the process collector's.
STANDARD_SERIES = {"up", "process_resident_memory_bytes", "process_cpu_seconds_total"}


def test_metric_name_parser():
    assert metric_names('sum by (a, b) (rate(x_total{code=~"A|B", le="+Inf"}[5m])) / on (a) y > bool 0.5') == [
        "x_total", "y"]
    assert metric_names("histogram_quantile(0.95, sum by (le) (rate(h_bucket[5m]))) > 10") == ["h_bucket"]


@pytest.fixture(scope="session")
def full():
    return render(yaml.safe_load((CHART / "ci" / "full.yaml").read_text()))


def _rules(full) -> dict:
    (rule,) = full.of_kind("PrometheusRule")
    return {"groups": rule["spec"]["groups"]}


def _dashboard(full) -> dict:
    cm = full.one("ConfigMap", "-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    return json.loads(cm["data"]["mascot.json"])


def _dashboard_exprs(dashboard: dict) -> list[str]:
    panels = []
    for p in dashboard["panels"]:
        panels += [p, *p.get("panels", [])]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def test_alerts_read_only_catalog_metrics(full):
    catalog = catalog_series()
    rules = [r for g in _rules(full)["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} == set(ALERTS)
    for r in rules:
        names = metric_names(r["expr"])
        unknown = [n for n in names if n not in catalog and n != "up"]
        assert names and not unknown, f"{r['alert']}: {unknown} not in mascot.core.metrics"
        assert ALERTS[r["alert"]] <= set(names), r["alert"]
        assert f'namespace="{NAMESPACE}"' in r["expr"], "scoped to the release namespace"
        assert r["labels"]["severity"] in ("warning", "critical") and r["annotations"]["summary"]
        # every alert links its runbook, and the runbook has that section
        assert r["annotations"]["runbook_url"] == f"docs/runbooks.md#{r['alert'].lower()}"
        assert f"## {r['alert']}" in RUNBOOKS.read_text(), f"docs/runbooks.md has no section for {r['alert']}"
    hosted = render({"monitoring": {"prometheusRule": {"runbookBaseUrl": "https://wiki.example/mascot"}}})
    urls = {r["annotations"]["runbook_url"] for g in _rules(hosted)["groups"] for r in g["rules"]}
    assert urls == {f"https://wiki.example/mascot#{a.lower()}" for a in ALERTS}


def test_dashboard_reads_only_catalog_metrics_and_shows_all_of_them(full):
    catalog = catalog_series()
    exprs = _dashboard_exprs(_dashboard(full))
    used = set()
    for expr in exprs:
        names = metric_names(expr)
        unknown = [n for n in names if n not in catalog and n not in STANDARD_SERIES]
        assert names and not unknown, f"{expr}: {unknown} not in mascot.core.metrics"
        used |= {catalog[n] for n in names if n in catalog}
    assert used == set(catalog.values()), f"catalog metrics without a panel: {set(catalog.values()) - used}"


def test_dashboard_reads_right(full):
    """Distinct legends where a panel has several queries, no time series over the whole range, and the release,
    component and persona variables applied to the queries that carry those labels."""
    dashboard = _dashboard(full)
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "namespace", "release", "component", "persona"} <= names
    for p in dashboard["panels"]:
        targets = p.get("targets", [])
        legends = [t.get("legendFormat", "__auto") for t in targets]
        if len(targets) > 1:
            assert "__auto" not in legends and len(set(legends)) == len(legends), (p["title"], legends)
        if p["type"] == "timeseries":
            assert not any("$__range" in t["expr"] for t in targets), p["title"]
        for t in targets:
            assert 'release=~"$release"' in t["expr"], (p["title"], t["expr"])
            if "mascot_rpc_requests_total" in t["expr"] and 'component="gateway"' not in t["expr"]:
                assert 'component=~"$component"' in t["expr"], p["title"]
            if "mascot_turn_duration_seconds_bucket" in t["expr"]:
                assert 'persona=~"$persona"' in t["expr"], p["title"]


def test_dashboard_file_is_the_configmap_content(full):
    assert _dashboard(full) == json.loads((CHART / "dashboards" / "mascot.json").read_text())
    off = render({"monitoring": {"dashboard": {"enabled": False}}})
    assert not [c for c in off.of_kind("ConfigMap") if c["metadata"]["name"].endswith("-dashboard")]


def test_service_monitors_scrape_the_ports_that_serve_metrics(full):
    gw_sm, models_sm = full.one("ServiceMonitor", "-gateway"), full.one("ServiceMonitor", "-models")
    svc = full.one("Service", "-gateway")
    assert gw_sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert gw_sm["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert gw_sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # model services: /metrics on KServe's HTTP port (mascot.app.modelserver), on the Services KServe creates
    (expr,) = models_sm["spec"]["selector"]["matchExpressions"]
    assert expr["key"] == "serving.kserve.io/inferenceservice"
    assert sorted(expr["values"]) == sorted(i["metadata"]["name"] for i in full.of_kind("InferenceService"))
    (ep,) = models_sm["spec"]["endpoints"]
    assert (ep["port"], ep["path"]) == ("http", "/metrics")
    for isvc in full.of_kind("InferenceService"):
        (c,) = isvc["spec"]["predictor"]["containers"]
        assert c["ports"][0]["name"] == "http" and c["args"][c["args"].index("--rest-port") + 1] == str(
            c["ports"][0]["containerPort"])
    # without KServe: our own Services, same port name; one per model service (the generation service serves the
    # speaker unless generation.enabled is false)
    for generation in (True, False):
        cpu = render({"kserve": {"enabled": False}, "model": {"storageUri": ""}, "reward": {"storageUri": ""},
                     "generation": {"enabled": generation}})
        sm = cpu.one("ServiceMonitor", "-models")
        serving = cpu.service_of("speaker")
        assert serving == ("generation" if generation else "speaker")
        svc = cpu.one("Service", f"-{serving}")
        assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
        assert sorted(sm["spec"]["selector"]["matchExpressions"][0]["values"]) == sorted(cpu.services)
        assert "http" in {p["name"] for p in svc["spec"]["ports"]}
    assert gw_sm["metadata"]["namespace"] == NAMESPACE and RELEASE in gw_sm["metadata"]["name"]


def test_promtool_check_rules_passes(full, tmp_path):
    promtool = promtool_path()
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(_rules(full), sort_keys=False))
    p = subprocess.run([promtool, "check", "rules", str(tmp_path / "rules.yaml")], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and f"SUCCESS: {len(ALERTS)} rules found" in p.stdout, p.stdout + p.stderr


def test_dashboard_queries_parse_as_promql(full, tmp_path):
    promtool = promtool_path()
    rules = []
    for i, expr in enumerate(_dashboard_exprs(_dashboard(full))):
        for var, value in GRAFANA_VARS.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, expr
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    (tmp_path / "dashboard.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    p = subprocess.run([promtool, "check", "rules", str(tmp_path / "dashboard.yaml")], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


def test_promtool_unit_tests_fire_and_stay_silent_as_expected(full, tmp_path):
    promtool = promtool_path()
    test_file = PROMTOOL_TESTS / "mascot_alerts_test.yaml"
    spec = yaml.safe_load(test_file.read_text())
    assert spec["rule_files"] == ["mascot-rules.yaml"]
    cases = [c for t in spec["tests"] for c in t["alert_rule_test"]]
    assert {c["alertname"] for c in cases if c["exp_alerts"]} == set(ALERTS), "each alert fires in a case"
    assert {c["alertname"] for c in cases if not c["exp_alerts"]} == set(ALERTS), "each alert stays silent in one"
    shutil.copy(test_file, tmp_path / test_file.name)
    (tmp_path / "mascot-rules.yaml").write_text(yaml.safe_dump(_rules(full), sort_keys=False))
    p = subprocess.run([promtool, "test", "rules", test_file.name], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and "SUCCESS" in p.stdout, p.stdout + p.stderr
