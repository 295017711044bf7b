"""The crisis detector's logic (docs/safety.md, "The trained detector"): labelled-set validation, threshold choice,
the per-kind figures, the gate's tier policy (:func:`mascot.gateway.safety.combine`), the other languages' lexicons,
and the shipped detector's provenance (its digest is the labelled set's)."""

from __future__ import annotations

import hashlib
import json

import pytest

from mascot.gateway import crisis_model as cm
from mascot.gateway import languages, risk_rules
from mascot.gateway.risk_rules import Hit
from mascot.gateway.safety import add_lexicon, combine


def _write(path, items):
    path.write_text("items:\n" + "".join(f"  - {json.dumps(it)}\n" for it in items), encoding="utf-8")
    return path


def test_load_examples_names_the_file_and_item_of_a_bad_entry(tmp_path):
    good = {"text": "I want to end it", "category": "suicide", "kind": "paraphrase", "lang": "en"}
    f = _write(tmp_path / "a.yaml", [good, {"text": "hi", "category": "sadness", "kind": "benign_sad"}])
    with pytest.raises(ValueError, match=r"a\.yaml: item 2: category 'sadness' is not one of"):
        cm.load_examples([f])
    f = _write(tmp_path / "b.yaml", [{"text": "the news", "category": "none", "kind": "explicit"}])
    with pytest.raises(ValueError, match=r"b\.yaml: item 1: kind 'explicit' is not one of .* for category 'none'"):
        cm.load_examples([f])
    f = _write(tmp_path / "c.yaml", [good, {**good, "text": "I  WANT to end it"}])
    with pytest.raises(ValueError, match=r"c\.yaml: item 2: duplicate text \(first at .*c\.yaml: item 1\)"):
        cm.load_examples([f])
    with pytest.raises(ValueError, match="cannot read the labelled set"):
        cm.load_examples([tmp_path / "missing.yaml"])
    ex = cm.load_examples([_write(tmp_path / "d.yaml", [good])])
    assert ex == [cm.Example("I want to end it", "suicide", "paraphrase", "en")] and ex[0].at_risk


def _ex(n_risk, n_safe):
    return ([cm.Example(f"r{i}", "suicide", "paraphrase") for i in range(n_risk)]
            + [cm.Example(f"s{i}", "none", "benign_sad") for i in range(n_safe)])


def test_thresholds_keep_the_recall_and_bound_the_crisis_false_positives():
    ex = _ex(20, 20)
    # at risk: 19 at 0.9, one at 0.3; safe: 18 at 0.1, one at 0.6, one at 0.95
    p = [0.9] * 19 + [0.3] + [0.1] * 18 + [0.6, 0.95]
    crisis, checkin = cm.choose_thresholds(p, ex, min_recall=0.95, max_crisis_fp=0.05)
    assert checkin == 0.9  # 19/20 = 0.95 of the at-risk reach it; above 0.9 none does
    assert crisis == 0.9  # the lowest value >= check-in with <= 1/20 safe at or above it (the 0.95 one)
    crisis, checkin = cm.choose_thresholds(p, ex, min_recall=1.0, max_crisis_fp=0.0)
    assert checkin == 0.3 and crisis == 0.96
    f = cm.figures(p, ex, crisis, checkin)
    assert f["recall_any"] == 1.0 and f["recall_crisis"] == 0.0 and f["fp_crisis"] == 0.0 and f["fp_any"] == 0.1
    assert f["kinds"]["paraphrase"] == {"n": 20, "flagged_any": 20, "flagged_crisis": 0, "at_risk": True}
    assert f["kinds"]["benign_sad"] == {"n": 20, "flagged_any": 2, "flagged_crisis": 0, "at_risk": False}
    assert [cm.tier_of(x, 0.8, 0.4) for x in (0.39, 0.4, 0.79, 0.8)] == ["none", "check_in", "check_in", "crisis"]


def a(p, category="suicide", tier=None):
    return cm.Assessment(p, category, tier or cm.tier_of(p, 0.9, 0.5))


