"""Errors raised by the reconstructor.

Hierarchy::

    polar_core.errors.InvalidArgument
    ├── MalformedCompletions        -> INVALID_ARGUMENT: the completions contradict each other
    │                                  (duplicate call ids, several sessions in one reconstruction)
    └── EndOfTurnUnknown            -> INVALID_ARGUMENT: prefix merging needs end-of-turn IDs that were
                                       neither given nor detectable from the completions
    polar_core.errors.NotFound / Unavailable are raised unchanged when completions are read from a proxy.

A completion whose response and logprob lengths differ is rejected by
:class:`polar_core.records.CompletionRecord` itself with ``InvalidArgument``.
"""

from __future__ import annotations

from polar_core.errors import InvalidArgument

__all__ = ["EndOfTurnUnknown", "MalformedCompletions"]


class MalformedCompletions(InvalidArgument):
    """The completions given for one reconstruction contradict each other."""


class EndOfTurnUnknown(InvalidArgument):
    """Prefix merging needs end-of-turn token IDs; none were given and none could be detected."""
