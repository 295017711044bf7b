"""What both training phases use: config shapes and the config reader (:mod:`.config`), the train/eval data split
(:mod:`.data`), stage manifests and resumption (:mod:`.manifest`), the reward rules (:mod:`.rewards`), LoRA helpers
(:mod:`.lora`), GRPO plumbing (:mod:`.grpo`), the Bradley–Terry reward-model recipe (:mod:`.reward_model`), preference
pairs (:mod:`.preference_pairs`), in-process judges (:mod:`.judges`) and publishing into the adapter store
(:mod:`.publish`). Nothing here imports :mod:`mascot_training.persona` or :mod:`mascot_training.collaborative`.
"""
