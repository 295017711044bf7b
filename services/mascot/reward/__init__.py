"""RewardService: persona-conditioned reward-model scoring (REFERENCE.md section 5)."""
