"""The safety gate: risk detection ahead of the director, safety turns from a fixed
template per locale, and screening of replies once a conversation is flagged.

Every user message (live chat and the simulated user in self-play) goes through :meth:`SafetyGate.detect`: the
rules of :mod:`mascot.gateway.risk_rules`, the trained crisis detector of :mod:`mascot.gateway.crisis_model` (when
``safety.classifier`` is ``minilm``, the default) and the other languages' lexicons of :mod:`mascot.gateway.languages`;
:func:`combine` and :func:`add_lexicon` decide the tier. On the crisis tier the turn loop answers with one safety turn
(the template, delivered by the mode's safety persona, ``Turn.safety`` true, directive source ``safety``) and the
round ends; the conversation stays flagged, later replies are screened with
:func:`~mascot.gateway.risk_rules.screen_reply` and a screened reply is replaced by the template's follow-up line. On
the check-in tier a check-in turn comes first and the round goes on (the conversation is not flagged).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mascot.gateway import languages, risk_rules
from mascot.gateway.risk_rules import CATEGORIES, SECRECY, Hit
from mascot.gateway.store import SafetyEvent

log = logging.getLogger(__name__)

#: The directive of a safety turn (source ``safety``, raw "": no model chose it).
SAFETY_ACTION = "Safety response: acknowledge, share crisis resources, encourage reaching a person"
SAFETY_TONE = "Calm and caring"
#: The directive of a check-in turn (tier ``check_in``; source ``safety``).
CHECKIN_ACTION = "Safety check-in: ask directly and caringly whether the user is safe, then go on"


class SafetyTemplate(BaseModel):
    """The fixed text of safety turns in one locale.

    A safety turn is ``acknowledge``, then ``emergency`` and the resource lines (one per line), then ``encourage``,
    separated by blank lines. ``follow_up`` replaces a screened reply. No part may promise secrecy.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    acknowledge: str = Field(min_length=1, max_length=600)
    emergency: str = Field(min_length=1, max_length=300)
    resources: list[str] = Field(default_factory=list, max_length=12)
    encourage: str = Field(min_length=1, max_length=800)
    follow_up: str = Field(min_length=1, max_length=600)
    #: The check-in turn (tier ``check_in``): a direct, caring question about safety; None = ``follow_up``.
    check_in: str | None = Field(None, min_length=1, max_length=800)

    @field_validator("acknowledge", "emergency", "encourage", "follow_up", "resources", "check_in")
    @classmethod
    def _no_secrecy(cls, v: Any) -> Any:
        for text in ([v] if isinstance(v, str) else v or []):
            if SECRECY.search(risk_rules.normalize(text)):
                raise ValueError("a safety template must never promise secrecy or confidentiality")
        return v


TEMPLATES: dict[str, SafetyTemplate] = {
    "en": SafetyTemplate(
        acknowledge=("Thank you for telling me. I want to make sure you're safe, so I'm pausing our conversation "
                     "to share this, whether it's about you or about someone you care about."),
        emergency="If you or someone else is in immediate danger, call your local emergency number now.",
        resources=["In the US, you can call or text 988 (Suicide & Crisis Lifeline).",
                   "In the UK and Ireland, you can call Samaritans on 116 123.",
                   "Elsewhere, a local crisis line, a doctor or an emergency department can help; "
                   "findahelpline.com lists free crisis lines for most countries and languages."],
        encourage=("Please reach out to someone you trust (a friend, a family member, a doctor or a counsellor) "
                   "and tell them what's going on. You don't have to carry this alone. I'm an AI companion, not a "
                   "crisis service, and a real person can do much more for you right now."),
        follow_up=("I'd like to stay with what you shared earlier. How are you doing right now? If you feel unsafe, "
                   "please contact a crisis line or someone you trust; if you are in immediate danger, call your "
                   "local emergency number."),
        check_in=("Before we go on, I want to check in with you, because what you wrote matters. Are you safe right "
                  "now? Are you having thoughts of ending your life, or of hurting yourself or someone else? You can "
                  "tell me honestly, whatever the answer. If you or someone else is in danger, please call your "
                  "local emergency number or a crisis line."),
    ),
}


