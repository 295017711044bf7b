"""RewardService: persona-conditioned reward-model scoring."""
