"""Fakes for tests and benchmarks: an in-memory gateway client, a real gRPC fake gateway, a private PostgreSQL."""
