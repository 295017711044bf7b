"""JudgeService: LLM-judge rubric scoring."""
