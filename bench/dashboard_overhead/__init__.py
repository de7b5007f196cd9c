"""Benchmark: polar run wall time with and without the live dashboard (see __main__)."""