@pytest.mark.parametrize("hits, assessment, expected", [
    ([Hit("suicide", "kill_self")], None, ("crisis", "rules")),  # rules-only gate: any hit is a crisis
    ([], None, None),
    ([], a(0.95), ("crisis", "classifier")),
    ([], a(0.6), ("check_in", "classifier")),
    ([], a(0.2), None),
    ([Hit("suicide", "kill_self")], a(0.6), ("crisis", "rules+classifier")),  # both fire: crisis
    ([Hit("suicide", "kill_self")], a(0.1), ("check_in", "rules")),  # the model reads no risk: check in
    ([Hit("abuse", "hit_by")], a(0.97, "self_harm"), ("crisis", "rules+classifier")),
])
def test_combine_policy(hits, assessment, expected):
    d = combine(hits, assessment)
    assert (d.tier, d.detector) == expected if expected else d is None


def test_topic_word_rules_need_some_risk_from_the_model():
    word, act = Hit("suicide", "suicide_word"), Hit("abuse", "passive_abuse")
    assert combine([word], a(0.1), rule_floor=0.27) is None  # "a documentary about suicide"
    assert combine([word], a(0.3), rule_floor=0.27).tier == "check_in"
    assert combine([word, act], a(0.1), rule_floor=0.27).categories == ("abuse",)  # other rules still count
    assert combine([word], cm.Assessment(None, "suicide", "none"), rule_floor=0.27).tier == "crisis"  # unreadable


def test_self_harm_rules_need_some_risk_from_the_model_and_topic_words_never_make_a_crisis():
    grief, threat = Hit("suicide", "kill_self"), Hit("harm_to_others", "kill_person")
    # "My brother killed himself years ago": a rule on harm to oneself the model reads as no risk is dropped
    assert combine([grief], a(0.1), rule_floor=0.27) is None
    assert combine([grief], a(0.3), rule_floor=0.27).tier == "check_in"  # some risk: ask
    assert combine([threat], a(0.1), rule_floor=0.27).tier == "check_in"  # danger to others: always ask
    assert combine([grief], cm.Assessment(None, "suicide", "none"), rule_floor=0.27).tier == "crisis"  # unreadable
    # a topic word beside a model check-in is no second detector ("I'm not suicidal, just burned out")
    word = Hit("suicide", "suicide_word")
    assert (combine([word], a(0.6), rule_floor=0.27).tier, combine([grief], a(0.6), rule_floor=0.27).tier) == (
        "check_in", "crisis")


@pytest.mark.parametrize("n_sentences, expected",
                         [(1, 1), (2, 1), (3, 1), (7, 1), (8, 1 + 8), (12, 1 + 12), (40, 1 + 12)])
def test_windows_read_a_long_message_by_sentence(n_sentences, expected):
    """5 words a sentence: from 8 sentences (40 words) a message is also read sentence by sentence, at most 12
    groups of sentences; a shorter one is read whole."""
    text = " ".join(f"This is sentence number {i}." for i in range(n_sentences))
    w = cm.windows(text)
    assert w[0] == text and len(w) == expected
    assert all(f"number {i}." in " ".join(w[1:]) for i in range(n_sentences)) or expected == 1  # nothing left out
    long = "Fine. Friday. " + "We walked the dog along the river and it rained the whole way back home. " * 3 + (
        "I want to go home now.")
    assert cm.windows(long)[1:] == [
        *["We walked the dog along the river and it rained the whole way back home."] * 3, "I want to go home now."]


def test_combined_detection_stores_its_tier_and_evidence_not_text():
    d = combine([Hit("abuse", "hit_by")], a(0.97, "self_harm"))
    assert d.categories == ("self_harm", "abuse") and d.kind == "user_risk"
    assert [(e.kind, e.category, e.rules) for e in d.events()] == [
        ("user_risk", "self_harm", "classifier(p=0.97)"), ("user_risk", "abuse", "hit_by")]
    d = combine([], a(0.61))
    assert d.kind == "user_checkin" and [(e.kind, e.rules, e.detector) for e in d.events()] == [
        ("user_checkin", "classifier(p=0.61)", "classifier")]


