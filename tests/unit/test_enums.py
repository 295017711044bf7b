"""Proto enum names come from the descriptors (mascot.core.enums), and every vocabulary that names the same values
(stored strings, metric labels, CLI words) agrees with them."""

from __future__ import annotations

import pytest

from mascot.api.adapter.v1 import adapter_pb2 as apb
from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.api.judge.v1 import judge_pb2 as jpb
from mascot.api.training.v1 import training_pb2 as tpb
from mascot.core.dialogue import directive_message, directive_source_name, directive_source_value, history_from_proto
from mascot.core.enums import enum_name, enum_names, enum_value

ALL_ENUMS = (dpb.Role, dpb.DirectiveSource, dpb.TraitLevel, cpb.Mode, cpb.RoundEndReason, tpb.TrainingPhase,
             tpb.RunState, apb.AdapterState, jpb.Rubric, jpb.JudgementStatus)


def test_names_drop_the_enum_prefix_and_are_lower_case():
    assert enum_names(dpb.DirectiveSource) == ("model", "retry", "fallback", "safety", "random")
    assert enum_names(cpb.RoundEndReason) == ("completed", "empty_replies", "safety", "interrupted")
    assert enum_names(apb.AdapterState) == ("staged", "canary", "stable", "retired")
    assert enum_names(tpb.RunState) == ("pending", "running", "succeeded", "failed", "cancelled")
    assert enum_names(tpb.TrainingPhase, sep="-") == ("persona-alignment", "collaborative")
    assert enum_name(dpb.DirectiveSource, dpb.DIRECTIVE_SOURCE_FALLBACK) == "fallback"
    assert enum_name(cpb.Mode, 0) == "unspecified"
    assert enum_name(cpb.Mode.DESCRIPTOR, cpb.MODE_MEETING) == "meeting"  # the descriptor works as well


@pytest.mark.parametrize("enum", ALL_ENUMS, ids=lambda e: e.DESCRIPTOR.name)
def test_every_enum_round_trips_and_follows_the_prefix_rule(enum):
    for number in enum.values():
        name = enum_name(enum, number)
        assert enum_value(enum, name) == number
        assert enum.Name(number).lower().endswith(name) and name.upper() != enum.Name(number)  # a prefix was cut
    assert len(set(enum_names(enum))) == len(enum.values()) - 1  # all but the unspecified zero, no clashes


def test_unknown_numbers_and_names():
    with pytest.raises(ValueError, match="7 is not a value of mascot.api.conversation.v1.Mode"):
        enum_name(cpb.Mode, 7)
    with pytest.raises(ValueError, match="'chat' is not one of support, meeting"):
        enum_value(cpb.Mode, "chat")
    assert enum_name(cpb.Mode, 7, default="?") == "?"
    assert enum_value(tpb.TrainingPhase, "persona_alignment", sep="-", default=0) == 0  # the separator matters
    with pytest.raises(TypeError, match="expected a proto enum"):
        enum_names("Mode")


def test_directive_sources_as_stored_and_as_shown_to_the_director():
    assert [directive_source_name(n) for n in range(7)] == ["model", "model", "retry", "fallback", "safety",
                                                             "random", "model"]
    assert directive_source_value("fallback") == dpb.DIRECTIVE_SOURCE_FALLBACK
    assert directive_source_value("nonsense") == dpb.DIRECTIVE_SOURCE_UNSPECIFIED
    # the director sees its own raw answer only for a model or retry directive (or an unknown source)
    turns = [dpb.Turn(index=0, role=dpb.ROLE_USER, text="hi")]
    for source, own in ((dpb.DIRECTIVE_SOURCE_UNSPECIFIED, True), (dpb.DIRECTIVE_SOURCE_RETRY, True),
                        (dpb.DIRECTIVE_SOURCE_SAFETY, False), (dpb.DIRECTIVE_SOURCE_FALLBACK, False)):
        d = dpb.Directive(persona_id="anchor", action="Listen.", tone="Calm", source=source, raw="RAW")
        t = dpb.Turn(index=1, role=dpb.ROLE_AGENT, persona_id="anchor", text="ok", directive=d)
        got = history_from_proto(turns + [t])[1].directive
        assert got == ("RAW" if own else directive_message("anchor", "Listen.", "Calm", "fallback", "RAW"))


def test_the_other_vocabularies_name_the_same_values():
    from mascot.cli import retrain
    from mascot.core.adapters import registry
    from mascot.core import metrics
    from mascot.core.situations import MODES
    from mascot.eval import report
    from mascot.gateway import job_specs

    assert metrics.MODES == report.MODES == MODES == enum_names(cpb.Mode)
    assert metrics.TRAINING_PHASES == job_specs.PHASES == retrain.PHASES == enum_names(tpb.TrainingPhase, sep="-")
    assert set(metrics.DIRECTIVE_SOURCES) == set(enum_names(dpb.DirectiveSource)) - {"safety"}
    assert registry.STATES == enum_names(apb.AdapterState)
    assert job_specs.STATES == enum_names(tpb.RunState)
    assert {enum_name(tpb.RunState, n) for n in retrain.FINISHED} == set(job_specs.FINISHED)
