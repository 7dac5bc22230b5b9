"""Benchmark figures, supervisor side: statistics, summaries, comparison, the HTML report."""
