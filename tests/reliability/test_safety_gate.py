"""The safety gate's parts without servers: template text, configuration, persona choice, reply screening."""

from __future__ import annotations

import re

import pytest

from mascot.core.config import MascotConfig, SafetyConfig
from mascot.core.personas import PersonaCatalog
from mascot.gateway.risk_rules import normalize, screen_reply
from mascot.gateway.safety import TEMPLATES, SafetyGate, load_templates

SECRECY_PROMISES = re.compile(r"secret|between us|between you and me|won't tell|confidential|stays here", re.I)


@pytest.fixture(scope="module")
def catalog():
    return PersonaCatalog.load()


def gate(catalog, **cfg) -> SafetyGate:
    return SafetyGate(SafetyConfig(**cfg), catalog)


def test_en_template_acknowledges_gives_resources_and_encourages_a_person(catalog):
    text = gate(catalog).safety_text()
    assert text.startswith("Thank you for telling me.")
    assert "call your local emergency number" in text
    assert "988" in text and "116 123" in text  # the two well-known lines, nothing invented
    assert "someone you trust" in text and "You don't have to carry this alone" in text
    assert not SECRECY_PROMISES.search(text)
    assert not SECRECY_PROMISES.search(gate(catalog).follow_up_text())
    assert set(re.findall(r"\d[\d ]{2,}\d", text)) == {"116 123"} and "988" in text  # no other phone numbers


def test_configured_resources_replace_the_locale_lines(catalog):
    g = gate(catalog, resources=["In Germany, call the TelefonSeelsorge.", "Or talk to your GP."])
    text = g.safety_text()
    assert "TelefonSeelsorge" in text and "Or talk to your GP." in text
    assert "988" not in text and "call your local emergency number" in text  # the generic line stays


def test_env_configures_locale_and_resources(monkeypatch):
    monkeypatch.setenv("MASCOT_SAFETY__RESOURCES", '["Call 111."]')
    monkeypatch.setenv("MASCOT_SAFETY__LOCALE", "en")
    cfg = MascotConfig()
    assert cfg.safety.resources == ["Call 111."] and cfg.safety.locale == "en"


@pytest.mark.parametrize("bad", [{"resources": ["two\nlines"]}, {"resources": [" "]}, {"locale": "EN!"},
                                 {"classifier": "bert"}, {"crisis_threshold": 0}, {"checkin_threshold": 1.0},
                                 {"classifier_threshold": 0.5}, {"unknown": 1}])
def test_bad_safety_config_is_refused(bad):
    with pytest.raises(ValueError):
        SafetyConfig(**bad)


def test_check_in_threshold_above_the_crisis_threshold_is_refused_at_start(catalog):
    with pytest.raises(ValueError, match="checkin_threshold 0.8 is above safety.crisis_threshold 0.6"):
        gate(catalog, crisis_threshold=0.6, checkin_threshold=0.8)


def test_unknown_locale_and_wrong_mode_persona_are_refused_at_start(catalog):
    with pytest.raises(ValueError, match="no template"):
        gate(catalog, locale="fr")
    with pytest.raises(ValueError, match="support set"):
        gate(catalog, support_persona="critic")
    with pytest.raises(ValueError, match="secrecy"):
        gate(catalog, resources=["Everything you say here stays between us."])


def test_templates_file_adds_a_locale_and_refuses_secrecy(catalog, tmp_path):
    f = tmp_path / "t.yaml"
    f.write_text("de:\n  acknowledge: Danke, dass du es mir sagst.\n  emergency: Im Notfall ruf 112 an.\n"
                 "  resources: [TelefonSeelsorge.]\n  encourage: Sprich mit einem Menschen, dem du vertraust.\n"
                 "  follow_up: Wie geht es dir gerade?\n")
    g = gate(catalog, locale="de", templates_file=f)
    assert g.safety_text().startswith("Danke") and "112" in g.safety_text()
    f.write_text("en:\n  acknowledge: I'll keep this a secret.\n  emergency: x\n  encourage: y\n  follow_up: z\n")
    with pytest.raises(ValueError, match="secrecy"):
        load_templates(f)
    f.write_text("- not a mapping\n")
    with pytest.raises(ValueError, match="mapping"):
        load_templates(f)
    assert "en" in TEMPLATES


def test_safety_persona_per_mode_and_roster_fallback(catalog):
    g = gate(catalog)
    assert g.persona_for("support", ["empathetic_listener", "anchor", "beacon"]) == "anchor"
    assert g.persona_for("meeting", ["critic", "minutes_scribe"]) == "minutes_scribe"
    assert g.persona_for("support", ["catalyst", "beacon"]) == "catalyst"  # roster without the Anchor
    d = g.directive("anchor")
    assert d["source"] == "safety" and d["raw"] == "" and d["persona_id"] == "anchor"


