"""``mascot safety``: the trained crisis detector (docs/safety.md).

``mascot safety train`` rebuilds the shipped ``crisis_detector.json`` from the labelled set (or the files given)
and prints its development-set figures; ``mascot safety check TEXT...`` shows the gate's tier, risk probability and
categories for each message, as the gateway decides them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from mascot.cli.common import console

safety_app = typer.Typer(help="The safety gate's trained crisis detector: rebuild it, or check messages.",
                         no_args_is_help=True)


@safety_app.command("train")
def train_cmd(
    data: Optional[list[Path]] = typer.Option(
        None, "--data", help="Labelled YAML files (default: the shipped crisis_train_*.yaml)."),
    dev: Optional[list[Path]] = typer.Option(None, "--dev", help="Development set the thresholds are chosen on "
                                                                 "(default: the shipped crisis_dev*.yaml)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Detector file to write (default: the shipped "
                                                           "crisis_detector.json)."),
    min_recall: float = typer.Option(0.90, "--min-recall", min=0.5, max=1.0,
                                     help="Development-set recall the check-in threshold keeps."),
    max_crisis_fp: float = typer.Option(0.005, "--max-crisis-fp", min=0.0, max=0.5,
                                        help="Development-set false-positive rate the crisis threshold allows."),
) -> None:
    """Fit the crisis detector and choose its thresholds on the development set; write it atomically."""
    from mascot.gateway import crisis_model as cm

    target = out or cm.DETECTOR_FILE
    try:
        det = cm.train(cm.load_examples(data or None), cm.load_examples(dev or cm.DEV_FILES), target,
                       min_recall=min_recall, max_crisis_fp=max_crisis_fp)
    except ValueError as e:
        console.print(f"[red]cannot train:[/red] {e}", soft_wrap=True, highlight=False)
        raise typer.Exit(1) from None
    s, d = det.settings, det.settings.dev
    console.print(f"{target}: {s.examples} training examples (digest {s.data_digest}), {len(det.vocabulary)} "
                  f"n-grams; thresholds crisis {s.crisis_threshold}, check-in {s.checkin_threshold}",
                  highlight=False, soft_wrap=True)
    console.print(f"development set ({d['examples']} messages, model alone): recall {d['recall_any']} (crisis tier "
                  f"{d['recall_crisis']}), false positives crisis tier {d['fp_crisis']}, any tier {d['fp_any']}",
                  highlight=False, soft_wrap=True)
    for kind, k in sorted(d["kinds"].items()):
        console.print(f"  {kind:20s} n={k['n']:3d}  flagged {k['flagged_any']:3d}  crisis {k['flagged_crisis']:3d}",
                      highlight=False, soft_wrap=True)


@safety_app.command("check")
def check_cmd(texts: list[str] = typer.Argument(..., help="Messages to check."),
              rules_only: bool = typer.Option(False, "--rules-only", help="Without the trained detector.")) -> None:
    """Print the gate's decision for each message as JSON lines: tier, risk probability, categories, detector."""
    from mascot.core.config import SafetyConfig
    from mascot.core.personas import PersonaCatalog
    from mascot.gateway.safety import SafetyGate

    gate = SafetyGate(SafetyConfig(classifier="none" if rules_only else "minilm"), PersonaCatalog.load())
    for text, d in zip(texts, gate.detect_many(texts)):
        print(json.dumps({"text": text, "tier": d.tier if d else "none", "p_risk": d.p_risk if d else None,
                          "categories": list(d.categories) if d else [], "detector": d.detector if d else ""}))


