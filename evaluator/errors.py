"""Errors raised by the evaluator.

Hierarchy (all :mod:`polar_core.errors` classes; the gRPC edge maps them)::

    polar_core.errors.InvalidArgument
    ├── UnknownStrategy         the spec names no known strategy and no importable ``module:callable``
    └── InvalidOptions          the strategy's options are malformed
    polar_core.errors.NotFound
    └── HandleNotFound          Evaluate on a handle that was never prepared or was released

Evaluation outcomes (invalid patch, test failures, timeouts, runtime deaths) are not exceptions at the
service boundary: they are terminal statuses in the result.
"""

from __future__ import annotations

from polar_core.errors import InvalidArgument, NotFound

__all__ = ["HandleNotFound", "InvalidOptions", "UnknownStrategy"]


class UnknownStrategy(InvalidArgument):
    """The evaluator strategy is not known."""


class InvalidOptions(InvalidArgument):
    """The evaluator options are malformed."""


class HandleNotFound(NotFound):
    """No prepared evaluation has this handle."""
