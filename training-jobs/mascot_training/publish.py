"""Gate and publish persona LoRA adapters into the adapter store as ``staged`` (DESIGN.md section 5).

Store layout (a local directory; the default is ``OUT/adapters``)::

    <store>/registry.json                 the index (written atomically, compare-and-swap on "revision")
    <store>/<persona_id>/v<N>/            PEFT files (adapter_config.json, adapter_model.safetensors) + manifest.json

``registry.json``::

    {"revision": int,
     "adapters": {persona_id: {"versions": {"<N>": {"state": "staged"|"canary"|"stable"|"retired",
                                                   "name": "<persona_id>--v<N>", "digest": sha256, "created": iso}},
                               "stable": null | N, "canary": null | N, "canary_weight": 0}}}

``manifest.json`` of a version: ``name``, ``persona_id``, ``version``, ``digest`` (SHA-256 of
``adapter_model.safetensors``), ``base_model``, ``rank``, ``run_id``, ``data_ids``, ``eval_metrics``, ``created``.

Publish is atomic (:func:`publish_adapter`): check the adapter (base model, rank within the serving limit, LoRA
tensors only), copy it to ``<persona>/v<N>.tmp-*``, verify the copy's digest, write its manifest, rename it to
``v<N>`` and register it as ``staged`` with a compare-and-swap on the registry revision. Any failure removes what
was written and leaves the registry as it was, so the serving adapter is untouched. Until AdapterService exists
(serving issue) this module is the registry's only writer; both serialise on ``<store>/registry.lock``.

The gate (:func:`gate`) refuses adapters whose replies collapsed: it generates with the adapter on the base model
(transformers + PEFT) and checks mean answer words and distinct-2 (Li et al. 2016, section 4.3) of the visible
answers against ``publish.gate``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from mascot.core.files import atomic_write_text
from mascot_training.config import GateConfig, PersonaAlignmentConfig
from mascot_training.manifest import digest_path, is_done, read_manifest, stage_dir
from mascot_training.rewards import split_think

STAGE = "publish"
REGISTRY = "registry.json"
LOCK = "registry.lock"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
#: Serving limit of vLLM ``max_lora_rank`` (config.validate uses the same bound).
MAX_RANK = 64
GATE_TEMPERATURE = 0.7
GATE_TOP_P = 0.95
_ID_RE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_VERSION_RE = re.compile(r"^v([1-9][0-9]*)$")
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


class PublishError(ValueError):
    """The adapter cannot be published; the message says what to change. Nothing was written."""


class RegistryConflict(RuntimeError):
    """The registry changed under us (or stayed locked) on every attempt; nothing was written."""


# ----------------------------------------------------------------------------------------------------- gate


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
        ``{"passed": bool, "mean_words": float, "distinct_2": float, "replies": int, "reason": str}``;
        ``reason`` is '' when passed. distinct-2 is 0.0 when no answer holds two words.
    """
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mascot.eval.automatic import distinct_n
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
    mean_words = sum(len(a.split()) for a in answers) / len(answers)
    d2 = distinct_n(answers, 2) or 0.0
    reasons = []
    if mean_words < cfg.min_mean_words:
        reasons.append(f"mean answer length {mean_words:.2f} words is below gate.min_mean_words "
                       f"{cfg.min_mean_words}")
    if d2 < cfg.min_distinct_2:
        reasons.append(f"distinct-2 {d2:.3f} is below gate.min_distinct_2 {cfg.min_distinct_2}")
    return {"passed": not reasons, "mean_words": round(mean_words, 4), "distinct_2": round(d2, 4),
            "replies": len(answers), "reason": "; ".join(reasons)}


# ----------------------------------------------------------------------------------------------------- store


