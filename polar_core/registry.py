"""A registry by name: the one shape of Polar's extension points.

Provider protocols (``model_proxy.protocols``), evaluator strategies (``evaluator.strategies``) and harnesses
(``polar_checks.harnesses``, ``gateway.harnesses``) are each a :class:`Registry` built once from a literal list of
``(name, entry)`` pairs, so adding one is a new module and one line in that list (see ``docs/extending.md``).

A registry is immutable after construction: nothing registers itself at import time, and no module holds a
mutable table. Construction refuses a name given twice (a dict literal would silently keep the last), and a
lookup of an unknown name raises an :class:`~polar_core.errors.InvalidArgument` (or a subclass the caller
chooses) that lists the known names.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Generic, TypeVar

from polar_core.errors import InvalidArgument

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """An immutable, ordered mapping of names to entries (factories, descriptions), for one kind of extension.

    Args:
        kind: What the entries are, for messages (``"evaluator strategy"``, ``"harness"``).
        entries: ``(name, entry)`` pairs, in the order :meth:`names` lists them.
        unknown: The error :meth:`get_or_raise` raises for an unknown name (an ``InvalidArgument`` subclass).

    Raises:
        ValueError: A name is empty or given twice (a bug in the table, found at import).
    """

    __slots__ = ("_entries", "_kind", "_unknown")

    def __init__(
        self, kind: str, entries: Iterable[tuple[str, T]], *, unknown: type[InvalidArgument] = InvalidArgument
    ) -> None:
        table: dict[str, T] = {}
        for name, entry in entries:
            if not name:
                raise ValueError(f"a {kind} needs a name")
            if name in table:
                raise ValueError(f"{kind} {name!r} is registered twice")
            table[name] = entry
        self._kind = kind
        self._entries: Mapping[str, T] = MappingProxyType(table)
        self._unknown = unknown

    @property
    def kind(self) -> str:
        """What the entries are."""
        return self._kind

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._entries)

    def get_or_raise(self, name: str, *, details: Mapping[str, str] | None = None) -> T:
        """The entry registered as ``name``.

        Args:
            name: The name to look up.
            details: Machine-readable details for the error (``InvalidArgument.details``).

        Raises:
            InvalidArgument: No entry has that name (the registry's ``unknown`` class); the message lists the
                known names.
        """
        try:
            return self._entries[name]
        except KeyError:
            pass
        raise self._unknown(
            f"unknown {self._kind} {name!r}; known: {', '.join(self._entries)}",
            details=details,
        )

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self._kind!r}, {list(self._entries)!r})"
