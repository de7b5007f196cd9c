"""In-memory fakes for the rollout server's tests and benchmarks: gateway and proxy clients, a real gRPC fake gateway.

The private PostgreSQL server the integration tests launch lives in ``integration_tests/support/postgres.py``.
"""
