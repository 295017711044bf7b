"""Stage ``sft`` of phase 1: optional SFT of the speaker (candidate) policy, one LoRA on the base model.

Off by default. The paper starts GRPO from an SFT policy but gives no SFT data; with ``sft_data`` enabled the data
are the move-compliant replies the ``sft_data`` stage sampled and kept (:mod:`mascot_training.persona.sft_data`),
rendered under the exact serving prompt. When enabled,
TRL ``SFTTrainer`` trains a LoRA (``cfg.lora``, PEFT ``task_type="CAUSAL_LM"``) on a conversational dataset and
the stage writes ``OUT/sft/adapter/`` (a PEFT directory) and ``OUT/sft/manifest.json``.

Data (``sft.data``), one JSON object a line, no other keys::

    {"persona_id": "<known persona id>",
     "messages": [{"role": "system"|"user"|"assistant", "content": "<non-empty text>"}, ...]}

``messages`` holds at least one user message and ends with the assistant reply to learn; the system message, when
present, is first (normally :func:`mascot.speaker.prompts.persona_system_prompt` of the persona). Each row becomes a
TRL conversational *prompt-completion* example (``prompt`` = every message but the last, ``completion`` = the last),
so the loss covers the reply only (TRL's ``completion_only_loss`` defaults to on for that format). Blank lines are
skipped. With ``sft.data`` unset the stage builds a tiny smoke set from the active persona cards
(:func:`mascot_training.common.lora.smoke_rows`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mascot.core.files import atomic_write_text
from mascot_training.common.config import active_personas
from mascot_training.common.lora import peft_lora, smoke_rows
from mascot_training.common.manifest import digest_obj, digest_path, is_done, read_manifest, stage_dir
from mascot_training.common.progress import trainer_progress, write_curves
from mascot_training.persona.config import PersonaAlignmentConfig

STAGE = "sft"
ROLES = ("system", "user", "assistant")


def _bad(path: Path, line: int, why: str) -> ValueError:
    return ValueError(f"{path}:{line}: {why}")


def load_sft_rows(path: str | Path, known_personas: set[str] | None = None) -> list[dict]:
    """Read and validate the SFT JSONL (schema in the module docstring).

    Args:
        path: The JSONL file.
        known_personas: Persona ids accepted in ``persona_id``; None accepts any non-empty id.

    Returns:
        ``[{"persona_id", "messages", "line"}]`` in file order (``line`` is 1-based).

    Raises:
        ValueError: unreadable file, no rows, or a bad line; the message reads ``FILE:LINE: problem``.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{p}: cannot read the SFT data ({e})") from None
    rows = []
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as e:
            raise _bad(p, n, f"not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise _bad(p, n, "a line must be a JSON object {\"persona_id\", \"messages\"}")
        extra = sorted(set(row) - {"persona_id", "messages"})
        if extra:
            raise _bad(p, n, f"unknown key(s) {extra}; allowed: persona_id, messages")
        pid = row.get("persona_id")
        if not isinstance(pid, str) or not pid:
            raise _bad(p, n, "persona_id must be a non-empty string")
        if known_personas is not None and pid not in known_personas:
            raise _bad(p, n, f"unknown persona_id {pid!r}; known: {sorted(known_personas)}")
        msgs = row.get("messages")
        if not isinstance(msgs, list) or len(msgs) < 2:
            raise _bad(p, n, "messages must be a list of at least two {\"role\", \"content\"} objects")
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or set(m) != {"role", "content"}:
                raise _bad(p, n, f"messages[{i}] must be an object with exactly the keys role and content")
            if m["role"] not in ROLES:
                raise _bad(p, n, f"messages[{i}].role {m['role']!r} must be one of {list(ROLES)}")
            if not isinstance(m["content"], str) or not m["content"].strip():
                raise _bad(p, n, f"messages[{i}].content must be a non-empty string")
            if m["role"] == "system" and i != 0:
                raise _bad(p, n, f"messages[{i}]: a system message may only come first")
        if msgs[-1]["role"] != "assistant":
            raise _bad(p, n, "the last message must be the assistant reply to learn")
        if not any(m["role"] == "user" for m in msgs[:-1]):
            raise _bad(p, n, "messages need at least one user message before the reply")
        rows.append({"persona_id": pid, "messages": msgs, "line": n})
    if not rows:
        raise ValueError(f"{p}: the SFT data holds no rows")
    return rows


def run(cfg: PersonaAlignmentConfig, out: Path, *, base_model: str) -> dict | None:
    """Train the SFT LoRA and write ``OUT/sft/adapter/`` (skipped when ``sft.enabled`` is False).

    Args:
        cfg: The run config (``sft``, ``lora``, ``max_model_len``, personas).
        out: The run's output root.
        base_model: Base model directory or hub id; recorded in the adapter's ``base_model_name_or_path``.

    Returns:
        The stage manifest (metrics ``train_loss``, ``rows``, ``steps``; ``adapter`` = path relative to the stage
        dir), or None when SFT is disabled. With ``sft.per_persona`` the manifest has ``adapters`` ({persona: path
        relative to the stage dir}) instead, and ``metrics.per_persona`` ({persona: train_loss, rows, steps}). A
        completed stage with the same config and inputs is returned as is.

    Raises:
        ValueError: bad SFT data (``FILE:LINE: problem``); with ``sft.per_persona``, a persona without rows.
    """
    if not cfg.sft.enabled:
        return None
    out = Path(out)
    personas = active_personas(cfg)
    config = cfg.sft.model_dump(mode="json") | {"lora": cfg.lora.model_dump(), "max_model_len": cfg.max_model_len}
    data = cfg.sft.data
    if data is None and cfg.sft_data.enabled:  # the rows the sft_data stage built
        built = read_manifest(out / "sft_data")
        if built is None:
            raise ValueError("sft_data is enabled but its stage has not run in this run directory; run the "
                             "sft-data stage first (mascot train sft-data, or the whole chain)")
        data = out / "sft_data" / built["rows"]
    inputs = {"data": (digest_path(data) if data else "") or "smoke", "base_model": str(base_model)}
    if data is None:
        inputs["personas"] = ",".join(personas)
    if is_done(out, STAGE, config, inputs):
        return read_manifest(out / STAGE)

    if data is not None:
        from mascot.core.personas import PersonaCatalog

        rows = load_sft_rows(data, set(PersonaCatalog.load().cards))
        data_ids = [f"{Path(data).name}:{r['line']}" for r in rows]
        if cfg.sft.data is None:  # built from training situations: those are the ids eval must refuse
            data_ids = read_manifest(out / "sft_data")["data_ids"]
    else:
        rows = smoke_rows(personas)
        data_ids = [f"smoke:{r['persona_id']}:{r['line']}" for r in rows]

    if cfg.sft.per_persona:
        by_p = {p: [r for r in rows if r["persona_id"] == p] for p in personas}
        empty = [p for p, rs in by_p.items() if not rs]
        if empty:
            raise ValueError(f"sft.per_persona: no SFT rows for persona(s) {empty}; sample more situations "
                             "(sft_data.limit), raise sft_data.k_teacher, or train one shared adapter")
        groups = by_p
    else:
        groups = {"": rows}
    with stage_dir(out, STAGE, config, inputs) as (partial, manifest):
        per: dict[str, dict] = {}
        for pid, part_rows in groups.items():
            dest = partial / ("adapters" if pid else "") / (pid or "adapter")
            # a killed or rerun stage keeps each adapter trained with the same settings on the same rows: new rows for
            # one persona retrain that persona only
            marker = dest.parent / f"{dest.name}.done.json"
            key = digest_obj([config, inputs["base_model"], pid, [r["messages"] for r in part_rows]])
            if (done := _finished(dest, marker, key)) is not None:
                per[pid] = done
                continue
            prev = out / STAGE / dest.relative_to(partial)  # the last finished stage's adapter of this persona
            shutil.rmtree(dest, ignore_errors=True)
            if (done := _finished(prev, prev.parent / marker.name, key)) is not None:
                shutil.copytree(prev, dest)
                atomic_write_text(marker, (prev.parent / marker.name).read_text(encoding="utf-8"))
                per[pid] = done
                continue
            per[pid] = _train_adapter(cfg, part_rows, base_model, dest, partial / "trainer",
                                      partial / (f"curves_{pid}.png" if pid else "curves.png"), pid)
            atomic_write_text(marker, json.dumps({"key": key, "metrics": per[pid]}) + "\n")
        manifest["data_ids"] = data_ids
        manifest["base_model"] = str(base_model)
        if cfg.sft.per_persona:
            manifest["adapters"] = {p: f"adapters/{p}" for p in groups}
            manifest["metrics"] = {"rows": len(rows), "steps": sum(m["steps"] for m in per.values()),
                                   "per_persona": per}
        else:
            manifest["adapter"] = "adapter"
            manifest["metrics"] = per[""]
    return manifest


def _finished(adapter: Path, marker: Path, key: str) -> dict | None:
    """The metrics of ``adapter`` when its ``marker`` records ``key`` (trained with these settings on these rows),
    else None."""
    done = json.loads(marker.read_text(encoding="utf-8")) if marker.is_file() else {}
    return done["metrics"] if done.get("key") == key and adapter.is_dir() else None


def _train_adapter(cfg: PersonaAlignmentConfig, rows: list[dict], base_model: str, dest: Path, work: Path,
                   curves: Path, label: str) -> dict:
    """Train one LoRA on ``rows`` (TRL ``SFTTrainer``, prompt-completion rows), save it to ``dest`` and its loss
    curve to ``curves`` (PNG, with the JSONL log beside it); ``label`` names the persona in progress lines.

    Returns:
        ``{"train_loss", "rows", "steps"}``.
    """
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import SFTConfig, SFTTrainer

    on_gpu = torch.cuda.is_available()
    name = f"sft {label}".strip()
    ds = Dataset.from_list([{"prompt": r["messages"][:-1], "completion": r["messages"][-1:]} for r in rows])
    tok = AutoTokenizer.from_pretrained(base_model)
    model = AutoModelForCausalLM.from_pretrained(base_model)
    args = SFTConfig(output_dir=str(work), num_train_epochs=cfg.sft.epochs, max_steps=cfg.sft.max_steps,
                     learning_rate=cfg.sft.lr, per_device_train_batch_size=cfg.sft.batch_size,
                     max_length=cfg.max_model_len, logging_steps=1, save_strategy="no", report_to=[],
                     bf16=on_gpu and torch.cuda.is_bf16_supported(), gradient_checkpointing=False,
                     use_cpu=not on_gpu, seed=0, dataloader_num_workers=0, disable_tqdm=True)
    trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok,
                         peft_config=peft_lora(cfg.lora), callbacks=[trainer_progress(name)])
    trainer.remove_callback(PrinterCallback)  # the progress lines carry the loss
    result = trainer.train()
    dest.parent.mkdir(parents=True, exist_ok=True)
    write_curves(trainer.state.log_history, curves, name)
    trainer.model.save_pretrained(str(dest))
    shutil.rmtree(work, ignore_errors=True)
    metrics = {"train_loss": float(result.training_loss), "rows": len(rows), "steps": int(trainer.state.global_step)}
    del trainer, model
    return metrics


def adapter_dirs(out: str | Path, personas: list[str]) -> dict[str, Path] | None:
    """Each persona's SFT adapter directory in the run ``out``: ``OUT/sft/adapters/<persona>`` when the stage trained
    one per persona (``sft.per_persona``), else the shared ``OUT/sft/adapter`` for every persona; None when the stage
    has not run (or SFT is off).

    Raises:
        ValueError: a persona of ``personas`` that the per-persona stage did not train (the run's roster changed).
    """
    m = read_manifest(Path(out) / STAGE)
    if m is None:
        return None
    if "adapters" in m:
        missing = [p for p in personas if p not in m["adapters"]]
        if missing:
            raise ValueError(f"the sft stage trained no adapter for persona(s) {missing}; rerun it with them")
        return {p: Path(out) / STAGE / m["adapters"][p] for p in personas}
    return {p: Path(out) / STAGE / m["adapter"] for p in personas}
