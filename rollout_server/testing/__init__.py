"""Fakes for tests and benchmarks: in-memory gateway and proxy clients, a gRPC fake gateway, a private PostgreSQL."""