def load_templates(path: Path | None) -> dict[str, SafetyTemplate]:
    """The shipped templates plus those of ``path`` (a YAML mapping ``locale -> template fields``), which win.

    Raises:
        ValueError: the file is missing, not a mapping, or a template is invalid (names the locale and field).
    """
    out = dict(TEMPLATES)
    if path is None:
        return out
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"safety.templates_file {path}: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"safety.templates_file {path}: expected a mapping of locale to template")
    for locale, fields in data.items():
        try:
            out[str(locale)] = SafetyTemplate(**(fields or {}))
        except (TypeError, ValidationError) as e:
            raise ValueError(f"safety.templates_file {path}: locale {locale!r}: {e}") from None
    return out


@dataclass(frozen=True)
class Detection:
    """Risk found in one user message: the hits, in rule order, which detector(s) found them, the ``tier``
    (``crisis``: the safety template replaces the round; ``check_in``: a check-in turn comes first and the round goes
    on) and the trained detector's risk probability (``None`` when it did not run)."""

    hits: tuple[Hit, ...]
    detector: str
    tier: str = "crisis"
    p_risk: float | None = None

    @property
    def categories(self) -> tuple[str, ...]:
        """Distinct categories in :data:`~mascot.gateway.risk_rules.CATEGORIES` order."""
        found = {h.category for h in self.hits}
        return tuple(c for c in CATEGORIES if c in found)

    @property
    def kind(self) -> str:
        """The stored event kind of this tier: ``user_risk`` (crisis) or ``user_checkin``."""
        return "user_risk" if self.tier == "crisis" else "user_checkin"

    def events(self) -> list[SafetyEvent]:
        """One event per category (kind :attr:`kind`; rule names joined, the classifier with its probability, as
        ``classifier(p=0.87)``; never the text)."""
        def name(h: Hit) -> str:
            return f"classifier(p={self.p_risk:.2f})" if h.rule == "classifier" and self.p_risk is not None else h.rule

        return [SafetyEvent(self.kind, c, ",".join(dict.fromkeys(name(h) for h in self.hits if h.category == c)),
                            self.detector) for c in self.categories]


#: A rule hit on harm to oneself or on a topic word (:data:`SELF_CATEGORIES`, :data:`MENTION_RULES`) the model does
#: not confirm counts when the model's risk probability is at least this share of its check-in threshold
#: (:func:`combine`).
RULE_FLOOR = 0.5
#: A topic-word hit (:data:`MENTION_RULES`) the model does not confirm needs this share of the check-in threshold:
#: on the development set and the three earlier held-out sets, topic words the model read between half and this share
#: of its threshold were all look-alikes (a novel, a definition asked for, grief, a past crisis, a helper; 12 check-ins,
#: no disclosure), while a first-person state ("i think im anerexic") is an act rule that keeps :data:`RULE_FLOOR`.
#: The abuse topic word is exempt: "i was molestd by my coach" reads as no risk to the model, and a disclosure of abuse
#: always gets at least a check-in. Rules on danger to or from others keep their check-in at any probability (a floor
#: of 0.2 of the threshold for harm to others was tried: with the fine-tuned encoder it dropped "Sometimes I fantasize
#: about strangling my roommate").
MENTION_FLOOR = 0.7
#: A crisis-strength lexicon hit (other languages) the model reads below this share of its check-in threshold is a
#: check-in (:func:`add_lexicon`): chosen on the other languages' development set among 0.2, 0.35, 0.5 and 0.7 of the
#: threshold (crisis-tier false positives 9.1%, 7.4%, 7.4%, 7.4%; recall at any tier the same at each).
LEXICON_FLOOR = 0.35
#: A lexicon hit on a message the language head read (:class:`~mascot.gateway.crisis_model.LanguageHead`, a reader of
#: that language) below this share of the head's check-in threshold is dropped, as the English rules' hits on harm to
#: oneself are below :data:`RULE_FLOOR` of the encoder's: on the other languages' development set such hits were a
#: haircut, a burnt cake, a student's essay on self-harm, a past attempt (check-ins on harmless messages 18.9% ->
#: 11.4%, recall unchanged). Chosen there among 0.2, 0.35, 0.5 and 0.7 (11.4% from 0.35 on, the same recall at each).
LANGUAGE_LEXICON_FLOOR = 0.35
#: On a message the language head read, a crisis-strength lexicon hit makes a crisis only when the head reaches its
#: own check-in threshold (two detectors agree, as an English act rule and the encoder in :func:`combine`), and a
#: check-in below it: on the other languages' development set crisis-tier false positives 1.7% -> 0.0% (past attempts
#: told as recovered), check-ins 3.4% -> 5.1%, recall at either tier unchanged (0.5 and 0.7 of the threshold tried).
#: The share of the head's check-in threshold below which :func:`add_lexicon` doubts a crisis-strength hit.
LANGUAGE_LEXICON_CRISIS_FLOOR = 1.0
#: Rules that fire on a topic word alone, whatever is said about it (see :func:`combine`).
MENTION_RULES = frozenset({"suicide_word", "self_harm_word", "ed_word", "abuse_word"})
#: Categories of harm to oneself: their rule hits need some risk from the model (:data:`RULE_FLOOR`, :func:`combine`).
SELF_CATEGORIES = frozenset({"suicide", "self_harm", "eating_disorder"})


