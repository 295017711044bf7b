"""Stage ``sft_data`` of phase 1: the SFT base policy's data, sampled and filtered by the card's moves.

The paper starts GRPO from an SFT policy; we have no human SFT set, so this stage builds one from the base model by
rejection sampling (docs/method.md, "Where we deviate"). For each training situation and persona it samples a pool
of candidate replies at a few contexts:

* **first reply**: the user's opening message only;
* **mid-dialogue** (``sft_data.mid_dialogue_share`` of the situations): the opening, then another persona's kept
  first reply to it, so the persona answers as the second agent, as serving asks it to.

Each context carries a directive: the fallback directive or an Action and Tone drawn from the director's vocabulary
(:data:`ACTIONS`, :data:`TONES`; "Gentle and calm" the most common, as the director writes it). Of the
``k_teacher + k_plain`` candidates of a context, ``k_teacher`` are sampled under the **teacher prompt** (the serving
prompt plus the persona's move hint, and two example exchanges from ``teacher_hints.yaml`` as earlier chat
turns: :func:`teacher_messages`) and ``k_plain`` under the
plain serving prompt. Every candidate goes through serving's reply checks (:func:`mascot.speaker.reply.guarded_reply`;
the hint and examples count as prompt text a reply may not echo).

A candidate is **eligible** when serving would deliver it, it complies with the card's moves (a required move, no
forbidden one: :func:`mascot.core.moves.assess`) and it fits the card's ``max_answer_words``. Of a context's eligible
candidates the best ``keep`` are kept (:func:`select`: more of the user's content words first, a plain-prompt
candidate before a teacher one on ties) under an opener cap: no four-word opener may take more than
``max_opener_share`` of a persona's kept replies, so the SFT policy does not learn one stock phrase.

Each kept reply becomes one SFT row rendered with the **plain serving prompt** of its context (card, directive,
history exactly as :func:`mascot.speaker.prompts.build_persona_messages` builds it), so the adapter learns to make
the move without the hint. Outputs in ``OUT/sft_data/``: ``pool.jsonl`` (every context's candidates with their
verdicts), ``rows.jsonl`` (the SFT data format of :mod:`mascot_training.persona.sft`) and the manifest (pass rates
by prompt and persona, rows kept, opener shares). Contexts are appended to the partial directory as they finish, so a
killed stage resumes where it stopped.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import yaml

from mascot.core.context import fit_history
from mascot.core.dialogue import FALLBACK_ACTION, history_from_dicts
from mascot.core.engine import SamplingParams
from mascot.core.files import append_jsonl, read_jsonl, write_jsonl
from mascot.core.guard import GuardSettings, words
from mascot.core.moves import assess, opener, shared_content_words
from mascot.core.personas import PersonaCard, PersonaCatalog
from mascot.speaker.prompts import build_persona_messages, stop_strings
from mascot.speaker.reply import RetryPolicy, guarded_reply, persona_reply_context, persona_text_filter
from mascot_training.common.config import active_personas
from mascot_training.common.data import training_situations
from mascot_training.common.manifest import digest_obj, digest_path, is_done, read_manifest, stage_dir
from mascot_training.common.progress import StepProgress

STAGE = "sft_data"
#: The bundled teacher hints (``personas: {id: {hint, examples: [{user, reply}]}}``).
DEFAULT_HINTS = Path(__file__).with_name("teacher_hints.yaml")

#: Director Actions a speaker is trained under (in the director's style: an imperative sentence about what the
#: person said). Mixed with the fallback directive; the same vocabulary for every persona, as serving's director
#: writes "Acknowledge ..." for every persona alike.
ACTIONS = (
    "Acknowledge what the person just shared and respond in your role.",
    "Acknowledge how the person feels about what happened.",
    "Respond to what the person just said about their situation.",
    "Help the person with what they just described.",
    "Stay with what the person is going through right now.",
    "Ask the person about what happened.",
    "Encourage the person about what they shared.",
    "Help the person think about what this means to them.",
    "Offer the person a small next step.",
    "Recognise what the person did in this situation.",
)
#: Director Tones, "Gentle and calm" weighted as the untrained director writes it (most served directives).
TONES = ("Gentle and calm", "Gentle and calm", "Gentle and calm", "Warm and attentive", "Calm and empathetic",
         "Curious and thoughtful", "Practical and encouraging", "Warm and upbeat", "Kind and supportive",
         "Calm and steady")


@dataclass(frozen=True)
class TeacherHint:
    """One persona's teacher prompt parts: ``hint`` (one paragraph), ``examples`` ((user message, reply) pairs) and
    ``shots``, how many of the examples a teacher prompt shows (1-8)."""

    hint: str
    examples: tuple[tuple[str, str], ...]
    shots: int = 2


def load_hints(path: str | Path | None = None) -> dict[str, TeacherHint]:
    """Read a teacher hints file (``personas: {id: {hint: str, examples: [{user, reply}, ...], shots: int}}``;
    ``shots``, the examples a teacher prompt shows, defaults to 2).

    Raises:
        ValueError: unreadable file, bad YAML or a malformed entry (the message names the file and the persona).
    """
    p = Path(path) if path else DEFAULT_HINTS
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ValueError(f"{p}: cannot read the teacher hints ({e})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("personas", {}), dict):
        raise ValueError(f"{p}: expected a mapping with a 'personas' mapping")
    out = {}
    for pid, entry in (raw.get("personas") or {}).items():
        if not isinstance(entry, dict) or not isinstance(entry.get("hint"), str) or not entry["hint"].strip():
            raise ValueError(f"{p}: persona {pid!r} needs a non-empty 'hint'")
        exs = entry.get("examples") or []
        if not isinstance(exs, list) or not all(isinstance(e, dict) and isinstance(e.get("user"), str)
                                                and isinstance(e.get("reply"), str) for e in exs):
            raise ValueError(f"{p}: persona {pid!r}: 'examples' must be a list of {{user, reply}} strings")
        shots = entry.get("shots", 2)
        if isinstance(shots, bool) or not isinstance(shots, int) or not 1 <= shots <= 8 or shots > max(1, len(exs)):
            raise ValueError(f"{p}: persona {pid!r}: 'shots' must be a whole number from 1 to 8 and at most the "
                             f"{len(exs)} examples given, not {shots!r}")
        out[str(pid)] = TeacherHint(" ".join(entry["hint"].split()),
                                    tuple((" ".join(e["user"].split()), " ".join(e["reply"].split())) for e in exs),
                                    shots)
    return out


def _unit(*parts: object) -> float:
    """A fixed number in [0, 1) from ``parts`` (SHA-256): the stage's choices do not depend on run order."""
    h = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def choose_directive(card: PersonaCard, key: str, fallback_share: float) -> tuple[str, str]:
    """``(action, tone)`` of the context ``key``: the fallback directive with the card's default tone in about
    ``fallback_share`` of the contexts, else an Action of :data:`ACTIONS` and a Tone of :data:`TONES`."""
    if _unit(key, "fallback") < fallback_share:
        return FALLBACK_ACTION, card.default_tone
    return (ACTIONS[int(_unit(key, "action") * len(ACTIONS))], TONES[int(_unit(key, "tone") * len(TONES))])


