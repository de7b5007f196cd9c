"""Benchmark: latency the model proxy adds over a direct HTTP call to the same stub backend."""
