"""Assemble ``report.json`` from dialogues, judgements and automatic metrics, and write every output.

Report schema: the requirements (``seed``, ``mode``, ``situations``, ``judges``, ``models``, ``systems`` → split →
criteria/overall/collective/collective_overall/automatic/safety_turns/unparseable/personas, and ``by_judge``
when several judges ran). Splits: positive/neutral/negative/all (support), academic/committee/product/all
(meeting).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from mascot.core.files import write_jsonl
from mascot.core.situations import MEETING_SPLITS, SUPPORT_SPLITS
from mascot.eval.aggregate import aggregate_split, combine_judges


def _nli_scorer(model: str) -> Any:
    from mascot.eval.automatic import NLIScorer, build_tiny_nli_model

    if not model:
        tiny = Path(".cache/tiny-nli")
        if not tiny.is_dir():
            build_tiny_nli_model(tiny)
        model = str(tiny)
    return NLIScorer(model)


def reply_check_counts(dialogues: list[dict]) -> dict:
    """What the reply checks did to a system's agent replies (the simulated user's turns are not counted):
    ``{"rejections": {reason: n}, "cut": n, "agent_turns": n}`` (refused attempts, those a dialogue keeps after its
    last delivered turn included, and replies cut back to a sentence end)."""
    from collections import Counter

    turns = [t for d in dialogues for t in d["turns"] if t["role"] == "agent"]
    # a baseline keeps the replies refused after its last delivered turn with the dialogue (an early end)
    refused = [r for t in turns for r in t.get("rejections", [])] + [r for d in dialogues
                                                                     for r in d.get("rejections", [])]
    rejections = Counter(r.get("reason", "") for r in refused)
    return {"rejections": dict(sorted(rejections.items())), "cut": sum(1 for t in turns if t.get("cut_reason")),
            "agent_turns": len(turns)}


def judge_models(opts: Any, backbone: str) -> dict[str, str]:
    """What model produced each judge's scores: the backbone for an in-process local judge (with its adapter),
    ``MODEL @ ENDPOINT`` for an OpenAI-compatible one, and for judges of a running JudgeService the target they
    were asked at (that service's config says which model it runs)."""
    out = {}
    for j in opts.judges:
        name = j.get("name", "local")
        if getattr(opts, "judge_target", ""):
            out[name] = f"judge {name!r} of the JudgeService at {opts.judge_target}"
        elif j.get("kind", "local") == "openai":
            out[name] = f"{j.get('model', '')} @ {j.get('endpoint', '')}"
        else:
            out[name] = backbone + (f" + adapter {j['adapter']}" if j.get("adapter") else "")
    return out


#: A criterion of a judge is flat when its scores' population std (1-5 scale) over the run is below this...
UNINFORMATIVE_STD = 0.25
#: ... or when one score value makes up at least this share of its scores.
UNINFORMATIVE_MODE_SHARE = 0.9


def judge_spread(judged: dict, names: list[str]) -> dict[str, dict]:
    """Per judge, how its raw 1-5 scores vary over the run, criterion by criterion (agent and collective criteria,
    every valid verdict of every system): ``{"n", "criteria": {criterion: {"n", "std", "mode", "mode_share",
    "flat"}}, "std", "mode_share", "informative", "reason"}``. A criterion is flat when its std < 0.25 or one value
    makes up >= 90% of its scores; a judge is informative when at least one criterion is not flat. ``std`` and
    ``mode_share`` at the top are the median over criteria. A judge without a single valid verdict is not
    informative either, for another reason (``reason`` says which)."""
    import statistics
    from collections import Counter, defaultdict

    out = {}
    for name in names:
        by_criterion: dict[str, list[int]] = defaultdict(list)
        for per in judged.values():
            j = per.get(name) or {}
            for verdict in [*j.get("agent", []), j.get("collective")]:
                for k, v in (verdict or {}).items():
                    by_criterion[k].append(int(v))
        criteria = {}
        for k, scores in sorted(by_criterion.items()):
            mode, count = Counter(scores).most_common(1)[0]
            std, share = statistics.pstdev(scores), count / len(scores)
            criteria[k] = {"n": len(scores), "std": round(std, 6), "mode": mode, "mode_share": round(share, 6),
                           "flat": std < UNINFORMATIVE_STD or share >= UNINFORMATIVE_MODE_SHARE}
        n = sum(c["n"] for c in criteria.values())
        informative = any(not c["flat"] for c in criteria.values())
        reason = ("no valid verdict in the run" if not criteria else "" if informative else
                  f"every criterion is flat (std < {UNINFORMATIVE_STD} or one score in >= "
                  f"{UNINFORMATIVE_MODE_SHARE:.0%} of verdicts)")
        out[name] = {"n": n, "criteria": criteria,
                     "std": round(statistics.median(c["std"] for c in criteria.values()), 6) if criteria else None,
                     "mode_share": round(statistics.median(c["mode_share"] for c in criteria.values()), 6)
                     if criteria else None,
                     "informative": informative, "reason": reason}
    return out


def measures_block(opts: Any, roster: list, dialogues: list[dict], embedder: Any, agent_turns: int,
                   progress: Callable[[str, int, int], None],
                   extra_cards: list | None = None) -> tuple[dict, list[dict]]:
    """The judge-free measures (:mod:`mascot.eval.measures`): per system a mean with a 95% bootstrap interval for
    every measure, the identifiability breakdown, who speaks and in what tone (``team``,
    :func:`mascot.eval.measures.team_figures`), and the paired comparisons of ``mascot`` (or the first system)
    against every other system over the situations both ran. Also returns the per-dialogue values (one row per
    dialogue, for ``measures.jsonl``). ``extra_cards``: speakers outside the roster (the baselines' supporter), whose
    prompts count as echo sources too. The few-shot examples of the prompting baselines are an echo source for every
    system (a copied example line is an echo whoever copies it). Differences are taken on unrounded values; only the
    rows written out are rounded."""
    from mascot.core.embedding import IDENTITY_FIELDS
    from mascot.eval.defects import echo_sources
    from mascot.eval.measures import (DEFINITIONS, MEASURES, MeasureContext, dialogue_measures,
                                      identification_summary, team_figures)
    from mascot.eval.stats import LEVEL, N_RESAMPLES, bootstrap_mean, paired_difference

    from mascot.eval.baselines import FEW_SHOT

    sources = echo_sources([*roster, *(extra_cards or [])])
    sources = {pid: [*texts, FEW_SHOT] for pid, texts in sources.items()}
    mctx = MeasureContext(roster, embedder.embed, sources)
    rows: list[dict] = []
    identified: dict[str, list] = {s: [] for s in opts.systems}
    # per system: (situation, speaker, compliant, forbidden, text) of every persona reply whose card has moves
    moved: dict[str, list] = {s: [] for s in opts.systems}
    for i, d in enumerate(dialogues):
        m = dialogue_measures(d, mctx, agent_turns)
        identified[d["system"]] += m["identified"]
        moved[d["system"]] += [(d["situation_id"], *x) for x in m["moves"]]
        rows.append({"system": d["system"], "situation_id": d["situation_id"], "split": d.get("split", ""),
                     **m["values"]})
        progress("measures", i + 1, len(dialogues))
    by = {(r["system"], r["situation_id"]): r for r in rows}
    ids = list(dict.fromkeys(d["situation_id"] for d in dialogues))
    systems = {}
    for s in opts.systems:
        mine = [by[(s, i)] for i in ids if (s, i) in by]
        systems[s] = {"n": len(mine),
                      "values": {k: bootstrap_mean([r[k] for r in mine if r[k] is not None], seed=opts.seed)
                                 for k in MEASURES},
                      "identification": identification_summary(identified[s], mctx.card_ids),
                      "team": team_figures([d for i in ids for d in dialogues
                                            if d["system"] == s and d["situation_id"] == i], mctx.card_ids, opts.seed),
                      **persona_moves(moved[s], mctx.card_ids, opts.seed)}
    def paired_against(reference: str) -> dict:
        paired: dict = {}
        for s in opts.systems:
            if s == reference:
                continue
            paired[s] = {}
            for k in MEASURES:
                pairs = [(by[(reference, i)][k], by[(s, i)][k]) for i in ids if (reference, i) in by and (s, i) in by
                         and by[(reference, i)][k] is not None and by[(s, i)][k] is not None]
                paired[s][k] = paired_difference([a for a, _ in pairs], [b for _, b in pairs], seed=opts.seed)
        return {"reference": reference, "difference": f"{reference} minus system, per situation",
                "test": "Wilcoxon signed-rank (two-sided) and a paired bootstrap of the mean difference",
                "systems": paired}

    reference = "mascot" if "mascot" in opts.systems else opts.systems[0]
    block = {"embedding": embedder.model_name, "roster": mctx.card_ids, "chance": round(mctx.chance, 6),
             "identity_fields": list(IDENTITY_FIELDS), "better": dict(MEASURES), "definitions": dict(DEFINITIONS),
             "interval": {"level": LEVEL, "method": "percentile bootstrap over dialogues", "resamples": N_RESAMPLES},
             "systems": systems, "paired": paired_against(reference)}
    if "mascot-trained" in opts.systems and reference != "mascot-trained":  # the trained system against the rest
        block["paired_trained"] = paired_against("mascot-trained")
    rows = [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()} for r in rows]
    return block, rows