def teacher_messages(plain: list[dict], hint: TeacherHint, key: str) -> list[dict]:
    """The teacher prompt: the plain serving messages ``plain`` with the hint appended to the system text and
    ``hint.shots`` of the hint's example exchanges (chosen by ``key``, so contexts see different ones) inserted as
    earlier user / assistant turns before the conversation (a small chat model follows the form of its own earlier
    turns far more closely than a description of it; the Action Guide's eligible rate went from 0.17 to 0.40 with
    four shown instead of two, on 16 training contexts x 3 candidates)."""
    exs = sorted(hint.examples, key=lambda e: _unit(key, e[0]))[:hint.shots]
    shots = [m for u, r in exs for m in ({"role": "user", "content": u}, {"role": "assistant", "content": r})]
    return [{"role": "system", "content": f"{plain[0]['content']}\n\n{hint.hint}"}, *shots, *plain[1:]]


def eligible(card: PersonaCard, text: str, user: str, require_moves: bool = True) -> tuple[bool, str]:
    """Whether a delivered candidate may become an SFT row: ``(ok, why_not)``; ``why_not`` is ``empty``,
    ``too_long`` (over the card's ``max_answer_words``), ``no_required_move``, ``forbidden:<detectors>`` or "".
    ``require_moves`` False (or a card without moves) checks only the text and its length."""
    if not text.strip():
        return False, "empty"
    if len(text.split()) > card.max_answer_words:
        return False, "too_long"
    if card.moves is None or not require_moves:
        return True, ""
    v = assess(card.moves, text, user)
    if v.forbidden:
        return False, "forbidden:" + ",".join(v.forbidden)
    if not v.required:
        return False, "no_required_move"
    return True, ""


