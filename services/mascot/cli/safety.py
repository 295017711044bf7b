"""``mascot safety``: the trained crisis detector (docs/safety.md).

``mascot safety train`` rebuilds the shipped ``crisis_detector.json`` from the labelled set (or the files given; or
writes another file with ``--out``), prints its development-set figures and how to serve it (``safety.detector_path``
for a file other than the shipped one); ``mascot safety check TEXT...`` shows the gate's tier, risk probability and
categories for each message, as the gateway decides them; ``mascot safety evaluate FILE...`` measures the gate on a
labelled set. ``check`` and ``evaluate`` take ``--detector FILE`` to use a retrained detector.
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
    min_recall: float = typer.Option(0.92, "--min-recall", min=0.5, max=1.0,
                                     help="Development-set recall the check-in threshold keeps."),
    max_crisis_fp: float = typer.Option(0.005, "--max-crisis-fp", min=0.0, max=0.5,
                                        help="Development-set false-positive rate the crisis threshold allows."),
    crisis_threshold: Optional[float] = typer.Option(None, "--crisis-threshold", min=0.0, max=1.0,
                                                     help="Crisis threshold to keep instead of choosing it on the "
                                                          "development set with --max-crisis-fp."),
    pretrained: bool = typer.Option(False, "--pretrained", help="Keep the pretrained encoder (no fine-tuning: about "
                                                                "a minute instead of 9 on 2 cores)."),
    language_data: Optional[list[Path]] = typer.Option(
        None, "--language-data", help="Other-language YAML files for the language head alone (default: the shipped "
                                      "language_train_*.yaml)."),
    language_min_recall: float = typer.Option(0.95, "--language-min-recall", min=0.5, max=1.0,
                                              help="Recall of the other languages' development disclosures the "
                                                   "language head's check-in threshold keeps."),
) -> None:
    """Fine-tune the encoder, fit the crisis detector and choose its thresholds on the development set; write it
    (and its encoder adapter) atomically."""
    from mascot.gateway import crisis_model as cm

    target = out or cm.DETECTOR_FILE
    try:
        det = cm.train(cm.load_examples(data or None), cm.load_examples(dev or cm.DEV_FILES), target,
                       min_recall=min_recall, max_crisis_fp=max_crisis_fp,
                       crisis_threshold=crisis_threshold,
                       settings=cm.DetectorSettings(fine_tune=not pretrained),
                       language_examples=cm.load_examples(language_data or cm.LANGUAGE_FILES),
                       language_min_recall=language_min_recall)
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
    if det.language_head is not None:
        h = det.language_head
        console.print(f"language head ({', '.join(h.languages)}): {h.examples} training examples, thresholds crisis "
                      f"{h.crisis_threshold}, check-in {h.checkin_threshold}; other languages' development set "
                      f"({h.dev['examples']} messages): recall {h.dev['recall_any']} (crisis tier "
                      f"{h.dev['recall_crisis']}), false positives crisis tier {h.dev['fp_crisis']}, any tier "
                      f"{h.dev['fp_any']}", highlight=False, soft_wrap=True)
    console.print(serving_hint(Path(target), cm.DETECTOR_FILE), highlight=False, soft_wrap=True)


def serving_hint(target: Path, shipped: Path) -> str:
    """How the gateway serves the detector just written to ``target``: the shipped file (``shipped``) at its next
    start, any other through ``safety.detector_path``."""
    if target.resolve() == shipped.resolve():
        return ("serve it: the gateway loads the shipped file at its next start while safety.detector_path is empty "
                "(restart it; in a container image, rebuild the image)")
    path = target.resolve()
    return (f"serve it: set safety.detector_path: {path} in the gateway's config (or MASCOT_SAFETY__DETECTOR_PATH="
            f"{path}) and restart the gateway; check it first with `mascot safety evaluate --detector {path} FILE`")


DETECTOR_HELP = "Detector file to use (as safety.detector_path; default: the shipped crisis_detector.json)."


def _gate(rules_only: bool, detector: Path | None) -> object:
    """The gate with the shipped thresholds of ``detector`` (or the shipped detector); exits 1 with the reason when
    the file cannot be used."""
    from pydantic import ValidationError

    from mascot.core.config import SafetyConfig
    from mascot.core.personas import PersonaCatalog
    from mascot.gateway.safety import SafetyGate

    try:
        cfg = SafetyConfig(classifier="none" if rules_only else "minilm", detector_path=str(detector or ""))
        return SafetyGate(cfg, PersonaCatalog.load())
    except (ValidationError, ValueError) as e:
        why = e.errors()[0]["msg"] if isinstance(e, ValidationError) else str(e)
        console.print(f"[red]cannot load the detector:[/red] {why}", soft_wrap=True, highlight=False)
        raise typer.Exit(1) from None


@safety_app.command("check")
def check_cmd(texts: list[str] = typer.Argument(..., help="Messages to check."),
              rules_only: bool = typer.Option(False, "--rules-only", help="Without the trained detector."),
              detector: Optional[Path] = typer.Option(None, "--detector", help=DETECTOR_HELP)) -> None:
    """Print the gate's decision for each message as JSON lines: tier, risk probability, categories, detector."""
    gate = _gate(rules_only, detector)
    for text, d in zip(texts, gate.detect_many(texts)):
        print(json.dumps({"text": text, "tier": d.tier if d else "none", "p_risk": d.p_risk if d else None,
                          "categories": list(d.categories) if d else [], "detector": d.detector if d else ""}))


@safety_app.command("evaluate")
def evaluate_cmd(
    files: list[Path] = typer.Argument(..., help="Labelled YAML files ({items: [{text, category, kind, lang}]})."),
    rules_only: bool = typer.Option(False, "--rules-only", help="Without the trained detector."),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write the figures and every message's decision "
                                                           "as JSON here."),
    detector: Optional[Path] = typer.Option(None, "--detector", help=DETECTOR_HELP),
) -> None:
    """Recall and false positives per kind of the gate as deployed (rules, trained detector, lexicons) on a
    labelled set: at risk, a message counts as caught at any tier (and separately at the crisis tier); not at
    risk, a check-in and a crisis are counted apart."""
    from mascot.gateway import crisis_model as cm

    try:
        examples = cm.load_examples(files)
    except ValueError as e:
        console.print(f"[red]cannot read:[/red] {e}", soft_wrap=True, highlight=False)
        raise typer.Exit(1) from None
    gate = _gate(rules_only, detector)
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
    reached any tier, the crisis tier and the check-in tier (counted by
    :func:`mascot.gateway.crisis_model.tier_table`, the count behind the detector's own figures).

    Returns:
        ``{"kinds": {kind: {"n", "at_risk", "any", "crisis", "check_in"}}, "total": {"recall_any",
        "recall_crisis", "lowest_kind_recall", "fp_crisis", "fp_check_in", "n_risk", "n_safe"}}``, the at-risk kinds
        first, each group by name.
    """
    from mascot.gateway.crisis_model import tier_table

    table = tier_table(examples, tiers)
    t = table["total"]
    total = {k: t[k] for k in ("n_risk", "n_safe", "recall_any", "recall_crisis", "lowest_kind_recall", "fp_crisis",
                               "fp_check_in")}
    return {"kinds": dict(sorted(table["kinds"].items(), key=lambda kv: (not kv[1]["at_risk"], kv[0]))),
            "total": total}
