"""Test machinery the integration tests and bench/ share: helpers that launch real processes (PostgreSQL, dockerd,
harness CLIs, backends)."""
