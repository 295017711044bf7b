"""Evaluation harness: rubric judging, automatic metrics, baselines, reports, human-preference export."""
