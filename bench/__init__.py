"""Benchmarks: one script per question, each printing ratios against a baseline."""
