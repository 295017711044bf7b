"""Phase 2, collaborative dialogue optimisation (``mascot train collaborative``).

Stages, in chain order (:mod:`.pipeline`, config :mod:`.config`): ``speakers`` (:mod:`.speakers`, the frozen phase 1
persona adapters), ``rollouts`` (:mod:`.rollouts`, prefixes and the group reward model's block continuations),
``group_rm`` (:mod:`.group_rm`, the group reward model), ``director_grpo`` (:mod:`.director_grpo`, GRPO of the
director's LoRA, after an optional warm start, :mod:`.director_warm_start`) and ``publish``
(:mod:`.publish_director`, gate and publish the director as ``staged``). :mod:`.simulate` simulates one dialogue:
the prefix–suffix rollout of the director with frozen speakers and a simulated user.
"""