@pytest.mark.parametrize("text, lang, category, strength", [
    ("me quiero morir, ya no aguanto", "es", "suicide", "crisis"),
    ("ya no puedo más con todo esto", "es", "suicide", "check_in"),
    ("je veux en finir ce soir", "fr", "suicide", "crisis"),
    ("mon copain m'a encore frappée hier", "fr", "abuse", "crisis"),
    ("Ich will nicht mehr leben.", "de", "suicide", "crisis"),
    ("ich ritze mich wieder jeden Abend", "de", "self_harm", "crisis"),
    ("quero me matar, ninguém liga", "pt", "suicide", "crisis"),
    ("não aguento mais essa vida", "pt", "suicide", "check_in"),
    ("voglio farla finita stanotte", "it", "suicide", "crisis"),
    ("mi faccio vomitare dopo ogni pasto", "it", "eating_disorder", "crisis"),
    # plans, knives, abuse happening now, self-harm without the textbook verb (written for this test)
    ("mañana me tomo todas mis pastillas", "es", "suicide", "crisis"),
    ("le voy a clavar un cuchillo a ese imbécil", "es", "harm_to_others", "crisis"),
    ("mi padre está pegando a mi hermanita otra vez", "es", "abuse", "crisis"),
    ("je vais me suicider demain", "fr", "suicide", "crisis"),
    ("il m'a serré le cou hier soir", "fr", "abuse", "crisis"),
    ("je vais le poignarder s'il revient", "fr", "harm_to_others", "crisis"),
    ("ich hab mich schon von allen verabschiedet", "de", "suicide", "crisis"),
    ("er würgt mich jedes Mal wenn er trinkt", "de", "abuse", "crisis"),
    ("ich drücke Zigaretten auf meiner Haut aus", "de", "self_harm", "crisis"),
    ("vou esfaquear aquele cara", "pt", "harm_to_others", "crisis"),
    ("estou sem comer há cinco dias", "pt", "eating_disorder", "crisis"),
    ("se mi tocca ancora lo accoltello", "it", "harm_to_others", "crisis"),
    ("mi ha detto che non devo dirlo alla mamma", "it", "abuse", "crisis"),
])
def test_lexicons_read_other_languages(text, lang, category, strength):
    hits = languages.lexicon_hits(text)
    assert (hits[0].language, hits[0].category, hits[0].strength) == (lang, category, strength), hits


@pytest.mark.parametrize("text", [
    "me muero de hambre, ¿pedimos pizza?", "je meurs de faim", "ich sterbe vor Langeweile",
    "minha mãe vai me matar se eu chegar tarde", "muoio dal ridere", "ma sœur va me tuer si j'oublie",
    "I want to kill myself", "we watched a documentary about suicide prevention",
    "la fiesta sorpresa es un secreto, no se lo digas", "j'ai écrit des lettres à ma grand-mère",
    "wir haben uns am Bahnhof verabschiedet", "Messer und Gabel liegen im Schrank", "o bolo é um segredo",
    "ho salutato la nonna e sono tornato a casa",
])
def test_lexicons_leave_idioms_and_english_alone(text):
    assert languages.lexicon_hits(text) == []


def test_lexicon_raises_the_tier_and_names_its_rule():
    lex = languages.lexicon_hits("je n'en peux plus")
    d = add_lexicon(None, lex)
    assert (d.tier, d.detector, d.categories) == ("check_in", "lexicon", ("suicide",))
    d = add_lexicon(combine([], a(0.6)), languages.lexicon_hits("quiero matarme"))
    assert (d.tier, d.detector) == ("crisis", "classifier+lexicon")
    assert "es_want_die" in d.events()[0].rules
    assert add_lexicon(None, []) is None