def test_detection_lists_categories_once_and_events_carry_no_text(catalog):
    d = gate(catalog).detect("I want to kill myself, I've been starving myself and cutting myself.")
    assert d.categories == ("suicide", "self_harm", "eating_disorder") and d.detector == "rules+classifier"
    assert d.tier == "crisis" and 0.5 < d.p_risk <= 1
    events = d.events()
    assert [e.category for e in events] == list(d.categories)
    assert all(e.kind == "user_risk" and "myself" not in e.rules for e in events)
    assert gate(catalog).detect("I miss my grandmother.") is None
    rules_only = gate(catalog, classifier="none").detect("I want to kill myself, I've been starving myself.")
    assert rules_only.detector == "rules" and rules_only.tier == "crisis" and rules_only.p_risk is None


def test_normalize_undoes_spacing_joining_symbols_and_non_characters():
    """Spellings that slipped past the gate (28 of 35 variants of an explicit disclosure in a review) are read."""
    from mascot.gateway.risk_rules import detect

    variants = ["k i l l myself", "k.i.l.l m.y.s.e.l.f", "k-i-l-l myself", "killmyself", "iwanttokillmyself",
                "I want to \U0001f52a kill \U0001f480 myself", "ki\ue000ll myself", "kil\uffffl myself",
                "I \u2728 want \u2728 to \u2728 die", "I want to d\ufdd0ie", "I want to kiII myself"]
    for v in variants:
        assert "suicide" in {h.category for h in detect(v)}, (v, normalize(v))
    assert normalize("\U0001f60a\U0001f389") == ""  # emoji only: no letters left
    assert normalize("the U.S.A. is big") == "the usa. is big"
    assert normalize("my coworkers and I") == "my coworkers and i"  # an inflected word stays whole
    assert normalize("quiero morir", segment=False) == "quiero morir"


def test_normalize_folds_case_quotes_leetspeak_and_typos():
    assert normalize("I WANNA K1LL MYSELFFF") == "i want to kill myself"
    assert normalize("I\u2019m so sucidal") == "i'm so suicidal"
    assert normalize("kill my self") == "kill myself"


@pytest.mark.parametrize("reply, categories, screen", [
    ("Maybe try counting calories and cutting back on carbs.", {"eating_disorder"}, "reply_diet_advice"),
    ("Skipping breakfast could help you lose weight.", {"eating_disorder"}, "reply_diet_advice"),
    ("A little intermittent fasting might make you feel in control.", {"eating_disorder", "suicide"},
     "reply_diet_advice"),
    ("Counting calories can help with energy.", {"suicide"}, None),  # diet talk is screened after ED only
    ("Honestly, you're overreacting.", {"suicide"}, "reply_dismissive"),
    ("It's not that bad, others have it worse.", {"abuse"}, "reply_dismissive"),
    ("Just snap out of it and think positive!", {"self_harm"}, "reply_dismissive"),
    ("I don't believe you.", {"abuse"}, "reply_dismissive"),
    ("Don't worry, this stays between us.", {"suicide"}, "reply_secrecy"),
    ("I won't tell anyone, I promise.", {"abuse"}, "reply_secrecy"),
    ("That sounds so heavy. I'm here with you.", {"eating_disorder"}, None),
    ("Honestly, you're overreacting.", set(), None),  # nothing is screened before a disclosure
])
def test_reply_screening(reply, categories, screen):
    hit = screen_reply(reply, categories)
    assert (hit.category if hit else None) == screen


def test_detection_never_raises_and_stays_fast_on_any_text(catalog):
    """Random model output found a crash once (a digit without a leetspeak mapping): any text must pass the gate."""
    import random
    import time

    rng = random.Random(7)
    alphabet = [chr(c) for c in (*range(32, 127), *range(0x80, 0x250), 0x200F, 0x202E, 0x0301, 0x1F600, 0, 7, 27)]
    g = gate(catalog)
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 200)))
        g.detect(text)
        screen_reply(text, {"eating_disorder", "suicide"})
    worst = "kill " * 400 + "myself a " * 200 + "9" * 100 + "k9ll a9b " * 100
    t0 = time.perf_counter()
    assert g.detect(worst[:4000]) is not None  # "kill myself" inside
    g.detect(("x" * 3999) + "!")
    assert time.perf_counter() - t0 < 1.0
