"""The judges a training stage scores with, built as the JudgeService builds them, and their clean-up.

Phase 1's ``judge`` stage (:mod:`mascot_training.persona.score_candidates`), phase 2's ``group_rm`` stage and its
``judge`` group reward (:mod:`mascot_training.collaborative`) judge in-process with the JudgeService code
(:func:`mascot.judge.judging.build_judges`): the same rubric prompts, retry/drop rule and content-hash cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def build_stage_judges(cfg: Any, engine: Any, cache_url: str) -> list:
    """The configured judges (local, OpenAI-compatible or metrics), built as the JudgeService builds them.

    Args:
        cfg: An object with ``judge`` (a :class:`~mascot_training.common.config.JudgeStageConfig`), ``model`` and
            ``tiny_dir`` (the run config of phase 1, or phase 2's group-reward view of it).
        engine: The run's engine, used by ``local`` judges (None when no judge is local).
        cache_url: SQLAlchemy URL of the judges' shared content-hash cache.

    Returns:
        The judges, in spec order.
    """
    from mascot.core.config import JudgeConfig
    from mascot.judge.judging import build_judges

    jc = JudgeConfig(judges=cfg.judge.judges, max_retries=cfg.judge.max_retries, cache_url=cache_url)
    needs_engine = any(spec.kind == "local" for spec in jc.judges)
    name = Path(str(cfg.model or cfg.tiny_dir)).name
    return list(build_judges(jc, engine if needs_engine else None, name).values())


def judging_versions(judges: Any) -> dict[str, str]:
    """What a judging stage's verdicts depend on besides its config and inputs, for its cache key: the rubric's
    version, and the metrics judge's mapping version when a judge of ``judges`` (specs with ``kind``) is one. A run
    directory resumed with another rubric or mapping judges again instead of keeping the old verdicts.
    """
    from mascot.judge import rubric as rb

    out = {"rubric": rb.rubric_version()}
    if any(getattr(j, "kind", None) == "metrics" for j in judges):
        from mascot.judge.metrics import VERSION

        out["metrics"] = VERSION
    return out


async def close_judges(judges: list) -> None:
    """Close every judge backend (HTTP clients) and their shared cache."""
    for j in judges:
        close = getattr(j.backend, "close", None)
        if close:
            await close()
    if judges and judges[0].cache is not None:
        judges[0].cache.close()