def select(groups: Sequence[dict], keep: int, max_opener_share: float) -> list[tuple[int, int]]:
    """The kept candidates of ``groups`` (pool rows in order): ``[(group index, candidate index)]``.

    Per group, its eligible candidates are ranked by the user's content words they reuse (at most 3 count), then a
    plain-prompt candidate before a teacher one, then candidate order; the best ``keep`` with distinct openers are
    kept, skipping one whose four-word opener already holds ``max_opener_share`` of its persona's expected kept
    replies (``keep`` x that persona's groups; at least 2 of each opener are always allowed).
    """
    per_persona = collections.Counter(g["persona_id"] for g in groups)
    used: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    out = []
    for gi, g in enumerate(groups):
        cap = max(2, int(max_opener_share * keep * per_persona[g["persona_id"]]))
        user = g["user"]
        ranked = sorted((i for i, c in enumerate(g["candidates"]) if c["eligible"]),
                        key=lambda i: (-min(3, len(shared_content_words(g["candidates"][i]["text"], user))),
                                       g["candidates"][i]["prompt"] != "plain", i))
        taken, openers = 0, set()
        for i in ranked:
            op = opener(g["candidates"][i]["text"])
            if op in openers or used[g["persona_id"]][op] >= cap:
                continue
            out.append((gi, i))
            openers.add(op)
            used[g["persona_id"]][op] += 1
            taken += 1
            if taken >= keep:
                break
    return out


def _contexts_first(cfg, situations, personas: Sequence[str]) -> list[dict]:
    catalog = PersonaCatalog.load()
    out = []
    for sit in situations:
        for pid in personas:
            key = f"{sit.id}|{pid}|first"
            action, tone = choose_directive(catalog.get(pid), key, cfg.sft_data.fallback_share)
            out.append({"group_id": key, "situation_id": sit.id, "persona_id": pid, "kind": "first",
                        "history": [{"role": "user", "persona_id": None, "text": sit.opening}],
                        "context": [list(c) for c in sit.context], "user": sit.opening, "action": action,
                        "tone": tone})
    return out


def _contexts_mid(cfg, first_rows: Sequence[dict], kept: Sequence[tuple[int, int]],
                  personas: Sequence[str]) -> list[dict]:
    """Mid-dialogue contexts: in ``mid_dialogue_share`` of the situations, each persona answers after another
    persona's kept first reply (chosen by hash among those kept)."""
    catalog = PersonaCatalog.load()
    by_sit: dict[str, list[dict]] = collections.defaultdict(list)
    for gi, ci in kept:
        g = first_rows[gi]
        by_sit[g["situation_id"]].append({"persona_id": g["persona_id"], "text": g["candidates"][ci]["text"]})
    firsts = {g["situation_id"]: g for g in first_rows}
    out = []
    for sid, g0 in firsts.items():
        if _unit(sid, "mid") >= cfg.sft_data.mid_dialogue_share:
            continue
        for pid in personas:
            others = [r for r in by_sit.get(sid, []) if r["persona_id"] != pid]
            if not others:
                continue
            prev = others[int(_unit(sid, pid, "prev") * len(others))]
            key = f"{sid}|{pid}|after-{prev['persona_id']}"
            action, tone = choose_directive(catalog.get(pid), key, cfg.sft_data.fallback_share)
            out.append({"group_id": key, "situation_id": sid, "persona_id": pid, "kind": "mid",
                        "history": [g0["history"][0], {"role": "agent", "persona_id": prev["persona_id"],
                                                        "text": prev["text"]}],
                        "context": g0["context"], "user": g0["user"], "action": action, "tone": tone})
    return out