def file_digest(path: str | Path) -> str:
    """SHA-256 (hex) of one file."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _same_model(a: str, b: str) -> bool:
    if a == b:
        return True
    pa, pb = Path(a), Path(b)
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()


def check_adapter(adapter_dir: str | Path, *, base_model: str, max_rank: int = MAX_RANK) -> dict:
    """Check an adapter against the serving limits before anything is written.

    Returns:
        The parsed ``adapter_config.json``.

    Raises:
        PublishError: missing files, another base model, rank above ``max_rank``, or full-weight modules
            (``modules_to_save`` or a tensor that is not a LoRA matrix).
    """
    from safetensors import safe_open

    d = Path(adapter_dir)
    for f in ADAPTER_FILES:
        if not (d / f).is_file():
            raise PublishError(f"adapter {d} has no {f}: pass a PEFT adapter directory (save_pretrained output)")
    try:
        conf = json.loads((d / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise PublishError(f"{d / 'adapter_config.json'} is not valid JSON ({e})") from None
    got = conf.get("base_model_name_or_path") or ""
    if not _same_model(str(got), str(base_model)):
        raise PublishError(f"adapter {d} was trained on base model {got!r}, but the serving base model is "
                           f"{str(base_model)!r}: retrain it on the serving base model")
    rank = conf.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise PublishError(f"{d / 'adapter_config.json'} has no valid LoRA rank 'r' (got {rank!r})")
    pattern = conf.get("rank_pattern") or {}
    top = max([rank, *[v for v in pattern.values() if isinstance(v, int)]])
    if top > max_rank:
        raise PublishError(f"adapter {d} has LoRA rank {top}, above the serving limit max_lora_rank {max_rank}: "
                           f"train with lora.r <= {max_rank}")
    if conf.get("modules_to_save"):
        raise PublishError(f"adapter {d} saves full-weight modules {conf['modules_to_save']} (modules_to_save); "
                           f"the server loads LoRA matrices only: train without modules_to_save")
    with safe_open(str(d / "adapter_model.safetensors"), "pt") as f:
        full = [k for k in f.keys() if "lora_" not in k]
    if full:
        raise PublishError(f"adapter {d} holds {len(full)} non-LoRA tensor(s) (e.g. {full[0]!r}); the server loads "
                           f"LoRA matrices only: train without modules_to_save or trainable embeddings")
    return conf


def read_registry(store: str | Path) -> dict:
    """The store's registry (an empty one at revision 0 when the file does not exist yet)."""
    p = Path(store) / REGISTRY
    if not p.is_file():
        return {"revision": 0, "adapters": {}}
    try:
        reg = json.loads(p.read_text(encoding="utf-8"))
    except ValueError as e:
        raise RuntimeError(f"{p} is not valid JSON ({e}); restore it from a backup before publishing") from None
    if not isinstance(reg, dict) or not isinstance(reg.get("revision"), int):
        raise RuntimeError(f"{p} has no integer 'revision'; restore it from a backup before publishing")
    return reg


@contextmanager
def registry_lock(store: Path, timeout_s: float = 30.0, stale_s: float = 600.0) -> Iterator[None]:
    """Hold ``<store>/registry.lock`` (``O_CREAT | O_EXCL``); a lock older than ``stale_s`` is broken.

    Raises:
        RegistryConflict: the lock stayed held for ``timeout_s``.
    """
    path = store / LOCK
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            break
        except FileExistsError:
            try:
                if time.time() - path.stat().st_mtime > stale_s:
                    path.unlink(missing_ok=True)
                    continue
            except FileNotFoundError:
                continue
            if time.monotonic() > deadline:
                raise RegistryConflict(f"{path} stayed locked for {timeout_s:.0f} s; if no publish is running, "
                                       f"remove it") from None
            time.sleep(0.05)
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
        os.close(fd)
        yield
    finally:
        path.unlink(missing_ok=True)


