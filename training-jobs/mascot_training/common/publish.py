"""Publish a checked LoRA adapter as ``staged``: straight into the run's adapter store, or through the gateway.

Both phases' ``publish`` stages end here: phase 1's persona adapters after their gate
(:mod:`mascot_training.persona.publish_personas`), phase 2's director adapter after its gate
(:mod:`mascot_training.collaborative.publish_director`). The store, its registry and the atomic publish live in
:mod:`mascot.core.adapters.store`; with ``publish.gateway`` set, adapters go through the gateway's AdapterService
instead (:func:`publish_via_gateway`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mascot.core.adapters.store import (
    MAX_RANK,
    PublishError,
    RegistryConflict,
    check_adapter,
    file_digest,
    find_version,
    publish_adapter,
    read_registry,
)

__all__ = ["MAX_RANK", "PublishError", "RegistryConflict", "check_adapter", "file_digest", "find_version",
           "publish_adapter", "publish_to", "publish_via_gateway", "read_registry", "still_published", "store_of"]


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
        return publish_via_gateway(publish_cfg.gateway, persona_id, adapter_dir, token_file=publish_cfg.token_file,
                                   run_id=run_id, data_ids=data_ids,
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
                        data_ids: list[str], eval_metrics: dict, attempts: int = 3, timeout_s: float = 300.0,
                        token_file: str = "") -> dict:
    """AdapterService.PublishAdapter on the control plane at ``gateway`` (host:port) with the token of ``token_file``
    (stripped), else of ``MASCOT_ADMIN_TOKEN``.

    ``adapter_dir`` must be readable by the control plane (in a cluster: the shared volume the Job writes to).
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

    if token_file:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as e:
            raise ValueError(f"publish.token_file {token_file} cannot be read ({e.strerror})") from None
    else:
        token = os.environ.get("MASCOT_ADMIN_TOKEN", "").strip()
    if not token:
        raise ValueError("publish.gateway is set but no admin token was found (publish.token_file or "
                         "MASCOT_ADMIN_TOKEN): give the Job a token with the role operator")
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
                raise PublishError(f"the control plane refused the adapter: {e.details()}") from None
            if e.code() != grpc.StatusCode.UNAVAILABLE or attempt + 1 == attempts:
                raise ValueError(f"publishing {persona_id} through {gateway} failed: {e.code().name}: "
                                 f"{e.details()}") from None
            time.sleep(1.0 * (attempt + 1))
    raise AssertionError("unreachable")
