"""Polar's own version, and the rule that keeps one fleet on one version.

A fleet's roles (rollout server, gateways, proxies) register with the rollout server, which refuses a role that
runs another Polar release than its own: their contracts, stored rows and reward rules may differ between
releases, and a mixed fleet would fail later and less clearly (or score sessions by two rules).
"""

from __future__ import annotations

import functools
import importlib.metadata

from packaging.version import InvalidVersion, Version

from polar_core.errors import FailedPrecondition

__all__ = ["check_same_version", "polar_version"]


@functools.cache
def polar_version() -> str:
    """This installation's Polar version (the ``polar-rollout`` distribution); empty when it is not installed."""
    try:
        return importlib.metadata.version("polar-rollout")
    except importlib.metadata.PackageNotFoundError:
        return ""


def check_same_version(role: str, theirs: str, ours: str) -> None:
    """Refuse a role whose Polar version differs from this server's, naming both.

    Only versions are compared: an empty or non-version string on either side (a checkout that is not
    installed, a test double) is not refused.

    Raises:
        FailedPrecondition: Both are versions and they differ (``details``: ``role``, ``version``,
            ``server_version``).
    """
    try:
        if Version(theirs) == Version(ours):
            return
    except InvalidVersion:
        return
    raise FailedPrecondition(
        f"{role} runs Polar {theirs} but this rollout server runs Polar {ours}: every role of a fleet must run "
        "the same Polar release (upgrade the fleet together)",
        details={"role": role, "version": theirs, "server_version": ours},
    )
