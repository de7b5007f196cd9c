"""Servers and fakes that stand in for production inference servers in tests."""