class RiskClassifier(Protocol):
    """The model detector: an :class:`~mascot.gateway.crisis_model.Assessment` per text, and its check-in
    threshold (``checkin_threshold``, a probability)."""

    checkin_threshold: float

    def assess(self, texts: Sequence[str]) -> list[Any]:
        """One assessment (``p_risk``, ``category``, ``tier``) per text."""


def combine(hits: list[Hit], assessment: Any, rule_floor: float = 0.0, mention_floor: float = 0.0,
            denied: bool = False) -> Detection | None:
    """The gate's decision from the rules' ``hits`` and the trained detector's ``assessment`` (None: not run).

    - Without the model, or on a text it cannot read (``p_risk`` None), any rule hit is a crisis (the rules-only
      gate).
    - The model's own tier when it fires (``check_in`` or ``crisis``); a hit of a rule on an act (any rule but
      :data:`MENTION_RULES`) raises a check-in to a crisis (two detectors agree); a topic word does not.
    - A rule hit the model reads as below its check-in threshold is a check-in, except below ``rule_floor``, where
      the hits on harm to oneself (:data:`SELF_CATEGORIES`) and on topic words (:data:`MENTION_RULES`) are dropped:
      the model reads the same normalised words, and on the development set every such hit was a look-alike (an
      idiom, a mention, a helper, grief, a past crisis or a denial: 25 hits, none on a disclosure; docs/safety.md).
      A topic-word hit needs ``mention_floor`` (abuse excepted); rules on danger to or from others keep a check-in at
      any probability (the model's weakest kind).
    - A message that denies an act on oneself (``denied``: :func:`~mascot.gateway.risk_rules.denies`, "I would never
      kill myself, but I'm exhausted") is no second detector either: its act rule does not raise the model's
      check-in to a crisis (the model's own crisis tier still counts). The multilingual detector reads that message at
      0.62, above its 0.39 threshold, and the crisis template answered a denial.

    Args:
        hits: The rules' hits.
        assessment: An object with ``p_risk``, ``category`` and ``tier`` (:class:`~mascot.gateway.crisis_model.
            Assessment`), or None.
        rule_floor: Risk probability in [0, 1] a rule hit on harm to oneself or a topic word needs from the model.
        mention_floor: Risk probability a topic-word hit needs (at least ``rule_floor`` in effect).
        denied: The message denies an act on oneself (see above).
    """
    if assessment is None or assessment.p_risk is None:  # no model, or a text it cannot read: the rules decide
        return Detection(tuple(hits), "rules") if hits else None
    model_fires = assessment.tier != "none"
    if not model_fires:  # a rule hit the model reads as (almost) no risk
        p = assessment.p_risk
        hits = [h for h in hits if not (p < rule_floor and (h.category in SELF_CATEGORIES or h.rule in MENTION_RULES))
                and not (p < mention_floor and h.rule in MENTION_RULES and h.category != "abuse")]
    rules = bool(hits)
    if not rules and not model_fires:
        return None
    hits = list(hits)
    if assessment.category not in {h.category for h in hits} and (model_fires or not hits):
        hits.append(Hit(assessment.category, "classifier"))
    detector = "rules+classifier" if rules and model_fires else "rules" if rules else "classifier"
    acts = any(h.rule not in MENTION_RULES and h.rule != "classifier" for h in hits)
    crisis = assessment.tier == "crisis" or (acts and model_fires and not denied)
    return Detection(tuple(hits), detector, "crisis" if crisis else "check_in", assessment.p_risk)


