"""Evaluation harness (issue 3): rubric judging, automatic metrics, baselines, reports, human-preference export."""
