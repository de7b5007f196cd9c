"""Benchmark: resident memory of the stack over many long sessions (``python -m bench.long_sessions``)."""
