"""Adapter version names ``<persona>--v<N>`` have one rule (mascot.core.adapters.registry): built and parsed there,
by the speaker's adapter choice and by the resolver and pinner of mascot.core.adapters.reconcile."""

from __future__ import annotations

import json

import pytest

from mascot.api.adapter.v1 import adapter_pb2 as apb
from mascot.core.adapters.reconcile import AdapterResolver, VersionPinner
from mascot.core.adapters.registry import parse_version_name, version_name
from mascot.core.errors import InvalidArgument
from mascot.core.personas import ID_RE
from mascot.gateway.admin import persona_to_proto
from mascot.speaker.reply import choose_adapter


@pytest.mark.parametrize(("persona", "n"), [("anchor", 1), ("director", 12), ("a", 7), ("x" * 63, 100)])
def test_round_trip(persona, n):
    name = version_name(persona, n)
    assert name == f"{persona}--v{n}" and parse_version_name(name) == (persona, n)


@pytest.mark.parametrize("name", ["anchor--v0", "anchor--v01", "anchor--v", "anchor-v1", "Anchor--v1", "--v1",
                                  "x" * 64 + "--v1", "anchor--v1\n", "anchor--v-1", "1anchor--v1", "base"])
def test_malformed_names_are_refused(name):
    with pytest.raises(ValueError, match="is not an adapter version name"):
        parse_version_name(name)


@pytest.mark.parametrize(("persona", "n"), [("anchor", 0), ("anchor", -1), ("anchor", True), ("anchor", "2"),
                                            ("Anchor", 1), ("x" * 64, 1), ("anchor\n", 1)])
def test_bad_parts_are_refused(persona, n):
    with pytest.raises(ValueError):
        version_name(persona, n)


def test_persona_ids_end_at_the_end_of_the_text():
    assert ID_RE.match("anchor") and not ID_RE.match("anchor\n")


def test_speaker_picks_the_highest_valid_version_of_its_persona():
    loaded = ["anchor--v2", "anchor--v10", "anchor--v0", "anchor--v011", "beacon--v99", "shared-lora"]
    assert choose_adapter(loaded, "anchor", "per_persona") == "anchor--v10"
    assert choose_adapter(["anchor--v0"], "anchor", "per_persona") is None  # v0 is not a version
    assert choose_adapter(loaded, "catalyst", "per_persona") is None
    assert choose_adapter(loaded, "anchor", "shared", shared="shared-lora") == "shared-lora"


class _Engine:
    def __init__(self, loaded: list[str]) -> None:
        self.loaded = loaded

    def adapters(self) -> list[str]:
        return self.loaded


async def test_resolver_accepts_only_versions_of_the_persona():
    r = AdapterResolver(_Engine(["anchor--v3"]), None)
    assert await r.ensure("anchor--v3", "anchor") == "anchor--v3"
    assert await r.ensure("base", "anchor") is None
    for name in ("anchor--v0", "beacon--v3", "anchor--v03", "anchor"):
        with pytest.raises(InvalidArgument, match="is not a version of anchor"):
            await r.ensure(name, "anchor")


def test_pinner_and_admin_build_names_with_the_one_rule(tmp_path):
    entry = {"versions": {"1": {"state": "retired"}, "2": {"state": "stable", "name": "anchor--v2"},
                          "3": {"state": "staged"}}, "stable": 2, "canary": None, "canary_weight": 0}
    (tmp_path / "registry.json").write_text(json.dumps({"revision": 1, "adapters": {"anchor": entry}}))
    assert VersionPinner(str(tmp_path)).pin(["anchor", "beacon"], "k") == {"anchor": "anchor--v2", "beacon": "base"}
    p = persona_to_proto("anchor", entry)
    assert [(v.version, v.name, v.state) for v in p.versions] == [
        (1, "anchor--v1", apb.ADAPTER_STATE_RETIRED), (2, "anchor--v2", apb.ADAPTER_STATE_STABLE),
        (3, "anchor--v3", apb.ADAPTER_STATE_STAGED)]