def add_lexicon(detection: Detection | None, lex: Sequence[languages.LexiconHit], p_risk: float | None = None,
                lexicon_floor: float = 0.0) -> Detection | None:
    """``detection`` with the other languages' lexicon hits added (rule names such as ``es_want_die``): a
    ``crisis``-strength hit makes the tier crisis, a ``check_in`` one makes it at least check-in.

    A ``crisis``-strength hit the trained detector reads as almost no risk (``p_risk`` below ``lexicon_floor``, a
    probability) makes a check-in instead: the detector learns the five languages too, and on their development set
    (350 messages) such hits were look-alikes ("me corté el dedo picando cebolla", "matarme a estudiar"): crisis-tier
    false positives 12.0% → 7.4%, recall unchanged (:data:`LEXICON_FLOOR`). ``p_risk`` None (no model, or a text it
    cannot read) leaves every hit its strength."""
    if not lex:
        return detection
    hits = list(detection.hits) if detection else []
    hits += [Hit(h.category, h.rule) for h in lex]
    doubted = p_risk is not None and p_risk < lexicon_floor
    tier = "crisis" if (not doubted and any(h.strength == "crisis" for h in lex)) \
        or (detection and detection.tier == "crisis") else "check_in"
    found = detection.detector if detection else ""
    detector = "+".join(dict.fromkeys([*(found.split("+") if found else []), "lexicon"]))
    return Detection(tuple(hits), detector, tier, detection.p_risk if detection else None)


