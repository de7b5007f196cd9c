"""What ``polar run`` and ``polar generate`` read from the environment: one typed settings object.

The commands load it once (:meth:`RunSettings.load`) and pass it down; nothing else in ``polar_run`` reads the
environment. The services the embedded stack starts get their own settings objects, built from the options.
"""

from __future__ import annotations

from typing import Self

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from polar_core.errors import InvalidArgument

__all__ = ["RunSettings"]


class RunSettings(BaseSettings):
    """The environment of ``polar run`` and ``polar generate``.

    Attributes:
        proxy_context_length: The embedded proxy's context in tokens when ``--context-length`` is not given
            (``POLAR_PROXY_CONTEXT_LENGTH``, the variable a deployed proxy reads); 0 (or unset, or empty) means
            the model's own.
    """

    model_config = SettingsConfigDict(frozen=True, extra="ignore", env_ignore_empty=True, populate_by_name=True)

    proxy_context_length: int = Field(default=0, ge=0, validation_alias="POLAR_PROXY_CONTEXT_LENGTH")

    @classmethod
    def load(cls) -> Self:
        """Read the environment.

        Raises:
            InvalidArgument: A variable does not parse (``POLAR_PROXY_CONTEXT_LENGTH`` is not an integer >= 0).
        """
        try:
            return cls()
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise InvalidArgument(f"the environment does not parse: {problems}") from None
