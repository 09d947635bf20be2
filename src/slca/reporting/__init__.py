"""Reporting: run reports, the token page and multi-seed comparisons (``slca report``, ``slca compare``).

Reads what training writes (``metrics.jsonl``, ``samples.json``, run folders).
"""
