"""JudgeService: LLM-judge rubric scoring (REFERENCE.md section 4)."""
