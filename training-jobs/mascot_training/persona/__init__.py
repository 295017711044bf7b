"""Phase 1, persona-aware behavioural alignment (``mascot train persona-alignment``).

Stages, in chain order (:mod:`.pipeline`, config :mod:`.config`): ``sft`` (:mod:`.sft`, optional SFT of the
candidate policy), ``sample`` (:mod:`.sample_candidates`, K candidate replies per context and persona), ``judge``
(:mod:`.score_candidates`, the agent rubric on every candidate), ``pairs`` (:mod:`.pairs`, preference pairs),
``persona_rm`` (:mod:`.persona_rm`, the persona reward model), ``persona_grpo`` (:mod:`.persona_grpo`, one GRPO LoRA
per persona) and ``publish`` (:mod:`.publish_personas`, gate and publish as ``staged``).
"""