def persona_moves(replies: list[tuple[str, str, bool, bool, str]], card_ids: list[str], seed: int) -> dict:
    """Per-persona card-move figures, distinguishability and opener diversity of one system.

    Args:
        replies: ``(situation_id, speaker, compliant, forbidden_present, text)`` of every persona reply whose card has
            moves.
        card_ids: Roster ids (report order).
        seed: Bootstrap and classifier seed.

    Returns:
        ``{"moves_per_persona": {id: {"n", "dialogues", "compliance", "forbidden"}}, "distinguishability": {...},
        "openers": {...}}``: per persona, the mean over the dialogues it spoke in of its share of compliant (and of
        forbidden-move) replies there, with a 95% bootstrap interval over those dialogues;
        :func:`mascot.eval.distinguish.distinguishability` over the system's replies grouped by situation; and
        :func:`mascot.eval.distinguish.opener_diversity`.
    """
    from collections import defaultdict

    from mascot.eval.distinguish import distinguishability, opener_diversity
    from mascot.eval.stats import bootstrap_mean

    per: dict[str, dict[str, list]] = {p: defaultdict(list) for p in card_ids}
    for sid, pid, ok, bad, _ in replies:
        if pid in per:
            per[pid][sid].append((ok, bad))
    block = {}
    for pid in card_ids:
        dl = list(per[pid].values())
        block[pid] = {"n": sum(len(x) for x in dl), "dialogues": len(dl),
                      "compliance": bootstrap_mean([sum(o for o, _ in x) / len(x) for x in dl], seed=seed),
                      "forbidden": bootstrap_mean([sum(b for _, b in x) / len(x) for x in dl], seed=seed)}
    texts = defaultdict(list)
    for _, pid, _, _, t in replies:
        texts[pid].append(t)
    return {"moves_per_persona": block,
            "distinguishability": distinguishability([r[4] for r in replies], [r[1] for r in replies],
                                                     [r[0] for r in replies], seed=seed),
            "openers": opener_diversity({p: texts.get(p, []) for p in card_ids})}


