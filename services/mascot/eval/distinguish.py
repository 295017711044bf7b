"""Persona distinguishability: can a plain text classifier tell the personas apart from their replies alone?

A bag-of-words classifier — TF-IDF of word 1-2-grams and of character 3-5-grams (``char_wb``), sublinear term
frequency, then multinomial logistic regression (scikit-learn) — is trained and tested by *k*-fold cross-validation
within one system's replies, with folds grouped by situation (``StratifiedGroupKFold``), so a reply is never
classified by a model that saw another reply to the same situation. The figure is the macro accuracy (scikit-learn's
``balanced_accuracy_score``: the mean over personas of the share of that persona's replies classified as it), against
chance 1/N for N personas, with a 95% percentile-bootstrap interval over situations (the out-of-fold predictions of
resampled situations; the classifier is not refitted).

It uses no persona card, no MiniLM and no detector: a system scores above chance only by sounding different per
persona, in any way at all — including ways nobody wants (a fixed opener per persona, which the opener-diversity
measure shows). Shuffled persona labels give chance; replies that each open with a persona-specific word give about 1.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

#: Folds of the cross-validation.
FOLDS = 5
#: A persona with fewer replies than this is left out (a class needs replies in most training folds).
MIN_PER_PERSONA = 10
#: Bootstrap resamples of the interval.
RESAMPLES = 1000


def _pipeline(seed: int) -> Any:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import FeatureUnion, make_pipeline

    features = FeatureUnion([
        ("word", TfidfVectorizer(analyzer="word", ngram_range=(1, 2), sublinear_tf=True, lowercase=True)),
        ("char", TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 5), sublinear_tf=True, lowercase=True)),
    ])
    return make_pipeline(features, LogisticRegression(C=10.0, max_iter=2000, random_state=seed))


def distinguishability(texts: Sequence[str], labels: Sequence[str], groups: Sequence[str], *, folds: int = FOLDS,
                       seed: int = 0, min_per_label: int = MIN_PER_PERSONA) -> dict[str, Any]:
    """Cross-validated macro accuracy of a bag-of-words persona classifier over one system's replies.

    Args:
        texts: Replies (one per item).
        labels: The persona that wrote each reply.
        groups: The situation of each reply (folds never split a situation).
        folds: Number of folds (fewer when there are fewer situations).
        seed: Seed of the fold assignment, the classifier and the bootstrap.
        min_per_label: Personas with fewer replies are left out (named in ``left_out``).

    Returns:
        ``{"n", "personas", "left_out", "folds", "accuracy", "lo", "hi", "chance", "per_persona": {id: recall},
        "confusion": {"labels", "matrix"}}`` (rounded to 4 decimals); ``accuracy`` is None (with a ``reason``) when
        fewer than two personas or two situations remain, or when scikit-learn cannot fit a fold.

    Raises:
        ValueError: the three sequences differ in length.
    """
    import numpy as np
    from sklearn.metrics import balanced_accuracy_score, confusion_matrix
    from sklearn.model_selection import StratifiedGroupKFold, cross_val_predict

    if not len(texts) == len(labels) == len(groups):
        raise ValueError(f"texts, labels and groups differ in length: {len(texts)}, {len(labels)}, {len(groups)}")
    counts = Counter(labels)
    keep_labels = sorted(p for p, n in counts.items() if n >= min_per_label)
    left_out = sorted(p for p in counts if p not in keep_labels)
    idx = [i for i, lab in enumerate(labels) if lab in keep_labels]
    out: dict[str, Any] = {"n": len(idx), "personas": keep_labels, "left_out": left_out, "folds": 0,
                           "accuracy": None, "lo": None, "hi": None,
                           "chance": round(1.0 / len(keep_labels), 4) if keep_labels else None,
                           "per_persona": {}, "confusion": {"labels": keep_labels, "matrix": []}}
    x = [texts[i] for i in idx]
    y = np.asarray([labels[i] for i in idx])
    g = np.asarray([groups[i] for i in idx])
    n_groups = len(set(g.tolist()))
    if len(keep_labels) < 2 or n_groups < 2:
        out["reason"] = (f"needs 2+ personas with {min_per_label}+ replies and 2+ situations; "
                         f"got {len(keep_labels)} and {n_groups}")
        return out
    k = min(folds, n_groups)
    cv = StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed)
    try:
        pred = cross_val_predict(_pipeline(seed), x, y, groups=g, cv=cv)
    except ValueError as e:  # e.g. a training fold left with one persona, or replies without a single word
        out["reason"] = f"the classifier could not be fitted: {e}"
        return out
    acc = float(balanced_accuracy_score(y, pred))
    # percentile bootstrap over situations of the out-of-fold predictions
    rng = np.random.default_rng(seed)
    uniq = np.unique(g)
    members = {s: np.flatnonzero(g == s) for s in uniq}
    stats = []
    for _ in range(RESAMPLES):
        pick = np.concatenate([members[s] for s in rng.choice(uniq, size=len(uniq), replace=True)])
        if len(set(y[pick].tolist())) < 2:
            continue
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a resample may miss a persona's predictions
            stats.append(balanced_accuracy_score(y[pick], pred[pick]))
    lo, hi = (float(np.percentile(stats, 2.5)), float(np.percentile(stats, 97.5))) if stats else (None, None)
    cm = confusion_matrix(y, pred, labels=keep_labels)
    recall = {p: round(float(cm[i, i] / cm[i].sum()), 4) if cm[i].sum() else None for i, p in enumerate(keep_labels)}
    out.update({"folds": k, "accuracy": round(acc, 4), "lo": None if lo is None else round(lo, 4),
                "hi": None if hi is None else round(hi, 4), "per_persona": recall,
                "confusion": {"labels": keep_labels, "matrix": cm.tolist()}})
    return out


def opener_diversity(texts_by_persona: dict[str, Sequence[str]], n_words: int = 4) -> dict[str, Any]:
    """Share of each persona's replies that open with its most common first ``n_words`` words (lower is more varied).

    Returns:
        ``{"per_persona": {id: {"n", "top_share", "opener"}}, "max_top_share", "worst"}``: ``top_share`` in [0, 1]
        (None without replies), ``opener`` the most common opener; ``max_top_share`` over personas and the persona it
        belongs to (``worst``).
    """
    from mascot.core.moves import opener

    per: dict[str, dict[str, Any]] = {}
    for pid, texts in texts_by_persona.items():
        ops = [opener(t, n_words) for t in texts if t.strip()]
        if not ops:
            per[pid] = {"n": 0, "top_share": None, "opener": ""}
            continue
        top, count = Counter(ops).most_common(1)[0]
        per[pid] = {"n": len(ops), "top_share": round(count / len(ops), 4), "opener": top}
    scored = [(v["top_share"], pid) for pid, v in per.items() if v["top_share"] is not None]
    worst = max(scored) if scored else (None, None)
    return {"per_persona": per, "max_top_share": worst[0], "worst": worst[1]}
