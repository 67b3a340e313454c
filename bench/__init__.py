"""Benchmarks: `python -m bench.create` (job creation through the HTTP API)."""
