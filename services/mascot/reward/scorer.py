"""Score replies with a sequence-classification reward model.

Inputs are built by :func:`mascot.core.formatting.reward_text` plus the tokenizer's EOS (as TRL's
``RewardTrainer`` appends it), so serving scores exactly what training saw. The model's metadata file
``mascot_reward.json`` (written by the phase-1 reward-model Job, or by :func:`build_tiny_reward_model`)
holds the standardisation statistics: ẑ = (r − μ) / σ with μ, σ from the RM's held-out pairs.

Padding: the pad token is set explicitly (from the tokenizer, else the model config; never guessed), and
left-padded batches get explicit ``position_ids`` (cumulative attention mask − 1), so a reply scores the same
alone and in a padded batch, with left or right padding.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from mascot.core import formatting
from mascot.core.files import atomic_write_text
from mascot.core.dialogue import HistoryTurn
from mascot.core.personas import PersonaCard

log = logging.getLogger(__name__)
METADATA_FILE = "mascot_reward.json"


@dataclass(frozen=True)
class RewardMetadata:
    """What is stored with a reward model.

    Attributes:
        name: Model name and version (e.g. ``persona-rm--v3``).
        mu: Standardisation mean of raw scores.
        sigma: Standardisation standard deviation (> 0).
        trained: False for a random-init model.
        format_version: :data:`mascot.core.formatting.FORMAT_VERSION` the model was trained with.
    """

    name: str
    mu: float = 0.0
    sigma: float = 1.0
    trained: bool = True
    format_version: str = formatting.FORMAT_VERSION


def read_metadata(model_dir: str | Path) -> RewardMetadata:
    """Read ``mascot_reward.json``; a model without one gets μ 0, σ 1 and its directory name.

    Raises:
        ValueError: σ is not positive, or the file is not valid JSON.
    """
    p = Path(model_dir) / METADATA_FILE
    if not p.is_file():
        log.warning("reward model %s has no %s: scores are not standardised (mu 0, sigma 1)", model_dir, METADATA_FILE)
        return RewardMetadata(name=Path(model_dir).name)
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e.msg})") from None
    meta = RewardMetadata(name=str(d.get("name", Path(model_dir).name)), mu=float(d.get("mu", 0.0)),
                          sigma=float(d.get("sigma", 1.0)), trained=bool(d.get("trained", True)),
                          format_version=str(d.get("format_version", formatting.FORMAT_VERSION)))
    if not meta.sigma > 0:
        raise ValueError(f"{p}: sigma must be > 0, got {meta.sigma}")
    if meta.format_version != formatting.FORMAT_VERSION:
        log.warning("reward model %s was trained with input format %s, serving uses %s", model_dir,
                    meta.format_version, formatting.FORMAT_VERSION)
    return meta


def write_metadata(model_dir: str | Path, meta: RewardMetadata) -> None:
    """Write ``mascot_reward.json`` atomically."""
    atomic_write_text(Path(model_dir) / METADATA_FILE, json.dumps(meta.__dict__, indent=2) + "\n")


class RewardScorer:
    """A loaded reward model.

    Args:
        model_dir: Directory of an ``AutoModelForSequenceClassification`` with ``num_labels=1`` and its tokenizer.
        max_length: Most tokens per input; longer inputs lose their oldest context first.
        batch_size: Forward micro-batch size.
        padding_side: ``"left"`` or ``"right"``.

    Raises:
        ValueError: the model has more than one output, or no pad token is defined.
    """

    def __init__(self, model_dir: str | Path, max_length: int = 2048, batch_size: int = 8,
                 padding_side: str = "right") -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.model_dir = str(model_dir)
        self.meta = read_metadata(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.model = AutoModelForSequenceClassification.from_pretrained(self.model_dir, dtype=torch.float32)
        if self.model.config.num_labels != 1:
            raise ValueError(f"reward model {model_dir} has {self.model.config.num_labels} outputs; a reward model "
                             "has num_labels=1")
        if self.tokenizer.pad_token is None:
            pid = self.model.config.pad_token_id
            if pid is None:
                raise ValueError(f"reward model {model_dir} defines no pad token; set pad_token in its tokenizer")
            self.tokenizer.pad_token = self.tokenizer.convert_ids_to_tokens(pid)
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.eval()
        self.max_length, self.batch_size, self.padding_side = max_length, batch_size, padding_side
        self._lock = threading.Lock()

    @property
    def eos_token(self) -> str | None:
        """The tokenizer's EOS token appended to every input."""
        return self.tokenizer.eos_token

    def build_inputs(self, card: PersonaCard, history: Sequence[HistoryTurn], replies: Sequence[str],
                     context: Sequence[tuple[str, str]] = (), names: Mapping[str, str] | None = None
                     ) -> list[tuple[str, bool]]:
        """``(text, truncated)`` per reply (:func:`formatting.reward_model_text`: reward text fitted to ``max_length``,
        plus EOS).

        Raises:
            ValueError: the card and a reply alone do not fit ``max_length``.
        """
        return [formatting.reward_model_text(self.tokenizer, self.max_length, card, history, r, context=context,
                                             names=names) for r in replies]

    def build_group_inputs(self, cards: Sequence[PersonaCard], history: Sequence[HistoryTurn],
                           blocks: Sequence[Sequence[HistoryTurn]], context: Sequence[tuple[str, str]] = ()
                           ) -> list[tuple[str, bool]]:
        """``(text, truncated)`` per N-turn block for a group reward model
        (:func:`formatting.group_reward_model_text`).

        Raises:
            ValueError: the roster and a block alone do not fit ``max_length``.
        """
        return [formatting.group_reward_model_text(self.tokenizer, self.max_length, cards, history, b, context)
                for b in blocks]

    def score_texts(self, texts: Sequence[str]) -> list[float]:
        """Raw scores r for already formatted inputs, in order. Blocking (run it in a thread from async code).

        Shapes: each micro-batch is tokenized to ``[b, seq]`` (padded to its longest, at most ``max_length``);
        the model returns logits ``[b, 1]``.
        """
        import torch

        scores: list[float] = []
        with self._lock, torch.no_grad():
            for i in range(0, len(texts), self.batch_size):
                enc = self.tokenizer(list(texts[i:i + self.batch_size]), padding=True, truncation=True,
                                     max_length=self.max_length, return_tensors="pt",
                                     padding_side=self.padding_side)
                mask = enc["attention_mask"]
                pos = (mask.cumsum(-1) - 1).clamp(min=0)
                logits = self.model(input_ids=enc["input_ids"], attention_mask=mask, position_ids=pos).logits
                scores += [float(x) for x in logits[:, 0]]
        return scores

    def standardize(self, raw: float) -> float:
        """ẑ = (r − μ) / σ."""
        return (raw - self.meta.mu) / self.meta.sigma