def build_report(opts: Any, cfg: Any, situations: list, dialogues: list[dict], judged: dict, embedder: Any,
                 progress: Callable[[str, int, int], None], roster: list | None = None,
                 extra_cards: list | None = None, trained_adapters: dict[str, dict] | None = None) -> dict:
    """The report dict (blocking: runs the NLI and embedding models). With ``roster`` (the persona cards of the
    run), the judge-free measures are added under ``measures`` and their per-dialogue rows under
    ``report["_measure_rows"]`` (taken out by :func:`write_outputs` into ``measures.jsonl``). ``trained_adapters``:
    the versions the ``mascot-trained`` system served (:func:`mascot.eval.runner.trained_versions`), named under
    ``models.trained_adapters``."""
    served = trained_adapters or {}
    from mascot.eval.automatic import aggregate as aggregate_automatic
    from mascot.eval.automatic import dialogue_metrics

    meeting = opts.mode == "meeting"
    splits = (*(MEETING_SPLITS if meeting else SUPPORT_SPLITS), "all")
    nli = _nli_scorer(opts.nli_model)
    auto: dict = {}
    for i, d in enumerate(dialogues):
        texts = [t["text"] for t in d["turns"] if t["role"] == "agent" and t["text"].strip()]
        auto[(d["system"], d["situation_id"])] = dialogue_metrics(texts, nli, embedder)
        progress("metrics", i + 1, len(dialogues))
    judges = [j["name"] for j in opts.judges]

    def systems_block(judge_names: list[str]) -> dict:
        res: dict = {}
        for system in opts.systems:
            res[system] = {}
            mine = [d for d in dialogues if d["system"] == system]
            for split in splits:
                items = []
                for d in mine:
                    if split != "all" and d["split"] != split:
                        continue
                    key = (system, d["situation_id"])
                    per = [judged[key][n] for n in judge_names]
                    n_agent = len(per[0]["agent"]) if per else 0
                    items.append({
                        "agent": [combine_judges([p["agent"][k] for p in per]) for k in range(n_agent)],
                        "agent_personas": [t["persona_id"] for t in d["turns"] if t["role"] == "agent"],
                        "collective": combine_judges([p["collective"] for p in per]),
                        "unparseable": sum(p["unparseable"] for p in per),
                        "safety_turns": sum(1 for t in d["turns"] if t.get("safety")),
                    })
                block = aggregate_split(items, meeting)
                block["reply_checks"] = reply_check_counts([d for d in mine if split == "all" or d["split"] == split])
                block["automatic"] = aggregate_automatic(
                    [auto[(system, d["situation_id"])] for d in mine if split == "all" or d["split"] == split],
                    nli.model_name, nli.trained)
                res[system][split] = block
        return res

    from mascot.core.engine.tiny import is_tiny

    from mascot.core.engine import resolve_model
    from mascot.core.engine.default_model import model_identity

    backbone = resolve_model(cfg.engine.model, cfg.engine.tiny_dir, cfg.engine.cache_dir)
    identity = model_identity(backbone)
    model_name = identity["name"]
    trained = not is_tiny(backbone)
    report = {
        "seed": opts.seed, "mode": opts.mode, "situations": [s.id for s in situations], "judges": judges,
        "models": {"backbone": model_name, "backbone_digest": identity["digest"], "trained": trained,
                   "nli": nli.model_name, "nli_trained": nli.trained, "embedding": embedder.model_name,
                   "sft_adapter": str(opts.sft_adapter) if opts.sft_adapter else None,
                   **({"trained_adapters": {pid: v["name"] for pid, v in served.items()},
                       "adapter_store": str(opts.adapters)} if served else {})},
        "agent_turns": opts.agent_turns or cfg.selfplay.agent_turns,
        "systems": systems_block(judges),
    }
    if len(judges) > 1:
        report["by_judge"] = {n: systems_block([n]) for n in judges}
    models = judge_models(opts, model_name)
    spread = judge_spread(judged, judges)
    report["judge_info"] = {n: {"model": models[n], **spread[n]} for n in judges}
    if roster:
        agent_turns = opts.agent_turns or cfg.selfplay.agent_turns
        report["measures"], report["_measure_rows"] = measures_block(opts, roster, dialogues, embedder, agent_turns,
                                                                     progress, extra_cards)
    return report


def write_outputs(out: Path, report: dict, dialogues: list[dict]) -> None:
    """``transcripts.jsonl`` (ordered by system then situation), ``measures.jsonl`` (one row of measure values per
    dialogue, same order), ``report.json``, ``report.md`` and the plots."""
    from mascot.eval.report import write_report

    rows = report.pop("_measure_rows", None)
    write_jsonl(out / "transcripts.jsonl", dialogues)
    if rows is not None:
        write_jsonl(out / "measures.jsonl", rows)
    write_report(report, out)