def test_a_crisis_lexicon_hit_the_model_reads_as_no_risk_is_a_check_in():
    """"me corté el dedo picando cebolla" hits ``es_self_harm``; the model's near-zero risk makes it a check-in, and
    without a model reading (None) the hit keeps its crisis strength."""
    lex = languages.lexicon_hits("otra vez me corté el dedo picando cebolla")
    assert [h.strength for h in lex] == ["crisis"]
    assert add_lexicon(None, lex, p_risk=0.05, lexicon_floor=0.2).tier == "check_in"
    assert add_lexicon(None, lex, p_risk=0.3, lexicon_floor=0.2).tier == "crisis"
    assert add_lexicon(None, lex, p_risk=None, lexicon_floor=0.2).tier == "crisis"
    assert add_lexicon(combine([], a(0.97)), lex, p_risk=0.01, lexicon_floor=0.2).tier == "crisis"  # model's own


class _Classifier:
    """A :class:`~mascot.gateway.safety.RiskClassifier` that returns the given assessments (the gate's policy alone)."""

    checkin_threshold = 0.5

    def __init__(self, *assessments):
        self.assessments = list(assessments)

    def assess(self, texts):
        return self.assessments[:len(texts)]


def test_a_lexicon_hit_the_language_head_reads_as_no_risk_is_dropped():
    """The head reads Spanish (its own check-in threshold 0.4): at 0.1, under 0.35 of it, the haircut's
    ``es_self_harm`` hit is dropped; the encoder's reading of the same text (no ``language``) keeps it (a check-in:
    ``LEXICON_FLOOR``). Between the floor and the head's threshold the crisis-strength hit is a check-in; with the
    head's check-in, a crisis. The floors are shares of the reader's own check-in threshold."""
    from mascot.core.config import SafetyConfig
    from mascot.core.personas import PersonaCatalog
    from mascot.gateway.safety import SafetyGate

    text = "me corté el pelo yo misma y ahora parezco un champiñón"
    assert [h.rule for h in languages.lexicon_hits(text)] == ["es_self_harm"]

    def gate(assessment):
        return SafetyGate(SafetyConfig(classifier="none"), PersonaCatalog.load(), classifier=_Classifier(assessment))

    head = cm.Assessment(0.1, "self_harm", "none", 0.4, "es")
    assert gate(head).detect(text) is None
    assert gate(cm.Assessment(0.1, "self_harm", "none")).detect(text).tier == "check_in"  # the encoder's reading
    d = gate(cm.Assessment(0.2, "self_harm", "none", 0.4, "es")).detect(text)  # 0.2 >= 0.35 * 0.4: kept,
    assert (d.tier, d.detector) == ("check_in", "lexicon")  # but below the head's threshold a check-in
    d = gate(cm.Assessment(0.45, "self_harm", "check_in", 0.4, "es")).detect(text)
    assert d.tier == "crisis" and d.p_risk == 0.45  # the head's check-in and the lexicon agree: a crisis
    assert gate(cm.Assessment(0.2, "self_harm", "none")).detect(text).tier == "crisis"  # the encoder's: not doubted


def test_the_language_head_reads_its_languages_only_when_sure():
    head = cm.Detector.load().language_head
    assert head is not None and tuple(head.languages) == tuple(sorted(cm.HEAD_LANGUAGES))
    assert head.language("ya no quiero seguir viviendo, estoy cansada de todo") == "es"
    assert head.language("je n'en peux plus de cette vie, je veux que ça s'arrête") == "fr"
    assert head.language("ich kann nicht mehr und will einfach nur weg") == "de"
    assert head.language("não aguento mais essa vida, quero sumir") == "pt"
    assert head.language("non ce la faccio più, voglio sparire per sempre") == "it"
    assert head.language("I can't do this anymore, I want to disappear") is None  # English: the encoder's
    assert head.language("este calor me está matando") in ("es", "pt")  # Galician at 0.37 among every language;
    # among the six, Portuguese at 0.51 and surely not English: the head reads both
    assert head.language("quiero morir") == "es" and head.language("morir") is None  # one word: the encoder's
    assert head.language("oh nice") is None and head.language("So do I!") is None
    assert head.language("Я больше не могу так жить, мне очень плохо") is None  # not a language it learnt