@safety_app.command("evaluate")
def evaluate_cmd(
    files: list[Path] = typer.Argument(..., help="Labelled YAML files ({items: [{text, category, kind, lang}]})."),
    rules_only: bool = typer.Option(False, "--rules-only", help="Without the trained detector."),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write the figures and every message's decision "
                                                           "as JSON here."),
) -> None:
    """Recall and false positives per kind of the gate as deployed (rules, trained detector, lexicons) on a
    labelled set: at risk, a message counts as caught at any tier (and separately at the crisis tier); not at
    risk, a check-in and a crisis are counted apart."""
    from mascot.core.config import SafetyConfig
    from mascot.core.personas import PersonaCatalog
    from mascot.gateway import crisis_model as cm
    from mascot.gateway.safety import SafetyGate

    try:
        examples = cm.load_examples(files)
    except ValueError as e:
        console.print(f"[red]cannot read:[/red] {e}", soft_wrap=True, highlight=False)
        raise typer.Exit(1) from None
    gate = SafetyGate(SafetyConfig(classifier="none" if rules_only else "minilm"), PersonaCatalog.load())
    decisions = gate.detect_many([e.text for e in examples])
    table = evaluation_table(examples, [d.tier if d else "none" for d in decisions])
    for kind, k in table["kinds"].items():
        what = "caught" if k["at_risk"] else "flagged"
        console.print(f"  {kind:22s} n={k['n']:3d}  {what} {k['any']:3d} ({k['any'] / k['n']:.2f})  crisis tier "
                      f"{k['crisis']:3d}  check-in {k['check_in']:3d}", highlight=False, soft_wrap=True)
    t = table["total"]
    console.print(f"at risk: recall {t['recall_any']:.3f} (crisis tier {t['recall_crisis']:.3f}), lowest kind "
                  f"{t['lowest_kind_recall']:.3f}; not at risk: crisis-tier false positives {t['fp_crisis']:.3f}, "
                  f"check-in {t['fp_check_in']:.3f}", highlight=False, soft_wrap=True)
    if out:
        rows = [{"text": e.text, "category": e.category, "kind": e.kind, "lang": e.lang,
                 "tier": d.tier if d else "none", "p_risk": d.p_risk if d else None,
                 "categories": list(d.categories) if d else [], "detector": d.detector if d else ""}
                for e, d in zip(examples, decisions)]
        out.write_text(json.dumps({"table": table, "decisions": rows}, indent=1) + "\n", encoding="utf-8")


def evaluation_table(examples: list, tiers: list[str]) -> dict:
    """Per kind (``language`` split into ``language_risk`` and ``language_safe``) and in total: how many messages
    reached any tier, the crisis tier and the check-in tier.

    Returns:
        ``{"kinds": {kind: {"n", "at_risk", "any", "crisis", "check_in"}}, "total": {"recall_any",
        "recall_crisis", "lowest_kind_recall", "fp_crisis", "fp_check_in", "n_risk", "n_safe"}}``.
    """
    kinds: dict[str, dict] = {}
    for e, tier in zip(examples, tiers):
        key = e.kind if e.kind != "language" else f"language_{'risk' if e.at_risk else 'safe'}"
        k = kinds.setdefault(key, {"n": 0, "at_risk": e.at_risk, "any": 0, "crisis": 0, "check_in": 0})
        k["n"] += 1
        k["any"] += tier != "none"
        k["crisis"] += tier == "crisis"
        k["check_in"] += tier == "check_in"
    risk = [k for k in kinds.values() if k["at_risk"]]
    safe = [k for k in kinds.values() if not k["at_risk"]]
    n_risk, n_safe = sum(k["n"] for k in risk), sum(k["n"] for k in safe)
    total = {"n_risk": n_risk, "n_safe": n_safe,
             "recall_any": sum(k["any"] for k in risk) / n_risk if n_risk else 0.0,
             "recall_crisis": sum(k["crisis"] for k in risk) / n_risk if n_risk else 0.0,
             "lowest_kind_recall": min((k["any"] / k["n"] for k in risk), default=0.0),
             "fp_crisis": sum(k["crisis"] for k in safe) / n_safe if n_safe else 0.0,
             "fp_check_in": sum(k["check_in"] for k in safe) / n_safe if n_safe else 0.0}
    return {"kinds": dict(sorted(kinds.items(), key=lambda kv: (not kv[1]["at_risk"], kv[0]))), "total": total}