async def _sample_context(engine: Any, g: dict, cfg, hints: dict[str, TeacherHint], seed: int) -> dict:
    """Every candidate of one context, checked as serving checks them, with its verdict."""
    catalog = PersonaCatalog.load()
    personas = active_personas(cfg)
    roster = [catalog.get(p) for p in personas]
    names = {c.id: c.name for c in roster}
    card = catalog.get(g["persona_id"])
    names.setdefault(card.id, card.name)
    history = history_from_dicts(g["history"])
    context = [tuple(c) for c in g["context"]]
    s = cfg.sft_data
    guard = cfg.guard.settings()
    hint = hints.get(card.id)

    def build(h: list, c: list) -> list[dict]:
        return build_persona_messages(card, h, c, g["action"], g["tone"], names)

    plain = fit_history(build, history, context, engine.render_chat, engine.count_tokens,
                        engine.max_context_tokens - s.max_tokens)
    system = plain[0]["content"]
    base_ctx = persona_reply_context(card, names, system, g["action"], g["tone"], history)
    prompts: list[tuple[str, list[dict], Any]] = []
    for k in range(s.k_teacher if hint else 0):
        msgs = teacher_messages(plain, hint, f"{g['group_id']}|{k}")
        ctx = replace(base_ctx, sources=[*base_ctx.sources, hint.hint, *(r for _, r in hint.examples)])
        prompts.append(("teacher", msgs, ctx))
    for _ in range(s.k_plain if hint else s.k_plain + s.k_teacher):
        prompts.append(("plain", plain, base_ctx))

    async def one(k: int, kind: str, msgs: list[dict], ctx: Any) -> dict:
        sp = SamplingParams(max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p, seed=seed + k,
                            stop=stop_strings(card.name, list(names.values())),
                            repetition_penalty=s.repetition_penalty, frequency_penalty=s.frequency_penalty)
        out = None
        async for item in guarded_reply(engine, lambda: persona_text_filter(card, names), engine.render_chat(msgs),
                                        sp, None, ctx, guard if guard is not None else GuardSettings(),
                                        RetryPolicy.from_guard(cfg.guard)):
            if not isinstance(item, str):
                out = item
        text = out.text.strip() if out is not None and not out.rejected else ""
        refused = "" if text else ((out.rejections[-1]["reason"] if out and out.rejections else "empty"))
        ok, why = eligible(card, text, g["user"], s.require_moves) if text else (False, "refused:" + refused)
        return {"prompt": kind, "text": text, "refused": refused, "cut": out.cut_reason if out else "",
                "eligible": ok, "why_not": why}

    cands = await asyncio.gather(*(one(k, kind, m, c) for k, (kind, m, c) in enumerate(prompts)))
    return {**g, "candidates": list(cands)}


async def _sample_all(engine: Any, todo: Sequence[dict], path: Path, cfg, hints, label: str) -> list[dict]:
    done = {r["group_id"] for r in read_jsonl(path)} if path.is_file() else set()
    bar = StepProgress(f"sft_data {label}", sum(g["group_id"] not in done for g in todo), unit="context")
    slots = asyncio.Semaphore(cfg.sft_data.concurrency)

    async def one(g: dict) -> None:
        async with slots:
            row = await _sample_context(engine, g, cfg, hints,
                                        cfg.sft_data.seed * 1_000_003 + int(_unit(g["group_id"]) * 1e9))
        append_jsonl(path, row)  # as each context finishes: a rerun resumes after it
        bar.step(persona=g["persona_id"])

    await asyncio.gather(*(one(g) for g in todo if g["group_id"] not in done))
    bar.close()
    order = {g["group_id"]: i for i, g in enumerate(todo)}
    rows = [r for r in read_jsonl(path) if r["group_id"] in order]
    rows.sort(key=lambda r: order[r["group_id"]])
    return rows


def sft_row(g: dict, text: str, names: dict[str, str]) -> dict:
    """The SFT row of a kept reply: the plain serving prompt of its context, then the reply as the assistant turn."""
    card = PersonaCatalog.load().get(g["persona_id"])
    msgs = build_persona_messages(card, history_from_dicts(g["history"]), [tuple(c) for c in g["context"]],
                                  g["action"], g["tone"], names)
    return {"persona_id": g["persona_id"], "messages": [*msgs, {"role": "assistant", "content": text}]}


