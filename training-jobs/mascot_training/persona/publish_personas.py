"""Stage ``publish`` of phase 1: gate every persona LoRA adapter and publish those that pass as ``staged``.

The gate (:func:`gate`) refuses adapters whose replies collapsed: it generates with the adapter on the base model
(transformers + PEFT) and checks mean answer words, distinct-2 (Li et al. 2016, section 4.3) and the shares of
looping answers and of answers that copy the persona's prompt or card (:func:`gate_verdict`) against
``publish.gate``. Passing adapters go to the run's store or the gateway
(:func:`mascot_training.common.publish.publish_to`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mascot.core.files import write_jsonl
from mascot_training.common.manifest import digest_path, is_done, read_manifest, stage_dir
from mascot_training.common.publish import PublishError, check_adapter, publish_to, still_published, store_of
from mascot_training.common.rewards import split_think
from mascot_training.persona.config import GateConfig, PersonaAlignmentConfig

STAGE = "publish"
GATE_TEMPERATURE = 0.7
GATE_TOP_P = 0.95
#: User messages the gate replies to (cycled to ``gate.prompts``).
GATE_MESSAGES = (
    "I feel so anxious about my exam tomorrow.",
    "My dog died last week and I miss him so much.",
    "I finally finished the project I was stuck on for months.",
    "Nobody at work listens to my ideas.",
    "I moved to a new city and I do not know anyone yet.",
    "My best friend forgot my birthday.",
    "I got the job I interviewed for!",
    "I keep putting off a difficult phone call.",
)


def gate(base_model: str, adapter_dir: str | Path, card: Any, cfg: GateConfig, *, seed: int = 0) -> dict:
    """Generate ``cfg.prompts`` replies with the adapter and refuse a collapsed one.

    Replies: speaker system prompt (:func:`mascot.speaker.prompts.persona_system_prompt`) + one stock user message
    each, sampled at temperature 0.7, top-p 0.95, ``cfg.max_tokens`` new tokens, torch seed ``seed``. The visible
    answer is the text after a leading ``<think>…</think>`` block.

    Args:
        base_model: Base model directory or hub id.
        adapter_dir: PEFT adapter directory.
        card: The persona's :class:`mascot.core.personas.PersonaCard`.
        cfg: ``publish.gate`` thresholds.
        seed: Sampling seed.

    Returns:
        :func:`gate_verdict`'s fields and ``"texts": [{"message", "reply"}]``; ``reason`` is '' when passed.
        distinct-2 is 0.0 when no answer holds two words.
    """
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mascot.speaker.prompts import persona_system_prompt

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tok = AutoTokenizer.from_pretrained(base_model)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(base_model)
    model = PeftModel.from_pretrained(model, str(adapter_dir)).to(device).eval()
    system = persona_system_prompt(card)
    texts = [tok.apply_chat_template([{"role": "system", "content": system},
                                      {"role": "user", "content": GATE_MESSAGES[i % len(GATE_MESSAGES)]}],
                                     tokenize=False, add_generation_prompt=True) for i in range(cfg.prompts)]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    torch.manual_seed(seed)
    with torch.no_grad():
        ids = model.generate(**enc, do_sample=True, temperature=GATE_TEMPERATURE, top_p=GATE_TOP_P,
                             max_new_tokens=cfg.max_tokens, pad_token_id=tok.pad_token_id)
    outs = tok.batch_decode(ids[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    answers = [split_think(o)[1].strip() for o in outs]
    verdict = gate_verdict(answers, card, cfg)
    return {**verdict,
            "texts": [{"message": GATE_MESSAGES[i % len(GATE_MESSAGES)], "reply": a} for i, a in enumerate(answers)]}


def gate_verdict(answers: list[str], card: Any, cfg: GateConfig) -> dict:
    """The gate's decision on an adapter's visible ``answers`` (at least one): mean words, distinct-2 (Li et al.
    2016, section 4.3), and the share of answers that loop (a word 4-gram three times, or a repeated sentence) or
    echo the persona's prompt or card (a shared word 8-gram): the quality bench's detectors
    (:mod:`mascot.core.defects`).

    Returns:
        ``{"passed", "mean_words", "distinct_2", "loop_rate", "echo_rate", "replies", "reason"}``; ``reason`` lists
        every threshold of ``cfg`` missed ('' when passed).
    """
    from mascot.core.defects import card_source_text, is_echo, is_loop
    from mascot.core.diversity import distinct_n
    from mascot.speaker.prompts import persona_system_prompt

    mean_words = sum(len(a.split()) for a in answers) / len(answers)
    d2 = distinct_n(answers, 2) or 0.0
    sources = [persona_system_prompt(card), card_source_text(card)]
    loops = sum(is_loop(a) for a in answers) / len(answers)
    echoes = sum(is_echo(a, sources) for a in answers) / len(answers)
    reasons = []
    if mean_words < cfg.min_mean_words:
        reasons.append(f"mean answer length {mean_words:.2f} words is below gate.min_mean_words "
                       f"{cfg.min_mean_words}")
    if d2 < cfg.min_distinct_2:
        reasons.append(f"distinct-2 {d2:.3f} is below gate.min_distinct_2 {cfg.min_distinct_2}")
    if loops > cfg.max_loop_rate:
        reasons.append(f"{loops:.0%} of the replies loop, over gate.max_loop_rate {cfg.max_loop_rate}")
    if echoes > cfg.max_echo_rate:
        reasons.append(f"{echoes:.0%} of the replies copy the persona's prompt or card, over gate.max_echo_rate "
                       f"{cfg.max_echo_rate}")
    return {"passed": not reasons, "mean_words": round(mean_words, 4), "distinct_2": round(d2, 4),
            "loop_rate": round(loops, 4), "echo_rate": round(echoes, 4), "replies": len(answers),
            "reason": "; ".join(reasons)}


def run(cfg: PersonaAlignmentConfig, out: Path, *, base_model: str, adapters: dict[str, Path],
        data_ids: list[str]) -> dict:
    """Gate every persona adapter and publish those that pass as ``staged``.

    A refused adapter (gate or check) is recorded and does not stop the other personas. An adapter already
    registered with the same digest (a resumed run) is recorded as published, not published twice.

    Args:
        cfg: The run config (``publish``, ``run_id``).
        out: The run's output root; the store defaults to ``OUT/adapters``.
        base_model: The serving base model.
        adapters: ``{persona_id: adapter directory}``.
        data_ids: Training data ids (recorded in each version's manifest).

    Returns:
        The stage manifest; ``metrics["personas"][persona_id]`` = ``{"gate": {...}, "published": {...}}`` or
        ``{"gate": {...}, "refused": reason}`` (no ``gate`` when the adapter check refused it first);
        ``metrics["published"]`` and ``metrics["refused"]`` count them.

    Raises:
        ValueError: ``publish.gateway`` is set and the gateway refused the credentials or stayed unavailable.
        KeyError: an unknown persona id.
    """
    from mascot.core.personas import PersonaCatalog

    out = Path(out)
    store = store_of(cfg.publish, out)
    config = cfg.publish.model_dump(mode="json") | {"run_id": cfg.run_id}
    inputs = {f"adapter:{p}": digest_path(d) for p, d in sorted(adapters.items())} | {"base_model": str(base_model),
                                                                                       "store": str(store)}
    if is_done(out, STAGE, config, inputs) and still_published(read_manifest(out / STAGE), cfg.publish):
        return read_manifest(out / STAGE)
    catalog = PersonaCatalog.load()
    cards = {pid: catalog.get(pid) for pid in adapters}
    with stage_dir(out, STAGE, config, inputs) as (partial, manifest):
        replies: list[dict] = []  # what each adapter said at the gate, for a person to read (gate_replies.jsonl)
        metrics: dict = {"published": 0, "refused": 0, "personas": {}}
        for pid, adir in adapters.items():
            card = cards[pid]
            rec: dict = {}
            try:
                check_adapter(adir, base_model=base_model)
                rec["gate"] = gate(base_model, adir, card, cfg.publish.gate)
                replies += [{"persona_id": pid, **t} for t in rec["gate"].pop("texts")]
                if not rec["gate"]["passed"]:
                    raise PublishError(f"gate: {rec['gate']['reason']}")
                rec["published"] = publish_to(cfg.publish, out, pid, adir, base_model=base_model,
                                              run_id=cfg.run_id, data_ids=data_ids, eval_metrics={"gate": rec["gate"]})
                metrics["published"] += 1
            except PublishError as e:
                rec["refused"] = str(e)
                metrics["refused"] += 1
            metrics["personas"][pid] = rec
        manifest["metrics"] = metrics
        manifest["data_ids"] = list(data_ids)
        manifest["store"] = str(store)
        write_jsonl(partial / "gate_replies.jsonl", replies)
    return manifest
