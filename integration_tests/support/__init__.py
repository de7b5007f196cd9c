"""Test machinery that launches real processes (PostgreSQL, dockerd, harness CLIs) for the integration tests."""
