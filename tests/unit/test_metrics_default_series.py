"""Series a library keeps in another registry (vLLM's ``vllm:*`` in prometheus_client's default one) exported on our
registry: only the prefix asked for, read at each scrape, never twice. The vLLM engine end to end:
tests/vllm/test_vllm_metrics.py."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mascot.core.metrics import DefaultRegistrySeries, Metrics


def _names(registry: CollectorRegistry) -> list[str]:
    return [f.name for f in text_string_to_metric_families(generate_latest(registry).decode())]


def test_only_the_prefixed_families_of_the_source_are_exported_live():
    source = CollectorRegistry()
    waiting = Gauge("vllm:num_requests_waiting", "queue", ["model_name", "engine"], registry=source)
    Gauge("kserve_other", "not ours to export", registry=source).set(1)
    metrics = Metrics()
    metrics.registry.register(DefaultRegistrySeries("vllm:", source=source))
    waiting.labels("m", "0").set(3)
    text = generate_latest(metrics.registry).decode()
    assert 'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0' in text
    assert "kserve_other" not in text
    waiting.labels("m", "0").set(5)  # read at scrape time, not copied
    assert 'vllm:num_requests_waiting{engine="0",model_name="m"} 5.0' in generate_latest(metrics.registry).decode()
    names = _names(metrics.registry)
    assert len(names) == len(set(names)) and any(n.startswith("mascot_") for n in names)


def test_export_default_series_is_added_once_and_follows_the_default_registry():
    metrics = Metrics()
    gauge = Gauge("vllm:test_export_gauge", "a family in the default registry", registry=REGISTRY)
    try:
        gauge.set(2)
        assert metrics.export_default_series("vllm:") is True
        assert metrics.export_default_series("vllm:") is False  # a second call adds nothing
        assert _names(metrics.registry).count("vllm:test_export_gauge") == 1
        assert "python_gc_objects_collected" not in _names(metrics.registry)  # other default families stay out
    finally:
        REGISTRY.unregister(gauge)
    assert "vllm:test_export_gauge" not in _names(metrics.registry)  # gone from the source, gone from ours
    with pytest.raises(ValueError):
        metrics.export_default_series("")
    with pytest.raises(ValueError):
        DefaultRegistrySeries("")
