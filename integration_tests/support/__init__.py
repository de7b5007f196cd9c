"""Helpers for integration tests that launch real processes (servers, inference engines, containers)."""
