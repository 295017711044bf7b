"""Build a tiny random-init Qwen3 and a byte-level BPE tokenizer trained locally.

Nothing is downloaded. The model is random: its words are not language, but every code path
(chat template, ``<think>`` tags, LoRA, batching, structured output) is the real one.
"""

from __future__ import annotations

from pathlib import Path

from mascot.core.personas import SHIPPED_DIR

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: Marker file written into every tiny model directory: its weights are random.
TINY_MARKER = "mascot_tiny.json"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]

_EXTRA_CORPUS = [
    "Agent: Action: Tone: User: Director: You are the director of a group of companion agents.",
    "I'm here with you. That sounds really hard. What is one small step you could take today?",
    "Tell me more about what happened. You showed real courage. Let's plan the next step together.",
    "The meeting discussed the budget, the schedule and the design. Decision: Rationale: Owner: Deadline:",
    "Calm and empathetic. Curious and thoughtful. Warm and upbeat. Practical and encouraging.",
    "I feel so anxious about my exam tomorrow. My dog died last week and I miss him so much.",
    "We agreed to ship the remote control prototype next month; marketing owns the survey.",
]


def _card_text(path: Path) -> str:
    """A persona file's text without comment lines, its cards' ``moves:`` blocks (detector settings, never words a
    speaker says) and their ``tone_words:`` lines (the director's Tone vocabulary), so that editing any of them leaves
    the tokenizer, and every tiny-model output, as it was."""
    kept, moves_indent = [], None
    for ln in path.read_text(encoding="utf-8").splitlines(keepends=True):
        indent = len(ln) - len(ln.lstrip())
        if moves_indent is not None and (indent > moves_indent or not ln.strip()):
            continue  # inside a moves block
        moves_indent = None
        if ln.lstrip().startswith(("#", "tone_words:")):
            continue
        if ln.lstrip().startswith("moves:"):
            moves_indent = indent
            continue
        kept.append(ln)
    return "".join(kept)


def training_corpus() -> list[str]:
    """Texts the tiny tokenizer is trained on: the shipped persona files (:func:`_card_text`: no comment lines, no
    ``moves:`` blocks) plus a few prompt phrases."""
    return [_card_text(SHIPPED_DIR / f) for f in ("support.yaml", "meeting.yaml")] + _EXTRA_CORPUS * 4


def build_tiny_qwen3(out_dir: str | Path, *, vocab_size: int = 2000, hidden_size: int = 64,
                     num_layers: int = 2, max_position_embeddings: int = 8192, seed: int = 0) -> Path:
    """Write a tiny random-init ``Qwen3ForCausalLM`` and its tokenizer to ``out_dir``.

    Args:
        out_dir: Target directory (created). Loads back with the ``Auto*`` classes.
        vocab_size: BPE target size; a small corpus yields fewer merges, which is expected.
        hidden_size: Model width; ``head_dim`` is fixed to 32 (vLLM-CPU refuses 16).
        num_layers: Decoder layers.
        max_position_embeddings: Context window in tokens.
        seed: torch seed of the random init, so that the same call gives the same weights.

    Returns:
        ``out_dir`` as a Path.
    """
    import torch
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(training_corpus(), trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    # Qwen3 keeps <think>/</think> as non-special added tokens; TRL decodes with skip_special_tokens=True.
    bpe.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<think>", "</think>")])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|pad|>",
                                  chat_template=CHAT_TEMPLATE)
    heads = max(2, hidden_size // 32)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
                      num_hidden_layers=num_layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                      head_dim=32, tie_word_embeddings=True, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, bos_token_id=None,
                      max_position_embeddings=max_position_embeddings)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / TINY_MARKER).write_text('{"trained": false, "name": "tiny-random-qwen3"}\n', encoding="utf-8")
    return out


def is_tiny(model: str | Path) -> bool:
    """True for a model directory built by :func:`build_tiny_qwen3` (random weights, not trained)."""
    return bool(model) and (Path(model) / TINY_MARKER).is_file()


def ensure_tiny(tiny_dir: str | Path) -> Path:
    """The tiny random Qwen3 at ``tiny_dir``, built there on first use (in a temporary sibling, then renamed)."""
    tiny = Path(tiny_dir)
    if not (tiny / "config.json").is_file() or not (tiny / "tokenizer.json").is_file():
        tmp = tiny.with_name(tiny.name + ".tmp")
        build_tiny_qwen3(tmp)
        if not tiny.exists():
            tmp.replace(tiny)
    return tiny
