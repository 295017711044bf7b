"""Stage ``speakers``: the frozen persona adapters phase 2 rolls out with.

Sources, in order: ``speakers.adapters`` (explicit directories), ``speakers.store`` (a phase 1 adapter store: the
persona's latest live version, :meth:`mascot.core.adapters.store.AdapterStore.latest_live`: ``stable``, else its
highest version that is not retired), else a quick step that makes one minimal LoRA per persona (``QUICK_STEPS``
SFT steps on rows built from its persona card, :func:`mascot_training.common.lora.smoke_rows`), so the chain runs
standalone on a fresh clone without the whole phase 1 chain.

The store is any URI the adapter store opens (:func:`mascot.core.adapters.store.open_store`): a local path,
``file:///abs/path``, ``pvc://<claim>/<path>`` (the claim mounted at ``/mnt/pvc``) or ``s3://<bucket>/<prefix>``
(credentials and endpoint from the standard AWS variables). A local or PVC store is read in place; a version of a
remote store is downloaded to ``OUT/.speakers-cache/`` first. Either way its weights must hash to the digest the
registry holds.

Output: ``OUT/speakers/manifest.json`` with ``adapters = {persona_id: {"path", "source", "digest"}}``; made
adapters live in ``OUT/speakers/<persona_id>/``.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from mascot.core.adapters.store import AdapterStore, backend_errors, open_store
from mascot_training.collaborative.config import CollaborativeConfig
from mascot_training.common import manifest as mf
from mascot_training.common.config import active_personas

log = logging.getLogger(__name__)
STAGE = "speakers"
#: SFT steps of a quick minimal persona adapter.
QUICK_STEPS = 2
#: Where versions of a remote store are downloaded, under the run directory.
CACHE_DIR = ".speakers-cache"


def from_store(store: AdapterStore, persona_id: str, cache_dir: str | Path) -> tuple[Path, str] | None:
    """The local adapter directory of ``persona_id``'s latest live version in ``store`` (stable, else the highest
    version that is not retired), downloaded to ``cache_dir`` when the store is remote.

    Returns:
        ``(path, "store:v<N>")`` or None when the store has no live version of the persona.

    Raises:
        ValueError: the store or its registry cannot be read, or the version's files do not match its digest.
    """
    try:
        v = store.latest_live(persona_id)
        if v is None:
            return None
        path = store.local_version(persona_id, v["version"], v.get("digest", ""), cache_dir)
    except (RuntimeError, *backend_errors()) as e:
        raise ValueError(f"speakers.store {store.display()}: cannot read {persona_id}'s adapter ({e})") from None
    return path, f"store:v{v['version']}"


def _quick_adapter(base_model: str, persona_id: str, cfg: CollaborativeConfig, out_dir: Path) -> None:
    """A minimal persona LoRA: ``QUICK_STEPS`` TRL SFT steps on the card's smoke rows."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from mascot_training.common.lora import peft_lora, smoke_rows

    rows = smoke_rows([persona_id])
    ds = Dataset.from_list([{"prompt": r["messages"][:-1], "completion": r["messages"][-1:]} for r in rows])
    work = out_dir.parent / f".{persona_id}-trainer"
    args = SFTConfig(output_dir=str(work), max_steps=QUICK_STEPS, learning_rate=2e-4, per_device_train_batch_size=2,
                     max_length=cfg.max_model_len, logging_steps=1, save_strategy="no", report_to=[],
                     bf16=False, gradient_checkpointing=False, use_cpu=not torch.cuda.is_available(), seed=0,
                     dataloader_num_workers=0, disable_tqdm=True)
    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(base_model), args=args, train_dataset=ds,
                         processing_class=AutoTokenizer.from_pretrained(base_model),
                         peft_config=peft_lora(cfg.lora))
    trainer.train()
    trainer.model.save_pretrained(str(out_dir))
    shutil.rmtree(work, ignore_errors=True)


def run(cfg: CollaborativeConfig, out: Path, *, base_model: str) -> dict:
    """Resolve (or make) one frozen adapter per active persona; returns the stage manifest.

    Raises:
        ValueError: adapters were given but some active persona has none (named), or a store is unreadable.
    """
    out = Path(out)
    personas = active_personas(cfg)
    given: dict[str, tuple[Path, str]] = {}
    if cfg.speakers.store:
        store = open_store(cfg.speakers.store)
        for pid in personas:
            hit = from_store(store, pid, out / CACHE_DIR)
            if hit:
                given[pid] = hit
    for pid, d in cfg.speakers.adapters.items():
        if pid in personas:
            given[pid] = (Path(d), "path")
    base_only: list[str] = []
    if given and set(given) != set(personas):
        missing = sorted(set(personas) - set(given))
        if cfg.speakers.missing != "base":
            raise ValueError(f"no phase 1 adapter for persona(s) {missing}: add them to speakers.adapters or the "
                             "store, drop them from personas, or set speakers.missing: base")
        base_only = missing
        log.warning("speakers: no phase 1 adapter for %s; they speak with the base model (speakers.missing: base)",
                    ", ".join(missing))
    config = {"personas": personas, "lora": cfg.lora.model_dump(mode="json"), "quick_steps": QUICK_STEPS,
              "sources": {p: s for p, (_, s) in sorted(given.items())} | {p: "base" for p in base_only}}
    inputs = {"base_model": mf.digest_path(base_model) or f"hub:{base_model}"} | {
        f"adapter:{p}": mf.digest_path(d) for p, (d, _) in sorted(given.items())}
    if mf.is_done(out, STAGE, config, inputs):
        return mf.read_manifest(out / STAGE)
    with mf.stage_dir(out, STAGE, config, inputs) as (partial, man):
        adapters = {}
        for pid in personas:
            if pid in base_only:
                adapters[pid] = {"path": "", "source": "base", "digest": ""}
                continue
            if pid in given:
                path, source = given[pid]
            else:
                path, source = out / STAGE / pid, "quick"
                if not (partial / pid / "adapter_config.json").is_file():
                    shutil.rmtree(partial / pid, ignore_errors=True)
                    log.info("speakers: making a minimal adapter for %s (%d SFT steps)", pid, QUICK_STEPS)
                    _quick_adapter(base_model, pid, cfg, partial / pid)
            digest_dir = partial / pid if source == "quick" else path
            adapters[pid] = {"path": str(path), "source": source, "digest": mf.digest_path(digest_dir)}
        man["adapters"] = adapters
        man["metrics"] = {"quick": sum(1 for a in adapters.values() if a["source"] == "quick"),
                          "given": len(given), "base": len(base_only)}
    return mf.read_manifest(out / STAGE)
