"""MASCOT training Jobs: two phases, each a chain of resumable stages (``mascot train``).

- :mod:`mascot_training.persona`: phase 1, persona-aware behavioural alignment. One GRPO LoRA per persona against
  a persona reward model trained on judge-ranked candidate replies.
- :mod:`mascot_training.collaborative`: phase 2, collaborative dialogue optimisation. GRPO of the director's LoRA on
  simulated prefix–suffix dialogues with the frozen phase 1 speakers and a simulated user, against a group reward.
- :mod:`mascot_training.common`: what both phases use: the shared config shapes and reader, the training data split,
  stage manifests, reward rules, LoRA / GRPO / reward-model / judging helpers and publishing into the adapter store.

Every stage reads its phase's run config (:mod:`mascot_training.persona.config`,
:mod:`mascot_training.collaborative.config`), writes its artefacts under ``OUT/<stage>/`` with a ``manifest.json``
(:mod:`mascot_training.common.manifest`), and resumes where it stopped.

Phase 1 artefacts:

- ``OUT/sft/adapter/``: optional SFT LoRA of the candidate policy (PEFT directory); with ``sft.per_persona``
  ``OUT/sft/adapters/<persona_id>/``, one per persona.
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
- ``OUT/adapters/<persona_id>/v<N>/``: the published store (``staged``), ``registry.json`` at its root.

Phase 2 artefacts:

- ``OUT/speakers/manifest.json``: ``adapters = {persona_id: {"path", "source", "digest"}}``, the frozen speakers
  (from ``speakers.adapters``, ``speakers.store`` or minimal LoRAs made under ``OUT/speakers/<persona_id>/``).
- ``OUT/rollouts/prefixes.jsonl``: ``{"prefix_id", "situation_id", "situation", "emotion", "k", "history",
  "context"}`` per prefix; ``blocks.jsonl``: ``{"prefix_id", "blocks": [Rollout.record(), ...K]}``
  (:meth:`mascot_training.collaborative.simulate.Rollout.record`); ``dropped.jsonl``: prefixes lost to a role flip.
- ``OUT/group_rm/model/``: the group reward model (as ``persona_rm``, on blocks of turns) and ``judgements.jsonl``
  (``{"prefix_id", "mean"}`` per block); with ``group_reward.source: judge`` or ``team`` only a manifest (and no
  ``blocks.jsonl``).
- ``OUT/director_grpo/adapter/``: the director's GRPO LoRA; ``metrics.json`` (rewards, persona distribution and
  valid-directive rate before and after); ``warm_start/`` when ``director.warm_start_steps`` is set.
- ``OUT/publish/manifest.json`` (the gate) and ``OUT/adapters/director/v<N>/`` in the store (``staged``).

Training imports :mod:`mascot.core`, the components' prompt builders, parsers and scorers, and the gRPC clients;
never a servicer, the composition root, eval or the CLI (the import contracts in ``.importlinter``).
"""
