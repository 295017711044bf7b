"""Fixed defect detectors for delivered dialogue: what a user must never be shown, measured on transcripts.

These definitions are fixed, on purpose independent of the reply-check settings (the ``guard`` config section), so
that a looser guard shows up as defects here instead of moving the yardstick with it:

- echo: an agent reply shares a word 8-gram with its persona's system prompt, its persona card or its directive;
- loop: a word 4-gram occurs 3 or more times in one reply, a word 3-gram three times (a refrain), three sentences
  on one frame (the same first two words), or a line (or sentence) of the reply repeats;
- near-duplicate: character 5-gram Jaccard similarity >= 0.8 between a reply and any earlier turn of the
  conversation (user turns included);
- empty: no word;
- clean ending: the reply ends with . ! ? or an ellipsis (optionally followed by closing quotes, brackets or an
  emoji), so it was neither cut mid-sentence nor mid-word;
- degenerate directive: a ``fallback`` directive, an empty Action or Tone, an Action of fewer than 4 words besides
  persona names, a Tone that is only a persona name, or an Action with Jaccard >= 0.8 to the previous directive's.

Input: ``transcripts.jsonl`` lines as ``mascot run`` writes them (see docs/commands.md).
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from typing import Sequence

from mascot.core.defects import ECHO_NGRAM, LOOP_COUNT, LOOP_NGRAM, card_source_text, is_echo, is_loop  # noqa: F401
from mascot.core.guard import char_ngrams, jaccard, words
from mascot.app.runjob import percentile

NEAR_DUPLICATE = 0.8
_CLEAN_END_RE = re.compile(r"([.!?…][\"'”’)\]]*|[\U0001F300-\U0001FAFF\u2600-\u27BF]\ufe0f?)\s*$")


def is_near_duplicate(reply: str, earlier: Sequence[str]) -> bool:
    """True when ``reply`` has character 5-gram Jaccard >= 0.8 with any earlier turn."""
    g = char_ngrams(reply)
    return bool(g) and any(jaccard(g, char_ngrams(e)) >= NEAR_DUPLICATE for e in earlier if e.strip())


def ends_cleanly(reply: str) -> bool:
    """True when ``reply`` ends on a sentence end (see the module docstring)."""
    return bool(_CLEAN_END_RE.search(reply.strip()))


def is_degenerate_directive(directive: dict, persona_names: Sequence[str], previous_action: str = "") -> bool:
    """True for a degenerate directive (see the module docstring). ``directive``: the transcript's dict."""
    if directive.get("source") == "fallback":
        return True
    action, tone = directive.get("action", "").strip(), directive.get("tone", "").strip()
    if not action or not tone:
        return True
    name_words = {w for n in persona_names for w in words(n)} | {"the"}
    if len([w for w in words(action) if w not in name_words]) < 4:
        return True
    if not [w for w in words(tone) if w not in name_words]:
        return True
    return bool(previous_action) and jaccard(char_ngrams(action), char_ngrams(previous_action)) >= NEAR_DUPLICATE


def echo_sources(cards: Sequence) -> dict[str, list[str]]:
    """``{persona_id: [system prompt, card text]}``: the texts a persona's reply must not copy 8 words of (with the
    turn's directive, added per turn). ``cards``: :class:`~mascot.core.personas.PersonaCard` objects."""
    from mascot.speaker.prompts import persona_system_prompt

    return {c.id: [persona_system_prompt(c), card_source_text(c)] for c in cards}


def analyse(lines: Sequence[dict], prompts: dict[str, list[str]], persona_names: dict[str, str]) -> dict:
    """Defect figures over transcripts.

    Args:
        lines: ``transcripts.jsonl`` objects.
        prompts: ``{persona_id: [system prompt, card text]}``; each turn's directive is added as a source.
        persona_names: ``{persona_id: display name}``.

    Returns:
        Counts and rates: ``agent_turns``, ``echoes``, ``loops``, ``near_duplicates``, ``empty``,
        ``clean_endings`` (share of agent replies), ``degenerate_directives`` (share of decisions),
        ``early_round_ends`` (share of conversations), ``regenerations_per_turn``, ``persona_shares``,
        ``median_words``, ``turn_latency_seconds`` {p50, p95}, ``first_delta_seconds`` {p50, p95},
        ``safety_turns``, ``user_defects`` (echo/loop/near-duplicate counts of simulated-user turns), and
        ``examples`` (the first delivered defects, for reading).
    """
    agent = echoes = loops = dups = empty = clean = degenerate = regens = safety = 0
    user_defects: Counter = Counter()
    shares: Counter = Counter()
    lat: list[float] = []
    first: list[float] = []
    n_words: list[int] = []
    examples: list[dict] = []
    names = list(persona_names.values())
    for ln in lines:
        earlier: list[str] = []
        prev_action = ""
        for t in ln["turns"]:
            text = t["text"]
            regens += len(t.get("rejections", []))
            if t["role"] == "agent":
                agent += 1
                shares[t["persona_id"]] += 1
                safety += 1 if t.get("safety") else 0
                d = t.get("directive") or {}
                sources = [*prompts.get(t["persona_id"], []), d.get("action", ""), d.get("tone", "")]
                found = {"echo": not t.get("safety") and is_echo(text, sources), "loop": is_loop(text),
                         "near_duplicate": is_near_duplicate(text, earlier), "empty": not words(text)}
                echoes += found["echo"]
                loops += found["loop"]
                dups += found["near_duplicate"]
                empty += found["empty"]
                clean += ends_cleanly(text)
                if d.get("source") != "safety":
                    degenerate += is_degenerate_directive(d, names, prev_action)
                    prev_action = d.get("action", "")
                lat.append(t.get("latency_seconds", 0.0))
                first.append(t.get("director_seconds", 0.0) + t.get("first_delta_seconds", 0.0))
                n_words.append(len(words(text)))
                for k, v in found.items():
                    if v and len(examples) < 10:
                        examples.append({"defect": k, "conversation_id": ln["conversation_id"],
                                         "index": t["index"], "text": text[:300]})
            else:
                user_defects["loop"] += is_loop(text)
                user_defects["near_duplicate"] += is_near_duplicate(text, earlier)
            earlier.append(text)
    conv = len(lines)
    return {
        "conversations": conv, "agent_turns": agent, "echoes": echoes, "loops": loops, "near_duplicates": dups,
        "empty": empty, "clean_endings": round(clean / agent, 4) if agent else 0.0,
        "degenerate_directives": round(degenerate / agent, 4) if agent else 0.0,
        "early_round_ends": round(sum(1 for ln in lines if ln.get("end_reason") == "empty_replies") / conv, 4)
        if conv else 0.0,
        "regenerations_per_turn": round(regens / max(1, sum(len(ln["turns"]) for ln in lines)), 4),
        "persona_shares": {k: round(v / agent, 4) for k, v in sorted(shares.items())} if agent else {},
        "median_words": statistics.median(n_words) if n_words else 0,
        "turn_latency_seconds": {"p50": round(percentile(sorted(lat), 50), 3),
                                 "p95": round(percentile(sorted(lat), 95), 3)},
        "first_delta_seconds": {"p50": round(percentile(sorted(first), 50), 3),
                                "p95": round(percentile(sorted(first), 95), 3)},
        "safety_turns": safety, "user_defects": dict(user_defects), "examples": examples,
    }
