"""Test machinery that launches real processes (dockerd, git-made patches) for the integration tests."""