def build_tiny_reward_model(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny random-init ``Qwen3ForSequenceClassification`` reward model (untrained) to ``out_dir``.

    μ and σ are measured on a small calibration set (the shipped support personas × a few stock replies), so
    standardised scores have unit scale. Built in a temporary folder and renamed: a crash leaves nothing.

    Returns:
        ``out_dir`` as a Path.
    """
    import statistics

    import torch
    from transformers import AutoModelForSequenceClassification

    from mascot.core.engine.tiny import _EXTRA_CORPUS, build_tiny_qwen3
    from mascot.core.personas import PersonaCatalog

    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + ".tmp"))
    try:
        build_tiny_qwen3(tmp / "lm", seed=seed)
        torch.manual_seed(seed + 1)
        model = AutoModelForSequenceClassification.from_pretrained(tmp / "lm", num_labels=1)
        model.save_pretrained(tmp / "rm")
        for f in (tmp / "lm").iterdir():
            if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
                shutil.copy(f, tmp / "rm" / f.name)
        write_metadata(tmp / "rm", RewardMetadata(name="tiny-random-rm", trained=False))
        scorer = RewardScorer(tmp / "rm", max_length=512)
        catalog = PersonaCatalog.load()
        texts = [t for card in catalog.in_set("support") for t, _ in
                 scorer.build_inputs(card, [HistoryTurn("user", _EXTRA_CORPUS[5])], _EXTRA_CORPUS[:3])]
        raw = scorer.score_texts(texts)
        write_metadata(tmp / "rm", RewardMetadata(name="tiny-random-rm", mu=statistics.fmean(raw),
                                                  sigma=statistics.pstdev(raw) or 1.0, trained=False))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp / "rm", out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def resolve_reward_model(model: str, tiny_dir: str | Path) -> str:
    """``model`` if given, else the tiny random reward model at ``tiny_dir`` (built on first use)."""
    if model:
        return model
    tiny = Path(tiny_dir)
    if not (tiny / METADATA_FILE).is_file():
        build_tiny_reward_model(tiny)
    return str(tiny)