def test_the_language_head_names_risk_and_category():
    head = cm.Detector.load().language_head
    texts = ["llevo tres días sin comer nada, quiero bajar a 45 kilos antes del verano",
             "mon mari m'a encore frappée hier soir et il a dit qu'il allait me tuer si je parlais",
             "ho comprato una corda e ho scelto l'albero, domani la faccio finita",
             "hoje cortei os braços de novo no banheiro da escola",
             "morgen steche ich meinen Stiefvater ab, das Messer liegt schon bereit",
             "heute hab ich einen Apfelkuchen gebacken und meine Oma hat sich riesig gefreut"]
    p, cat = head.p_risk(texts)
    assert [cm.CATEGORIES[int(c)] for c in cat[:5]] == ["eating_disorder", "abuse", "suicide", "self_harm",
                                                          "harm_to_others"]
    assert min(p[:5]) >= head.checkin_threshold > p[5], p


def test_fit_language_head_needs_both_classes_in_both_sets():
    examples = [e for e in cm.load_examples() if e.kind == "language"]
    safe = [e for e in examples if not e.at_risk]
    with pytest.raises(ValueError, match="training set needs both at-risk and not-at-risk"):
        cm.fit_language_head(safe, examples)
    with pytest.raises(ValueError, match="development set needs both"):
        cm.fit_language_head(examples, safe[:10])


def test_unread_language_is_named_only_when_sure_and_not_read():
    assert languages.unread_language("Я больше не могу так жить, мне очень плохо") == "ru"
    assert languages.unread_language("ich kann nicht mehr, alles ist zu viel") is None  # German: read
    assert languages.unread_language("I had a long day at work today") is None
    assert languages.unread_language("ok") is None  # too short to tell


def test_shipped_detector_was_trained_on_the_shipped_labelled_set():
    """Editing the labelled set or the development set without retraining (``mascot safety train``) fails here."""
    det = cm.Detector.load()
    s = det.settings
    examples = cm.load_examples()
    assert s.data_digest == cm.examples_digest(examples)
    assert s.languages and s.examples == len(cm.model_examples(examples, s.languages)) == len(examples)
    all_dev = cm.load_examples(cm.DEV_FILES)
    dev = cm.model_examples(all_dev)
    assert s.dev["digest"] == cm.examples_digest(dev) and s.dev["examples"] == len(dev)
    dev_lang = [e for e in all_dev if e.kind == "language"]
    assert s.dev["languages"]["digest"] == cm.examples_digest(dev_lang) and len(dev_lang) >= 350
    assert 0 < s.checkin_threshold <= s.crisis_threshold < 1
    assert s.dev["recall_any"] >= s.dev["min_recall"] and s.dev["fp_crisis"] <= s.dev["max_crisis_fp"], s.dev
    assert len(det.vocabulary) == len(det.idf) and len(det.risk_coef) == 384 + len(det.vocabulary)
    assert s.fine_tune and s.adapter and (cm.DATA_DIR / s.adapter).is_file()
    assert hashlib.sha256((cm.DATA_DIR / s.adapter).read_bytes()).hexdigest() == s.adapter_sha256
    assert len(det.category_coef) == 5 and all(len(r) == len(det.risk_coef) for r in det.category_coef)
    head = det.language_head  # the other languages' head: every kind 'language' message, its own thresholds
    head_data = [e for e in examples + cm.load_examples(cm.LANGUAGE_FILES) if e.kind == "language"]
    assert head.data_digest == cm.examples_digest(head_data) and head.examples == len(head_data) >= 4800
    assert head.dev["digest"] == cm.examples_digest(dev_lang) and head.dev["examples"] == len(dev_lang)
    assert head.dev["recall_any"] >= head.dev["min_recall"] >= 0.95, head.dev
    assert head.dev["fp_crisis"] <= head.dev["max_crisis_fp"] and head.dev["fp_any"] < 0.05, head.dev
    assert 0 < head.checkin_threshold <= head.crisis_threshold < 1
    assert len(head.coef) == len(head.char_vocabulary) + len(head.word_vocabulary)
    assert len(head.char_idf) == len(head.char_vocabulary) and len(head.word_idf) == len(head.word_vocabulary)
    assert len(head.category_coef) == 5 and all(len(r) == len(head.word_vocabulary) for r in head.category_coef)
    assert head.dev["category_accuracy"] >= 0.95, head.dev  # the encoder's category head: 0.93 there