def _existing_versions(pdir: Path, entry: dict | None) -> set[int]:
    got = {int(k) for k in (entry or {}).get("versions", {})}
    if pdir.is_dir():
        got |= {int(m.group(1)) for c in pdir.iterdir() if (m := _VERSION_RE.match(c.name))}
    return got


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def publish_adapter(store: str | Path, persona_id: str, adapter_dir: str | Path, *, base_model: str,
                    run_id: str, data_ids: list[str], eval_metrics: dict, max_rank: int = MAX_RANK,
                    attempts: int = 3) -> dict:
    """Publish one adapter as ``<store>/<persona_id>/v<N>`` (N = highest existing + 1) in state ``staged``.

    Args:
        store: Store root (local directory; created when missing).
        persona_id: The persona (snake_case id); the version is named ``<persona_id>--v<N>``.
        adapter_dir: PEFT adapter directory (``adapter_config.json``, ``adapter_model.safetensors``).
        base_model: The serving base model; must equal the adapter's ``base_model_name_or_path``.
        run_id: Training run id (manifest).
        data_ids: Data ids the adapter was trained on (manifest).
        eval_metrics: Evaluation metrics, e.g. the gate's (manifest).
        max_rank: Serving limit on the LoRA rank.
        attempts: Compare-and-swap attempts before :class:`RegistryConflict`.

    Returns:
        ``{"persona_id", "version", "name", "path", "digest", "revision"}`` (revision after the write).

    Raises:
        PublishError: the adapter fails a check or its copy does not match its digest.
        RegistryConflict: the registry kept changing or stayed locked.
        OSError: the store is not writable.
        In every case no version directory is left and the registry is unchanged.
    """
    if not _ID_RE.match(persona_id):
        raise PublishError(f"persona id {persona_id!r} must be snake_case (lower-case letters, digits, '_')")
    src = Path(adapter_dir)
    conf = check_adapter(src, base_model=base_model, max_rank=max_rank)
    digest = file_digest(src / "adapter_model.safetensors")
    store = Path(store)
    pdir = store / persona_id
    new_pdir = not pdir.exists()
    pdir.mkdir(parents=True, exist_ok=True)
    try:
        return _publish_locked(store, pdir, persona_id, src, conf, digest, base_model=base_model, run_id=run_id,
                               data_ids=data_ids, eval_metrics=eval_metrics, attempts=attempts)
    except BaseException:
        if new_pdir:
            try:
                pdir.rmdir()  # only when empty: a version published meanwhile stays
            except OSError:
                pass
        raise


def _publish_locked(store: Path, pdir: Path, persona_id: str, src: Path, conf: dict, digest: str, *,
                    base_model: str, run_id: str, data_ids: list[str], eval_metrics: dict, attempts: int) -> dict:
    for _ in range(attempts):
        with registry_lock(store):
            for stale in pdir.glob("v*.tmp-*"):  # left by a killed publisher; we hold the lock
                shutil.rmtree(stale, ignore_errors=True)
            reg = read_registry(store)
            rev = reg.get("revision", 0)
            n = max(_existing_versions(pdir, reg.get("adapters", {}).get(persona_id)), default=0) + 1
            name, final = f"{persona_id}--v{n}", pdir / f"v{n}"
            tmp = pdir / f"v{n}.tmp-{uuid.uuid4().hex[:8]}"
            created = _now()
            renamed = False
            try:
                shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("manifest.json", "checkpoint-*", ".*"))
                got = file_digest(tmp / "adapter_model.safetensors")
                if got != digest:
                    raise PublishError(f"the copy of {src / 'adapter_model.safetensors'} in the store has digest "
                                       f"{got[:12]}…, not {digest[:12]}…: the copy is corrupt; publish again")
                manifest = {"name": name, "persona_id": persona_id, "version": n, "digest": digest,
                            "base_model": str(base_model), "rank": conf["r"], "alpha": conf.get("lora_alpha"),
                            "target_modules": conf.get("target_modules"), "run_id": run_id,
                            "data_ids": list(data_ids), "eval_metrics": eval_metrics, "created": created}
                atomic_write_text(tmp / "manifest.json", json.dumps(manifest, indent=2, default=str) + "\n")
                if read_registry(store).get("revision", 0) != rev:
                    shutil.rmtree(tmp, ignore_errors=True)
                    continue  # compare-and-swap failed (a writer outside the lock): retry
                os.rename(tmp, final)
                renamed = True
                new = json.loads(json.dumps(reg))
                new["revision"] = rev + 1
                entry = new.setdefault("adapters", {}).setdefault(
                    persona_id, {"versions": {}, "stable": None, "canary": None, "canary_weight": 0})
                entry["versions"][str(n)] = {"state": "staged", "name": name, "digest": digest, "created": created}
                if read_registry(store).get("revision", 0) != rev:
                    shutil.rmtree(final, ignore_errors=True)
                    renamed = False
                    continue
                atomic_write_text(store / REGISTRY, json.dumps(new, indent=2, sort_keys=True) + "\n")
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                if renamed:
                    shutil.rmtree(final, ignore_errors=True)
                raise
        return {"persona_id": persona_id, "version": n, "name": name, "path": str(final), "digest": digest,
                "revision": rev + 1}
    raise RegistryConflict(f"{store / REGISTRY} changed during each of {attempts} attempts; publish again")


