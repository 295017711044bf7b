"""Stage ``publish`` of phase 2: gate the trained director LoRA and publish it as ``<store>/director/v<N>``
(``staged``), straight into the run's store or through the gateway (:mod:`mascot_training.common.publish`).
"""

from __future__ import annotations

from pathlib import Path

from mascot_training.collaborative.config import CollaborativeConfig
from mascot_training.common import manifest as mf
from mascot_training.common.publish import PublishError, check_adapter, publish_to, still_published, store_of


def run(cfg: CollaborativeConfig, out: Path, *, base_model: str) -> dict:
    """Gate and publish ``OUT/director_grpo/adapter`` as ``<store>/director/v<N>`` (``staged``).

    Gate: the valid-directive rate after training may fall at most ``publish.gate.max_valid_rate_drop`` below the
    rate before (both measured by ``director_grpo`` on the same prefixes). A refusal is recorded in the manifest
    (``metrics.refused``) and leaves the store untouched; a resumed run does not publish the same digest twice.

    Raises:
        ValueError: director_grpo has not run, or the gateway (``publish.gateway``) refused the credentials.
    """
    grpo = mf.read_manifest(out / "director_grpo")
    if grpo is None:
        raise ValueError(f"{out / 'director_grpo'} has no manifest: run the director_grpo stage first")
    adir = out / "director_grpo" / "adapter"
    store = store_of(cfg.publish, out)
    conf = cfg.publish.model_dump(mode="json") | {"run_id": cfg.run_id}
    inputs = {"adapter": mf.digest_path(adir), "base_model": str(base_model), "store": str(store)}
    if mf.is_done(out, "publish", conf, inputs) and still_published(mf.read_manifest(out / "publish"), cfg.publish):
        return mf.read_manifest(out / "publish")
    m = grpo["metrics"]
    drop = round(m["valid_rate_before"] - m["valid_rate_after"], 4)
    gate = {"valid_rate_before": m["valid_rate_before"], "valid_rate_after": m["valid_rate_after"], "drop": drop,
            "max_drop": cfg.publish.gate.max_valid_rate_drop,
            "passed": drop <= cfg.publish.gate.max_valid_rate_drop + 1e-9}
    with mf.stage_dir(out, "publish", conf, inputs) as (_part, man):
        rec: dict = {"gate": gate}
        try:
            check_adapter(adir, base_model=base_model)
            if not gate["passed"]:
                raise PublishError(f"gate: the valid-directive rate fell from {m['valid_rate_before']} to "
                                   f"{m['valid_rate_after']} (more than {gate['max_drop']})")
            rec["published"] = publish_to(cfg.publish, out, "director", adir, base_model=base_model,
                                          run_id=cfg.run_id, data_ids=grpo.get("data_ids", []),
                                          eval_metrics={"gate": gate, "director_grpo": {
                                              k: m.get(k) for k in ("group_reward_mean", "i_div_mean",
                                                                    "persona_distribution_before",
                                                                    "persona_distribution_after")}})
        except PublishError as e:
            rec["refused"] = str(e)
        man["metrics"] = rec
        man["data_ids"] = grpo.get("data_ids", [])
        man["store"] = store
    return mf.read_manifest(out / "publish")