class SafetyGate:
    """Detection, templates, persona choice and reply screening, from ``safety`` config.

    Args:
        cfg: :class:`~mascot.core.config.SafetyConfig`.
        catalog: Persona cards (the safety personas must exist and belong to their mode's set).
        classifier: A :class:`RiskClassifier` to use instead of the one ``cfg.classifier`` names (tests).

    Raises:
        ValueError: an unknown locale, a bad templates file, or a safety persona missing from its mode's set.
    """

    def __init__(self, cfg: Any, catalog: Any, classifier: RiskClassifier | None = None) -> None:
        self.cfg = cfg
        templates = load_templates(cfg.templates_file)
        if cfg.locale not in templates:
            raise ValueError(f"safety.locale {cfg.locale!r} has no template; shipped: {sorted(TEMPLATES)} "
                             "(add one with safety.templates_file)")
        self.template = templates[cfg.locale]
        if cfg.resources:
            self.template = self.template.model_copy(update={"resources": list(cfg.resources)})
            SafetyTemplate(**self.template.model_dump())  # the configured lines must not promise secrecy either
        self.personas = {"support": cfg.support_persona, "meeting": cfg.meeting_persona}
        for mode, pid in self.personas.items():
            card = catalog.cards.get(pid)
            if card is None or card.persona_set != mode:
                raise ValueError(f"safety.{mode}_persona {pid!r} is not a persona of the {mode} set")
        risk_rules.vocabulary()  # load the word list and the language identifier now, not on the first message
        languages.identify("warm up")
        if classifier is None and cfg.classifier == "minilm":
            from mascot.gateway.crisis_model import shared_classifier

            classifier = shared_classifier(cfg.crisis_threshold, cfg.checkin_threshold,
                                           cfg.detector_path)
        self.classifier = classifier

    # -------------------------------------------------------------- detection
    def detect(self, text: str) -> Detection | None:
        """Risk in one user message, or None. Rules always run; the classifier adds its hits when configured."""
        return self.detect_many([text])[0]

    def detect_many(self, texts: Sequence[str]) -> list[Detection | None]:
        """:meth:`detect` of each text, the classifier run as one batch: :func:`combine` decides the tier of the
        English detectors, then the other languages' lexicons (:func:`add_lexicon`) may raise it. The floors are
        shares of the check-in threshold of the reader that read the message (the encoder's, or the language
        head's); a lexicon hit the language head reads below :data:`LANGUAGE_LEXICON_FLOOR` of its threshold is
        dropped, and one below its threshold is at most a check-in."""
        model = self.classifier.assess(list(texts)) if self.classifier is not None and texts else None
        default_ci = self.classifier.checkin_threshold if self.classifier is not None else 0.0
        out = []
        for i, t in enumerate(texts):
            assessment = model[i] if model is not None else None
            ci = default_ci  # the threshold this message's reader judged it against (the language head has its own)
            if assessment is not None and getattr(assessment, "checkin_threshold", None) is not None:
                ci = assessment.checkin_threshold
            hits, denied = risk_rules.read(t)
            detection = combine(hits, assessment, rule_floor=ci * RULE_FLOOR, mention_floor=ci * MENTION_FLOOR,
                                denied=denied)
            lex = languages.lexicon_hits(t)
            p = assessment.p_risk if assessment is not None else None
            head_read = p is not None and bool(getattr(assessment, "language", ""))
            if lex and head_read and p < ci * LANGUAGE_LEXICON_FLOOR:
                lex = []  # the head reads this language and finds almost no risk (LANGUAGE_LEXICON_FLOOR)
            # a crisis-strength hit needs the head's own check-in to make a crisis, as an English act rule needs the
            # encoder's (combine); below it, a check-in ("hace tres años intenté quitarme la vida. Hoy celebro ...")
            doubt = LANGUAGE_LEXICON_CRISIS_FLOOR if head_read else LEXICON_FLOOR
            out.append(add_lexicon(detection, lex, p, ci * doubt))
        return out

    def unread_language(self, text: str) -> str | None:
        """See :func:`mascot.gateway.languages.unread_language`."""
        return languages.unread_language(text)

    @property
    def slow(self) -> bool:
        """True when detection runs a model (call it off the event loop)."""
        return self.classifier is not None

    # -------------------------------------------------------------- safety turns
    def persona_for(self, mode: str, roster: Sequence[str]) -> str:
        """The persona that delivers a safety turn: the mode's safety persona, or the roster's first when the
        conversation's roster lacks it."""
        pid = self.personas.get(mode, "")
        return pid if pid in roster or not roster else roster[0]

    def directive(self, persona_id: str, tier: str = "crisis") -> dict:
        """The stored directive of a safety turn (``tier`` crisis) or a check-in turn (``tier`` check_in)."""
        action = SAFETY_ACTION if tier == "crisis" else CHECKIN_ACTION
        return {"persona_id": persona_id, "action": action, "tone": SAFETY_TONE, "source": "safety", "raw": ""}

    def safety_text(self) -> str:
        """The safety turn's text: acknowledgement, emergency line and resources, encouragement."""
        t = self.template
        return "\n\n".join([t.acknowledge, "\n".join([t.emergency, *t.resources]), t.encourage])

    def check_in_text(self) -> str:
        """The check-in turn's text (tier ``check_in``): the template's ``check_in`` (else its ``follow_up``), then
        the resource lines, one per line (``safety.resources`` when set, else the locale template's), as the crisis
        template lists them."""
        t = self.template
        return "\n\n".join([t.check_in or t.follow_up, *(["\n".join(t.resources)] if t.resources else [])])

    def follow_up_text(self) -> str:
        """The line that replaces a screened reply."""
        return self.template.follow_up

    def screen(self, text: str, categories: set[str] | frozenset[str]) -> Hit | None:
        """See :func:`~mascot.gateway.risk_rules.screen_reply`."""
        return risk_rules.screen_reply(text, categories)
