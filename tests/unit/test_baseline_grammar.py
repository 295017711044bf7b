"""The prompting baselines' output constraint: a group turn of one line per persona, cut to the lines a dialogue
still needs."""

from __future__ import annotations

import re

import pytest

from mascot.core.personas import PersonaCatalog
from mascot.eval.baselines import group_regex, parse_group_turn


@pytest.fixture(scope="module")
def roster():
    return PersonaCatalog.load().in_set("support")


def test_full_group_turn_has_one_line_per_persona_in_order(roster):
    rx = re.compile(group_regex(roster, 40))
    full = "\n".join(f"{c.name}: reply of {c.id}" for c in roster)
    assert rx.fullmatch(full)
    assert not rx.fullmatch("\n".join(full.splitlines()[:3]))  # every persona must speak
    assert group_regex(roster, 40, lines=len(roster)) == group_regex(roster, 40) == group_regex(roster, 40, lines=9)


def test_a_cut_group_turn_is_the_start_of_a_full_one(roster):
    cut = group_regex(roster, 40, lines=2)
    rx = re.compile(cut)
    two = f"{roster[0].name}: I hear you.\n{roster[1].name}: That sounds so heavy.\n"
    assert rx.fullmatch(two)
    assert not rx.fullmatch(two + f"{roster[2].name}: What else?")  # nothing past the second line
    assert not rx.fullmatch(two.rstrip("\n"))  # the last line is closed, as it is inside a full turn
    # Up to its closing newline, every text the cut constraint accepts starts a text the full one accepts.
    full = re.compile(group_regex(roster, 40))
    rest = "\n".join(f"{c.name}: more" for c in roster[2:])
    assert full.fullmatch(two + rest)
    assert parse_group_turn(two, roster) == [(roster[0].id, "I hear you."), (roster[1].id, "That sounds so heavy.")]
    with pytest.raises(ValueError, match="lines"):
        group_regex(roster, 40, lines=0)