def find_version(store: str | Path, persona_id: str, digest: str) -> dict | None:
    """The registered version of ``persona_id`` whose adapter has ``digest`` (``{"version", "name", ...}``)."""
    entry = read_registry(store).get("adapters", {}).get(persona_id) or {}
    for k, v in entry.get("versions", {}).items():
        if v.get("digest") == digest:
            return {"version": int(k), **v}
    return None


# ----------------------------------------------------------------------------------------------------- stage


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
        NotImplementedError: ``publish.gateway`` is set (AdapterService is not built yet).
        KeyError: an unknown persona id.
    """
    if cfg.publish.gateway:
        raise NotImplementedError("AdapterService is not built yet; unset publish.gateway to publish into the store")
    from mascot.core.personas import PersonaCatalog

    out = Path(out)
    store = Path(cfg.publish.store) if cfg.publish.store else out / "adapters"
    config = cfg.publish.model_dump(mode="json") | {"run_id": cfg.run_id}
    inputs = {f"adapter:{p}": digest_path(d) for p, d in sorted(adapters.items())} | {"base_model": str(base_model),
                                                                                       "store": str(store)}
    if is_done(out, STAGE, config, inputs):
        return read_manifest(out / STAGE)
    catalog = PersonaCatalog.load()
    cards = {pid: catalog.get(pid) for pid in adapters}
    with stage_dir(out, STAGE, config, inputs) as (_partial, manifest):
        metrics: dict = {"published": 0, "refused": 0, "personas": {}}
        for pid, adir in adapters.items():
            card = cards[pid]
            rec: dict = {}
            try:
                check_adapter(adir, base_model=base_model)
                rec["gate"] = gate(base_model, adir, card, cfg.publish.gate)
                if not rec["gate"]["passed"]:
                    raise PublishError(f"gate: {rec['gate']['reason']}")
                prior = find_version(store, pid, file_digest(Path(adir) / "adapter_model.safetensors"))
                if prior is not None:
                    rec["published"] = {"version": prior["version"], "name": prior["name"], "already": True}
                else:
                    res = publish_adapter(store, pid, adir, base_model=base_model, run_id=cfg.run_id,
                                          data_ids=data_ids, eval_metrics={"gate": rec["gate"]})
                    rec["published"] = {k: res[k] for k in ("version", "name", "digest", "revision")}
                metrics["published"] += 1
            except PublishError as e:
                rec["refused"] = str(e)
                metrics["refused"] += 1
            metrics["personas"][pid] = rec
        manifest["metrics"] = metrics
        manifest["data_ids"] = list(data_ids)
        manifest["store"] = str(store)
    return manifest
