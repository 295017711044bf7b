"""MASCOT training Jobs. Phase 1 (persona-aware behavioural alignment) runs as stages.

Every stage reads the run config (:mod:`mascot_training.config`), writes its artefacts under ``OUT/<stage>/`` and
a ``manifest.json`` (:mod:`mascot_training.manifest`), and resumes where it stopped. Artefacts:

- ``OUT/sft/adapter/``: optional SFT LoRA of the candidate policy (PEFT directory).
- ``OUT/sample/candidates.jsonl``: one line per group (context x, persona):
  ``{"group_id", "situation_id", "persona_id", "history": [{"role", "persona_id", "text"}], "context":
  [[speaker, content]], "candidates": [text, ...K], "thinks": [text, ...K]}`` (visible answer and think split).
- ``OUT/judge/judgements.jsonl``: ``{"group_id", "persona_id", "scores": [{criterion: int} | null, ...K],
  "means": [float | null, ...K]}`` (null = unparseable, dropped).
- ``OUT/pairs/pairs.jsonl``: ``{"group_id", "situation_id", "persona_id", "history", "context", "chosen",
  "rejected", "margin", "split": "train" | "heldout"}``; ``chosen``/``rejected`` are visible answers.
- ``OUT/persona_rm/model/``: sequence-classification reward model + tokenizer + ``mascot_reward.json``
  (μ, σ from held-out pairs); its manifest records ``rm_heldout_accuracy``.
- ``OUT/persona_grpo/<persona_id>/``: the persona's GRPO LoRA adapter (PEFT directory).
- ``OUT/adapters/<persona_id>/v<N>/``: the published store, ``registry.json`` at its root.

Nothing here imports a servicer; only :mod:`mascot.core` and the gRPC clients.
"""