def _rates(rows: Sequence[dict]) -> dict:
    """Eligible share of candidates by persona and prompt kind: ``{persona: {teacher: r, plain: r}}``."""
    n: dict = collections.defaultdict(collections.Counter)
    ok: dict = collections.defaultdict(collections.Counter)
    for g in rows:
        for c in g["candidates"]:
            n[g["persona_id"]][c["prompt"]] += 1
            ok[g["persona_id"]][c["prompt"]] += int(c["eligible"])
    return {p: {k: round(ok[p][k] / n[p][k], 3) for k in sorted(n[p])} for p in sorted(n)}


async def run(cfg, out: Path, *, engine: Any) -> dict | None:
    """Build the SFT data (module docstring); None when ``sft_data.enabled`` is False.

    Returns:
        The stage manifest: ``metrics`` with ``contexts``, ``candidates``, ``eligible_rate`` ({persona: {teacher,
        plain}}), ``rows`` and ``rows_by_persona``, ``rows_by_prompt``, ``rows_mid_dialogue``, ``top_opener_share``
        ({persona: share}), ``why_not`` (counts of the reasons candidates were not eligible); ``rows`` = the rows file
        relative to the stage directory.

    Raises:
        ValueError: no training situation, a bad hints file, or no eligible candidate at all.
    """
    s = cfg.sft_data
    if not s.enabled:
        return None
    out = Path(out)
    personas = active_personas(cfg)
    hints = load_hints(s.hints)
    conf = {"sft_data": s.model_dump(mode="json"), "data": cfg.data.model_dump(mode="json"), "personas": personas,
            "mode": cfg.mode, "guard": cfg.guard.model_dump(mode="json")}
    inputs = {"situations": digest_path(cfg.data.situations), "base_model": str(cfg.model or "default"),
              "hints": digest_obj({k: [v.hint, v.examples, v.shots] for k, v in sorted(hints.items())})}
    if is_done(out, STAGE, conf, inputs):
        return read_manifest(out / STAGE)
    catalog = PersonaCatalog.load()
    names = {p: catalog.get(p).name for p in personas}
    situations = training_situations(cfg, s.limit) if s.limit else training_situations(cfg)
    with stage_dir(out, STAGE, conf, inputs) as (part, manifest):
        pool = part / "pool.jsonl"
        first = await _sample_all(engine, _contexts_first(cfg, situations, personas), pool, cfg, hints, "first")
        kept_first = select(first, s.keep, s.max_opener_share)
        mid = await _sample_all(engine, _contexts_mid(cfg, first, kept_first, personas), part / "pool_mid.jsonl",
                                cfg, hints, "mid")
        every = first + mid
        kept = select(every, s.keep, s.max_opener_share)
        if not kept:
            raise ValueError("no candidate complied with its card's moves; raise sft_data.k_teacher, check the "
                             "teacher hints, or look at why_not in pool.jsonl")
        rows = [sft_row(every[gi], every[gi]["candidates"][ci]["text"], names) for gi, ci in kept]
        write_jsonl(part / "rows.jsonl", rows)
        write_jsonl(pool, every)
        (part / "pool_mid.jsonl").unlink(missing_ok=True)
        by_p = collections.Counter(r["persona_id"] for r in rows)
        openers: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for r in rows:
            openers[r["persona_id"]][opener(r["messages"][-1]["content"])] += 1
        why = collections.Counter("refused" if c["why_not"].startswith("refused:") else c["why_not"]
                                  for g in every for c in g["candidates"] if not c["eligible"])
        manifest["data_ids"] = sorted({s_.id for s_ in situations})
        manifest["rows"] = "rows.jsonl"
        manifest["metrics"] = {
            "contexts": len(every), "contexts_mid_dialogue": len(mid),
            "candidates": sum(len(g["candidates"]) for g in every),
            "eligible_rate": _rates(every), "rows": len(rows), "rows_by_persona": dict(sorted(by_p.items())),
            "rows_by_prompt": dict(collections.Counter(every[gi]["candidates"][ci]["prompt"] for gi, ci in kept)),
            "rows_mid_dialogue": sum(1 for gi, _ in kept if every[gi]["kind"] == "mid"),
            "top_opener_share": {p: round(c.most_common(1)[0][1] / by_p[p], 3) for p, c in sorted(openers.items())},
            "median_words": {p: sorted(len(words(r["messages"][-1]["content"])) for r in rows
                                       if r["persona_id"] == p)[by_p[p] // 2] for p in sorted(by_p)},
            "why_not": dict(sorted(why.items())),
        }
    return read_manifest(out / STAGE)
