"""Gate and publish persona LoRA adapters into the adapter store as ``staged``.

The store, its registry and the atomic publish live in :mod:`mascot.core.adapters.store`; with ``publish.gateway``
set, adapters go through the gateway's AdapterService instead (:func:`publish_via_gateway`).

The gate (:func:`gate`) refuses adapters whose replies collapsed: it generates with the adapter on the base model
(transformers + PEFT) and checks mean answer words and distinct-2 (Li et al. 2016, section 4.3) of the visible
answers against ``publish.gate``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mascot.core.adapters.store import (  # noqa: F401 - re-exported for the training API
    MAX_RANK,
    PublishError,
    RegistryConflict,
    check_adapter,
    file_digest,
    find_version,
    publish_adapter,
    read_registry,
)
from mascot_training.config import GateConfig, PersonaAlignmentConfig
from mascot_training.manifest import digest_path, is_done, read_manifest, stage_dir
from mascot_training.rewards import split_think

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
    return manifest


def still_published(manifest: dict | None, publish_cfg: Any) -> bool:
    """True when every version a publish manifest records is still in its local store's registry with the same
    digest (a resumed run then skips); always True for a gateway (the registry is the gateway's)."""
    if not manifest or publish_cfg.gateway:
        return bool(manifest)
    recs = manifest.get("metrics", {}).get("personas") or {"director": manifest.get("metrics", {})}
    for pid, rec in recs.items():
        pub = rec.get("published")
        if not pub:
            continue
        try:
            reg = read_registry(manifest["store"])
        except RuntimeError:
            return False
        v = reg.get("adapters", {}).get(pid, {}).get("versions", {}).get(str(pub.get("version")))
        if not v or (pub.get("digest") and v.get("digest") != pub["digest"]):
            return False
    return True


def store_of(publish_cfg: Any, out: Path) -> str:
    """Where a run publishes: ``gateway:<address>`` when ``publish.gateway`` is set, else the store directory
    (``publish.store`` or ``OUT/adapters``)."""
    if publish_cfg.gateway:
        return f"gateway:{publish_cfg.gateway}"
    return str(Path(publish_cfg.store) if publish_cfg.store else Path(out) / "adapters")


def publish_to(publish_cfg: Any, out: Path, persona_id: str, adapter_dir: str | Path, *, base_model: str,
               run_id: str, data_ids: list[str], eval_metrics: dict) -> dict:
    """Publish one checked adapter as ``staged``: through the gateway's AdapterService when ``publish.gateway`` is
    set, else straight into the run's store. A digest already registered is not published twice.

    Returns:
        ``{"version", "name", "digest", "revision"}`` plus ``"already": True`` for an existing digest.

    Raises:
        PublishError: the adapter was refused (checks, digest). ValueError: the gateway refused the credentials or
        stayed unavailable.
    """
    if publish_cfg.gateway:
        return publish_via_gateway(publish_cfg.gateway, persona_id, adapter_dir, run_id=run_id, data_ids=data_ids,
                                   eval_metrics=eval_metrics)
    store = Path(store_of(publish_cfg, out))
    digest = file_digest(Path(adapter_dir) / "adapter_model.safetensors")
    prior = find_version(store, persona_id, digest)
    if prior is not None:
        return {"version": prior["version"], "name": prior["name"], "digest": digest, "already": True}
    res = publish_adapter(store, persona_id, adapter_dir, base_model=base_model, run_id=run_id, data_ids=data_ids,
                          eval_metrics=eval_metrics)
    return {k: res[k] for k in ("version", "name", "digest", "revision")}


def publish_via_gateway(gateway: str, persona_id: str, adapter_dir: str | Path, *, run_id: str,
                        data_ids: list[str], eval_metrics: dict, attempts: int = 3, timeout_s: float = 300.0) -> dict:
    """AdapterService.PublishAdapter on ``gateway`` (host:port) with the token in ``MASCOT_ADMIN_TOKEN``.

    ``adapter_dir`` must be readable by the gateway (in a cluster: the shared volume the Job writes to).
    UNAVAILABLE is retried ``attempts`` times with a short back-off.

    Raises:
        PublishError: INVALID_ARGUMENT (the gateway's checks refused the adapter; its message says why).
        ValueError: no token, UNAUTHENTICATED / PERMISSION_DENIED, or still unavailable after the attempts.
    """
    import asyncio
    import os
    import time

    import grpc

    from mascot.api.adapter.v1 import adapter_pb2 as pb
    from mascot.api.adapter.v1 import adapter_pb2_grpc
    from mascot.core.server import channel

    token = os.environ.get("MASCOT_ADMIN_TOKEN", "").strip()
    if not token:
        raise ValueError("publish.gateway is set but MASCOT_ADMIN_TOKEN is empty: give the Job the admin token")
    req = pb.PublishAdapterRequest(persona_id=persona_id, source_path=str(Path(adapter_dir).resolve()),
                                   run_id=run_id, data_ids=list(data_ids),
                                   eval_metrics_json=json.dumps(eval_metrics, default=str))

    async def call() -> Any:
        ch = channel(gateway)
        try:
            return await adapter_pb2_grpc.AdapterServiceStub(ch).PublishAdapter(
                req, metadata=(("authorization", f"Bearer {token}"),), timeout=timeout_s)
        finally:
            await ch.close()

    for attempt in range(attempts):
        try:
            r = asyncio.run(call())
            out = {"version": r.version.version, "name": r.version.name, "digest": r.version.digest,
                   "revision": r.revision}
            return out | ({"already": True} if r.already_published else {})
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise PublishError(f"the gateway refused the adapter: {e.details()}") from None
            if e.code() != grpc.StatusCode.UNAVAILABLE or attempt + 1 == attempts:
                raise ValueError(f"publishing {persona_id} through {gateway} failed: {e.code().name}: "
                                 f"{e.details()}") from None
            time.sleep(1.0 * (attempt + 1))
    raise AssertionError("unreachable")
