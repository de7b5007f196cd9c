"""Benchmark: a host full of real ``pi`` sessions (see ``__main__``)."""
