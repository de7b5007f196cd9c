"""Machinery the integration tests and bench/ share: helpers that launch real processes."""