def test_train_fits_writes_atomically_and_reloads(tmp_path, monkeypatch):
    """A small real training run (a LoRA fine-tuned on MiniLM, scikit-learn): the detector file and its adapter
    reload to the same probabilities, thresholds come from the development set, the fine-tuned encoder is not the
    shared one, a changed adapter is refused, and a failed write leaves the old file."""
    import numpy as np

    examples = cm.load_examples()
    risk = [e for e in examples if e.kind == "language" and e.at_risk]
    safe = [e for e in examples if e.kind == "language" and not e.at_risk]
    other, other_dev = risk[:10] + safe[:10], risk[-10:] + safe[-10:]
    train = [e for e in examples if e.kind in ("explicit", "paraphrase", "idiom", "benign_sad")][:160] + other
    dev = [e for e in examples if e.kind in ("negation", "mention", "grief")][:60] + other_dev
    out = tmp_path / "det.json"
    det = cm.train(train, dev, out, settings=cm.DetectorSettings(epochs=2), min_recall=0.9, max_crisis_fp=0.1)
    again = cm.Detector.load(out)
    assert again.model_dump() == det.model_dump() and det.settings.examples == len(train)  # other languages too
    assert det.settings.dev["languages"]["examples"] == 20  # recorded, choosing no English threshold
    head = det.language_head  # ... and the language head's: fitted on the 20, thresholds from the other 20
    assert head.examples == 20 and head.dev["examples"] == 20 and head.dev["recall_any"] >= 0.95
    assert det.settings.adapter == "det.adapter.safetensors" and len(det.settings.adapter_sha256) == 64
    assert det.settings.dev["examples"] == len(dev) - 20 and det.settings.dev["recall_any"] >= 0.9
    clf = cm.CrisisClassifier(out)
    assert clf.encoder is not cm.shared_encoder()
    texts = ["I want to kill myself", "this traffic is killing me, lol"]
    p, cat = clf.p_risk(texts)
    assert p[0] > 0.5 > p[1] and cm.CATEGORIES[cat[0]] == "suicide"
    assert np.allclose(cm.CrisisClassifier(det).p_risk(texts)[0], p, atol=1e-5)  # as fitted == as reloaded
    pretrained = cm.shared_encoder().embed([cm.model_text(texts[0])])
    assert float((clf.encoder.embed([cm.model_text(texts[0])]) * pretrained).sum()) < 0.9999  # the LoRA is merged
    adapter = tmp_path / det.settings.adapter
    blob = adapter.read_bytes()
    adapter.write_bytes(blob[:-1] + bytes([blob[-1] ^ 0xFF]))
    with pytest.raises(ValueError, match="SHA-256 differs.*mascot safety train"):
        cm.CrisisClassifier(out)
    adapter.write_bytes(blob)
    before = out.read_bytes()

    def broken(*a, **kw):
        raise OSError("disk full")

    monkeypatch.setattr(cm.os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        det.model_copy(update={"risk_intercept": 9.0}).save(out)
    assert out.read_bytes() == before and sorted(f.name for f in tmp_path.iterdir()) == [
        "det.adapter.safetensors", "det.json"]
    with pytest.raises(ValueError, match="rebuild it with `mascot safety train`"):
        cm.Detector.load(tmp_path / "missing.json")


def test_labelled_set_covers_every_kind_with_provenance():
    examples = cm.load_examples()
    kinds = {(e.kind, e.at_risk) for e in examples}
    assert {k for k, r in kinds if r} == set(cm.RISK_KINDS)
    assert {k for k, r in kinds if not r} == set(cm.SAFE_KINDS)
    assert {e.category for e in examples} == set(cm.LABELS)
    for f in cm.TRAIN_FILES + cm.LANGUAGE_FILES:
        assert "Provenance: written by hand for this project" in f.read_text(encoding="utf-8")
    assert len(cm.LANGUAGE_FILES) == 15 and all("Read by the language head only" in f.read_text(encoding="utf-8")
                                                for f in cm.LANGUAGE_FILES)
    assert {e.kind for e in cm.load_examples(cm.LANGUAGE_FILES)} == {"language"}


def test_the_evaluate_table_and_the_detector_figures_come_from_one_count():
    """``mascot safety evaluate``'s table (:func:`mascot.cli.safety.evaluation_table`) and the detector's figures
    (:func:`cm.figures`) are one count (:func:`cm.tier_table`), each in its own published shape."""
    from mascot.cli.safety import evaluation_table

    E = cm.Example
    ex = [E("r1", "suicide", "paraphrase"), E("r2", "suicide", "paraphrase"), E("r3", "abuse", "explicit"),
          E("s1", "none", "idiom"), E("s2", "none", "idiom"), E("s3", "none", "benign_sad"),
          E("l1", "suicide", "language", "es"), E("l2", "none", "language", "fr")]
    p = [0.95, 0.6, 0.1, 0.7, 0.2, 0.99, 0.92, 0.3]
    tiers = [cm.tier_of(x, 0.9, 0.5) for x in p]
    assert tiers == ["crisis", "check_in", "none", "check_in", "none", "crisis", "crisis", "none"]
    table = evaluation_table(ex, tiers)
    assert list(table["kinds"]) == ["explicit", "language_risk", "paraphrase", "benign_sad", "idiom", "language_safe"]
    assert table["kinds"]["paraphrase"] == {"n": 2, "at_risk": True, "any": 2, "crisis": 1, "check_in": 1}
    assert table["kinds"]["idiom"] == {"n": 2, "at_risk": False, "any": 1, "crisis": 0, "check_in": 1}
    assert table["total"] == {"n_risk": 4, "n_safe": 4, "recall_any": 0.75, "recall_crisis": 0.5,
                              "lowest_kind_recall": 0.0, "fp_crisis": 0.25, "fp_check_in": 0.25}
    f = cm.figures(p, ex, 0.9, 0.5)
    assert {k: f[k] for k in ("recall_any", "recall_crisis", "fp_crisis", "fp_any")} == {
        "recall_any": 0.75, "recall_crisis": 0.5, "fp_crisis": 0.25, "fp_any": 0.5}
    assert list(f["kinds"]) == ["paraphrase", "explicit", "idiom", "benign_sad", "language_risk", "language_safe"]
    for kind, k in table["kinds"].items():
        assert f["kinds"][kind] == {"n": k["n"], "flagged_any": k["any"], "flagged_crisis": k["crisis"],
                                    "at_risk": k["at_risk"]}
    assert evaluation_table([], []) == {"kinds": {}, "total": {
        "n_risk": 0, "n_safe": 0, "recall_any": 0.0, "recall_crisis": 0.0, "lowest_kind_recall": 0.0,
        "fp_crisis": 0.0, "fp_check_in": 0.0}}


@pytest.mark.parametrize("text, rule", [
    ("my daughter's dance teacher wants her to stay late and keep it a secret from me", "grooming"),
    ("a guy she met online asked for a pic of herself with no top on", "grooming"),
    ("his tutor told him the sleepovers are their little secret", "grooming"),
    ("ok I'm signing off for good now. thanks for everything", "farewell_for_good"),
    ("I've written my own eulogy and put it in the drawer", "farewell_for_good"),
    ("the pills are lined up on the desk", "farewell_for_good"),
])
def test_grooming_and_farewell_rules(text, rule):
    """Rules written for a new writer's misses (secrecy, pictures or time without parents asked by an adult; final
    goodbyes)."""
    from mascot.gateway import risk_rules

    assert rule in [h.rule for h in risk_rules.detect(text)], risk_rules.detect(text)


@pytest.mark.parametrize("text", [
    "the coach says our surprise for the team is top secret until Saturday", "our teacher let us out early",
    "my coach has a secret recipe for protein pancakes",
    "my uncle and I went fishing, just the two of us", "logging off for the night, see you tomorrow",
    "I wrote the eulogy for my grandad's funeral", "the tablets are in the bathroom cabinet",
])
def test_grooming_and_farewell_rules_leave_look_alikes(text):
    from mascot.gateway import risk_rules

    assert not [h for h in risk_rules.detect(text) if h.rule in ("grooming", "farewell_for_good")]


@pytest.mark.parametrize("text", [
    "How do I write about it without details that could hurt someone?",
    "the railing is loose and it might hurt somebody",
    "honestly this week can go jump off a cliff", "my printer can kindly go jump in a lake",
])
def test_idioms_of_the_third_held_out_set_are_not_risk(text):
    """Found on the third held-out set after it was measured (so not held-out figures): a thing that could hurt
    someone is no threat, a day told to go jump off a cliff no plan."""
    from mascot.gateway import risk_rules

    assert risk_rules.detect(text) == []


def test_a_person_who_could_hurt_someone_or_would_jump_is_still_read():
    from mascot.gateway import risk_rules

    assert [h.rule for h in risk_rules.detect("I could hurt someone tonight")] == ["kill_person"]
    assert risk_rules.detect("I want to go jump off a cliff")


def test_packed_embeddings_equal_one_by_one_embeddings():
    """SentenceEncoder.embed_packed lays texts end to end under a block-diagonal mask: each text, short, long or over
    the 256-piece limit, gets the embedding it gets alone (cosine 1 to float rounding), in the caller's order, across
    several rows and passes; bad sizes are refused."""
    import numpy as np

    enc = cm.shared_encoder()
    texts = ["I want to go home now.", "ok", "We walked the dog along the river and it rained the whole way back. " * 8,
             "My week was long and tiring but I am fine.", "x " * 400, "Thank you."]
    alone = np.vstack([enc.embed([t]) for t in texts])
    for row_tokens, rows_per_pass in ((512, 8), (256, 1)):  # one pass; one row per pass (the long ones alone)
        packed = enc.embed_packed(texts, row_tokens=row_tokens, rows_per_pass=rows_per_pass)
        assert packed.shape == (len(texts), 384)
        assert np.allclose((packed * alone).sum(1), 1.0, atol=1e-4), (packed * alone).sum(1)
    assert enc.embed_packed([]).shape == (0, 384)
    with pytest.raises(ValueError, match="row_tokens must be >= 256"):
        enc.embed_packed(texts, row_tokens=100)


def test_other_languages_are_learnt_only_when_the_setting_says_so():
    examples = cm.load_examples()
    other = [e for e in examples if e.kind == "language"]
    assert {e.lang for e in other} == {"es", "fr", "de", "pt", "it"} and len(other) >= 800
    assert cm.model_examples(examples, languages=True) == examples
    assert [e for e in cm.model_examples(examples) if e.kind == "language"] == []
    assert cm.DetectorSettings().languages and not cm.DetectorSettings(languages=False).languages


@pytest.mark.parametrize("text, denied", [
    ("I would never kill myself, but I'm exhausted.", True), ("i'd never hurt myself", True),
    ("I won't end my life.", True), ("I'm not going to kill myself, I'm just tired", True),
    ("I will kill myself", False), ("I want to kill myself", False), ("I'm not going to do anything stupid", False),
    ("I never want to hurt myself again but I did last night", False)])
def test_a_denial_of_an_act_on_oneself_is_recognised(text, denied):
    assert risk_rules.denies(text) is denied


def test_a_denial_is_no_second_detector():
    """The act rule of a denial does not raise the model's check-in to a crisis; the model's own crisis tier stays."""
    hits = list(risk_rules.detect("I would never kill myself, but I'm exhausted."))
    assert hits and combine(hits, a(0.6), denied=True).tier == "check_in"
    assert combine(hits, a(0.6)).tier == "crisis"
    assert combine(hits, a(0.95), denied=True).tier == "crisis"
